"""``runpath-outside-venv`` between lab hosts whose systems differ, with the clean twin.

The donor (trixie) has a vendor library in ``/opt/vendor/lib``, a folder its loader cache does
not list; an extension module finds it there through its DT_RUNPATH, baked in at build time.
Bookworm lacks that folder: the same bytes cannot load there, and the plan blocks. Trixie's twin
has the folder and the library, as the donor: clean. A second module's DT_RUNPATH names a build
tree that no host has, the donor's included: info on both targets (the loader skips it).

The host roots have no compiler: the library and the modules are built here with ``cc`` (no C
runtime, so that only the run path and the vendor library decide) and their bytes copied in."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python

pytestmark = pytest.mark.hosts

VENV = "/srv/rp"
VENDOR = "/opt/vendor/lib"
SONAME = "libtransplantvendor.so.1"
BUILD_TREE = "/home/builder/src/build/lib"
MODULE = "vend/_vend.cpython-311-x86_64-linux-gnu.so"
IDLE = "vend/_idle.cpython-311-x86_64-linux-gnu.so"


def _compile(tmp, name: str, source: str, *args: str) -> bytes:
    """``cc -shared`` of ``source`` without the C runtime; the output's bytes."""
    (tmp / f"{name}.c").write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", "-o", str(tmp / name), str(tmp / f"{name}.c"), *args],
                   check=True, capture_output=True)
    return (tmp / name).read_bytes()


def _readelf_dynamic(path) -> str:
    return subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def stacks(systems, tmp_path_factory):
    """The donor venv on trixie with ``vend`` (a module needing :data:`SONAME` through the
    DT_RUNPATH :data:`VENDOR`, and one whose DT_RUNPATH is a build tree); the library in
    :data:`VENDOR` on trixie and its twin, not on bookworm; empty venvs of the same Python on both targets."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    if shutil.which("cc") is None or shutil.which("readelf") is None:
        pytest.skip("no C compiler (cc) or readelf on this machine to build the modules")
    tmp = tmp_path_factory.mktemp("runpath")
    library = _compile(tmp, SONAME, "int vendor_answer(void) { return 42; }\n", f"-Wl,-soname,{SONAME}")
    (tmp / "libtransplantvendor.so").symlink_to(SONAME)
    module = _compile(tmp, "vend.so", "int vendor_answer(void);\nint vend(void) { return vendor_answer(); }\n",
                      f"-L{tmp}", "-ltransplantvendor", f"-Wl,-rpath,{VENDOR}", "-Wl,--enable-new-dtags")
    idle = _compile(tmp, "idle.so", "int idle(void) { return 0; }\n", f"-Wl,-rpath,{BUILD_TREE}",
                    "-Wl,--enable-new-dtags")
    dynamic = _readelf_dynamic(tmp / "vend.so")
    assert "(RUNPATH)" in dynamic and VENDOR in dynamic and f"[{SONAME}]" in dynamic, dynamic
    wheel = build_wheel(tmp, "vend", "1.0", {"vend/__init__.py": "", MODULE: module, IDLE: idle},
                        tag="cp311-cp311-linux_x86_64")
    python = f"{build}/bin/python3"
    for name in ("trixie", "bookworm", "trixie-twin"):
        host = systems.hosts[name]
        host.run(["rm", "-rf", VENV, "/srv/wheels", "/opt/vendor"])
        host.run([python, "-m", "venv", "--without-pip", VENV])
    for name in ("trixie", "trixie-twin"):
        systems.hosts[name].install(f"{VENDOR}/{SONAME}", library, mode=0o755)
    trixie = systems.hosts["trixie"]
    trixie.install(f"/srv/wheels/{wheel.name}", wheel.read_bytes())
    trixie.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                "--prefix", VENV, f"/srv/wheels/{wheel.name}"])
    yield systems
    for name in ("trixie", "bookworm", "trixie-twin"):
        systems.hosts[name].run(["rm", "-rf", VENV, "/srv/wheels", "/opt/vendor"])


def plan_json(systems, tmp_path, target: str, capsys) -> tuple[int, dict]:
    """``transplant plan --json`` of ``vend`` from the trixie donor to ``target``: (exit code, plan document)."""
    manifest = tmp_path / f"to-{target}.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: ["vend"]
        """))
    code = main(["plan", str(manifest), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _runpath(doc: dict) -> dict[str, dict]:
    """The plan's ``runpath-outside-venv`` findings by severity (one of each at most)."""
    found = [f for f in doc["findings"] if f["code"] == "runpath-outside-venv"]
    by = {f["severity"]: f for f in found}
    assert len(by) == len(found), found
    return by


def test_a_library_found_only_through_a_donor_run_path_blocks_where_the_folder_is_missing(stacks, tmp_path, capsys):
    code, doc = plan_json(stacks, tmp_path, "bookworm", capsys)
    found = _runpath(doc)
    error = found["error"]
    assert error["dists"] == ["vend"] and f"{SONAME} from {VENDOR}" in error["message"]
    assert "the donor's host (trixie)" in error["message"] and "target's host (bookworm)" in error["message"]
    assert error["hint"].startswith(f"install {SONAME} on the target at {VENDOR}/{SONAME}")
    assert "$ORIGIN" in error["hint"]
    assert any(p.endswith(MODULE) for p in error["files"])
    # the donor finds the library: not host-library-missing's "the donor lacks it too"
    assert not [f for f in doc["findings"] if f["code"] == "host-library-missing" and f["dists"] == ["vend"]]
    assert code == 3  # an error blocks


def test_the_same_bytes_on_the_twin_with_the_folder_are_clean(stacks, tmp_path, capsys):
    code, doc = plan_json(stacks, tmp_path, "trixie-twin", capsys)
    found = _runpath(doc)
    assert "error" not in found
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert code == 0


@pytest.mark.parametrize("target", ["bookworm", "trixie-twin"])
def test_a_run_path_folder_the_donor_lacks_too_is_info_on_either_system(stacks, tmp_path, capsys, target):
    _, doc = plan_json(stacks, tmp_path, target, capsys)
    info = _runpath(doc)["info"]
    assert BUILD_TREE in info["message"] and "the donor's host has no such folder either" in info["message"]
    assert VENDOR not in info["message"]  # the donor loads its library from there
    assert [p for p in info["files"] if p.endswith(IDLE)] and not [p for p in info["files"] if p.endswith(MODULE)]
