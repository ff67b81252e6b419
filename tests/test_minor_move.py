"""A pure-Python distribution moves between venvs of two Python minors: its site-packages files
land at the same path below the target's site-packages (read where the donor has them:
``FileCopy.donor_path``), its RECORD stays valid, its console scripts name the target's
interpreter; a distribution with binaries stays blocked. Pure-core plans built as data, then
real local venvs (a pyenv 3.13 or 3.12 donor, this machine's 3.11 target) through plan, apply,
verify and rollback."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inventory_docs import SITE, dist, document
from transplant.apply.execute import check_plan_paths
from transplant.cli.app import main
from transplant.core.inventory import parse_inventory
from transplant.core.manifest import parse_manifest
from transplant.core.plan import FileCopy, moved_roots, plan_from_dict
from transplant.core.planner import plan
from transplant.errors import ApplyError
from transplant.lab.wheels import build_wheel

SITE13 = "lib/python3.13/site-packages"
DONOR, TARGET = "/donor/venv", "/target/venv"


def at(entry: dict, site: str) -> dict:
    """A ``dist()`` entry as installed in another site-packages (its venv paths moved there)."""
    out = dict(entry, site_packages=site)
    out["record"] = [dict(r, venv_path=r["venv_path"].replace(SITE, site, 1)) for r in entry["record"]]
    return out


def pure(name: str, files: dict[str, str], **kw) -> dict:
    entry = dist(name, "1.0", files, **kw)
    entry["wheel"] = dict(entry["wheel"], root_is_purelib=True, tags=["py3-none-any"])
    return entry


def inventory(prefix: str, python: str, site: str, dists: list[dict]):
    doc = document(prefix, [at(d, site) for d in dists], python=python)
    doc["paths"].update(purelib=site, platlib=site)
    return parse_inventory(doc, label=f"h:{prefix}")


def manifest(overlay: list[str]):
    return parse_manifest({"version": 1, "donor": {"host": "root@d", "venv": DONOR},
                           "target": {"host": "root@t", "venv": TARGET}, "overlay": overlay}, path="m.yaml")


def minor_findings(result):
    return [(f.severity, f.dists) for f in result.findings if f.code == "python-version-mismatch"]


PUREPKG = {"purepkg/__init__.py": "X = 1\n", "purepkg/__pycache__/__init__.cpython-313.pyc": "pyc313"}
SCRIPT = {"tool": f"#!{DONOR}/bin/python3.13\nimport purepkg\n"}
EXT = dist("ext313", "1.0", {"ext313/__init__.py": "", "ext313/_x.cpython-313-x86_64-linux-gnu.so": "elf"},
           tags=["cp313-cp313-linux_x86_64"])


def test_a_pure_distribution_moves_to_the_targets_site_packages_and_one_with_binaries_stays_blocked():
    donor = inventory(DONOR, "3.13.1", SITE13, [pure("purepkg", PUREPKG, scripts=SCRIPT), EXT])
    target = inventory(TARGET, "3.11.7", SITE, [])
    result = plan(manifest(["purepkg", "ext313"]), donor, target)
    change = {c.name: c for c in result.changes}["purepkg"]
    assert change.dist_info == f"{SITE}/purepkg-1.0.dist-info"
    moved = {c.path: c.donor_path for c in change.copy}
    assert moved == {"bin/tool": None,
                     f"{SITE}/purepkg/__init__.py": f"{SITE13}/purepkg/__init__.py",
                     f"{SITE}/purepkg/__pycache__/__init__.cpython-313.pyc":
                         f"{SITE13}/purepkg/__pycache__/__init__.cpython-313.pyc",
                     f"{SITE}/purepkg-1.0.dist-info/RECORD": f"{SITE13}/purepkg-1.0.dist-info/RECORD"}
    script = next(c for c in change.copy if c.path == "bin/tool")
    assert script.head == f"#!{TARGET}/bin/python3.11\n"
    assert all(c.path in [] or c.donor_path is None for c in {c.name: c for c in result.changes}["ext313"].copy)
    assert minor_findings(result) == [("error", ("ext313",)), ("warning", ("purepkg",))]
    error = next(f for f in result.findings if f.code == "python-version-mismatch" and f.severity == "error")
    assert error.message.startswith("Python 3.13 vs 3.11: ") and "ext313 1.0: " in error.message
    assert "1 shared object (lib/python3.13/site-packages/ext313/_x.cpython-313-x86_64-linux-gnu.so)" in error.message
    assert error.hint.startswith("leave ext313 out of overlay in m.yaml")
    note = next(f for f in result.findings if f.code == "python-version-mismatch" and f.severity == "warning")
    assert f"from the donor's {SITE13} to the target's {SITE}" in note.message
    assert "__pycache__/*.cpython-313.pyc) are copied as RECORD lists them" in note.message
    assert [f.dists for f in result.findings if f.code == "python-abi-mismatch"] == [("ext313",)]
    alone = plan(manifest(["purepkg"]), donor, target)
    assert not alone.blocking and minor_findings(alone) == [("warning", ("purepkg",))]
    # the plan's JSON keeps where each file is read, and apply's path check takes it
    again = plan_from_dict(json.loads(json.dumps(alone.to_dict())), source="plan.json")
    assert again == alone
    check_plan_paths(again, Path("/nonexistent"))


def test_a_newer_target_gets_an_info_and_the_target_copy_is_compared_at_its_own_path():
    donor = inventory(DONOR, "3.11.7", SITE, [pure("purepkg", {"purepkg/__init__.py": "X = 1\n"})])
    site12 = "lib/python3.12/site-packages"
    same = inventory(TARGET, "3.12.3", site12, [pure("purepkg", {"purepkg/__init__.py": "X = 1\n"})])
    result = plan(manifest(["purepkg"]), donor, same)
    assert minor_findings(result) == [("info", ("purepkg",))]
    [change] = result.changes
    assert change.action == "keep" and not change.copy and not change.remove, change
    older = inventory(TARGET, "3.12.3", site12, [pure("purepkg", {"purepkg/__init__.py": "X = 0\n",
                                                                  "purepkg/old.py": ""})])
    [change] = plan(manifest(["purepkg"]), donor, older).changes
    assert [(c.path, c.donor_path) for c in change.copy if c.path.endswith(".py")] == [
        (f"{site12}/purepkg/__init__.py", f"{SITE}/purepkg/__init__.py")]
    assert change.remove == (f"{site12}/purepkg/old.py",)


def test_what_cannot_move_between_minors_is_named():
    excluded = pure("newsyntax", {"newsyntax/__init__.py": ""})
    excluded["requires_python"] = ">=3.12"
    data = pure("withdata", {"withdata/__init__.py": ""})
    data["record"].insert(0, {"path": "../../../include/site/python3.13/withdata/x.h",
                              "venv_path": "include/site/python3.13/withdata/x.h", "record_hash": None,
                              "record_size": None, "exists": True, "mode": 0o644, "size": 1})
    donor = inventory(DONOR, "3.13.1", SITE13, [excluded, data, dist("nowheel", "1.0", {"nowheel.py": ""})])
    target = inventory(TARGET, "3.11.7", SITE, [])
    result = plan(manifest(["newsyntax", "withdata", "nowheel"]), donor, target)
    [error] = [f for f in result.findings if f.code == "python-version-mismatch"]
    assert error.severity == "error" and error.dists == ("newsyntax", "nowheel", "withdata")
    assert "its Requires-Python >=3.12 excludes 3.11.7" in error.message
    assert "1 file outside site-packages in a folder of the donor's Python (include/site/python3.13/withdata/x.h)" \
        in error.message
    assert "its WHEEL says Root-Is-Purelib: false" in error.message
    assert all(c.donor_path is None for c in result.changes for c in c.copy)


def test_apply_refuses_a_donor_path_that_leaves_the_venv_or_names_another_file():
    assert moved_roots(f"{SITE13}/a/b.py", f"{SITE}/a/b.py") == ("lib/python3.13", "lib/python3.11",
                                                                  "site-packages/a/b.py")
    assert moved_roots("x/a.py", "y/b.py") is None
    donor = inventory(DONOR, "3.13.1", SITE13, [pure("purepkg", {"purepkg/__init__.py": "X = 1\n"})])
    good = plan(manifest(["purepkg"]), donor, inventory(TARGET, "3.11.7", SITE, []))
    for bad in ("../etc/passwd", f"{SITE13}/purepkg/other.py"):
        change = good.changes[0]
        copies = tuple(FileCopy(path=c.path, size=c.size, hash=c.hash, donor_path=bad) if c.donor_path else c
                       for c in change.copy)
        edited = good.__class__(**{**good.__dict__, "changes": (change.__class__(**{**change.__dict__,
                                                                                    "copy": copies}),)})
        with pytest.raises(ApplyError, match="refusing the plan"):
            check_plan_paths(edited, Path("/nonexistent"))


# -- real venvs: a pyenv 3.13 (or 3.12) donor, this machine's 3.11 target ----------------------------

def _other_minor() -> Path | None:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = sorted(Path("/root/.pyenv/versions").glob("3.1[2-9].*/bin/python3"), reverse=True) \
        if Path("/root/.pyenv/versions").is_dir() else []
    return next((p for p in found if p.exists() and not p.parent.parent.name.startswith(here + ".")), None)


OTHER = _other_minor()


def _record_valid(venv: Path, dist_info: Path) -> list[str]:
    """RECORD rows whose file is missing or differs from its hash and size (paths relative to site-packages)."""
    bad = []
    with open(dist_info / "RECORD", newline="") as f:
        for row in csv.reader(f):
            path, digest, size = row[0], row[1], row[2]
            where = (dist_info.parent / path).resolve()
            if not where.is_file() or not str(where).startswith(str(venv.resolve())):
                bad.append(f"{path}: missing")
            elif digest:
                data = where.read_bytes()
                mine = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                if mine != digest or int(size) != len(data):
                    bad.append(f"{path}: differs")
    return bad


@pytest.mark.skipif(OTHER is None, reason="needs a second Python minor (pyenv) for the donor venv")
@pytest.mark.parametrize("way", ["stream", "rsync"])
def test_a_pure_distribution_plans_applies_verifies_and_rolls_back_between_minors(way, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TRANSPLANT_TRANSFER", way)
    wheels = tmp_path / "wheels"
    tool = build_wheel(wheels, "purepkg", "1.0", {"purepkg/__init__.py": "X = 1\n",
                                                  "purepkg/cli.py": "def main():\n    print('ran purepkg')\n"},
                       entry_points="[console_scripts]\npuretool = purepkg.cli:main\n")
    ext = build_wheel(wheels, "extmod", "1.0", {"extmod/__init__.py": "",
                                                "extmod/_x.cpython-313-x86_64-linux-gnu.so": b"\x7fELF"},
                      tag="cp313-cp313-linux_x86_64")
    donor, target = tmp_path / "donor", tmp_path / "target"
    subprocess.run([str(OTHER), "-m", "venv", "--without-pip", str(donor)], check=True)
    theirs = subprocess.run([str(donor / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(donor / "bin" / "python"), "install", "-q",
                    "--no-index", "--no-deps", "--disable-pip-version-check", str(tool), str(ext)], check=True)
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(target)],
                   check=True)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    donor_site, target_site = donor / "lib" / f"python{theirs}" / "site-packages", target / "lib" / f"python{here}" / "site-packages"
    cached = sorted(p.name for p in (donor_site / "purepkg" / "__pycache__").iterdir())
    assert cached and all(f".cpython-{theirs.replace('.', '')}.pyc" in n for n in cached), cached

    def write(overlay: str) -> str:
        m = tmp_path / "m.yaml"
        m.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {donor}}}
            target: {{host: local, venv: {target}}}
            overlay: {overlay}
            verify: {{imports: [purepkg]}}
            """))
        return str(m)

    assert main(["plan", write("[purepkg, extmod]"), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    minor = sorted((f["severity"], f["dists"]) for f in doc["findings"] if f["code"] == "python-version-mismatch")
    assert minor == [("error", ["extmod"]), ("warning", ["purepkg"])]
    m = write("[purepkg]")
    assert main(["plan", m, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert (target_site / "purepkg" / "__init__.py").read_text() == "X = 1\n"
    assert not (target / "lib" / f"python{theirs}").exists(), "nothing lands in the donor's minor's folder"
    dist_info = target_site / "purepkg-1.0.dist-info"
    assert _record_valid(target, dist_info) == []
    assert sorted(p.name for p in (target_site / "purepkg" / "__pycache__").iterdir()) == cached  # inert on 3.11
    script = target / "bin" / "puretool"
    head = script.read_text().splitlines()[0]
    assert head in (f"#!{target}/bin/python", f"#!{target}/bin/python{here}") and Path(head[2:]).exists(), head
    ran = subprocess.run([str(script)], capture_output=True, text=True, check=True)
    assert ran.stdout == "ran purepkg\n"
    imported = subprocess.run([str(target / "bin" / "python"), "-c", "import purepkg; print(purepkg.__file__)"],
                              capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == str(target_site / "purepkg" / "__init__.py")
    code = main(["verify", m, "--json"])
    said = capsys.readouterr().out
    assert code == 0, said
    assert main(["plan", m, "--json"]) == 0  # applied: nothing left to copy
    doc = json.loads(capsys.readouterr().out)
    assert all(c["action"] == "keep" for c in doc["changes"]), doc["changes"]
    assert main(["rollback", m, "--yes"]) == 0
    assert not (target_site / "purepkg").exists() and not dist_info.exists() and not script.exists()


@pytest.mark.skipif(OTHER is None, reason="needs a second Python minor (pyenv) for the donor venv")
def test_a_moved_distributions_generated_modules_are_judged_against_the_targets_protobuf(tmp_path, monkeypatch,
                                                                                         capsys):
    """Generated ``_pb2.py`` modules are pure Python, so their distribution moves between minors; the
    probe's stamps are keyed by the donor's site-packages path, and the rule must still find them at
    the path the moved files land on: protobuf 5.27.0 gencode meeting the target's 4.25.3 is refused."""
    from test_gencode import _pb2

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    old = build_wheel(wheels / "old", "protobuf", "4.25.3", {"google/protobuf/__init__.py": "__version__ = '4.25.3'\n"})
    new = build_wheel(wheels / "new", "protobuf", "5.27.0", {"google/protobuf/__init__.py": "__version__ = '5.27.0'\n"})
    svc = build_wheel(wheels / "svc", "svc", "1.0", {"svc/__init__.py": "", "svc/api_pb2.py": _pb2("5.27.0", "svc/api.proto")})
    donor, target = tmp_path / "donor", tmp_path / "target"
    subprocess.run([str(OTHER), "-m", "venv", "--without-pip", str(donor)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(donor / "bin" / "python"), "install", "-q",
                    "--no-index", "--no-deps", "--disable-pip-version-check", str(new), str(svc)], check=True)
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(target)],
                   check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install", "-q",
                    "--no-index", "--no-deps", "--disable-pip-version-check", str(old)], check=True)
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                 f"overlay: [svc]\n")
    capsys.readouterr()
    main(["plan", str(m), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [(f["severity"], f["dists"]) for f in doc["findings"] if f["code"] == "python-version-mismatch"] == [
        ("warning", ["svc"])]
    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    [f] = [f for f in doc["findings"] if f["code"] == "gencode-runtime-mismatch"]
    assert f["severity"] == "error" and f["dists"] == ["svc", "protobuf"]
    assert f["files"] == [f"lib/{here}/site-packages/svc/api_pb2.py"]
