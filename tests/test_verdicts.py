"""How verify judges each stage's report (pure core)."""

from __future__ import annotations

import dataclasses

import pytest

from transplant.core.plan import Finding
from transplant.verify.judges import (StageResult, expect_matches, judge_imports, judge_requirements, judge_server_args,
                                 judge_smoke, overall_ok)


def test_imports():
    ok = {"imports": [{"name": "torch", "ok": True, "version": "2.13.0+cpu", "file": "/v/torch/__init__.py"}]}
    assert judge_imports(ok) == ("pass", "1 import: torch 2.13.0+cpu")
    bad = {"imports": ok["imports"] + [{"name": "flashinfer", "ok": False, "error": "ModuleNotFoundError: x"}]}
    assert judge_imports(bad) == ("fail", "1 of 2 imports failed; flashinfer: ModuleNotFoundError: x")
    assert judge_imports({"imports": bad["imports"][1:]}) == ("fail", "1 of 1 import failed; flashinfer: ModuleNotFoundError: x")
    assert judge_imports({"imports": []})[0] == "skip"


@pytest.mark.parametrize("want,got,ok", [
    ("DFLASH", {"name": "DFLASH", "value": 7}, True),
    ("DFLASH", {"name": None, "value": "DFLASH"}, True),
    ("EAGLE", {"name": "DFLASH", "value": "DFLASH"}, False),
    (16, {"name": None, "value": 16}, True),
    (16, {"name": None, "value": 16.0}, True),
    (16, {"name": None, "value": "16"}, True),
    (16, {"name": None, "value": 15}, False),
    (True, {"name": None, "value": 1}, False),
    (None, {"name": None, "value": None}, True),
    ("x", None, False),
])
def test_expect_matches(want, got, ok):
    assert expect_matches(want, got) is ok


def test_server_args():
    expect = {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16}
    report = {"ok": True, "values": {"speculative_algorithm": {"name": None, "value": "DFLASH", "repr": "'DFLASH'"},
                                     "speculative_num_draft_tokens": {"name": None, "value": 16, "repr": "16"}}}
    assert judge_server_args(expect, report) == ("pass", "parsed; DFLASH 16 (speculative_algorithm, speculative_num_draft_tokens)")
    report["values"]["speculative_num_draft_tokens"]["value"] = 8
    assert judge_server_args(expect, report) == ("fail", "parsed, but speculative_num_draft_tokens=8 (expected 16)")
    rejected = {"ok": False, "error": "sglang serve: error: argument --speculative-algorithm: invalid choice: 'DFLASH'"}
    status, reason = judge_server_args(expect, rejected)
    assert status == "fail" and reason.endswith("invalid choice: 'DFLASH'")


def test_smoke():
    checks = [{"name": "matmul 256x256", "dtype": "float32", "rel_error": 1e-7, "bound": 1e-4, "ok": True}]
    ok = {"ok": True, "device": "cpu", "reason": "ran on cpu", "torch": "2.13.0+cpu", "checks": checks}
    assert judge_smoke(ok) == ("pass", "ran on cpu; torch 2.13.0+cpu; matmul 256x256 float32 1.0e-07 <= 1e-04")
    bad = dict(ok, ok=False, checks=[dict(checks[0], rel_error=0.5, ok=False)])
    assert judge_smoke(bad) == ("fail", "matmul 256x256 float32 on cpu: relative error 5.00e-01 above the bound 1e-04")
    nogpu = {"ok": False, "device": None, "reason": "device cuda asked for, but torch.cuda.is_available() is False", "checks": []}
    assert judge_smoke(nogpu) == ("fail", nogpu["reason"])
    assert judge_smoke(dict(ok, checks=[]))[0] == "fail"


def test_requirements_and_overall():
    err = Finding(code="requirement-unmet", severity="error", dists=("a", "b"), message="a 1 requires b>2, found 1", hint="h")
    warn = Finding(code="requirement-unmet", severity="warning", dists=("c",), message="m", hint="h")
    assert judge_requirements([warn])[0] == "pass"
    assert judge_requirements([err, warn]) == ("fail", "1 distribution with unmet requirements the donor satisfies: a 1 requires b>2, found 1")
    assert judge_requirements([err, err])[1].startswith("2 distributions with unmet requirements the donor satisfies: ")
    stages = [StageResult(name="x", status="skip", reason="r", seconds=0.0)]
    assert overall_ok(stages)
    assert not overall_ok(stages + [StageResult(name="y", status="fail", reason="r", seconds=1.0)])
    with pytest.raises(ValueError):
        StageResult(name="z", status="passed", reason="r", seconds=0)


def test_requirements_without_a_donor_name_none():
    err = Finding(code="requirement-unmet", severity="error", dists=("a", "b"), message="a 1 requires b>2, found 1", hint="h")
    assert judge_requirements([], donor=False) == ("pass", "every requirement of the venv's distributions is satisfied")
    assert judge_requirements([err], donor=False) == ("fail", "1 distribution with unmet requirements: a 1 requires b>2, found 1")
    assert "donor" not in judge_requirements([], donor=False)[1] + judge_requirements([err], donor=False)[1]
    assert judge_requirements([]) == ("pass", "every requirement the donor satisfies is satisfied")


def test_requirements_reason_is_cut_at_a_word_boundary():
    long = "sglang 0.5.9 requires " + ", ".join(f"flashinfer-python-component{i}==0.6.{i}" for i in range(12))
    err = Finding(code="requirement-unmet", severity="error", dists=("sglang",), message=long, hint="h")
    warn = Finding(code="requirement-unmet", severity="warning", dists=("x",), message=long, hint="h")
    words = set(long.replace(",", " ").split())
    for findings in ([err], [warn]):
        reason = judge_requirements(findings)[1]
        shown = reason.split(": ", 1)[1] if findings[0].severity == "error" else reason.split("warning: ", 1)[1]
        assert shown.endswith("...") and len(shown) <= 160, reason
        assert all(w in words for w in shown.removesuffix("...").replace(",", " ").split()), reason  # whole words


def test_clip():
    from transplant.core.units import clip

    assert clip("short", 10) == "short"
    assert clip("alpha beta gamma", 12) == "alpha..."
    assert clip("alpha beta; gamma", 15) == "alpha beta..."
    assert clip("alpha beta gamma", 13) == "alpha beta..."
    assert clip("/one/long/path/with/no/blank", 10) == "/one/long/path/with/no/blank"



# --- the ladder's later stages (plain data) ---

from transplant.verify import judges, ladder  # noqa: E402 - imported where the section that uses them starts
from transplant.core.inventory import Distribution, FileEntry  # noqa: E402 - imported where the section that uses them starts
from transplant.cli.render import verify_junit  # noqa: E402 - imported where the section that uses them starts


def _dist(name, top_level=(), paths=()):
    record = tuple(FileEntry(record_path=p, path=f"lib/python3.11/site-packages/{p}", exists=True) for p in paths)
    return Distribution(name=name, display_name=name, version=None, raw_version="1", dist_info=f"{name}-1.dist-info",
                        metadata_present=True, top_level=tuple(top_level), record=record)


def test_import_names_from_top_level_else_record():
    torch = _dist("torch", top_level=("functorch", "torch", "torchgen"))
    nv = _dist("nvidia-cuda-runtime", paths=("nvidia/cuda_runtime/lib/libcudart.so.13", "nvidia/cu13/__init__.py",
                                             "nvidia_cuda_runtime-13.0.96.dist-info/RECORD"))
    ext = _dist("sgl-kernel", paths=("sgl_kernel/__init__.py", "common_ops.cpython-311-x86_64-linux-gnu.so",
                                     "tests/data/x.txt", "six.py", "../../bin/tool"))
    assert ladder.import_names([torch, nv, ext], extra=("sglang", "torch")) == [
        "sglang", "torch", "functorch", "torchgen", "nvidia", "common_ops", "sgl_kernel", "six"]
    assert ladder.shared_objects([nv, ext], "/v") == [
        "/v/lib/python3.11/site-packages/common_ops.cpython-311-x86_64-linux-gnu.so",
        "/v/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.13"]


@pytest.mark.parametrize("name,key", [
    ("/usr/local/cuda/lib64/libcudart.so.13.0.96", "libcudart.so.13"), ("libcudart.so.13", "libcudart.so.13"),
    ("/x/libtorch_cuda.so", "libtorch_cuda.so"), ("libgomp-a34b3233.so.1", "libgomp-a34b3233.so.1"),
    ("python3.11", "python3.11"),
])
def test_library_key(name, key):
    assert ladder.library_key(name) == key


def test_judge_interpreter():
    target = {"version": "3.11.2", "implementation": "cpython", "home": "/usr/bin", "home_exists": True,
              "executable": "/v/bin/python"}
    assert judges.judge_interpreter(target, None) == (
        "pass", "cpython 3.11.2 (/v/bin/python, home /usr/bin); no donor interpreter to compare with")
    assert judges.judge_interpreter(target, dict(target, version="3.11.9"))[0] == "pass"
    assert judges.judge_interpreter(target, dict(target, version="3.10.12")) == (
        "fail", "cpython 3.11.2 (/v/bin/python, home /usr/bin), but the donor runs cpython 3.10.12: extension "
                "modules built for 3.10 do not load in 3.11")
    assert judges.judge_interpreter(target, None, python="3.11") == (
        "pass", "cpython 3.11.2 (/v/bin/python, home /usr/bin); Python 3.11 as the manifest expects; no donor "
                "interpreter to compare with")
    assert judges.judge_interpreter(target, None, python="3.11.9") == (
        "fail", "cpython 3.11.2 (/v/bin/python, home /usr/bin), but the manifest expects Python 3.11.9 (verify.python)")
    assert judges.judge_interpreter(dict(target, version="3.1.0"), None, python="3.11")[0] == "fail"
    assert judges.judge_interpreter(dict(target, home_exists=False), None) == (
        "fail", "pyvenv.cfg home /usr/bin does not exist: the venv's python points to nothing")
    # another CPython minor: the venv's extension modules decide (None: not read, the minor alone fails)
    older = dict(target, version="3.13.1")
    assert judges.judge_interpreter(target, older, foreign=[])[0] == "pass"
    status, reason = judges.judge_interpreter(target, older, foreign=["lib/python3.11/site-packages/x/_c.cpython-313-x86_64-linux-gnu.so"])
    assert status == "fail" and reason.endswith("(1 extension module: lib/python3.11/site-packages/x/_c.cpython-313-x86_64-linux-gnu.so)")
    assert judges.judge_interpreter(target, older, foreign=None)[0] == "fail"


def test_judge_native_names_soname_symbol_and_driver_libraries():
    libs = [{"path": "/v/a.so", "ok": True, "error": None},
            {"path": "/v/b.so", "ok": False, "error": "libcudart.so.12: cannot open shared object file: No such file"},
            {"path": "/v/c.so", "ok": False, "error": "/v/c.so: undefined symbol: _ZN3c104cuda9SetDeviceEa"},
            {"path": "/v/d.so", "ok": False, "error": "libcuda.so.1: cannot open shared object file: No such file"}]
    status, reason = judges.judge_native({"libraries": libs}, driver=False, venv="/v")
    assert (status, reason) == ("fail", "2 of 4 shared objects do not load: b.so: missing libcudart.so.12; c.so: "
                                        "undefined symbol _ZN3c104cuda9SetDeviceEa; 1 needs the NVIDIA driver's "
                                        "libraries, absent on this host (e.g. d.so): not checkable here")
    assert judges.judge_native({"libraries": libs}, driver=True, venv="/v")[1].startswith("3 of 4 shared objects")
    assert judges.judge_native({"libraries": [libs[0], libs[3]]}, driver=False)[0] == "pass"
    assert judges.judge_native({"libraries": []}, driver=True)[0] == "skip"


def test_provenance_says_why_each_outside_library_was_taken():
    shipped = ["/v/nvidia/cu13/lib/libcudart.so.13", "/v/torch/lib/libtorch_cuda.so", "/v/nvidia/lib/libcublas.so.13",
               "/v/nvidia/lib/libnvrtc.so.13", "/v/nvidia/lib/libcublasLt.so.13"]
    report = {"prefix": "/v", "prefix_real": "/real/v",
              "mapped": ["/real/v/torch/lib/libtorch_cuda.so", "/usr/local/cuda/lib64/libcudart.so.13.0.96",
                         "/opt/pre/libcublas.so.13", "/usr/lib/x86_64-linux-gnu/libnvrtc.so.13.0.1",
                         "/lib64/libcublasLt.so.13", "/usr/lib/x86_64-linux-gnu/libc.so.6"],
              "ld_library_path": [["/usr/local/cuda/lib64", "/usr/local/cuda/lib64"]],
              "ld_preload": [["/opt/pre/libcublas.so.13", "/opt/pre/libcublas.so.13"]],
              "ld_so_conf": [["/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]],
              "imported": [{"name": "torch", "ok": True}]}
    why = {c["library"]: c["why"] for c in ladder.provenance_conflicts(report, shipped)}
    assert why == {
        "libcudart.so.13": "LD_LIBRARY_PATH lists /usr/local/cuda/lib64, searched before the venv's RUNPATH",
        "libcublas.so.13": "LD_PRELOAD names it",
        "libnvrtc.so.13": "ld.so.conf lists /usr/lib/x86_64-linux-gnu (the loader's cache), and nothing loaded the "
                          "venv's copy by path first",
        "libcublasLt.so.13": "/lib64 is one of the loader's default folders"}
    assert ladder.cuda_torch_libraries(report) == [
        {"library": "libtorch_cuda.so", "path": "/real/v/torch/lib/libtorch_cuda.so", "from": "venv"},
        {"library": "libcudart.so.13", "path": "/usr/local/cuda/lib64/libcudart.so.13.0.96", "from": "outside"},
        {"library": "libcublas.so.13", "path": "/opt/pre/libcublas.so.13", "from": "outside"},
        {"library": "libnvrtc.so.13", "path": "/usr/lib/x86_64-linux-gnu/libnvrtc.so.13.0.1", "from": "outside"},
        {"library": "libcublasLt.so.13", "path": "/lib64/libcublasLt.so.13", "from": "outside"}]
    status, reason = judges.judge_provenance(report, shipped)
    assert status == "fail" and reason.startswith("4 libraries from outside the venv: libcublas.so.13 mapped from "
                                                  "/opt/pre/libcublas.so.13 instead of the venv's")
    assert reason.endswith("; and 1 more")
    clean = dict(report, mapped=["/real/v/torch/lib/libtorch_cuda.so", "/usr/lib/x86_64-linux-gnu/libc.so.6"])
    assert judges.judge_provenance(clean, shipped) == (
        "pass", "after importing torch: 1 libraries mapped from the venv, 1 from the system, none shadowing a library "
                "the venv ships")
    empty_entry = dict(report, mapped=["/cwd/libcudart.so.13"], ld_library_path=[["", "/cwd"]], ld_preload=[])
    assert ladder.provenance_conflicts(empty_entry, shipped)[0]["why"].startswith("LD_LIBRARY_PATH has an empty entry")
    rpath = dict(report, mapped=["/opt/x/libcudart.so.13"], ld_preload=[])
    assert ladder.provenance_conflicts(rpath, shipped)[0]["why"] == \
        "loaded by absolute path or through another library's RPATH/RUNPATH"
    nothing = dict(clean, imported=[{"name": "torch", "ok": False, "error": "ImportError: x"}])
    assert judges.judge_provenance(nothing, shipped)[0] == "skip"


@pytest.mark.parametrize("report,expected", [
    ({"ran": False, "error": "ServerArgs has no separate resolution step (resolve_once); its parser already resolved"},
     ("skip", "ServerArgs has no separate resolution step (resolve_once); its parser already resolved")),
    ({"ran": True, "ok": True, "method": "ServerArgs.resolve_once"},
     ("pass", "ServerArgs.resolve_once() ran: the arguments resolve against the model and platform")),
    ({"ran": True, "ok": False, "method": "ServerArgs.resolve_once", "error": "ModuleNotFoundError: No module named 'regex'",
      "kind": ["ModuleNotFoundError", "ImportError", "Exception"], "config_json": False},
     ("fail", "ServerArgs.resolve_once() needs a module the venv lacks: ModuleNotFoundError: No module named 'regex'")),
    ({"ran": True, "ok": False, "method": "M", "error": "OSError: /m does not appear to have a file named config.json",
      "kind": ["OSError"], "model_path": "/m", "config_json": False, "gpu": False},
     ("skip", "M() needs the model's config.json, and /m/config.json is absent on the target; put the model there to "
              "run it (OSError: /m does not appear to have a file named config.json)")),
    ({"ran": True, "ok": False, "method": "M", "error": "RuntimeError: No CUDA GPUs are available", "kind": ["RuntimeError"],
      "model_path": "/m", "config_json": True, "gpu": False},
     ("skip", "M() needs a GPU, and none is visible here (RuntimeError: No CUDA GPUs are available)")),
    ({"ran": True, "ok": False, "method": "M", "error": "RuntimeError: No CUDA GPUs are available", "kind": ["RuntimeError"],
      "model_path": "/m", "config_json": True, "gpu": True},
     ("fail", "M() failed: RuntimeError: No CUDA GPUs are available")),
])
def test_judge_resolve(report, expected):
    assert judges.judge_resolve(report) == expected


def test_judge_serve_shape_and_failures():
    ok = {"started": True, "startup_seconds": 12.34, "first_token_seconds": 0.5, "streamed": False,
          "answer": {"choices": [{"text": "hello"}]}, "stopped": "stopped by SIGTERM"}
    assert judges.judge_serve(ok, "choices.0.text") == (
        "pass", "started in 12.3 s; answer after 0.50 s; choices.0.text: 5 characters; server stopped by SIGTERM")
    assert judges.judge_serve(ok, "choices.1.text")[1].startswith("the answer has no 'choices.1.text'")
    many = dict(ok, answer={"output_ids": list(range(9))})
    assert judges.judge_serve(many, "output_ids", max_tokens=4)[1].startswith(
        "the answer's output_ids has 9 items, more than the 4 asked for")
    assert judges.judge_serve(dict(many, streamed=True), "output_ids")[1].startswith(
        "started in 12.3 s; streamed first token after 0.50 s; output_ids: 9 items")
    down = {"started": False, "error": "the server exited with code 1 before x answered", "log_tail": "a\nboom\n"}
    assert judges.judge_serve(down, "output_ids") == ("fail", "the server exited with code 1 before x answered; its log "
                                                              "ends: boom")


def test_judge_jit_caches():
    caches = [{"name": "triton", "library": "triton", "path": "/h/.triton/cache", "exists": True, "files": 3,
               "versions": ["3.4.0", "3.5.0"], "installed": "3.5.0"},
              {"name": "flashinfer", "library": "flashinfer", "path": "/h/.cache/flashinfer", "exists": False,
               "files": 0, "versions": [], "installed": "0.7.2"}]
    assert judges.stale_versions(caches[0]) == ["3.4.0"]
    assert judges.judge_jit_caches(caches, cleared=False) == (
        "pass", "triton /h/.triton/cache (3 files, built for triton 3.4.0, 3.5.0); warning: triton cache holds builds "
                "for triton 3.4.0 but 3.5.0 is installed (--clear-jit-caches=triton removes it)")
    refused = [dict(caches[0], removed=False, error="not removed: it is a symlink")]
    assert judges.judge_jit_caches(refused, cleared=True) == ("fail", "/h/.triton/cache: not removed: it is a symlink")
    assert judges.judge_jit_caches([caches[1]], cleared=False) == (
        "pass", "no JIT cache folders exist (/h/.cache/flashinfer)")
    elsewhere = [dict(caches[0], installed=None)]  # a user-wide cache of a library this venv lacks
    assert judges.judge_jit_caches(elsewhere, cleared=False) == (
        "pass", "triton /h/.triton/cache (3 files, built for triton 3.4.0, 3.5.0; triton is not installed in this "
                "venv: a user-wide folder other venvs may use, left alone)")


def test_smoke_subchecks_fail_the_stage_and_skips_are_named():
    checks = [{"name": "matmul 256x256", "dtype": "float32", "rel_error": 1e-7, "bound": 1e-4, "ok": True}]
    subs = [{"name": "triton kernel", "status": "skip", "reason": "no GPU: a triton kernel needs one"}]
    report = {"ok": True, "device": "cpu", "reason": "ran on cpu", "torch": "2.13.0+cpu", "checks": checks,
              "subchecks": subs}
    status, reason = judge_smoke(report)
    assert status == "pass" and reason.endswith("; triton kernel: skip (no GPU: a triton kernel needs one)")
    bad = dict(report, ok=False, subchecks=subs + [{"name": "flashinfer rmsnorm", "status": "fail",
                                                    "reason": "flashinfer 0.7.2: relative error 3.00e-01 above the bound 2e-02"}])
    assert judge_smoke(bad) == ("fail", "flashinfer rmsnorm: flashinfer 0.7.2: relative error 3.00e-01 above the bound 2e-02")


def test_junit_counts_skips_apart_from_passes():
    from xml.etree import ElementTree

    results = [StageResult(name="a", status="pass", reason="fine", seconds=1.0),
               StageResult(name="b", status="skip", reason="no GPU", seconds=0.0, cause="no-device"),
               StageResult(name="c", status="fail", reason="broken <&>", seconds=2.5)]
    suite = ElementTree.fromstring(verify_junit(results, "local:/v")).find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("time")) == ("3", "1", "1", "3.500")
    cases = suite.findall("testcase")
    assert cases[0].find("failure") is None and cases[0].find("skipped") is None
    assert cases[1].find("skipped").get("message") == "[no-device] no GPU"  # the cause, as in --json
    assert cases[2].find("failure").get("message") == "broken <&>"


def test_history_table_says_whether_each_verify_passed():
    from rich.console import Console

    from transplant.cli.render import history_table

    events = [{"id": "t1", "event": "applied", "time": 0},
              {"id": "t1", "event": "verified", "ok": False, "time": 60},
              {"id": "t1", "event": "verified", "ok": True, "time": 120},
              {"id": "t1", "event": "verified", "time": 180}]
    table = history_table([{"id": "t1", "state": "committed", "source": "d", "steps": 3}], events, "local:/v")
    console = Console(width=300, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    # several verifies of one transaction: one entry, the last outcome where it stands, and the count of each
    assert "applied 00:00:00, verify ? 00:03:00 (3 verifies: 1 passed, 1 failed, 1 ?)" in text
    for ok, said in ((False, "verify failed 00:01:00"), (True, "verify passed 00:01:00")):
        console = Console(width=300, record=True, color_system=None)
        console.print(history_table([{"id": "t1", "state": "committed", "source": "d", "steps": 3}],
                                    [events[0], {**events[1], "ok": ok}], "local:/v"))
        assert f"applied 00:00:00, {said}" in console.export_text()


def test_imports_needing_the_driver_are_not_checkable_without_one():
    torch = {"name": "torch", "ok": True, "version": "2.9.1"}
    kernel = {"name": "sgl_kernel", "ok": False,
              "error": "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory"}
    other = {"name": "flashinfer", "ok": False,
             "error": "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"}
    assert judge_imports({"imports": [torch, kernel]}, driver=False) == (
        "pass", "1 of 2 imports: torch 2.9.1; not checkable here: sgl_kernel (needs libcuda.so.1), the NVIDIA "
                "driver's library, absent on this host")
    assert judge_imports({"imports": [kernel]}, driver=False)[0] == "skip"
    # with a driver it is a failure, and a missing CUDA runtime is one everywhere
    assert judge_imports({"imports": [torch, kernel]}, driver=True)[0] == "fail"
    status, reason = judge_imports({"imports": [torch, kernel, other]}, driver=False)
    assert status == "fail" and reason.startswith("1 of 3 imports failed; flashinfer: ImportError: libcudart.so.12")


def test_an_import_error_naming_another_missing_library_besides_the_driver_still_fails():
    wrapped = ("ImportError: Could not load any common_ops library!\n- ImportError: libcuda.so.1: cannot open shared "
               "object file: No such file or directory\n- ImportError: libcudart.so.12: cannot open shared object file")
    assert judge_imports({"imports": [{"name": "sgl_kernel", "ok": False, "error": wrapped}]}, driver=False)[0] == "fail"
    assert judge_imports({"imports": [{"name": "sgl_kernel", "ok": False, "error": wrapped.rsplit("\n", 1)[0]}]},
                         driver=False)[0] == "skip"


def test_judge_native_kinds_host_library_foreign_machine_and_venv_library():
    err = "{}: cannot open shared object file: No such file or directory".format
    shipped = {"libcufile.so.0", "libtorchcodec_core4.so", "libnvshmem_host.so.3"}
    rdma = {"path": "/v/nvidia/cufile/lib/libcufile_rdma.so.1", "ok": False, "error": err("libmlx5.so.1"),
            "missing": ["libibverbs.so.1", "libmlx5.so.1", "librdmacm.so.1"]}
    ucx = {"path": "/v/nvidia/nvshmem/lib/nvshmem_transport_ucx.so.3", "ok": False, "error": err("libucs.so.0"),
           "missing": ["libucp.so.0", "libucs.so.0"]}
    arm = {"path": "/v/stubs/aarch64-unknown-linux-gnu/libcute_dsl_runtime.so", "ok": False, "error": None,
           "skipped": "built for aarch64 (e_machine 183, 64-bit), this interpreter is x86_64 (e_machine 62, 64-bit)"}
    ok = {"path": "/v/a.so", "ok": True, "error": None}
    status, reason = judges.judge_native({"libraries": [ok, rdma, ucx, arm]}, driver=False, venv="/v", shipped=shipped)
    assert status == "pass"
    assert reason == ("1 of 4 shared objects loads (RTLD_NOW); skipped 1 built for another machine than this "
                      "interpreter's (1 for aarch64; e.g. stubs/aarch64-unknown-linux-gnu/libcute_dsl_runtime.so): "
                      "not loadable here by construction; warning: 2 need host libraries that no distribution of the "
                      "venv ships, absent here (optional plugins; objects needing each: libibverbs.so.1 (1), "
                      "libmlx5.so.1 (1), librdmacm.so.1 (1), libucp.so.0 (1), libucs.so.0 (1); e.g. "
                      "nvidia/cufile/lib/libcufile_rdma.so.1)")
    # without knowing what the venv ships, a missing library is a failure
    assert judges.judge_native({"libraries": [ok, rdma]}, driver=False, shipped=None)[0] == "fail"
    # a library the venv ships (RECORD), or of a CUDA family pip ships, or auditwheel-grafted, is a failure,
    # also when the loader's message named a host library first
    for name in ("libcufile.so.0", "libcudart.so.12", "libgomp-a34b3233.so.1"):
        both = dict(rdma, missing=["libmlx5.so.1", name])
        status, reason = judges.judge_native({"libraries": [ok, both]}, driver=False, venv="/v", shipped=shipped)
        assert (status, reason) == ("fail", f"1 of 2 shared objects does not load: nvidia/cufile/lib/libcufile_rdma.so.1: "
                                            f"missing {name}"), name
    # an undefined symbol stays a failure
    undefined = {"path": "/v/t.so", "ok": False, "error": "/v/t.so: undefined symbol: _ZN3c10"}
    assert judges.judge_native({"libraries": [ok, undefined]}, driver=False, shipped=shipped)[0] == "fail"
    # only foreign objects: nothing checkable
    assert judges.judge_native({"libraries": [arm]}, driver=False, shipped=shipped)[0] == "skip"


def test_judge_native_passes_a_host_reason_on_through_the_venvs_own_library():
    err = "{}: cannot open shared object file: No such file or directory".format
    core = {"path": "/v/torchcodec/libtorchcodec_core4.so", "ok": False, "error": err("libavutil.so.56"),
            "missing": ["libavcodec.so.58", "libavutil.so.56"]}
    ops = {"path": "/v/torchcodec/libtorchcodec_custom_ops4.so", "ok": False, "error": err("libtorchcodec_core4.so"),
           "missing": ["libavutil.so.56", "libtorchcodec_core4.so"]}
    shipped = {"libtorchcodec_core4.so", "libtorchcodec_custom_ops4.so"}
    status, reason = judges.judge_native({"libraries": [{"path": "/v/a.so", "ok": True}, core, ops]}, driver=False,
                                         venv="/v", shipped=shipped)
    assert status == "pass" and "warning: 2 need host libraries" in reason and "libavutil.so.56 (2)" in reason
    # the venv's copy loading, or not being in the report, leaves the dependant a failure
    loaded = dict(core, ok=True, error=None)
    assert judges.judge_native({"libraries": [loaded, ops]}, driver=False, shipped=shipped)[0] == "fail"
    assert judges.judge_native({"libraries": [{"path": "/v/a.so", "ok": True}, ops]}, driver=False,
                               shipped=shipped)[0] == "fail"
    # a copy that needs the driver passes "not checkable" on; with a driver it is a failure
    drv = dict(core, error=err("libcuda.so.1"), missing=["libcuda.so.1"])
    status, reason = judges.judge_native({"libraries": [{"path": "/v/a.so", "ok": True}, drv, ops]}, driver=False,
                                         venv="/v", shipped=shipped)
    assert status == "pass" and "2 need the NVIDIA driver's libraries" in reason
    assert judges.judge_native({"libraries": [drv, ops]}, driver=True, shipped=shipped)[0] == "fail"


def test_record_library_keys_count_listed_files_even_when_gone():
    dist = _dist("x", paths=("nvidia/cu13/lib/libcudart.so.13", "pkg/_csv.cpython-311-x86_64-linux-gnu.so",
                             "pkg/__init__.py"))
    gone = dataclasses.replace(dist, record=tuple(dataclasses.replace(e, path=None, exists=False) for e in dist.record))
    for d in (dist, gone):
        assert ladder.record_library_keys([d]) == {"libcudart.so.13", "_csv.cpython-311-x86_64-linux-gnu.so"}
    assert ladder.shared_objects([gone], "/v") == [], "shared_objects counts only files on disk"


def test_extension_modules_are_not_libraries_for_provenance():
    base = {"prefix": "/v", "prefix_real": "/v"}
    stdlib = "/py/lib/python3.11/lib-dynload/_csv.cpython-311-x86_64-linux-gnu.so"
    shipped = ["/v/site/pyarrow/_csv.cpython-311-x86_64-linux-gnu.so", "/v/site/pkg/_speedups.so"]
    assert ladder.provenance_conflicts(dict(base, mapped=[stdlib]), shipped) == []
    # an untagged extension module: known as one from the report's extension_modules
    plain = "/usr/lib/python3/dist-packages/_speedups.so"
    assert [c["library"] for c in ladder.provenance_conflicts(dict(base, mapped=[plain]), shipped)] == ["_speedups.so"]
    assert ladder.provenance_conflicts(dict(base, mapped=[plain], extension_modules=[plain]), shipped) == []
    assert ladder.extension_module("x/_json.abi3.so") and not ladder.extension_module("libfoo.so.1")


# --- what the donor shares is not the transplant's fault ------------------------------------

def test_an_import_failing_the_same_way_on_the_donor_is_a_warning():
    from transplant.verify.ladder import donor_shared_imports

    target = {"imports": [{"name": "torch", "ok": True, "version": "2.14.1"},
                          {"name": "deep_ep", "ok": False, "error": "ImportError: The NVIDIA driver does not expose "
                                                                    "a usable CUDA device"},
                          {"name": "broken", "ok": False, "error": "ModuleNotFoundError: No module named 'x'"}]}
    donor = {"imports": [{"name": "deep_ep", "ok": False, "error": "ImportError: The NVIDIA driver does not expose"},
                         {"name": "broken", "ok": True}]}
    shared = donor_shared_imports(target, donor)
    assert shared == {"deep_ep"} and donor_shared_imports(target, None) == set()
    status, reason = judge_imports(target, donor_shared=shared)
    assert status == "fail" and reason.startswith("1 of 3 imports failed; broken:")
    assert "not checkable here: 1 fails identically in the donor, which runs with it" in reason
    ok = {"imports": target["imports"][:2]}
    status, reason = judge_imports(ok, donor_shared=shared)
    assert status == "pass" and "deep_ep (ImportError: The NVIDIA driver" in reason
    # another exception class on the donor is another failure: not excused
    other = {"imports": [{"name": "deep_ep", "ok": False, "error": "RuntimeError: boom"}]}
    assert donor_shared_imports(target, other) == set()


def test_a_shared_object_failing_the_same_way_on_the_donor_is_a_warning():
    from transplant.verify.judges import judge_native
    from transplant.verify.ladder import donor_shared_objects

    venv, donor_venv = "/t/venv", "/d/venv"
    bridge = "lib/python3.11/site-packages/cuda/core/_tensor_bridge.so"
    kern = "lib/python3.11/site-packages/k/kern.so"
    report = {"preload": [], "libraries": [
        {"path": f"{venv}/{bridge}", "ok": False, "error": f"{venv}/{bridge}: undefined symbol: aoti_torch_dtype_float32"},
        {"path": f"{venv}/{kern}", "ok": False, "error": f"{venv}/{kern}: undefined symbol: _Z3foov"},
        {"path": f"{venv}/lib/ok.so", "ok": True}]}
    donor = {"prefix": donor_venv, "libraries": [
        {"path": f"{donor_venv}/{bridge}", "ok": False,
         "error": f"{donor_venv}/{bridge}: undefined symbol: aoti_torch_dtype_float32"},
        {"path": f"{donor_venv}/{kern}", "ok": True}]}
    shared = donor_shared_objects(report, donor, venv)
    assert shared == {f"{venv}/{bridge}"}
    status, reason = judge_native(report, driver=False, venv=venv, shipped=(), donor_shared=shared)
    assert status == "fail" and reason.startswith("1 of 3 shared objects does not load: lib/python3.11/site-packages/k/kern.so")
    assert "not checkable here: 1 fails identically in the donor, which runs with it" in reason and "aoti_torch_dtype_float32" in reason
    report["libraries"].pop(1)
    assert judge_native(report, driver=False, venv=venv, shipped=(), donor_shared=shared)[0] == "pass"
    assert judge_native(report, driver=False, venv=venv, shipped=())[0] == "fail"


def test_smoke_without_torch_in_the_venv_is_a_skip_and_a_failed_import_a_failure():
    from transplant.verify.judges import judge_smoke

    reason = "torch is not installed in this venv; the smoke pass runs torch's matmuls and MLP"
    assert judge_smoke({"ok": False, "skipped": True, "reason": reason, "checks": []}) == ("skip", reason)
    # torch there but broken is broken here
    assert judge_smoke({"ok": False, "reason": "import torch failed: OSError: libcudart.so.13", "checks": []}) == \
        ("fail", "import torch failed: OSError: libcudart.so.13")


def test_the_verdict_line_counts_stages_and_names_each_skip_by_its_cause():
    from transplant.verify.verdict import causes_of, verdict_line

    results = [StageResult(name="imports", status="pass", reason="ok", seconds=1.0,
                           unchecked=({"item": "deep_ep", "cause": "no-driver", "evidence": "needs libcuda.so.1"},
                                      {"item": "flash_mla", "cause": "donor-identical", "evidence": "OSError"})),
               StageResult(name="smoke", status="skip", reason="no torch", seconds=0.0, cause="no-torch"),
               StageResult(name="serve", status="skip", reason="not asked", seconds=0.0, cause="not-requested"),
               StageResult(name="native-load", status="fail", reason="broken", seconds=0.0)]
    assert causes_of(results) == {"not-requested": ["serve"], "no-driver": ["imports:deep_ep"],
                                  "no-torch": ["smoke"], "donor-identical": ["imports:flash_mla"]}
    assert verdict_line(results) == (
        "verify failed: 1 passed, 1 failed, 2 skipped (not requested: serve; no torch: smoke); not checked here: "
        "2 items (no NVIDIA driver: imports:deep_ep; fails identically in the donor: imports:flash_mla)")


def test_strict_fails_what_could_not_be_checked_and_nothing_else():
    from transplant.verify.verdict import strict, verdict_line

    results = [StageResult(name="imports", status="pass", reason="3 imports", seconds=1.0,
                           unchecked=({"item": "deep_ep", "cause": "no-driver", "evidence": "needs libcuda.so.1"},)),
               StageResult(name="requirements", status="pass", reason="fine", seconds=0.0),
               StageResult(name="smoke", status="skip", reason="no GPU", seconds=0.0, cause="no-driver"),
               StageResult(name="serve", status="skip", reason="not asked", seconds=0.0, cause="not-requested"),
               StageResult(name="native-load", status="skip", reason="none", seconds=0.0, cause="nothing-to-check")]
    out = {r.name: r for r in strict(results)}
    assert [n for n, r in out.items() if r.status == "fail"] == ["imports", "smoke"]
    assert out["imports"].reason == "--strict: 1 not checked here: deep_ep (no NVIDIA driver); 3 imports"
    assert out["smoke"].reason == "--strict: not checked here (no NVIDIA driver): no GPU"
    assert out["serve"].status == "skip" and out["native-load"].status == "skip" and out["requirements"].status == "pass"
    assert verdict_line(list(out.values()), strict_mode=True).startswith("verify failed (--strict): 1 passed, 2 failed")


def test_a_stage_result_refuses_a_cause_outside_the_table():
    with pytest.raises(ValueError, match="cause 'gpu' is not one of"):
        StageResult(name="smoke", status="skip", reason="x", seconds=0.0, cause="gpu")
    with pytest.raises(ValueError, match="cause 'later' is not one of"):
        StageResult(name="imports", status="pass", reason="x", seconds=0.0,
                    unchecked=({"item": "a", "cause": "later", "evidence": ""},))


def test_failure_classes_compare_the_kind_of_failure_not_its_text():
    from transplant.verify.ladder import failure_class, system_library_gap

    assert failure_class("smoke", {"ok": False, "missing": "torch", "checks": []}) == "missing:torch"
    assert failure_class("smoke", {"ok": False, "unavailable": "cuda", "checks": []}) == "unavailable:cuda"
    assert failure_class("smoke", {"ok": False, "reason": "import torch failed: OSError: libcudart.so.13: cannot open",
                                   "checks": []}) == "import:OSError"
    assert failure_class("smoke", {"ok": True, "checks": [{"name": "matmul", "ok": True}],
                                   "subchecks": [{"name": "triton", "status": "fail"}]}) == "checks:triton"
    assert failure_class("smoke", {"ok": True, "checks": [], "subchecks": [{"name": "triton", "status": "skip"}]}) is None
    assert failure_class("server-args", {"ok": False, "error": "ValueError: no such option"}) == "rejected:ValueError"
    assert failure_class("server-args", {"ok": True}) is None and failure_class("smoke", None) is None
    error = "OSError: libcbor.so.0.10: cannot open shared object file: No such file or directory"
    assert system_library_gap(error, {"libc.so.6"}, {"libc.so.6", "libcbor.so.0.10"}) == \
        "libcbor.so.0.10: the donor's system has it, this host's has not"
    assert system_library_gap(error, {"libcbor.so.0.10"}, {"libcbor.so.0.10"}) is None
    assert system_library_gap(error, None, {"libcbor.so.0.10"}) is None  # unknown: no claim


def test_an_import_failing_on_another_loader_error_in_the_donor_is_not_shared():
    from transplant.verify.ladder import donor_shared_imports

    target = {"imports": [{"name": "fido", "ok": False, "error": "ImportError: libcbor.so.0.10: cannot open shared "
                                                                   "object file: No such file or directory"}]}
    donor = {"imports": [{"name": "fido", "ok": False, "error": "ImportError: dynamic module does not define module "
                                                                 "export function (PyInit__fido)"}]}
    assert donor_shared_imports(target, donor) == set()
    assert donor_shared_imports(target, target) == {"fido"}


def test_a_name_missing_from_both_venvs_is_never_what_the_donor_runs():
    from transplant.verify.ladder import donor_shared_imports

    missing = {"imports": [{"name": "no_such_module", "ok": False,
                            "error": "ModuleNotFoundError: No module named 'no_such_module'"},
                           {"name": "alpha.gone", "ok": False, "error": "ModuleNotFoundError: No module named 'alpha.gone'"},
                           {"name": "brokenpkg", "ok": False,
                            "error": "ModuleNotFoundError: No module named 'missing_dependency_xyz'"}]}
    assert donor_shared_imports(missing, missing) == {"brokenpkg"}  # only a dependency the donor lacks too
