"""The benchmark workload is what the benchmark says it is: the plan between its donor and
target copies exactly the files ``differing_files`` names (the baselines copy that list)."""

from __future__ import annotations

import json
import textwrap

from bench.real import plan_summary
from bench.workload import SITE, build_venv, differing_files, distributions
from transplant.cli.app import main


def test_workload_plan_moves_exactly_the_differing_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    scale = 0.002
    donor = build_venv(tmp_path / "donor", "donor", scale)
    target = build_venv(tmp_path / "target", "target", scale, common=donor)
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {donor}}}
        target: {{host: local, venv: {target}}}
        overlay: [torch, torchvision, triton, sgl-kernel, "nvidia-*"]
        """))
    assert main(["plan", "--detailed-exitcode", str(m), "--json"]) == 2
    out = capsys.readouterr().out
    plan = json.loads(out)
    copied = sorted(c["path"] for change in plan["changes"] for c in change["copy"])
    paths, total = differing_files(scale)
    removed = sum(len(change["remove"]) for change in plan["changes"])
    assert removed > 0  # the target's own dist-info files of the versions that go
    assert plan_summary(out + "maxrss 1 2\n") == f"{len(paths)} file(s) to copy, {removed} to remove; blocking: none"
    assert copied == sorted(f"{SITE}/{p}" for p in paths)
    assert total == sum(c["size"] for change in plan["changes"] for c in change["copy"]
                        if not c["path"].split("/")[-2].endswith(".dist-info"))
    assert len(distributions(1.0)) == 300 and sum(len(d.files) for d in distributions(1.0)) > 55000


def test_synthetic_shared_objects_are_real_elf(tmp_path):
    """The workload's shared objects are what transplant's own ELF reader (the elf_facts host
    script, run by the venv's interpreter) parses as on a real stack: sonames, DT_NEEDED,
    hundreds of undefined torch symbols that the torch libraries define, device code entries."""
    from elftools.elf.elffile import ELFFile

    from bench.elfgen import object_size
    from transplant.hosts.elf_facts import read_elf_facts
    from transplant.hosts.host import LocalHost

    scale = 0.002
    venv = build_venv(tmp_path / "donor", "donor", scale)
    cuda, c10, cpu = (f"{SITE}/torch/lib/{n}" for n in ("libtorch_cuda.so", "libc10.so", "libtorch_cpu.so"))
    ext, cublas = f"{SITE}/torchvision/_C.so", f"{SITE}/nvidia/cublas/lib/libcublas.so"
    report = read_elf_facts(LocalHost(), str(venv), [cuda, ext, cublas, c10], device_code=True)
    assert {rel: f.error for rel, f in report.files.items()} == dict.fromkeys((cuda, ext, cublas, c10))
    assert report.files[cuda].soname == "libtorch_cuda.so"
    assert report.files[ext].needed[:2] == ("libtorch_cpu.so", "libc10.so")
    kinds = {(d.kind, d.arch, d.variant) for d in report.files[cuda].device_code}
    assert {("sass", 90, "a"), ("sass", 120, ""), ("ptx", 120, "")} <= kinds
    assert report.files[cublas].device_code and not report.files[c10].device_code
    wanted = report.files[ext].torch_undefined
    assert len(wanted) > 500 and all(s.startswith(("_ZN3c10", "_ZN2at", "_ZN5torch", "_ZN6caffe2")) for s in wanted)
    found = read_elf_facts(LocalHost(), str(venv), [], torch_symbols=False, defined=([cpu, c10], list(wanted)))
    assert set(found.defined.values()) == {True}
    with open(venv / cpu, "rb") as handle:
        assert ELFFile(handle).get_section_by_name(".dynsym").num_symbols() > 9000
    with open(venv / cublas, "rb") as handle:
        verdef = ELFFile(handle).get_section_by_name(".gnu.version_d")
        assert ["libnvbench.so.13"] in [[a.name for a in aux] for _, aux in verdef.iter_versions()]
    sizes = {rel: size for d in distributions(scale) for rel, size in d.files}
    assert (venv / cuda).stat().st_size == object_size("torch/lib/libtorch_cuda.so", sizes["torch/lib/libtorch_cuda.so"])


def test_real_workload_skips_with_its_reason(tmp_path, capsys):
    from bench.real import MARKER, main as real_main, missing

    assert real_main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"real pair: skipped: no donor venv at {tmp_path / 'donor'} " \
                                      "(scripts/real-stacks installs the real pair)\n"
    for side in ("donor", "target"):
        (tmp_path / side / "bin").mkdir(parents=True)
        (tmp_path / side / "bin" / "python").write_text("")
    (tmp_path / "donor" / MARKER).write_text("")
    assert missing(tmp_path) == (f"the target venv at {tmp_path / 'target'} is incomplete "
                                 f"(no {MARKER}: its install did not finish)")
    (tmp_path / "target" / MARKER).write_text("")
    assert missing(tmp_path) is None  # the complete twin is measured


def test_real_apply_workload_skips_with_its_reason_and_reports_ratios_to_the_floor(tmp_path, capsys):
    from bench.realapply import main as realapply_main, report

    assert realapply_main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"real apply: skipped: no donor venv at {tmp_path / 'donor'} " \
                                      "(scripts/real-stacks installs the real pair)\n"
    section = report({"apply right after plan": (50.0, "prepare 1.0 s"), "tar floor": (20.0, "9 files")}, tmp_path)
    assert "| apply right after plan | 50.00 | 2.50 | prepare 1.0 s |" in section
    assert "| tar floor | 20.00 | 1.00 | 9 files |" in section


def test_identical_distributions_are_the_no_op_overlay(tmp_path):
    from bench.real import identical_distributions

    for side, record in (("donor", "a,,\n"), ("target", "a,,\n")):
        for name in ("rpds_py-2026.9.1", "torch-2.11.0"):
            info = tmp_path / side / "lib/python3.11/site-packages" / f"{name}.dist-info"
            info.mkdir(parents=True)
            (info / "RECORD").write_text(record if name != "torch-2.11.0" or side == "donor" else "b,,\n")
    info = tmp_path / "donor/lib/python3.11/site-packages/six-1.17.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("a,,\n")  # the target lacks it
    assert identical_distributions(tmp_path / "donor", tmp_path / "target") == ["rpds-py"]


def test_verify_summary_and_the_verify_rows_of_the_report(tmp_path):
    from bench.real import report, verify_summary
    from transplant.cli.render import verify_json
    from transplant.verify.judges import StageResult

    stages = [StageResult(name=name, status=status, reason="why", seconds=seconds, details={})
              for name, status, seconds in (("interpreter", "pass", 8.46), ("imports", "fail", 11.23),
                                            ("smoke", "skip", 0.0))]
    text = "noise before\n" + verify_json(stages, "local:/v")
    assert verify_summary(text) == "interpreter 8.5 s, imports 11.2 s FAILED"
    assert verify_summary("Traceback ...").startswith("(no verify document")
    section = report({"verify: target": (14.2, 2**30, 0, "interpreter 8.5 s"),
                      "verify: donor": (31.0, 2**30, 0, "imports 20.0 s")}, tmp_path)
    assert "| verify of the real target at most 15 s | 14.20 s | 15.00 s | yes |" in section
    assert "| verify of the real donor at most 15 s | 31.00 s | 15.00 s | no, by 2.07x |" in section
    assert "plan of the real pair" not in section  # not measured (--verify-only): no row
