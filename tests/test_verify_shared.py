"""One interpreter imports torch for imports, library-provenance and native-load, in real venvs.

The venv's ``torch`` is a real distribution whose import notes the importing process in a
folder (``IMPORTED_DIR``): the count of notes is how many interpreters imported it, proven
without timing. native-load's loader is forked from the imports process once that process has
imported torch and nothing else, so it still loads each shared object in a process that has
imported only its preload, and its verdicts are those of a loader of its own: the twins below
(a broken import, a dying imports process, a shared object whose constructor aborts) each
still report their own stage's verdict and message.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from transplant.core.manifest import VerifySettings
from transplant.hosts.host import LocalHost
from transplant.lab.wheels import build_wheel, make_venv
from transplant.verify.runner import run_stages

TAG = "cp311-cp311-linux_x86_64"

#: The venv's torch: notes each importing process, and loads its library by path, as torch does.
TORCH = textwrap.dedent('''\
    import ctypes, os
    _dir = os.environ.get("IMPORTED_DIR")
    if _dir:
        open(os.path.join(_dir, "torch-%d" % os.getpid()), "w").close()
    ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libc10.so"), mode=os.RTLD_GLOBAL)
    __version__ = "2.9.1"
    ''')


def _gcc(out: Path, name: str, source: str, *flags: str) -> Path:
    src = out / (name + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / name), str(src), *flags], check=True, cwd=out)
    return out / name


@pytest.fixture(scope="module")
def venvs(tmp_path_factory) -> dict[str, str]:
    """``good``: torch (libc10.so) and ext (libext.so, which names libc10.so without a path, as
    extensions built against torch do); ``aborts``: the same plus ``libboom.so``, whose
    constructor aborts; ``broken``: ext's import raises; ``dies``: importing ext ends the process."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the test libraries (apt-get install gcc)")
    root = tmp_path_factory.mktemp("shared")
    lib = root / "lib"
    lib.mkdir()
    c10 = _gcc(lib, "libc10.so", "int c10_answer(void) { return 42; }\n", "-Wl,-soname,libc10.so")
    ext = _gcc(lib, "libext.so", "int c10_answer(void);\nint ext(void) { return c10_answer() + 1; }\n",
               "-L.", "-l:libc10.so")
    boom = _gcc(lib, "libboom.so", "#include <stdlib.h>\n__attribute__((constructor)) static void boom(void) "
                                   "{ abort(); }\n")
    wheels = root / "wheels"
    torch = build_wheel(wheels, "torch", "2.9.1", {"torch/__init__.py": TORCH,
                                                  "torch/lib/libc10.so": c10.read_bytes()}, tag=TAG)

    def ext_wheel(name: str, init: str, extra: dict | None = None) -> Path:
        return build_wheel(wheels / name, "ext", "1.0", {"ext/__init__.py": init, "ext/libext.so": ext.read_bytes(),
                                                         **(extra or {})}, tag=TAG)

    good = ext_wheel("good", "import torch\n__version__ = '1.0'\n")
    aborts = ext_wheel("aborts", "import torch\n__version__ = '1.0'\n", {"ext/libboom.so": boom.read_bytes()})
    broken = ext_wheel("broken", "raise ImportError('ext is broken on purpose')\n")
    dies = ext_wheel("dies", "import os\nos._exit(7)\n")
    out = {}
    for name, wheel in (("good", good), ("aborts", aborts), ("broken", broken), ("dies", dies)):
        venv = make_venv(root / name, [torch, wheel])
        for so in venv.rglob("*.so"):  # pip --target does not keep the execute bit
            so.chmod(0o755)
        out[name] = str(venv)
    return out


def _settings(tmp_path: Path, **changes) -> VerifySettings:
    imported = tmp_path / "imported"
    imported.mkdir()
    env = {"IMPORTED_DIR": str(imported), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    return VerifySettings(imports=("torch", "ext"), env=env, timeout=120, **changes)


def _torch_imports(tmp_path: Path) -> int:
    """How many interpreters imported torch."""
    return len(list((tmp_path / "imported").glob("torch-*")))


def _by_name(results):
    return {r.name: r for r in results}


@pytest.mark.parametrize("overlay", [(), ("torch", "ext")], ids=["early", "after-the-inventory"])
def test_one_interpreter_imports_torch_for_three_stages(venvs, tmp_path, overlay):
    """Without an overlay the imports process starts beside the inventory and gets the shared
    objects later; with one it starts after it with both: either way torch is imported once."""
    by = _by_name(run_stages(_settings(tmp_path, overlay=overlay), target=LocalHost(), venv=venvs["good"]))
    assert by["imports"].status == "pass" and by["imports"].reason == "2 imports: torch 2.9.1, ext 1.0"
    assert by["native-load"].status == "pass", by["native-load"].reason
    assert by["native-load"].reason == "2 of 2 shared objects load (RTLD_NOW)"
    assert by["native-load"].details["preload"] == [{"name": "torch", "ok": True, "error": None}]
    assert by["library-provenance"].status == "pass", by["library-provenance"].reason
    assert _torch_imports(tmp_path) == 1, "imports, library-provenance and native-load shared one torch import"


def test_one_at_a_time_the_stages_still_share_the_import(venvs, tmp_path):
    by = _by_name(run_stages(_settings(tmp_path), target=LocalHost(), venv=venvs["good"], parallel=1))
    assert by["imports"].status == by["native-load"].status == by["library-provenance"].status == "pass"
    assert _torch_imports(tmp_path) == 1


def test_a_broken_import_fails_imports_and_native_load_keeps_its_own_verdict(venvs, tmp_path):
    by = _by_name(run_stages(_settings(tmp_path), target=LocalHost(), venv=venvs["broken"]))
    assert by["imports"].status == "fail"
    assert by["imports"].reason == "1 of 2 imports failed; ext: ImportError: ext is broken on purpose"
    assert by["native-load"].status == "pass" and by["native-load"].reason == "2 of 2 shared objects load (RTLD_NOW)"
    assert "could not import ext (see imports)" in by["library-provenance"].reason
    assert _torch_imports(tmp_path) == 1


def test_when_the_imports_process_dies_native_load_runs_on_its_own(venvs, tmp_path):
    """The process dies importing ext, after it forked the loader: imports and library-provenance
    fail with its exit status, and native-load, whose report went with it, loads on its own."""
    by = _by_name(run_stages(_settings(tmp_path), target=LocalHost(), venv=venvs["dies"]))
    assert by["imports"].status == "fail" and "(exit 7)" in by["imports"].reason
    assert by["library-provenance"].reason == by["imports"].reason
    assert by["native-load"].status == "pass" and by["native-load"].reason == "2 of 2 shared objects load (RTLD_NOW)"
    assert _torch_imports(tmp_path) == 2, "the imports process's torch, and native-load's own"


def test_a_constructor_that_aborts_is_pinned_on_its_file_and_the_rest_load(venvs, tmp_path):
    """The forked loader dies on libboom.so; a loader of its own goes on after it (importing torch
    again, as it must), and the stage names the file and the signal."""
    by = _by_name(run_stages(_settings(tmp_path), target=LocalHost(), venv=venvs["aborts"]))
    native = by["native-load"]
    assert native.status == "fail"
    assert native.reason.startswith("1 of 3 shared objects does not load: ") and "ext/libboom.so: killed by SIGABRT (aborted)" \
        in native.reason, native.reason
    loaded = {Path(lib["path"]).name: lib["ok"] for lib in native.details["libraries"]}
    assert loaded == {"libboom.so": False, "libext.so": True, "libc10.so": True}
    assert by["imports"].status == "pass" and by["library-provenance"].status == "pass"
    assert _torch_imports(tmp_path) == 2, "the forked loader's torch, and the next loader's"


def test_names_that_do_not_begin_with_torch_still_import_it_once(venvs, tmp_path):
    """``ext`` alone (it imports torch itself): the process imports the preload first and forks
    the loader then, so that it has imported nothing but its preload, and torch is imported once."""
    settings = dataclasses.replace(_settings(tmp_path), imports=("ext",))
    by = _by_name(run_stages(settings, target=LocalHost(), venv=venvs["good"]))
    assert by["imports"].status == "pass" and by["imports"].reason == "1 import: ext 1.0"
    assert by["native-load"].reason == "1 of 1 shared object loads (RTLD_NOW)"
    assert by["native-load"].details["preload"] == [{"name": "torch", "ok": True, "error": None}]
    assert _torch_imports(tmp_path) == 1, "the imports process's preload, which the loader and ext share"


def test_the_inventory_verify_takes_looks_on_disk_only_at_shared_objects(venvs, tmp_path):
    """``record="shared"``: the shared objects' rows have the disk's facts (a removed one is said
    to be absent), the other rows RECORD's alone; the full inventory (the twin) has them all."""
    from transplant.hosts.probing import take_inventory

    venv = Path(venvs["good"])
    copy = tmp_path / "venv"
    shutil.copytree(venv, copy, symlinks=True)
    (copy / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    removed = next(copy.rglob("libext.so"))
    removed.unlink()
    lean = take_inventory(LocalHost(), str(copy), record="shared").latest()
    full = take_inventory(LocalHost(), str(copy)).latest()
    site = str(removed.parent.parent.relative_to(copy))
    for dists, disk in ((lean, False), (full, True)):
        ext = dists["ext"].files
        assert ext[f"{site}/ext/libext.so"].exists is False, "a missing shared object is absent either way"
        assert ext[f"{site}/ext/__init__.py"].exists is disk
        assert (ext[f"{site}/ext/__init__.py"].size is not None) is disk
        c10 = dists["torch"].files[f"{site}/torch/lib/libc10.so"]
        assert c10.exists is True and c10.size == (copy / site / "torch/lib/libc10.so").stat().st_size
    assert set(lean["ext"].files) == set(full["ext"].files), "every RECORD row is there"


#: A package noting the process that imports it (``<name>-<pid>`` in IMPORTED_DIR) and loading its
#: own library by path, as extension packages do.
NOTES = textwrap.dedent('''\
    import ctypes, os
    open(os.path.join(os.environ["IMPORTED_DIR"], __name__ + "-%d" % os.getpid()), "w").close()
    ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libown.so"))
    __version__ = "1.0"
    ''')


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> str:
    """torch and ``pa``, ``pc`` (each notes its importing process and loads its ``libown.so``),
    ``pb`` (its import ends the process with status 9)."""
    root = tmp_path_factory.mktemp("jobs")
    own = _gcc(root, "libown.so", "int own(void) { return 1; }\n")
    wheels = root / "wheels"
    made = [build_wheel(wheels, "torch", "2.9.1", {"torch/__init__.py": "__version__ = '2.9.1'\n"}, tag=TAG)]
    for name in ("pa", "pc"):
        made.append(build_wheel(wheels, name, "1.0", {f"{name}/__init__.py": NOTES,
                                                      f"{name}/libown.so": own.read_bytes()}, tag=TAG))
    made.append(build_wheel(wheels, "pb", "1.0", {"pb/__init__.py": "import os\nos._exit(9)\n"}, tag=TAG))
    return str(make_venv(root / "venv", made))


def _imports(venv: str, names: list[str], jobs: int, tmp_path: Path) -> dict:
    from transplant import remote
    from transplant.hosts.probing import run_script

    imported = tmp_path / f"imported-{jobs}"
    imported.mkdir()
    request = {"jobs": jobs, "provenance": {"modules": ["torch", *names], "optional": ["torch"],
                                            "source": remote.source("stage_provenance").decode()}}
    return run_script(LocalHost(), venv, "stage_imports", names, request=request,
                      env={"IMPORTED_DIR": str(imported)}, timeout=60)


def test_import_workers_give_the_document_one_process_gives(packages, tmp_path):
    """Three processes import pa, pb and pc (one each): the results, in the names' order, are
    those of one process, but for the name whose worker died; what the workers mapped is in the
    provenance report."""
    names = ["pa", "pb", "pc"]
    alone = _imports(packages, ["pa", "pc"], 1, tmp_path)
    apart = _imports(packages, names, 3, tmp_path)
    assert [i["name"] for i in apart["imports"]] == names

    def same(doc):
        return {i["name"]: (i["ok"], i["version"], i["file"]) for i in doc["imports"] if i["name"] != "pb"}

    assert same(apart) == same(alone) and all(ok for ok, _, _ in same(apart).values())
    pids = {p.name.split("-")[0]: p.name.split("-")[1] for p in (tmp_path / "imported-3").iterdir()}
    assert set(pids) == {"pa", "pc"} and pids["pa"] != pids["pc"], "pa and pc were imported by two processes"
    [pb] = [i for i in apart["imports"] if i["name"] == "pb"]
    assert pb["ok"] is False and pb["error"] == \
        "SystemError: the import worker ended (exited with code 9) without answering", pb
    mapped = [m for m in apart["provenance"]["mapped"] if m.endswith("/libown.so")]
    assert {Path(m).parent.name for m in mapped} == {"pa", "pc"}, apart["provenance"]["mapped"]
    assert [i["name"] for i in apart["provenance"]["imported"]] == ["torch", *names]
