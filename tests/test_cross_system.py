"""Host-dependent judgments between lab hosts whose systems differ, each with its clean twin.

The donor runs on trixie (glibc 2.41), the target on bookworm (glibc 2.36) or on trixie's twin;
every venv runs the same CPython build (this machine's, bound into each host), so the systems
differ in glibc and libraries only. The same bytes get another verdict only where the fault
depends on what differs: a shared object built against glibc 2.41 that needs ``GLIBC_2.38``
cannot load on bookworm, while a fault inside the venv that the donor runs (a ``cpython-310``
module it carries) stays info on both targets."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from pathlib import Path

from transplant.cli import main
from transplant.lab.standins import Driver, Gpu, install_driver, remove_cpu, remove_driver, set_cpu_level
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python, ssh

pytestmark = pytest.mark.hosts

VENV = "/srv/xs"
FATBIN = Path(__file__).parent / "data" / "fatbin" / "libdevice-sm80.so"
H100 = Gpu("NVIDIA H100 80GB HBM3", "9.0", 81559)
A100 = Gpu("NVIDIA A100-SXM4-80GB", "8.0", 81920)
#: A library of trixie's own root: Debian built it against glibc 2.41, and it binds
#: ``GLIBC_2.38`` symbols (readelf -V), which bookworm's glibc 2.36 does not define.
TRIXIE_LIBRARY = "/usr/lib/x86_64-linux-gnu/libacl.so.1"
#: Another one, whose DT_NEEDED names ``libcbor.so.0.10``: trixie's system has it, bookworm's has not.
NEEDS_CBOR = "/usr/lib/x86_64-linux-gnu/libfido2.so.1"


@pytest.fixture(scope="module")
def stacks(systems, tmp_path_factory):
    """The donor venv on trixie with ``glx`` (trixie's libacl as its extension module) and ``kern``
    (a ``cpython-310`` module beside its own); empty venvs of the same Python on bookworm and on
    trixie's twin."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    trixie = systems.hosts["trixie"]
    acl = trixie.run(["cat", TRIXIE_LIBRARY]).stdout
    fido = trixie.run(["cat", NEEDS_CBOR]).stdout
    wheels = tmp_path_factory.mktemp("wheels")
    tag = "cp311-cp311-linux_x86_64"
    made = [
        build_wheel(wheels, "glx", "1.0", {"glx/__init__.py": "", "glx/_acl.cpython-311-x86_64-linux-gnu.so": acl},
                    tag=tag),
        build_wheel(wheels, "kern", "1.0", {"kern/__init__.py": "",
                                            "kern/ops.cpython-311-x86_64-linux-gnu.so": acl,
                                            "kern/old_ops.cpython-310-x86_64-linux-gnu.so": acl}, tag=tag),
        build_wheel(wheels, "fido", "1.0", {"fido/__init__.py": "", "fido/_fido.cpython-311-x86_64-linux-gnu.so": fido},
                    tag=tag),
        # an optional plugin: it needs a library no host here has, the donor's included
        build_wheel(wheels, "plug", "1.0", {"plug/__init__.py": "", "plug/_gone.cpython-311-x86_64-linux-gnu.so":
                                            fido.replace(b"libcbor.so.0.10", b"libnone.so.0.10")}, tag=tag),
        # CUDA 13 by its version (the rules' evidence for nvidia-* distributions)
        build_wheel(wheels, "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": acl}, tag=tag),
        # device code: SASS for sm_80 and sm_100f only, no PTX (tests/data/fatbin/build.sh)
        build_wheel(wheels, "devkern", "1.0", {"devkern/__init__.py": "", "devkern/device.so": FATBIN.read_bytes()},
                    tag=tag),
        # what matters of triton here is its name: it links its launchers with -lcuda
        build_wheel(wheels, "triton", "3.5.0", {"triton/__init__.py": ""}),
    ]
    python = f"{build}/bin/python3"
    for name in ("trixie", "bookworm", "trixie-twin"):
        host = systems.hosts[name]
        host.run(["rm", "-rf", VENV, "/srv/wheels"])
        host.run([python, "-m", "venv", "--without-pip", VENV])
    for wheel in made:
        trixie.install(f"/srv/wheels/{wheel.name}", wheel.read_bytes())
    # the donor installs with the pip of the same build, run from outside the venv
    trixie.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                "--prefix", VENV, *[f"/srv/wheels/{w.name}" for w in made]])
    return systems


def plan_json(systems, tmp_path, target: str, capsys, overlay=("glx", "kern", "fido", "plug")) -> tuple[int, dict]:
    """``transplant plan --json`` from the trixie donor to ``target``: (exit code, plan document)."""
    manifest = tmp_path / f"to-{target}.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: {json.dumps(list(overlay))}
        """))
    code = main(["plan", str(manifest), "--json"])
    return code, json.loads(capsys.readouterr().out)


def by_code(doc: dict, code: str) -> list[dict]:
    """The plan's findings of ``code``."""
    return [f for f in doc["findings"] if f["code"] == code]


def test_glibc_symbol_versions_the_target_lacks_block(stacks, tmp_path, capsys):
    code, doc = plan_json(stacks, tmp_path, "bookworm", capsys)
    platform = [f for f in by_code(doc, "platform-mismatch") if f["severity"] == "error"]
    assert {tuple(f["dists"]) for f in platform} == {("glx",), ("kern",), ("fido",), ("plug",)}
    glx = next(f for f in platform if f["dists"] == ["glx"])
    assert "GLIBC_2.38" in glx["message"] and "glibc 2.36" in glx["message"]
    assert code == 3  # an error blocks


def test_the_same_bytes_on_the_twin_system_are_clean(stacks, tmp_path, capsys):
    code, doc = plan_json(stacks, tmp_path, "trixie-twin", capsys)
    assert not by_code(doc, "platform-mismatch")
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert code == 0


@pytest.mark.parametrize("target", ["bookworm", "trixie-twin"])
def test_a_fault_inside_the_venv_the_donor_runs_is_info_on_either_system(stacks, tmp_path, capsys, target):
    # the cpython-310 module does not load on 3.11 anywhere, the donor's own host included: its verdict
    # depends on the Python, which is the same build on all three hosts, not on glibc
    _, doc = plan_json(stacks, tmp_path, target, capsys)
    [abi] = [f for f in doc["findings"] if f["code"] == "python-abi-mismatch"]
    assert abi["severity"] == "info" and abi["dists"] == ["kern"]
    assert "kern/old_ops.cpython-310-x86_64-linux-gnu.so" in " ".join(abi["files"])


def test_a_library_the_targets_system_lacks_blocks_and_the_twin_has_it(stacks, tmp_path, capsys):
    _, doc = plan_json(stacks, tmp_path, "bookworm", capsys)
    [fido] = [f for f in by_code(doc, "host-library-missing") if f["dists"] == ["fido"]]
    assert fido["severity"] == "error" and "libcbor.so.0.10" in fido["message"]
    assert "the donor's system (trixie) has libcbor.so.0.10" in fido["message"]
    _, twin = plan_json(stacks, tmp_path, "trixie-twin", capsys)
    assert not [f for f in by_code(twin, "host-library-missing") if f["dists"] == ["fido"]]


@pytest.mark.parametrize("target", ["bookworm", "trixie-twin"])
def test_a_library_the_donors_system_lacks_too_is_info(stacks, tmp_path, capsys, target):
    _, doc = plan_json(stacks, tmp_path, target, capsys)
    [plug] = [f for f in by_code(doc, "host-library-missing") if f["dists"] == ["plug"]]
    assert plug["severity"] == "info" and "libnone.so.0.10" in plug["message"]
    assert "lacks it too" in plug["message"]


@pytest.fixture(scope="module")
def drivers(stacks):
    """The donor (trixie) on driver 580 (CUDA 13.0) with an H100; the bookworm target on driver
    535 (CUDA 12.2) with two H100s and no unversioned ``libcuda.so``; trixie's twin on driver 580
    with an A100. Removed afterwards."""
    hosts = stacks.hosts
    install_driver(hosts["trixie"], Driver("580.95.05", "13.0", (H100,)))
    install_driver(hosts["bookworm"], Driver("535.104.05", "12.2", (H100, H100), unversioned_link=False))
    install_driver(hosts["trixie-twin"], Driver("580.95.05", "13.0", (A100,)))
    yield stacks
    for name in ("trixie", "bookworm", "trixie-twin"):
        remove_driver(hosts[name])


def test_a_driver_older_than_the_cuda_major_blocks_and_the_twins_driver_runs_it(drivers, tmp_path, capsys):
    overlay = ("nvidia-cuda-runtime",)
    code, doc = plan_json(drivers, tmp_path, "bookworm", capsys, overlay)
    [old] = by_code(doc, "driver-too-old")
    assert old["severity"] == "error" and "driver 535.104.05 supports CUDA 12.2" in old["message"]
    assert "CUDA 13.0" in old["message"] and code == 3
    code, twin = plan_json(drivers, tmp_path, "trixie-twin", capsys, overlay)
    assert not by_code(twin, "driver-too-old") and code == 0


def test_gpus_without_sass_or_ptx_for_them_block_and_the_twins_gpu_runs_it(drivers, tmp_path, capsys):
    overlay = ("devkern",)
    _, doc = plan_json(drivers, tmp_path, "bookworm", capsys, overlay)
    [arch] = by_code(doc, "gpu-arch-unsupported")
    assert arch["severity"] == "error" and arch["dists"] == ["devkern"]
    assert "sm_100f, sm_80" in arch["message"] and "NVIDIA H100 80GB HBM3 (sm_90)" in arch["message"]
    code, twin = plan_json(drivers, tmp_path, "trixie-twin", capsys, overlay)
    assert not by_code(twin, "gpu-arch-unsupported") and code == 0


def test_the_driver_stand_in_answers_as_the_real_one(drivers):
    host = drivers.hosts["bookworm"]
    assert ssh(drivers, "bookworm", "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader") == \
        "NVIDIA H100 80GB HBM3, 9.0\nNVIDIA H100 80GB HBM3, 9.0\n"
    assert "CUDA Version: 12.2" in ssh(drivers, "bookworm", "nvidia-smi")
    assert "Kernel Module  535.104.05" in ssh(drivers, "bookworm", "cat /proc/driver/nvidia/version")
    asked = host.run(["python3", "-c", "import ctypes; c = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(); "
                      "n = ctypes.c_int(); print(c.cuDeviceGetCount(ctypes.byref(n)), c.cuInit(0), "
                      "c.cuDriverGetVersion(ctypes.byref(v)), v.value, c.cuDeviceGetCount(ctypes.byref(n)), n.value)"])
    assert asked.stdout.split() == [b"3", b"0", b"0", b"12020", b"0", b"2"]  # not initialised before cuInit


def test_a_python_313_donor_and_a_311_target_are_named_as_such(systems, tmp_path, capsys):
    """Debian's own Pythons: 3.13 on trixie, 3.11 on bookworm. The pair is "Python 3.13 vs 3.11",
    never a missing interpreter; a cp313 extension is named for its ABI and stays blocked, while
    the pure-Python distribution moves into bookworm's lib/python3.11/site-packages over SSH,
    imports there, passes verify and rolls back."""
    trixie, bookworm = systems.hosts["trixie"], systems.hosts["bookworm"]
    wheels = tmp_path / "wheels"
    made = [build_wheel(wheels, "purepkg", "1.0", {"purepkg/__init__.py": "X = 1\n",
                                                   "purepkg/cli.py": "def main():\n    print('ran purepkg')\n"},
                        entry_points="[console_scripts]\npuretool = purepkg.cli:main\n"),
            build_wheel(wheels, "ext313", "1.0", {"ext313/__init__.py": "",
                                                  "ext313/_x.cpython-313-x86_64-linux-gnu.so": b"\x7fELF"},
                        tag="cp313-cp313-linux_x86_64")]
    for host in (trixie, bookworm):
        host.run(["rm", "-rf", "/srv/debpy", "/srv/debwheels"])
    trixie.run(["python3", "-m", "venv", "/srv/debpy"])
    bookworm.run(["python3", "-m", "venv", "--without-pip", "/srv/debpy"])
    for wheel in made:
        trixie.install(f"/srv/debwheels/{wheel.name}", wheel.read_bytes())
    trixie.run(["/srv/debpy/bin/pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                *[f"/srv/debwheels/{w.name}" for w in made]])
    cached = trixie.run(["ls", "/srv/debpy/lib/python3.13/site-packages/purepkg/__pycache__"]).stdout.decode().split()
    assert cached and all(".cpython-313.pyc" in n for n in cached), cached

    def write(overlay: str) -> Path:
        manifest = tmp_path / "py.yaml"
        manifest.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: "{trixie.spec}", venv: /srv/debpy}}
            target: {{host: "{bookworm.spec}", venv: /srv/debpy}}
            ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
            overlay: {overlay}
            verify: {{imports: [purepkg]}}
            """))
        return manifest

    assert main(["plan", str(write("[purepkg, ext313]")), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert not by_code(doc, "interpreter-missing")
    minor = {f["severity"]: f for f in by_code(doc, "python-version-mismatch")}
    assert sorted(minor) == ["error", "warning"]
    assert minor["error"]["dists"] == ["ext313"] and minor["error"]["message"].startswith("Python 3.13 vs 3.11: ")
    assert "lib/python3.13/site-packages" in minor["error"]["message"] and "1 shared object" in minor["error"]["message"]
    assert minor["warning"]["dists"] == ["purepkg"]
    assert "from the donor's lib/python3.13/site-packages to the target's lib/python3.11/site-packages" \
        in minor["warning"]["message"]
    [abi] = by_code(doc, "python-abi-mismatch")
    assert abi["dists"] == ["ext313"] and "cp313-cp313-linux_x86_64" in abi["message"]
    # the pure distribution alone: no error; applied over SSH it lands where bookworm's 3.11 reads it
    manifest = write("[purepkg]")
    assert main(["plan", str(manifest), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    [change] = doc["changes"]
    assert {c["path"]: c["donor_path"] for c in change["copy"]}[
        "lib/python3.11/site-packages/purepkg/__init__.py"] == "lib/python3.13/site-packages/purepkg/__init__.py"
    assert main(["apply", str(manifest), "--yes"]) == 0
    capsys.readouterr()
    said = bookworm.run(["/srv/debpy/bin/python", "-c", "import purepkg, sys; print(purepkg.X, purepkg.__file__, "
                         "'%d.%d' % sys.version_info[:2])"]).stdout.decode().split()
    assert said == ["1", "/srv/debpy/lib/python3.11/site-packages/purepkg/__init__.py", "3.11"], said
    assert bookworm.run(["/srv/debpy/bin/puretool"]).stdout == b"ran purepkg\n"
    assert bookworm.run(["test", "!", "-e", "/srv/debpy/lib/python3.13"]).returncode == 0
    assert main(["verify", str(manifest), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stages = {s["name"]: s["status"] for s in report["stages"]}
    assert report["ok"] is True and stages["interpreter"] == "pass" and stages["imports"] == "pass", stages
    assert main(["rollback", str(manifest), "--yes"]) == 0
    left = bookworm.run(["find", "/srv/debpy/lib/python3.11/site-packages", "/srv/debpy/bin", "-name", "*purepkg*",
                         "-o", "-name", "puretool", "-o", "-name", "*.py", "-path", "*purepkg*"]).stdout.decode().split()
    # what apply wrote is gone; the cpython-311 caches bookworm's Python wrote on import were never the plan's
    assert left in ([], ["/srv/debpy/lib/python3.11/site-packages/purepkg"]), left


def test_a_driver_without_the_unversioned_libcuda_link_blocks_triton_and_the_twin_has_it(drivers, tmp_path, capsys):
    _, doc = plan_json(drivers, tmp_path, "bookworm", capsys, ("triton",))
    [link] = by_code(doc, "libcuda-unversioned-missing")
    assert link["severity"] == "error" and "ldconfig -p lists /lib/x86_64-linux-gnu/libcuda.so.1" in link["message"]
    assert link["hint"].startswith("on the target, as root: ln -s libcuda.so.1 /lib/x86_64-linux-gnu/libcuda.so")
    _, twin = plan_json(drivers, tmp_path, "trixie-twin", capsys, ("triton",))
    assert not by_code(twin, "libcuda-unversioned-missing")


@pytest.fixture(scope="module")
def avx512(stacks, tmp_path_factory):
    """``avx512`` on the donor: an object compiled here with ``-march=x86-64-v4 -mneeded`` (its GNU
    property note says it needs x86-64-v4). bookworm's CPU stand-in reaches x86-64-v3 only; trixie's
    twin reads this machine's own CPU, which has AVX-512 where these tests run (checked below)."""
    tmp = tmp_path_factory.mktemp("avx512")
    source = tmp / "v4.c"
    source.write_text("int total(const int *a) { int s = 0; for (int i = 0; i < 64; i++) s += a[i]; return s; }\n")
    built = tmp / "v4.so"
    subprocess.run(["cc", "-O2", "-march=x86-64-v4", "-mneeded", "-shared", "-fPIC", "-o", str(built), str(source)],
                   check=True)
    wheel = build_wheel(tmp, "avx512", "1.0", {"avx512/__init__.py": "", "avx512/_v4.so": built.read_bytes()},
                        tag="cp311-cp311-linux_x86_64")
    trixie = stacks.hosts["trixie"]
    trixie.install(f"/srv/wheels/{wheel.name}", wheel.read_bytes())
    trixie.run([f"{shared_python()}/bin/python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                "--disable-pip-version-check", "--prefix", VENV, f"/srv/wheels/{wheel.name}"])
    set_cpu_level(stacks.hosts["bookworm"], "x86-64-v3")
    yield stacks
    remove_cpu(stacks.hosts["bookworm"])


def test_an_object_needing_a_cpu_level_the_target_lacks_blocks_and_the_twins_cpu_runs_it(avx512, tmp_path, capsys):
    if "avx512f" not in ssh(avx512, "trixie-twin", "cat /proc/cpuinfo"):
        pytest.skip("this machine's CPU has no AVX-512: no twin here reaches x86-64-v4")
    assert "x86-64-v3" in ssh(avx512, "bookworm", "cat /proc/cpuinfo")
    _, doc = plan_json(avx512, tmp_path, "bookworm", capsys, ("avx512",))
    [cpu] = by_code(doc, "cpu-isa-unsupported")
    assert cpu["severity"] == "error" and "needs x86-64-v4" in cpu["message"]
    assert "avx512f" in cpu["message"] and cpu["files"] == ["lib/python3.11/site-packages/avx512/_v4.so"]
    _, twin = plan_json(avx512, tmp_path, "trixie-twin", capsys, ("avx512",))
    assert not by_code(twin, "cpu-isa-unsupported")


def test_a_driver_that_does_not_answer_is_named_broken_and_the_twins_answers(drivers, tmp_path, capsys):
    bookworm = drivers.hosts["bookworm"]
    install_driver(bookworm, Driver("535.104.05", "12.2", (H100,), state="mismatch"))
    try:
        assert "Driver/library version mismatch" in ssh(drivers, "bookworm", "nvidia-smi || true")
        _, doc = plan_json(drivers, tmp_path, "bookworm", capsys, ("nvidia-cuda-runtime",))
        [broken] = by_code(doc, "driver-unusable")
        assert broken["severity"] == "error" and broken["dists"] == ["nvidia-cuda-runtime"]
        assert "Failed to initialize NVML: Driver/library version mismatch" in broken["message"]
        assert "the loaded kernel module is 535.104.05" in broken["message"]
        _, twin = plan_json(drivers, tmp_path, "trixie-twin", capsys, ("nvidia-cuda-runtime",))
        assert not by_code(twin, "driver-unusable")
    finally:
        install_driver(bookworm, Driver("535.104.05", "12.2", (H100, H100), unversioned_link=False))


#: A fatbin built by nvcc 13.0 (tests/data/fatbin/build.sh): SASS for sm_90, sm_90a and sm_120a, and
#: PTX for compute_90 of PTX ISA 9.0, which a driver older than CUDA 13.0 cannot JIT-compile.
PTX13 = Path(__file__).parent / "data" / "fatbin" / "libdevice.so"
B200 = Gpu("NVIDIA B200", "10.0", 183359)


def test_ptx_the_targets_driver_cannot_jit_blocks_and_the_twins_newer_driver_runs_it(drivers, tmp_path, capsys):
    """The same bytes, the same GPU (a B200: no SASS for sm_100, so its driver JIT-compiles the
    PTX): the driver of CUDA 12.9 on bookworm does not know PTX ISA 9.0, the twin's of 13.0 does."""
    trixie, bookworm, twin = (drivers.hosts[n] for n in ("trixie", "bookworm", "trixie-twin"))
    wheel = build_wheel(tmp_path, "ptxkern", "1.0", {"ptxkern/__init__.py": "", "ptxkern/device.so": PTX13.read_bytes()},
                        tag="cp311-cp311-linux_x86_64")
    trixie.install(f"/srv/wheels/{wheel.name}", wheel.read_bytes())
    trixie.run([f"{shared_python()}/bin/python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                "--disable-pip-version-check", "--prefix", VENV, f"/srv/wheels/{wheel.name}"])
    install_driver(bookworm, Driver("575.51.03", "12.9", (B200,)))
    install_driver(twin, Driver("580.95.05", "13.0", (B200,)))
    try:
        code, doc = plan_json(drivers, tmp_path, "bookworm", capsys, ("ptxkern",))
        [ptx] = by_code(doc, "ptx-too-new")
        assert ptx["severity"] == "error" and ptx["dists"] == ["ptxkern"] and code == 3
        assert "no SASS for the target's NVIDIA B200 (sm_100)" in ptx["message"]
        assert "driver 575.51.03 (CUDA 12.9)" in ptx["message"]
        code, clean = plan_json(drivers, tmp_path, "trixie-twin", capsys, ("ptxkern",))
        assert not by_code(clean, "ptx-too-new") and code == 0, clean["findings"]
    finally:
        install_driver(bookworm, Driver("535.104.05", "12.2", (H100, H100), unversioned_link=False))
        install_driver(twin, Driver("580.95.05", "13.0", (A100,)))
        site = f"{VENV}/lib/python3.11/site-packages"
        trixie.run(["rm", "-rf", "--", f"{site}/ptxkern", f"{site}/ptxkern-1.0.dist-info"])


def test_a_venv_whose_home_the_targets_system_lacks_blocks_and_the_twin_has_it(stacks, tmp_path, capsys):
    """One venv, made alike on both hosts, whose ``pyvenv.cfg`` names ``home = /opt/py311/bin``:
    the twin's system has that Python installation, bookworm's does not (a host re-imaged without
    the Python build its venvs were made from)."""
    build = shared_python()
    for name in ("bookworm", "trixie-twin"):
        host = stacks.hosts[name]
        host.run(["rm", "-rf", "/srv/homed", "/opt/py311"])
        host.run([f"{build}/bin/python3", "-m", "venv", "--without-pip", "/srv/homed"])
        host.run(["sed", "-i", "s|^home = .*|home = /opt/py311/bin|", "/srv/homed/pyvenv.cfg"])
    stacks.hosts["trixie-twin"].run(["ln", "-s", build, "/opt/py311"])
    try:
        for target, blocked in (("bookworm", True), ("trixie-twin", False)):
            manifest = tmp_path / f"homed-{target}.yaml"
            manifest.write_text(textwrap.dedent(f"""\
                version: 1
                donor: {{host: "{stacks.hosts['trixie'].spec}", venv: {VENV}}}
                target: {{host: "{stacks.hosts[target].spec}", venv: /srv/homed}}
                ssh: {{identity_file: {stacks.identity_file}, known_hosts: {stacks.known_hosts}}}
                overlay: [kern]
                """))
            code = main(["plan", str(manifest), "--json"])
            found = by_code(json.loads(capsys.readouterr().out), "interpreter-missing")
            if blocked:
                [missing] = found
                assert missing["severity"] == "error" and code == 3
                assert "home = /opt/py311/bin, which does not exist on" in missing["message"]
            else:
                assert not found, found
    finally:
        for name in ("bookworm", "trixie-twin"):
            stacks.hosts[name].run(["rm", "-rf", "/srv/homed", "/opt/py311"])
