"""Host-dependent judgments between lab hosts whose systems differ, each with its clean twin.

The donor runs on trixie (glibc 2.41), the target on bookworm (glibc 2.36) or on trixie's twin;
every venv runs the same CPython build (this machine's, bound into each host), so the systems
differ in glibc and libraries only. The same bytes get another verdict only where the fault
depends on what differs: a shared object built against glibc 2.41 that needs ``GLIBC_2.38``
cannot load on bookworm, while a fault inside the venv that the donor runs (a ``cpython-310``
module it carries) stays info on both targets."""

from __future__ import annotations

import json
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python

pytestmark = pytest.mark.hosts

VENV = "/srv/xs"
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


def plan_json(systems, tmp_path, target: str, capsys) -> tuple[int, dict]:
    manifest = tmp_path / f"to-{target}.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: [glx, kern, fido, plug]
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
