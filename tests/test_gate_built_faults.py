"""The gate's rules on faults built for real: wheels written here and installed by pip into
real venvs, objects built with gcc, probed on the local host by the same host scripts as
over SSH, then planned (and verified) by the real code. Each fault has a fault-free twin
that must raise nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from transplant.hosts.host import LocalHost
from transplant.lab.wheels import build_wheel, make_venv
from transplant.core.manifest import VerifySettings, parse_manifest
from transplant.core.planner import plan
from transplant.hosts.probing import run_script, take_inventory
from transplant.verify.judges import judge_imports
from transplant.core.inventory import TEXTS
from transplant.verify.runner import run_stages

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
EXT = sysconfig.get_config_var("EXT_SUFFIX")
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}{sys.version_info.minor}-linux_x86_64"


def _extension(out: Path, name: str, origin: str) -> bytes:
    """A real CPython extension module ``name`` whose ``origin`` attribute is ``origin``."""
    src = out / f"{name}.c"
    src.write_text(f"""#include <Python.h>
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{name}(void) {{
    PyObject *m = PyModule_Create(&def);
    if (m) PyModule_AddStringConstant(m, "origin", "{origin}");
    return m;
}}
""")
    lib = out / f"{name}{EXT}"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", str(lib), str(src)],
                   check=True)
    return lib.read_bytes()


def _manifest(donor: Path, target: Path, overlay: list[str], **extra):
    data = {"version": 1, "donor": {"host": "local", "venv": str(donor)},
            "target": {"host": "local", "venv": str(target)}, "overlay": overlay, **extra}
    return parse_manifest(data, path="m.yaml")


def _plan(donor: Path, target: Path, overlay: list[str], **extra):
    host = LocalHost()
    d = take_inventory(host, str(donor), hash_patterns=overlay, texts=TEXTS)
    t = take_inventory(host, str(target), hash_patterns=overlay, texts=TEXTS)
    return plan(_manifest(donor, target, overlay, **extra), d, t)


def _found(result, code):
    return [f for f in result.findings if f.code == code]


# --- target-record-missing -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def recordless(tmp_path_factory):
    """pkg 1.0 (an extension module ``pkg.fast``) on the target, pkg 2.0 (``pkg/fast.py``) on the donor."""
    tmp = tmp_path_factory.mktemp("recordless")
    fast = _extension(tmp, "fast", "old-extension")
    init = "from .fast import origin\n"
    old = build_wheel(tmp / "old", "pkg", "1.0", {"pkg/__init__.py": init, f"pkg/fast{EXT}": fast}, tag=TAG)
    new = build_wheel(tmp / "new", "pkg", "2.0", {"pkg/__init__.py": init, "pkg/fast.py": "origin = 'new-source'\n"})
    # mypyc's layout: one wheel ships md.py and the md extension module side by side
    both = build_wheel(tmp / "both", "pkg", "2.0", {"pkg/__init__.py": init, "pkg/fast.py": "origin = 'source'\n",
                                                    f"pkg/fast{EXT}": fast}, tag=TAG)
    return {"tmp": tmp, "old": old, "new": new, "both": both}


def _strip_record(venv: Path, dist_info: str, installer: str = "conda") -> None:
    folder = venv / SITE / dist_info
    (folder / "RECORD").unlink()
    (folder / "INSTALLER").write_text(installer + "\n")


def test_a_target_distribution_without_record_blocks_its_replacement(recordless, tmp_path):
    donor = make_venv(tmp_path / "donor", [recordless["new"]])
    target = make_venv(tmp_path / "target", [recordless["old"]])
    _strip_record(target, "pkg-1.0.dist-info")
    result = _plan(donor, target, ["pkg"])
    [f] = _found(result, "target-record-missing")
    assert f.severity == "error" and f.dists == ("pkg",)
    assert f.files == (f"{SITE}/pkg", f"{SITE}/pkg-1.0.dist-info")
    assert "installed by conda" in f.message and "RECORD file not found" in f.message
    assert f.hint.startswith("on the target, conda remove --force pkg") and f"{target}/{SITE}/pkg " in f.hint
    assert f in result.blocking
    # the same names in remove: leave the package folder too
    result = _plan(donor, target, ["nothing"], remove=["pkg"])
    [f] = _found(result, "target-record-missing")
    assert "removes (remove:)" in f.message


def test_a_target_distribution_with_record_is_replaced_quietly(recordless, tmp_path):
    donor = make_venv(tmp_path / "donor", [recordless["new"]])
    target = make_venv(tmp_path / "target", [recordless["old"]])
    result = _plan(donor, target, ["pkg"])
    assert not _found(result, "target-record-missing")
    [change] = [c for c in result.changes if c.name == "pkg"]
    assert f"{SITE}/pkg/fast{EXT}" in change.remove


def _applied_without_record(recordless, tmp_path: Path) -> Path:
    """The target as a forced apply leaves it: pkg 1.0 had no RECORD, so its extension module
    stays beside pkg 2.0's files and dist-info (what apply writes: the donor's files)."""
    target = make_venv(tmp_path / "target", [recordless["old"]])
    _strip_record(target, "pkg-1.0.dist-info")
    staged = make_venv(tmp_path / "staged", [recordless["new"]])
    shutil.rmtree(target / SITE / "pkg-1.0.dist-info")
    shutil.copytree(staged / SITE, target / SITE, dirs_exist_ok=True)
    return target


def test_verify_names_a_stale_extension_module_that_shadows_the_new_source(recordless, tmp_path):
    target = _applied_without_record(recordless, tmp_path)
    check = subprocess.run([str(target / "bin" / "python"), "-c", "import pkg; print(pkg.origin)"],
                           capture_output=True, text=True, check=True)
    assert check.stdout.strip() == "old-extension"  # the condition is real: the old module wins
    stage = {r.name: r for r in run_stages(VerifySettings(overlay=("pkg",)), target=LocalHost(), venv=str(target))}
    prov = stage["library-provenance"]
    assert prov.status == "fail", prov.reason
    assert f"{SITE}/pkg/fast{EXT} (listed by no RECORD) is imported instead of {SITE}/pkg/fast.py (pkg)" in prov.reason
    assert f"rm {target}/{SITE}/pkg/fast{EXT}" in prov.reason
    assert prov.details["stale_modules"][0]["source_owner"] == "pkg"


def test_verify_passes_an_extension_module_its_own_record_lists_beside_the_source(recordless, tmp_path):
    target = make_venv(tmp_path / "target", [recordless["both"]])
    stage = {r.name: r for r in run_stages(VerifySettings(overlay=("pkg",)), target=LocalHost(), venv=str(target))}
    prov = stage["library-provenance"]
    assert prov.status in ("pass", "skip") and not prov.details["stale_modules"], prov.reason
    assert prov.details["beside_source"], "the pair is there and seen, but one RECORD lists both"


# --- undefined-symbol ----------------------------------------------------------------------------

def _gcc(out: Path, source: str, *args: str) -> bytes:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def siblings(tmp_path_factory):
    """A jit-link library whose symbols carry their release in the name, under one version node
    ``libjl.so.1`` in both releases (as libnvJitLink's ``__nvJitLinkCreate_12_8``), and a sparse
    library built against each release: 1.0 on the target, 2.0 on the donor."""
    tmp = tmp_path_factory.mktemp("siblings")
    wheels = {}
    for version, names in (("1.0", ["jl_create_12_4"]), ("2.0", ["jl_create_12_4", "jl_create_12_8"])):
        d = tmp / version
        d.mkdir()
        (d / "v.map").write_text("libjl.so.1 { global: " + " ".join(f"{n};" for n in names) + " local: *; };\n")
        jl = _gcc(d / "libjl.so.1", "".join(f"int {n}(void) {{ return 1; }}\n" for n in names),
                  "-Wl,-soname,libjl.so.1", f"-Wl,--version-script={d / 'v.map'}")
        use = names[-1]
        sp = _gcc(d / "libsp.so.1", f"int {use}(void);\nint sp_run(void) {{ return {use}(); }}\n",
                  "-Wl,-soname,libsp.so.1", str(d / "libjl.so.1"))
        wheels[("nvjl", version)] = build_wheel(d / "w", "nvjl", version, {"nvjl/__init__.py": "",
                                                                          "nvjl/lib/libjl.so.1": jl}, tag=TAG)
        wheels[("sparse", version)] = build_wheel(d / "w", "sparse", version, {"sparse/__init__.py": "",
                                                                              "sparse/lib/libsp.so.1": sp}, tag=TAG)
    donor = make_venv(tmp / "donor", [wheels[("nvjl", "2.0")], wheels[("sparse", "2.0")]])
    target = make_venv(tmp / "target", [wheels[("nvjl", "1.0")], wheels[("sparse", "1.0")]])
    return donor, target


def _gathered_plan(donor: Path, target: Path, overlay: list[str]):
    from transplant.pipeline.gather import gather

    m = _manifest(donor, target, overlay)
    facts = gather(m, LocalHost(), LocalHost())
    return plan(m, facts.donor, facts.target, donor_elf=facts.donor_elf, target_elf=facts.target_elf), facts


def test_a_library_moving_without_its_sibling_needs_symbols_the_staying_one_lacks(siblings):
    donor, target = siblings
    result, facts = _gathered_plan(donor, target, ["sparse"])
    sp = f"{SITE}/sparse/lib/libsp.so.1"
    assert facts.donor_elf.files[sp].versioned_undefined == {"libjl.so.1": ("jl_create_12_8",)}
    assert facts.donor_elf.files[sp].version_needs == {"libjl.so.1": ("libjl.so.1",)}  # the names look alike
    [f] = _found(result, "undefined-symbol")
    assert f.severity == "error" and f.dists == ("sparse", "nvjl")
    assert f.files == (sp, f"{SITE}/nvjl/lib/libjl.so.1")
    assert "needs 1 symbol from libjl.so.1" in f.message and "jl_create_12_8" in f.message
    assert "it moves from the donor while nvjl 1.0 stays" in f.message
    assert f.hint == "add 'nvjl' to overlay in m.yaml (the donor has nvjl 2.0)"
    # the same pair, the other way: the library moves and the object that needs it stays
    result, _ = _gathered_plan(target, donor, ["nvjl"])
    [f] = _found(result, "undefined-symbol")
    assert "nvjl 1.0 arrives from the donor while sparse stays" in f.message


def test_siblings_that_move_together_or_a_newer_sibling_raise_nothing(siblings):
    donor, target = siblings
    for overlay in (["sparse", "nvjl"], ["nvjl"]):
        result, _ = _gathered_plan(donor, target, overlay)
        assert not _found(result, "undefined-symbol"), overlay


# --- numpy-abi-mismatch --------------------------------------------------------------------------

#: What NumPy's headers compile ``_import_array()`` to, as far as the binary shows: 1.x headers
#: import ``numpy.core._multiarray_umath``; 2.x headers try ``numpy._core._multiarray_umath`` first.
_IMPORT_ARRAY = {
    "1": 'void *PyImport_ImportModule(const char *);\n'
         'void *init_numpy(void) { return PyImport_ImportModule("numpy.core._multiarray_umath"); }\n',
    "2": 'void *PyImport_ImportModule(const char *);\n'
         'void *init_numpy(void) { void *m = PyImport_ImportModule("numpy._core._multiarray_umath");\n'
         '  return m ? m : PyImport_ImportModule("numpy.core._multiarray_umath"); }\n',
}


@pytest.fixture(scope="module")
def numpy_stacks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numpyabi")
    wheels = {}
    for abi, version in (("1", "1.0"), ("2", "2.0")):
        d = tmp / abi
        d.mkdir()
        ext = _gcc(d / f"_ext{EXT}", _IMPORT_ARRAY[abi])
        wheels[abi] = build_wheel(d, "legacy", version, {"legacy/__init__.py": "", f"legacy/_ext{EXT}": ext}, tag=TAG)
    numpy1 = build_wheel(tmp / "n1", "numpy", "1.26.4", {"numpy/__init__.py": "__version__ = '1.26.4'\n"}, tag=TAG)
    numpy2 = build_wheel(tmp / "n2", "numpy", "2.1.0", {"numpy/__init__.py": "__version__ = '2.1.0'\n"}, tag=TAG)
    return {"old-donor": make_venv(tmp / "old-donor", [numpy1, wheels["1"]]),
            "new-donor": make_venv(tmp / "new-donor", [numpy1, wheels["2"]]),
            "target": make_venv(tmp / "target", [numpy2])}


def test_an_extension_built_for_numpy_1_moving_onto_numpy_2(numpy_stacks):
    result, facts = _gathered_plan(numpy_stacks["old-donor"], numpy_stacks["target"], ["legacy"])
    ext = f"{SITE}/legacy/_ext{EXT}"
    assert facts.donor_elf.files[ext].numpy_abi == "1"
    [f] = _found(result, "numpy-abi-mismatch")
    assert f.severity == "error" and f.dists == ("legacy", "numpy") and f.files == (ext,)
    assert "built against NumPy 1.x" in f.message and "meet numpy 2.1.0 after apply" in f.message
    assert "the donor runs it with numpy 1.26.4" in f.message
    assert f.hint == "add 'numpy' to overlay in m.yaml (the donor has numpy 1.26.4)"


def test_numpy_2_builds_and_a_numpy_that_moves_along_raise_nothing(numpy_stacks):
    result, facts = _gathered_plan(numpy_stacks["new-donor"], numpy_stacks["target"], ["legacy"])
    assert facts.donor_elf.files[f"{SITE}/legacy/_ext{EXT}"].numpy_abi == "2"
    assert not _found(result, "numpy-abi-mismatch")
    result, _ = _gathered_plan(numpy_stacks["old-donor"], numpy_stacks["target"], ["legacy", "numpy"])
    assert not _found(result, "numpy-abi-mismatch")


# --- libcuda-unversioned-missing -----------------------------------------------------------------

NVIDIA_SMI = """\
#!/bin/sh
# stand-in for nvidia-smi: one H100 on driver 580 (CUDA 13.0)
case "$1" in
  --query-gpu=*) echo "NVIDIA H100 80GB HBM3, 9.0, 81559, 580.95.05" ;;
  *) echo "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |" ;;
esac
"""


@pytest.fixture(scope="module")
def triton_venvs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("libcuda")
    triton = build_wheel(tmp, "triton", "3.5.0", {"triton/__init__.py": "__version__ = '3.5.0'\n"}, tag=TAG)
    return make_venv(tmp / "donor", [triton]), make_venv(tmp / "target")


def _driver_host(tmp: Path, monkeypatch, *, smi: bool, unversioned: bool) -> Path:
    """A stand-in nvidia-smi first on PATH (when ``smi``), and a folder on LD_LIBRARY_PATH that
    holds a gcc-built ``libcuda.so.1`` (and the ``libcuda.so`` link when ``unversioned``)."""
    bin_dir, lib_dir = tmp / "bin", tmp / "driver"
    bin_dir.mkdir(parents=True)
    lib_dir.mkdir(parents=True)
    if smi:
        (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
        (bin_dir / "nvidia-smi").chmod(0o755)
    _gcc(lib_dir / "libcuda.so.1", "int cuInit(unsigned int flags) { return 0; }\n", "-Wl,-soname,libcuda.so.1")
    if unversioned:
        (lib_dir / "libcuda.so").symlink_to("libcuda.so.1")
    if "libcuda.so" in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout:
        pytest.skip("this host has a driver library in ldconfig's cache, which triton (and the probe) search first")
    # only the stand-in answers: a real nvidia-smi elsewhere on PATH is left out
    base = [d for d in os.environ["PATH"].split(":") if not os.path.exists(os.path.join(d, "nvidia-smi"))]
    monkeypatch.setenv("PATH", ":".join([str(bin_dir), *base]))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib_dir))
    monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
    return lib_dir


def test_triton_arriving_on_a_host_without_libcuda_so(triton_venvs, tmp_path, monkeypatch):
    lib_dir = _driver_host(tmp_path, monkeypatch, smi=True, unversioned=False)
    result = _plan(*triton_venvs, ["triton"])
    [f] = _found(result, "libcuda-unversioned-missing")
    assert f.severity == "error" and f.dists == ("triton",) and f.files == (f"{lib_dir}/libcuda.so.1",)
    assert "triton 3.5.0 links its kernel launchers with -lcuda" in f.message and "driver 580.95.05" in f.message
    assert f"ln -s libcuda.so.1 {lib_dir}/libcuda.so && ldconfig" in f.hint and "TRITON_LIBCUDA_PATH" in f.hint


def test_libcuda_so_beside_the_driver_raises_nothing(triton_venvs, tmp_path, monkeypatch):
    _driver_host(tmp_path, monkeypatch, smi=True, unversioned=True)
    assert not _found(_plan(*triton_venvs, ["triton"]), "libcuda-unversioned-missing")


def test_no_driver_raises_nothing(triton_venvs, tmp_path, monkeypatch):
    _driver_host(tmp_path, monkeypatch, smi=False, unversioned=False)
    target = take_inventory(LocalHost(), str(triton_venvs[1]))
    assert not target.nvidia.available and target.libcuda is not None and not target.libcuda.unversioned
    assert not _found(_plan(*triton_venvs, ["triton"]), "libcuda-unversioned-missing")


# --- outside-venv --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """torch 2.6.0 in the target venv, 2.7.0 on the donor, and a folder outside the target venv
    (on sys.path through a .pth line) holding plugins that pin torch."""
    tmp = tmp_path_factory.mktemp("outside")
    torch26 = build_wheel(tmp / "a", "torch", "2.6.0", {"torch/__init__.py": "__version__ = '2.6.0'\n"})
    torch27 = build_wheel(tmp / "b", "torch", "2.7.0", {"torch/__init__.py": "__version__ = '2.7.0'\n"})
    pinned = build_wheel(tmp / "c", "plugin", "1.0", {"plugin/__init__.py": ""}, requires=("torch==2.6.0",))
    loose = build_wheel(tmp / "d", "loose", "1.0", {"loose/__init__.py": ""}, requires=("torch>=2.6",))
    return {"tmp": tmp, "torch26": torch26, "torch27": torch27, "pinned": pinned, "loose": loose}


def _with_outside_folder(venv: Path, folder: Path, wheels: list[Path]) -> None:
    folder.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                    "--target", str(folder), *map(str, wheels)], check=True)
    (venv / SITE / "shared_plugins.pth").write_text(f"import os\n# shared plugins\n{folder}\n")


def test_a_distribution_outside_the_venv_is_checked_with_the_rest(outside, tmp_path):
    donor = make_venv(tmp_path / "donor", [outside["torch27"]])
    target = make_venv(tmp_path / "target", [outside["torch26"]])
    _with_outside_folder(target, tmp_path / "shared", [outside["pinned"]])
    check = subprocess.run([str(target / "bin" / "python"), "-c", "import plugin; print(plugin.__file__)"],
                           capture_output=True, text=True, check=True)
    assert check.stdout.startswith(str(tmp_path / "shared"))  # the condition is real: it imports from there
    result = _plan(donor, target, ["torch"])
    [where] = _found(result, "outside-venv")
    assert where.severity == "info" and where.dists == ("plugin",) and where.files == (str(tmp_path / "shared"),)
    assert "(shared_plugins.pth in " in where.message and "plugin 1.0" in where.message
    [unmet] = _found(result, "requirement-unmet")
    assert unmet.severity == "error" and unmet.dists == ("plugin", "torch")
    assert "plugin 1.0 requires torch==2.6.0" in unmet.message
    # verify's imports stage names the folder an import came from when it is outside the venv
    report = run_script(LocalHost(), str(target), "stage_imports", ["plugin", "torch"])
    status, reason = judge_imports(report)
    assert status == "pass" and f"plugin 1.0 (from {tmp_path / 'shared'}, outside the venv)" in reason, reason
    assert "torch 2.6.0," not in reason and reason.endswith("torch 2.6.0")  # the venv's own: no folder named


def test_an_outside_distribution_that_fits_and_a_system_site_folder(outside, tmp_path):
    donor = make_venv(tmp_path / "donor", [outside["torch27"]])
    target = make_venv(tmp_path / "target", [outside["torch26"]])
    _with_outside_folder(target, tmp_path / "shared", [outside["loose"]])
    result = _plan(donor, target, ["torch"])
    assert not _found(result, "requirement-unmet")
    assert [f.dists for f in _found(result, "outside-venv")] == [("loose",)]
    # a venv without .pth lines and without system site-packages has nothing outside
    plain = make_venv(tmp_path / "plain", [outside["torch26"]])
    assert not take_inventory(LocalHost(), str(plain)).outside_folders
    # include-system-site-packages: the base interpreter's site-packages is listed with why (read only)
    cfg = plain / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("include-system-site-packages = false", "include-system-site-packages = true"))
    folders = take_inventory(LocalHost(), str(plain)).outside_folders
    assert "include-system-site-packages = true" in folders.values(), folders


# --- ptx-too-new ---------------------------------------------------------------------------------

FATBIN = Path(__file__).parent / "data" / "fatbin" / "libdevice.so"  # nvcc 13.0: sm_90, sm_90a, sm_120a, compute_90


def _smi(tmp: Path, monkeypatch, gpu: str, cc: str, driver: str, cuda: str) -> None:
    """A stand-in nvidia-smi first on PATH, reporting one GPU on one driver."""
    bin_dir = tmp / "smi"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvidia-smi").write_text(
        f'#!/bin/sh\ncase "$1" in\n  --query-gpu=*) echo "{gpu}, {cc}, 183359, {driver}" ;;\n'
        f'  *) echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda} |" ;;\nesac\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    base = [d for d in os.environ["PATH"].split(":") if not os.path.exists(os.path.join(d, "nvidia-smi"))]
    monkeypatch.setenv("PATH", ":".join([str(bin_dir), *base]))


@pytest.fixture(scope="module")
def ptx_venvs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ptx")
    kern = build_wheel(tmp, "kern", "1.0", {"kern/__init__.py": "", "kern/device.so": FATBIN.read_bytes()}, tag=TAG)
    return make_venv(tmp / "donor", [kern]), make_venv(tmp / "target")


def test_ptx_the_driver_must_jit_but_cannot(ptx_venvs, tmp_path, monkeypatch):
    _smi(tmp_path, monkeypatch, "NVIDIA B200", "10.0", "575.51.03", "12.9")
    result, facts = _gathered_plan(*ptx_venvs, ["kern"])
    assert facts.donor_elf.files[f"{SITE}/kern/device.so"].ptx_isa == {"compute_90": "9.0"}
    [f] = _found(result, "ptx-too-new")
    assert f.severity == "error" and f.dists == ("kern",) and f.files == (f"{SITE}/kern/device.so",)
    assert "no SASS for the target's NVIDIA B200 (sm_100)" in f.message
    assert "compute_90 is PTX ISA 9.0 (CUDA 13.0)" in f.message and "driver 575.51.03 (CUDA 12.9)" in f.message
    assert f.hint.startswith("upgrade the target's NVIDIA driver to 580.65.06 or newer (CUDA 13.0)")


@pytest.mark.parametrize("gpu, cc, driver, cuda", [
    ("NVIDIA B200", "10.0", "580.95.05", "13.0"),  # the driver knows PTX ISA 9.0
    ("NVIDIA H100 80GB HBM3", "9.0", "575.51.03", "12.9"),  # SASS for sm_90: no JIT
])
def test_ptx_the_driver_knows_or_never_needs_raises_nothing(ptx_venvs, tmp_path, monkeypatch, gpu, cc, driver, cuda):
    _smi(tmp_path, monkeypatch, gpu, cc, driver, cuda)
    result, facts = _gathered_plan(*ptx_venvs, ["kern"])
    assert facts.donor_elf.files[f"{SITE}/kern/device.so"].device_code  # the device code was read
    assert not _found(result, "ptx-too-new")
