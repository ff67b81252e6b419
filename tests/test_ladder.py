"""The verify ladder end to end in real venvs on this machine: gcc-built shared objects (a
missing soname, an undefined symbol, a same-soname library shadowing the venv's through
LD_LIBRARY_PATH or LD_PRELOAD), a real HTTP server for ``serve``, JIT cache folders, and
the command's JSON and JUnit reports read back."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest
from packaging.version import Version

from transplant.cli.app import main
from transplant.hosts.host import HostSpec
from transplant.hosts.connecting import connect
from transplant.lab.wheels import build_wheel, make_venv
from transplant.core.manifest import ServeCheck, VerifySettings
from transplant.hosts.probing import take_inventory
from transplant.reporting import RecordingReporter
from transplant.verify.runner import GROUP, run_stages

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"

LOADER = textwrap.dedent('''\
    """Loads its libbar.so, which needs libfoo.so.1 (found through RUNPATH $ORIGIN)."""
    import ctypes, os
    _lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libbar.so"))
    __version__ = "1.0"
    ''')

SERVER = textwrap.dedent('''\
    """A small real HTTP server standing in for a model server: reads the model folder's
    config.json, answers /health after a delay and /generate with max_new_tokens ids."""
    import http.server, json, os, sys, time
    port, model, mode, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    open(pidfile, "w").write(str(os.getpid()))
    config = json.load(open(os.path.join(model, "config.json")))
    assert os.path.getsize(os.path.join(model, "model.safetensors")) > 8
    if mode == "crash":
        sys.stderr.write("CUDA error: no kernel image is available\\n")
        sys.exit(3)
    ready = time.monotonic() + 0.5

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            healthy = time.monotonic() > ready and mode != "never"
            self._send(200 if healthy else 503, {"ok": healthy})

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = request["sampling_params"]["max_new_tokens"]
            ids = [(i * 7) % config["vocab_size"] for i in range(n)]
            if mode == "stream":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(1, n + 1):
                    self.wfile.write(("data: " + json.dumps({"output_ids": ids[:i]}) + "\\n\\n").encode())
                    self.wfile.flush()
                    time.sleep(0.2)
                self.wfile.write(b"data: [DONE]\\n\\n")
                return
            self._send(200, {"output_ids": ids if mode != "empty" else [], "meta_info": {}})

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    ''')


def _gcc(out: Path, name: str, source: str, *flags: str) -> Path:
    src = out / (name + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / name), str(src), *flags], check=True, cwd=out)
    return out / name


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Venvs ``good`` (fakecuda) and ``broken`` (fakecuda + brokenext), a folder ``outside`` with
    another libfoo.so.1, and the server script."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the test libraries (apt-get install gcc)")
    root = tmp_path_factory.mktemp("ladder")
    lib = root / "lib"
    lib.mkdir()
    foo = _gcc(lib, "libfoo.so.1", "int foo(void) { return 42; }\n", "-Wl,-soname,libfoo.so.1")
    bar = _gcc(lib, "libbar.so", "int foo(void);\nint bar(void) { return foo() + 1; }\n", "-L.", "-l:libfoo.so.1",
               "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
    undef = _gcc(lib, "libundef.so", "void nowhere_symbol(void);\nvoid call_it(void) { nowhere_symbol(); }\n")
    _gcc(lib, "libmissing.so.7", "int foo(void) { return 1; }\n", "-Wl,-soname,libmissing.so.7")
    needs = _gcc(lib, "libneeds.so", "int foo(void);\nint f(void) { return foo(); }\n", "-L.", "-l:libmissing.so.7")
    outside = root / "outside"
    outside.mkdir()
    _gcc(outside, "libfoo.so.1", "int foo(void) { return 7; }\n", "-Wl,-soname,libfoo.so.1")
    wheels = root / "wheels"
    tag = "cp311-cp311-linux_x86_64"
    fake = build_wheel(wheels, "fakecuda", "1.0", {"fakecuda/__init__.py": LOADER,
                                                  "fakecuda/lib/libfoo.so.1": foo.read_bytes(),
                                                  "fakecuda/lib/libbar.so": bar.read_bytes()}, tag=tag)
    # brokenext's RECORD lists libmissing.so.7, whose file is removed below: a library the venv
    # ships, absent (a host library nothing ships would be an optional plugin's, a warning)
    broken = build_wheel(wheels, "brokenext", "1.0", {"brokenext/__init__.py": "__version__ = '1.0'\n",
                                                      "brokenext/libneeds.so": needs.read_bytes(),
                                                      "brokenext/elsewhere/libmissing.so.7": b"removed",
                                                      "brokenext/libundef.so": undef.read_bytes()}, tag=tag)
    good_venv = make_venv(root / "good", [fake])
    broken_venv = make_venv(root / "broken", [fake, broken])
    (broken_venv / SITE / "brokenext" / "elsewhere" / "libmissing.so.7").unlink()
    for venv in (good_venv, broken_venv):  # pip --target does not keep the execute bit
        for so in (venv / SITE).rglob("*.so*"):
            so.chmod(0o755)
    server = root / "server.py"
    server.write_text(SERVER)
    empty = root / "empty"
    empty.mkdir()
    return {"root": root, "good": str(good_venv), "broken": str(broken_venv), "outside": outside, "server": server,
            "empty": empty}


@pytest.fixture
def local():
    with connect(HostSpec.parse("local")) as host:
        yield host


def _env(built, tmp_path, **extra):
    """A stage environment with LD_LIBRARY_PATH set explicitly (set-but-empty here would mean
    the current folder) and the JIT cache folders inside tmp_path."""
    return {"LD_LIBRARY_PATH": str(built["empty"]), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
            "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
            **extra}


def _by_name(results):
    return {r.name: r for r in results}


def test_sound_venv_passes_each_stage_and_skips_what_has_no_settings(built, local, tmp_path):
    settings = VerifySettings(overlay=("fakecuda",), env=_env(built, tmp_path), timeout=120)
    recorded = RecordingReporter()
    results = run_stages(settings, target=local, venv=built["good"], reporter=recorded)
    seen = recorded.steps()
    by = _by_name(results)
    assert [r.name for r in results] == ["interpreter", "imports", "native-load", "library-provenance", "requirements",
                                         "server-args", "smoke", "serve", "jit-caches"]
    # the independent stages overlap, so their steps come in the order they start: each once, between
    # interpreter and smoke (jit-caches only looks here, so it is one of them)
    assert seen[0] == "interpreter" and seen[-2:] == ["smoke", "serve"]
    assert sorted(seen[1:-2]) == sorted(GROUP)
    done = [e[1:] for e in recorded.events if e[0] == "progress"]
    assert [d for d, _ in done] == sorted(d for d, _ in done) and done[-1] == (len(results), len(results))
    assert by["interpreter"].status == "pass" and "no donor interpreter to compare with" in by["interpreter"].reason
    # the import name comes from fakecuda's RECORD (the wheel has no top_level.txt)
    assert by["imports"].reason == "1 import: fakecuda 1.0"
    assert by["imports"].details["imports"][0]["file"] == f"{built['good']}/{SITE}/fakecuda/__init__.py"
    assert by["native-load"].reason == "2 of 2 shared objects load (RTLD_NOW)"
    assert by["library-provenance"].status == "pass"
    mapped = by["library-provenance"].details["mapped"]
    assert f"{built['good']}/{SITE}/fakecuda/lib/libfoo.so.1" in mapped
    for name in ("server-args", "smoke", "serve"):
        assert by[name].status == "skip" and by[name].reason == f"no verify.{name.replace('-', '_')} in the manifest"
    assert by["jit-caches"].status == "pass" and by["jit-caches"].reason.startswith("no JIT cache folders exist")
    assert all(r.seconds >= 0 for r in results)


def test_skip_imports_leaves_a_derived_name_out_and_says_why(built, local, tmp_path):
    settings = VerifySettings(overlay=("brokenext", "fakecuda"), env=_env(built, tmp_path), timeout=120,
                              skip_imports={"fakecuda": "not meant to import here"})
    by = _by_name(run_stages(settings, target=local, venv=built["broken"]))
    assert by["imports"].reason == "1 import: brokenext 1.0; skipped fakecuda (verify.skip_imports: not meant to import here)"
    assert by["library-provenance"].details["imported"] == [{"name": "brokenext", "ok": True, "error": None}]


def test_native_load_names_the_missing_soname_and_the_undefined_symbol(built, local, tmp_path):
    settings = VerifySettings(overlay=("brokenext", "fakecuda"), env=_env(built, tmp_path), timeout=120)
    native = _by_name(run_stages(settings, target=local, venv=built["broken"]))["native-load"]
    assert native.status == "fail"
    assert native.reason == (f"2 of 4 shared objects do not load: {SITE}/brokenext/libneeds.so: missing libmissing.so.7; "
                             f"{SITE}/brokenext/libundef.so: undefined symbol nowhere_symbol")
    errors = {Path(lib["path"]).name: lib["error"] for lib in native.details["libraries"]}
    assert "libmissing.so.7: cannot open shared object file" in errors["libneeds.so"]
    assert errors["libbar.so"] is None


@pytest.mark.parametrize("how", ["LD_LIBRARY_PATH", "LD_PRELOAD"])
def test_library_provenance_fails_when_an_outside_copy_shadows_the_venvs(built, local, tmp_path, how):
    outside = built["outside"]
    extra = {"LD_LIBRARY_PATH": str(outside)} if how == "LD_LIBRARY_PATH" else {"LD_PRELOAD": str(outside / "libfoo.so.1")}
    settings = VerifySettings(overlay=("fakecuda",), env=_env(built, tmp_path, **extra), timeout=120)
    by = _by_name(run_stages(settings, target=local, venv=built["good"]))
    assert by["imports"].status == "pass", "the import works either way: only provenance sees the wrong library"
    stage = by["library-provenance"]
    assert stage.status == "fail"
    venv_copy = f"{built['good']}/{SITE}/fakecuda/lib/libfoo.so.1"
    why = (f"LD_LIBRARY_PATH lists {outside}, searched before the venv's RUNPATH" if how == "LD_LIBRARY_PATH"
           else "LD_PRELOAD names it")
    assert stage.reason == (f"1 library from outside the venv: libfoo.so.1 mapped from {outside}/libfoo.so.1 instead "
                            f"of the venv's {venv_copy}: {why}")
    assert stage.details["conflicts"] == [{"library": "libfoo.so.1", "mapped": f"{outside}/libfoo.so.1",
                                           "venv_copy": venv_copy, "why": why}]


def test_interpreter_fails_against_another_donor_python_and_a_missing_home(built, local, tmp_path):
    live = take_inventory(local, built["good"])
    other = dataclasses.replace(live, interpreter=dataclasses.replace(live.interpreter, version=Version("3.12.4")))
    settings = VerifySettings(env=_env(built, tmp_path), timeout=120)
    # another CPython minor: nothing in this venv is built for another Python's ABI (pure-Python
    # distributions move between minors), so the interpreter stands
    minor = run_stages(settings, target=local, venv=built["good"], donor_inventory=lambda: other)[0]
    assert minor.status == "pass" and "the donor runs 3.12.4, another minor" in minor.reason
    pypy = dataclasses.replace(other, interpreter=dataclasses.replace(other.interpreter, implementation="pypy"))
    stage = run_stages(settings, target=local, venv=built["good"], donor_inventory=lambda: pypy)[0]
    assert stage.status == "fail"
    assert stage.reason.endswith("but the donor runs pypy 3.12.4: extension modules built for 3.12 do not load in 3.11")
    same = run_stages(settings, target=local, venv=built["good"], donor_inventory=lambda: live)[0]
    assert same.status == "pass" and same.reason.endswith(f"matches the donor's {live.interpreter.version}")
    wrong = dataclasses.replace(settings, python="3.9")
    assert run_stages(wrong, target=local, venv=built["good"])[0].reason.endswith(
        "but the manifest expects Python 3.9 (verify.python)")
    copy = tmp_path / "moved"
    shutil.copytree(built["good"], copy, symlinks=True)
    cfg = copy / "pyvenv.cfg"
    cfg.write_text("".join("home = /nonexistent/bin\n" if line.startswith("home") else line
                           for line in cfg.read_text().splitlines(True)))
    broken = run_stages(settings, target=local, venv=str(copy))[0]
    assert broken.status == "fail" and "/nonexistent/bin" in broken.reason


def _serve_settings(built, tmp_path, mode, **changes):
    pidfile = tmp_path / f"server-{mode}.pid"
    serve = ServeCheck(command=("{python}", str(built["server"]), "{port}", "{model}", mode, str(pidfile)),
                       timeout=changes.pop("timeout", 60))
    return VerifySettings(serve=serve, env=_env(built, tmp_path), timeout=60), pidfile


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_serve_starts_asks_and_stops_a_real_server(built, local, tmp_path):
    settings, pidfile = _serve_settings(built, tmp_path, "ok")
    serve = _by_name(run_stages(settings, target=local, venv=built["good"]))["serve"]
    assert serve.status == "pass", serve.reason
    assert serve.reason.startswith("started in ") and "; answer after " in serve.reason
    assert "output_ids: 4 items; server stopped by SIGTERM" in serve.reason
    details = serve.details
    assert details["answer"]["output_ids"] == [0, 7, 14, 21]
    assert details["startup_seconds"] >= 0.5, "the server answers /health only after half a second"
    assert details["first_token_seconds"] > 0
    assert _gone(int(pidfile.read_text())), "the server's process group was stopped"
    assert not Path(details["model"]).exists(), "the tiny model folder is removed"
    assert list((Path(built["good"]) / ".transplant").iterdir()) == []


def test_serve_streamed_answer_times_the_first_token(built, local, tmp_path):
    settings, _ = _serve_settings(built, tmp_path, "stream")
    settings = dataclasses.replace(settings, serve=dataclasses.replace(
        settings.serve, body={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}, "stream": True}))
    serve = _by_name(run_stages(settings, target=local, venv=built["good"]))["serve"]
    assert serve.status == "pass", serve.reason
    assert "; streamed first token after " in serve.reason and "output_ids: 4 items" in serve.reason
    details = serve.details
    assert details["streamed"] is True and details["answer"] == {"output_ids": [0, 7, 14, 21]}
    assert details["request_seconds"] - details["first_token_seconds"] >= 0.5, "three more events, 0.2 s apart"


def test_a_stage_past_its_timeout_fails_and_says_so(built, local, tmp_path):
    (tmp_path / "slowpoke.py").write_text("import time\ntime.sleep(60)\n")
    settings = VerifySettings(imports=("slowpoke",), env=_env(built, tmp_path, PYTHONPATH=str(tmp_path)), timeout=3)
    imports = _by_name(run_stages(settings, target=local, venv=built["good"]))["imports"]
    assert imports.status == "fail" and 3 <= imports.seconds < 30
    assert imports.reason == ("ran past its timeout of 3 s and was stopped; give it longer with verify.timeout "
                              "(verify.serve.timeout for serve)")


@pytest.mark.parametrize("mode,expected", [
    ("crash", "the server exited with code 3 before http://127.0.0.1:{port}/health answered; its log ends: "
              "CUDA error: no kernel image is available"),
    ("empty", "the answer's output_ids is [], expected a non-empty string or list; server stopped by SIGTERM"),
    ("never", "http://127.0.0.1:{port}/health did not answer 200 within"),
])
def test_serve_failures_say_what_went_wrong(built, local, tmp_path, mode, expected):
    settings, pidfile = _serve_settings(built, tmp_path, mode, timeout=4)
    serve = _by_name(run_stages(settings, target=local, venv=built["good"]))["serve"]
    assert serve.status == "fail"
    assert serve.reason.startswith(expected.format(port=serve.details["port"])), serve.reason
    assert _gone(int(pidfile.read_text()))


def test_cli_without_manifest_writes_json_and_junit(built, tmp_path, monkeypatch, capsys):
    for key, value in _env(built, tmp_path).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "triton" / "ab12").mkdir(parents=True)
    (tmp_path / "triton" / "ab12" / "k.json").write_text(json.dumps({"name": "k", "triton_version": "3.1.0"}))
    (tmp_path / "fi" / ".cache" / "flashinfer" / "0.6.3" / "90").mkdir(parents=True)
    junit = tmp_path / "verify.xml"
    code = main(["verify", f"local:{built['broken']}", "--imports", "brokenext,fakecuda", "--json", "--junit", str(junit)])
    assert code == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "transplant.verify/3" and doc["ok"] is False
    assert doc["verdict"].startswith("verify failed: ") and doc["strict"] is False
    stages = {s["name"]: s for s in doc["stages"]}
    assert stages["native-load"]["status"] == "fail" and stages["imports"]["status"] == "pass", stages["native-load"]
    assert doc["counts"] == {s: sum(x["status"] == s for x in doc["stages"]) for s in ("pass", "fail", "skip")}
    jit = stages["jit-caches"]
    # neither library is installed in that venv: the user-wide folders are named, never pointed at for removal
    assert "built for triton 3.1.0; triton is not installed in this venv" in jit["reason"]
    assert "built for flashinfer 0.6.3; flashinfer is not installed in this venv" in jit["reason"]
    assert "warning" not in jit["reason"] and "removes it" not in jit["reason"]
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == [s["name"] for s in doc["stages"]]
    assert suite.get("failures") == str(doc["counts"]["fail"]) and suite.get("skipped") == str(doc["counts"]["skip"])
    for name, stage in stages.items():
        failure, skipped = cases[name].find("failure"), cases[name].find("skipped")
        assert (failure is not None) == (stage["status"] == "fail")
        assert (skipped is not None) == (stage["status"] == "skip")
        assert cases[name].find("system-out").text == stage["reason"]
    assert cases["native-load"].find("failure").get("message") == stages["native-load"]["reason"]


def test_clear_jit_caches_alone_lists_the_user_wide_folders_and_removes_nothing(built, tmp_path, monkeypatch,
                                                                                 capsys):
    # the cache folders are the user's (outside the target venv): removing them takes their names
    for key, value in _env(built, tmp_path, HOME=str(tmp_path / "home")).items():
        monkeypatch.setenv(key, value)
    for folder in ("triton/x", "inductor/y"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "f").write_text("x")
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--clear-jit-caches"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"--clear-jit-caches removed nothing; not removed, outside the target venv (the user's, shared by its "
            f"other venvs): triton {tmp_path}/triton (1 file, 1 B), torch-inductor {tmp_path}/inductor (1 file, 1 B); "
            f"to remove them: transplant verify local:{built['good']} --imports fakecuda "
            f"--clear-jit-caches=triton,torch-inductor; nothing else was touched") in out
    assert (tmp_path / "triton" / "x" / "f").read_text() == "x" and (tmp_path / "inductor" / "y" / "f").read_text() == "x"
    # naming one removes that one only
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--clear-jit-caches=triton"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"--clear-jit-caches removed {tmp_path}/triton; not removed, outside the target venv" in out
    assert not (tmp_path / "triton").exists() and (tmp_path / "inductor" / "y" / "f").read_text() == "x"
    # an empty cache folder is listed as empty, with no option to remove it
    (tmp_path / "inductor" / "y" / "f").unlink()
    (tmp_path / "inductor" / "y").rmdir()
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--clear-jit-caches"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"--clear-jit-caches removed nothing; empty, nothing to remove: torch-inductor {tmp_path}/inductor; "
            f"nothing else was touched") in out, out
    assert "to remove" not in out.replace("nothing to remove", "") and (tmp_path / "inductor").is_dir()


def test_bare_clear_jit_caches_before_the_venv_leaves_the_venv_positional(built, tmp_path, monkeypatch, capsys):
    # argparse's optional value would take the next word (the venv) as cache names: the bare
    # option lists, and the word after it stays the MANIFEST|HOST:VENV argument
    for key, value in _env(built, tmp_path, HOME=str(tmp_path / "home")).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "triton" / "x").mkdir(parents=True)
    (tmp_path / "triton" / "x" / "f").write_text("x")
    assert main(["verify", "--clear-jit-caches", f"local:{built['good']}", "--imports", "fakecuda"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--clear-jit-caches removed nothing; not removed, outside the target venv" in out
    assert (tmp_path / "triton" / "x" / "f").read_text() == "x"


def test_clear_jit_caches_names_must_be_caches(built, capsys):
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--clear-jit-caches=triton,home"]) == 64
    assert "--clear-jit-caches: 'home' is not a JIT cache" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("names", ["flashinfer,bogus,all", "all,bogus"])
def test_clear_jit_caches_refuses_an_unknown_name_beside_all(built, tmp_path, monkeypatch, capsys, names):
    """A misspelt name beside ``all`` is refused like one alone, and nothing is removed (it was
    ignored and every cache removed)."""
    for key, value in _env(built, tmp_path, HOME=str(tmp_path / "home")).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "triton" / "x").mkdir(parents=True)
    (tmp_path / "triton" / "x" / "f").write_text("x")
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", f"--clear-jit-caches={names}"]) == 64
    assert "--clear-jit-caches: 'bogus' is not a JIT cache" in " ".join(capsys.readouterr().out.split())
    assert (tmp_path / "triton" / "x" / "f").read_text() == "x"


def test_clear_jit_caches_removes_only_those_folders(built, tmp_path, monkeypatch, capsys):
    for key, value in _env(built, tmp_path).items():
        monkeypatch.setenv(key, value)
    for folder in ("triton/x", "fi/.cache/flashinfer/0.6.3", "inductor/y"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "f").write_text("x")
    (tmp_path / "fi" / "keep.txt").write_text("not a cache")
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--clear-jit-caches=all"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"--clear-jit-caches removed {tmp_path}/triton, {tmp_path}/fi/.cache/flashinfer, {tmp_path}/inductor; "
            f"nothing else was touched") in out
    assert not (tmp_path / "triton").exists() and not (tmp_path / "inductor").exists()
    assert not (tmp_path / "fi" / ".cache" / "flashinfer").exists()
    assert (tmp_path / "fi" / "keep.txt").read_text() == "not a cache"
    assert "verify passed" in out


def test_bad_imports_option_is_a_clear_error(built, capsys):
    assert main(["verify", f"local:{built['good']}", "--imports", "torch,no-dash"]) == 1
    out = capsys.readouterr().out
    assert "--imports: 'no-dash' is not an import name" in out and "hint:" in out


def test_gpu_check_script_runs_the_ladder_and_fails_without_a_gpu(built, tmp_path):
    """scripts/gpu-check is for a CUDA machine; here it must still run every stage and fail smoke."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, COLUMNS="400", **_env(built, tmp_path))
    done = subprocess.run([sys.executable, str(root / "scripts" / "gpu_check.py"), built["good"], "--timeout", "120",
                           "--json", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=600, env=env)
    out = " ".join(done.stdout.split())
    assert done.returncode == 3, out[-3000:]
    doc = json.loads((tmp_path / "g.json").read_text())
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == ["interpreter", "imports", "native-load", "library-provenance", "requirements", "server-args",
                            "smoke", "serve", "jit-caches"]
    assert stages["smoke"]["status"] == "fail" and stages["smoke"]["reason"].startswith("torch is not installed")
    assert stages["server-args"]["status"] == "skip" and stages["serve"]["status"] == "skip"
    assert "checked: python 3.11" in out and "sglang absent" in out


def test_clear_jit_caches_refuses_a_symlinked_cache_and_says_so(built, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep")
    (tmp_path / "triton").symlink_to(elsewhere)
    for key, value in _env(built, tmp_path).items():
        monkeypatch.setenv(key, value)
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--clear-jit-caches=triton"]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"--clear-jit-caches removed nothing; left in place: {tmp_path}/triton (not removed: a symlink" in out
    assert (elsewhere / "precious.txt").read_text() == "keep"


def test_verify_without_manifest_or_imports_is_a_clear_error(tmp_path, capsys):
    # before this, it "passed" with every overlay stage skipped: nothing had been checked
    assert main(["verify", f"local:{tmp_path}/venv"]) == 64  # a usage mistake
    out = " ".join(capsys.readouterr().out.split())
    assert "without a manifest, --imports must name what to check" in out and "--imports torch,sglang" in out


def test_junit_that_cannot_be_written_is_a_clear_error(built, tmp_path, monkeypatch, capsys):
    for key, value in _env(built, tmp_path).items():
        monkeypatch.setenv(key, value)
    target = "/proc/transplant-verify.xml"  # an existing folder no one can create files in, root included
    assert main(["verify", f"local:{built['good']}", "--imports", "fakecuda", "--junit", target]) == 1
    out = " ".join(capsys.readouterr().out.split())
    # refused before any stage runs, naming the folder where no file can be made
    assert f"--junit {target}: no file can be written in the folder /proc" in out and "Traceback" not in out


DRIVER_LOADER = textwrap.dedent('''\
    """Loads its libdrv.so, which needs the NVIDIA driver's libcuda.so.1."""
    import ctypes, os
    _lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libdrv.so"))
    __version__ = "1.0"
    ''')


def _driver_present() -> bool:
    import ctypes.util

    return os.path.exists("/dev/nvidiactl") or ctypes.util.find_library("cuda") is not None


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """A venv with the kinds of objects every real install has that do not load on every host:
    ``hostplug`` (an optional plugin needing a host library nothing ships, and an AArch64 copy
    of a library), ``needsdriver`` (a package whose library needs libcuda.so.1), ``fakearrow``
    (an extension module named like the standard library's ``_csv``; importing csv and json)
    and ``cudaneed`` (needing a host library and, after it, the CUDA runtime no wheel here ships)."""
    import importlib.machinery

    root = tmp_path_factory.mktemp("plugins")
    stubs = root / "stubs"  # link-time stand-ins, never installed
    stubs.mkdir()
    for soname, fn in (("libnothere_host.so.1", "host_fn"), ("libcudart.so.12", "cudart_fn"), ("libcuda.so.1", "cu_fn")):
        _gcc(stubs, soname, f"int {fn}(void) {{ return 1; }}\n", f"-Wl,-soname,{soname}")
    lib = root / "lib"
    lib.mkdir()
    flags = ("-Wl,--no-as-needed", f"-L{stubs}")
    plug = _gcc(lib, "libplug.so", "int host_fn(void);\nint plug(void) { return host_fn(); }\n", *flags,
                "-l:libnothere_host.so.1")
    both = _gcc(lib, "libboth.so", "int host_fn(void); int cudart_fn(void);\nint both(void) { return host_fn() + "
                "cudart_fn(); }\n", *flags, "-l:libnothere_host.so.1", "-l:libcudart.so.12")
    drv = _gcc(lib, "libdrv.so", "int cu_fn(void);\nint drv(void) { return cu_fn(); }\n", *flags, "-l:libcuda.so.1")
    plain = _gcc(lib, "libplain.so", "int plain(void) { return 3; }\n")
    arm = bytearray(plain.read_bytes())
    assert arm[:4] == b"\x7fELF" and arm[5] == 1, "a little-endian ELF object"
    arm[18:20] = (183).to_bytes(2, "little")  # e_machine EM_AARCH64
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so
    assert suffix.startswith(".cpython-")
    wheels = root / "wheels"
    tag = "cp311-cp311-linux_x86_64"
    made = [build_wheel(wheels, "hostplug", "1.0", {"hostplug/__init__.py": "__version__ = '1.0'\n",
                                                     "hostplug/libplug.so": plug.read_bytes(),
                                                     "hostplug/libplain.so": plain.read_bytes(),
                                                     "hostplug/stubs/aarch64-unknown-linux-gnu/libplain.so": bytes(arm)},
                        tag=tag),
            build_wheel(wheels, "needsdriver", "1.0", {"needsdriver/__init__.py": DRIVER_LOADER,
                                                        "needsdriver/libdrv.so": drv.read_bytes()}, tag=tag),
            build_wheel(wheels, "fakearrow", "1.0", {"fakearrow/__init__.py": "import csv, json\n__version__ = '1.0'\n",
                                                      f"fakearrow/_csv{suffix}": plain.read_bytes(),
                                                      f"fakearrow/_json{suffix}": plain.read_bytes()}, tag=tag),
            build_wheel(wheels, "cudaneed", "1.0", {"cudaneed/__init__.py": "__version__ = '1.0'\n",
                                                     "cudaneed/libboth.so": both.read_bytes()}, tag=tag)]
    venv = make_venv(root / "venv", made)
    for so in (venv / SITE).rglob("*.so*"):
        so.chmod(0o755)
    empty = root / "empty"
    empty.mkdir()
    return {"venv": str(venv), "empty": empty, "suffix": suffix}


@pytest.fixture(scope="module")
def plugin_stages(plugins, tmp_path_factory):
    """The ladder's results on the plugins venv, overlay fakearrow, hostplug and needsdriver (run once)."""
    if _driver_present():
        pytest.skip("this host has the NVIDIA driver: libcuda.so.1 would load")
    settings = VerifySettings(overlay=("fakearrow", "hostplug", "needsdriver"),
                              env=_env(plugins, tmp_path_factory.mktemp("plugin-stages")), timeout=120)
    with connect(HostSpec.parse("local")) as host:
        return _by_name(run_stages(settings, target=host, venv=plugins["venv"]))


def test_an_import_needing_the_driver_is_not_checkable_on_a_driverless_host(plugin_stages):
    imports = plugin_stages["imports"]
    assert (imports.status, imports.reason) == (
        "pass", "2 of 3 imports: fakearrow 1.0, hostplug 1.0; not checkable here: needsdriver (needs libcuda.so.1), "
                "the NVIDIA driver's library, absent on this host")


def test_optional_plugins_warn_and_foreign_machine_objects_are_skipped(plugin_stages):
    native = plugin_stages["native-load"]
    assert native.status == "pass", native.reason
    assert native.reason == (
        f"3 of 6 shared objects load (RTLD_NOW); skipped 1 built for another machine than this interpreter's "
        f"(1 for aarch64; e.g. {SITE}/hostplug/stubs/aarch64-unknown-linux-gnu/libplain.so): not loadable here by "
        f"construction; 1 needs the NVIDIA driver's libraries, absent on this host (e.g. {SITE}/needsdriver/libdrv.so): "
        f"not checkable here; warning: 1 needs host libraries that no distribution of the venv ships, absent here "
        f"(optional plugins; objects needing each: libnothere_host.so.1 (1); e.g. {SITE}/hostplug/libplug.so)")
    arm = next(lib for lib in native.details["libraries"] if "aarch64" in lib["path"])
    assert arm["error"] is None and arm["skipped"].startswith("built for aarch64 (e_machine 183, 64-bit)")


def test_standard_library_extension_modules_do_not_shadow_a_venv_module_of_the_same_name(plugins, plugin_stages):
    provenance = plugin_stages["library-provenance"]
    assert provenance.status == "pass", provenance.reason
    stdlib_csv = [m for m in provenance.details["mapped"] if m.endswith("/_csv" + plugins["suffix"])]
    assert stdlib_csv and not stdlib_csv[0].startswith(plugins["venv"]), "the standard library's _csv was mapped"
    assert stdlib_csv[0] in provenance.details["extension_modules"]


def test_a_missing_cuda_runtime_behind_a_host_library_still_fails(plugins, local, tmp_path):
    settings = VerifySettings(overlay=("cudaneed", "hostplug"), env=_env(plugins, tmp_path), timeout=120)
    native = _by_name(run_stages(settings, target=local, venv=plugins["venv"]))["native-load"]
    assert native.status == "fail"
    assert native.reason.startswith(f"1 of 4 shared objects does not load: {SITE}/cudaneed/libboth.so: missing "
                                    f"libcudart.so.12;")
    both = next(lib for lib in native.details["libraries"] if lib["path"].endswith("libboth.so"))
    assert "libnothere_host.so.1: cannot open shared object file" in both["error"], "dlopen names the host one first"
    assert both["missing"] == ["libcudart.so.12", "libnothere_host.so.1"]


@pytest.mark.parametrize("words", [["triton"], ["triton,torch-inductor"], ["all"]])
def test_clear_jit_caches_names_after_a_space_say_to_write_them_with_equals(words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["verify", "--clear-jit-caches", *words, "local:/nonexistent/venv", "--imports", "x"])
    assert info.value.code == 64
    err = " ".join(capsys.readouterr().err.split())
    assert f"--clear-jit-caches takes its cache names after '=' (without it, it lists them and removes nothing): " \
           f"write --clear-jit-caches={words[0]}" in err, err
    # the twin: a manifest file that happens to be named like a cache is the manifest argument
    (tmp_path / words[0]).write_text("version: 1\n")
    assert main(["verify", "--clear-jit-caches", words[0]]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{words[0]}: " in out and "takes its cache names" not in out, out
    # ...but with another positional after it (the venv), that file is not what was meant
    with pytest.raises(SystemExit) as info:
        main(["verify", "--clear-jit-caches", *words, "local:/nonexistent/venv", "--imports", "x"])
    assert info.value.code == 64
    assert f"write --clear-jit-caches={words[0]}" in " ".join(capsys.readouterr().err.split())


def test_clear_jit_caches_with_a_spaced_word_that_is_no_cache_names_it_and_the_caches(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["verify", "--clear-jit-caches", "bogus", "local:/nonexistent/venv", "--imports", "x"])
    assert info.value.code == 64
    err = " ".join(capsys.readouterr().err.split())
    assert "--clear-jit-caches: 'bogus' is not a JIT cache; the caches are triton, flashinfer, torch-inductor (or all)" \
        in err and "unrecognized arguments" not in err, err
    # the twin: a manifest named after the bare option, with an option's value after it, is the manifest
    (tmp_path / "manifest").write_text("version: 1\n")
    assert main(["verify", "--clear-jit-caches", "manifest", "--imports", "x"]) == 1
    captured = capsys.readouterr()
    assert "not a JIT cache" not in captured.err + captured.out and "manifest: " in " ".join(captured.out.split())
    # and another stray argument, with no cache word, keeps argparse's own error
    with pytest.raises(SystemExit):
        main(["verify", "local:/nonexistent/venv", "extra", "--imports", "x"])
    assert "unrecognized arguments: extra" in capsys.readouterr().err


def test_native_load_without_a_distribution_to_check_says_so(built, tmp_path, monkeypatch, capsys):
    """An import of no installed distribution: native-load skips naming why, not a list "(none)"."""
    for key, value in _env(built, tmp_path).items():
        monkeypatch.setenv(key, value)
    assert main(["verify", f"local:{built['good']}", "--imports", "nosuchmod", "--json"]) == 3
    stages = {s["name"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
    assert stages["imports"]["status"] == "fail"
    assert stages["native-load"]["status"] == "skip"
    assert stages["native-load"]["reason"] == "no distribution to check: the imports named none the venv has installed"
