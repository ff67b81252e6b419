"""The whole flow between hosts whose systems differ: init, plan, apply, verify, rollback, a
snapshot and recover, from a bookworm donor (glibc 2.36) to a trixie target (glibc 2.41) and
back, with the demo's manifest shape. Every venv runs the same CPython build (this machine's,
bound into each host); ``cext`` is a real C extension compiled here against it, imported by
verify on each target's own glibc."""

from __future__ import annotations

import json
import subprocess
import sysconfig

import pytest

from transplant.cli import main
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python

pytestmark = pytest.mark.hosts

VENV = "/srv/flow"
EXTENSION = """
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c", NULL, -1, methods};
PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&module); }
"""


@pytest.fixture(scope="module")
def flow(systems, tmp_path_factory):
    """``/srv/flow`` on bookworm and trixie: alpha 1.1, beta 2.0 (needs alpha>=1.1) and cext on
    one side, alpha 1.0 on the other; each test picks the direction."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    tmp = tmp_path_factory.mktemp("flow")
    source = tmp / "c.c"
    source.write_text(EXTENSION)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = tmp / f"_c{suffix}"
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", str(built), str(source)],
                   check=True)
    tag = "cp311-cp311-linux_x86_64"
    wheels = {
        "alpha-1.1": build_wheel(tmp / "w1", "alpha", "1.1", {"alpha/__init__.py": "VERSION = '1.1'\n"}),
        "alpha-1.0": build_wheel(tmp / "w0", "alpha", "1.0", {"alpha/__init__.py": "VERSION = '1.0'\n"}),
        "beta": build_wheel(tmp / "w1", "beta", "2.0", {"beta/__init__.py": "import alpha\n"},
                            requires=("alpha>=1.1",)),
        "cext": build_wheel(tmp / "w1", "cext", "1.0", {"cext/__init__.py": "from cext._c import answer\n",
                                                        f"cext/_c{suffix}": built.read_bytes()}, tag=tag),
    }
    return systems, build, wheels


def prepare(flow, donor: str, target: str) -> None:
    systems, build, wheels = flow
    for name, which in ((donor, ("alpha-1.1", "beta", "cext")), (target, ("alpha-1.0",))):
        host = systems.hosts[name]
        host.run(["rm", "-rf", VENV, "/srv/flow-wheels"])
        host.run([f"{build}/bin/python3", "-m", "venv", "--without-pip", VENV])
        for key in which:
            host.install(f"/srv/flow-wheels/{wheels[key].name}", wheels[key].read_bytes())
        host.run([f"{build}/bin/python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                  "--disable-pip-version-check", "--prefix", VENV,
                  *[f"/srv/flow-wheels/{wheels[k].name}" for k in which]])


def versions(systems, name: str) -> dict[str, str]:
    out = systems.hosts[name].run([f"{VENV}/bin/python", "-c", "import importlib.metadata as m, json; print(json.dumps("
                                   "{d.metadata['Name']: d.version for d in m.distributions()}))"]).stdout
    return json.loads(out)


def ssh_flags(systems) -> list[str]:
    return ["--identity-file", str(systems.identity_file), "--known-hosts", str(systems.known_hosts)]


@pytest.mark.parametrize("donor, target", [("bookworm", "trixie"), ("trixie", "bookworm")])
def test_init_plan_apply_verify_rollback_across_systems(flow, tmp_path, capsys, donor, target):
    systems = flow[0]
    prepare(flow, donor, target)
    d, t = systems.hosts[donor], systems.hosts[target]
    manifest = tmp_path / "m.yaml"
    assert main(["init", "--donor", f"{d.spec}:{VENV}", "--target", f"{t.spec}:{VENV}", "--overlay", "beta",
                 "--overlay", "cext", "--out", str(manifest), *ssh_flags(systems)]) == 0
    capsys.readouterr()
    assert main(["plan", str(manifest), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert {c["name"]: c["action"] for c in doc["changes"]} == {"alpha": "upgrade", "beta": "add", "cext": "add"}
    assert main(["apply", str(manifest), "--yes"]) == 0
    assert versions(systems, target) == {"alpha": "1.1", "beta": "2.0", "cext": "1.0"}
    # the extension compiled against glibc 2.36 headers loads on the target's own glibc
    assert systems.hosts[target].run([f"{VENV}/bin/python", "-c", "import cext; print(cext.answer())"]).stdout == b"42\n"
    capsys.readouterr()
    assert main(["verify", str(manifest), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert {s["name"]: s["status"] for s in report["stages"]}["imports"] == "pass"
    assert main(["rollback", str(manifest), "--yes"]) == 0
    assert versions(systems, target) == {"alpha": "1.0"}


def test_snapshot_and_recover_onto_a_fresh_host_of_the_other_release(flow, tmp_path, capsys):
    systems = flow[0]
    prepare(flow, "bookworm", "trixie")
    d, t = systems.hosts["bookworm"], systems.hosts["trixie"]
    manifest = tmp_path / "m.yaml"
    assert main(["init", "--donor", f"{d.spec}:{VENV}", "--target", f"{t.spec}:{VENV}", "--overlay", "beta",
                 "--overlay", "cext", "--out", str(manifest), *ssh_flags(systems)]) == 0
    store = tmp_path / "store"
    assert main(["snapshot", str(manifest), "--out", str(store)]) == 0
    capsys.readouterr()
    assert main(["snapshot", "--out", str(store), "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    snapshots = listed if isinstance(listed, list) else listed.get("snapshots", [])
    [snap] = snapshots
    # the donor is gone; trixie's twin, holding alpha 1.0, is rebuilt from the snapshot alone
    twin = systems.hosts["trixie-twin"]
    twin.run(["rm", "-rf", VENV])
    twin.run([f"{flow[1]}/bin/python3", "-m", "venv", "--without-pip", VENV])
    assert main(["recover", "--target", f"{twin.spec}:{VENV}", "--snapshot", snap["id"], "--out", str(store),
                 "--yes", *ssh_flags(systems)]) == 0
    assert versions(systems, "trixie-twin") == {"alpha": "1.1", "beta": "2.0", "cext": "1.0"}
    assert twin.run([f"{VENV}/bin/python", "-c", "import cext; print(cext.answer())"]).stdout == b"42\n"


def test_init_proposes_no_smoke_pass_where_no_torch_will_be(flow, tmp_path):
    systems = flow[0]
    prepare(flow, "bookworm", "trixie")
    d, t = systems.hosts["bookworm"], systems.hosts["trixie"]
    manifest = tmp_path / "m.yaml"
    assert main(["init", "--donor", f"{d.spec}:{VENV}", "--target", f"{t.spec}:{VENV}", "--overlay", "beta",
                 "--out", str(manifest), *ssh_flags(systems)]) == 0
    text = manifest.read_text()
    assert "imports: [alpha, beta]" in text and "smoke:" not in text


def test_a_target_that_is_no_venv_is_refused_even_with_force(flow, tmp_path, capsys):
    """The target named is a Debian host's own Python, ``/usr`` (``/usr/bin/python`` as Debian's
    python-is-python3 makes it; no pyvenv.cfg): plan names it, apply refuses it with ``--force``
    too and writes nothing; ``allow_shared_interpreter: true``, said loudly in the manifest, makes
    it a warning."""
    systems = flow[0]
    prepare(flow, "trixie", "bookworm")
    d, t = systems.hosts["trixie"], systems.hosts["bookworm"]
    t.run(["ln", "-sf", "python3", "/usr/bin/python"])
    try:
        _refused_then_allowed(systems, d, t, tmp_path, capsys)
    finally:
        t.run(["rm", "-f", "/usr/bin/python"])


def _refused_then_allowed(systems, d, t, tmp_path, capsys) -> None:
    listing = ["sh", "-c", "ls -R /usr/lib/python3 /usr/local/lib 2>/dev/null | md5sum"]
    before = t.run(listing).stdout

    def manifest(extra: str = "") -> str:
        path = tmp_path / f"prefix{len(extra)}.yaml"
        path.write_text(f"version: 1\ndonor: {{host: \"{d.spec}\", venv: {VENV}}}\n"
                        f"target: {{host: \"{t.spec}\", venv: /usr{extra}}}\n"
                        f"ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}\n"
                        f"overlay: [beta]\n")
        return str(path)

    capsys.readouterr()
    assert main(["plan", manifest(), "--json"]) != 0
    doc = json.loads(capsys.readouterr().out)
    [finding] = [f for f in doc["findings"] if f["code"] == "target-not-a-venv"]
    assert finding["severity"] == "error" and "is not a venv (no pyvenv.cfg)" in finding["message"]
    assert "allow_shared_interpreter: true" in finding["hint"]
    assert main(["apply", manifest(), "--yes", "--force"]) != 0
    said = " ".join(capsys.readouterr().out.split())
    assert "target-not-a-venv" in said, said
    assert t.run(listing).stdout == before, "nothing was written into the host's Python"
    main(["plan", manifest(", allow_shared_interpreter: true"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [f["severity"] for f in doc["findings"] if f["code"] == "target-not-a-venv"] == ["warning"]
