"""What transplant reads back from a state folder is trusted no more than what it was given:
a plan memo edited after ``plan`` kept it is checked against its manifest (as a saved plan is),
and a state file or folder another user could have written (another owner, group- or
world-writable) is refused, as OpenSSH refuses a loose key, naming the file and the chmod/chown.

Real local venvs from real wheels (the plan memo tests' ``pair``), real memo files edited the way
a person would (inflate, edit the JSON, deflate), real modes and owners; nothing on the target
may change when a command is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib
from pathlib import Path

import pytest

from test_plan_memo import SITE, pair, plan  # noqa: F401  (the fixture, and plan --json)
from transplant.cli.app import main

NOBODY = 65534


def _tree(root: Path) -> str:
    """sha256 of every path, mode and content under ``root`` (symlinks as their text)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}\0{info.st_mode}\0".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _memo(root: Path) -> Path:
    (kept,) = (root / "state" / "plan-memo").glob("*.memo")
    return kept


def _edit_memo(root: Path, edit) -> None:
    kept = _memo(root)
    document = json.loads(zlib.decompress(kept.read_bytes()))
    edit(document["plan"], root)
    kept.write_bytes(zlib.compress(json.dumps(document).encode()))


def _change(plan: dict, name: str) -> dict:
    return next(c for c in plan["changes"] if c["name"] == name)


def _file_copy(path: str, data: bytes, **extra) -> dict:
    import base64

    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return {"path": path, "size": len(data), "hash": f"sha256={digest}", "source": "donor", "local": None,
            "head": None, "body_hash": None, "link": None, "record_identity": None, "record_scripts": [],
            **extra}


def _retarget(plan: dict, root: Path) -> None:
    plan["target"]["venv"] = str(root / "victim")


def _unlisted_distribution(plan: dict, root: Path) -> None:
    data = (root / "donor" / SITE / "bar" / "__init__.py").read_bytes()
    plan["changes"].insert(0, {"kind": "distribution", "name": "bar", "action": "refresh", "reason": "edited",
                               "from_version": "1.0", "to_version": "1.0", "dist_info": f"{SITE}/bar-1.0.dist-info",
                               "unchanged": 0, "remove": [], "copy": [_file_copy(f"{SITE}/bar/__init__.py", data)]})


def _unlisted_patch_file(plan: dict, root: Path) -> None:
    data = (root / "m.yaml").read_bytes()
    plan["changes"].append({"kind": "patch", "name": f"{SITE}/evil.py", "action": "add", "reason": "edited",
                            "from_version": None, "to_version": None, "dist_info": None, "unchanged": 0,
                            "remove": [], "copy": [_file_copy(f"{SITE}/evil.py", data, source="patch",
                                                              local="m.yaml")]})


def _another_distribution_removed(plan: dict, root: Path) -> None:
    site = root / "target" / SITE
    files = sorted(str(p.relative_to(root / "target")) for p in [*site.glob("bar/*"), *site.glob("bar-1.0.dist-info/*")])
    plan["changes"].insert(0, {"kind": "distribution", "name": "bar", "action": "remove", "reason": "edited",
                               "from_version": "1.0", "to_version": None, "dist_info": None, "unchanged": 0,
                               "remove": files, "copy": []})


def _another_distributions_metadata_removed(plan: dict, root: Path) -> None:
    foo = _change(plan, "foo")
    foo["remove"] = sorted([*foo["remove"], f"{SITE}/bar-1.0.dist-info/RECORD", f"{SITE}/bar-1.0.dist-info/METADATA"])


def _patch_copied_elsewhere(plan: dict, root: Path) -> None:
    patch = next(c for c in plan["changes"] if c["kind"] == "patch")
    patch["copy"][0]["local"] = "m.yaml"


TAMPERED = {
    "retargeted-venv": (_retarget, "its target is local:"),
    "distribution-the-overlay-does-not-select": (_unlisted_distribution, "distribution bar: the manifest's overlay "
                                                                          "does not select it"),
    "file-no-patch-names": (_unlisted_patch_file, "the manifest has no patch file for it"),
    "another-distribution-uninstalled": (_another_distribution_removed, "distribution bar: uninstalled, but the "
                                                                        "manifest's remove: does not name it"),
    "another-distributions-metadata-removed": (_another_distributions_metadata_removed,
                                               "lies in another distribution's metadata (bar)"),
    "patch-from-another-file": (_patch_copied_elsewhere, "does not copy exactly the manifest's patches/extra.py"),
}


@pytest.mark.parametrize("how", sorted(TAMPERED))
def test_an_edited_plan_memo_is_refused_by_apply_and_plan_and_nothing_changes(pair, capsys, how):  # noqa: F811 - pytest passes the imported fixture by this name
    edit, said = TAMPERED[how]
    shutil.copytree(pair / "target", pair / "victim", symlinks=True)
    plan(pair, capsys)  # keeps the memo
    _edit_memo(pair, edit)
    before = {side: _tree(pair / side) for side in ("target", "victim", "donor")}
    code = main(["apply", str(pair / "m.yaml"), "--yes"])
    out = " ".join("".join(capsys.readouterr()).split())
    assert code == 1, out
    assert "refusing the kept plan of" in out and said in out, out
    assert "rm " in out and "transplant plan" in out, "the hint removes the memo and plans afresh"
    assert "Traceback" not in out
    assert {side: _tree(pair / side) for side in before} == before, "nothing changed on any venv"
    # plan shows no edited plan either
    assert main(["plan", str(pair / "m.yaml")]) == 1
    assert "refusing the kept plan of" in " ".join("".join(capsys.readouterr()).split())


@pytest.mark.parametrize("overlay", ["overlay: [foo]", "overlay: [{closure: foo}]", "overlay: [foo]\nremove: [bar]",
                                     "overlay: ['f*']"])
def test_an_untouched_memo_still_passes_the_check_and_applies(pair, capsys, overlay):  # noqa: F811 - pytest passes the imported fixture by this name
    """The twin of the tampered memos: what plan kept (closures, globs and remove: too) is applied as kept."""
    m = pair / "m.yaml"
    m.write_text(m.read_text().replace("overlay: [foo]", overlay))
    plan(pair, capsys)
    assert main(["apply", str(m), "--yes"]) == 0
    out = " ".join("".join(capsys.readouterr()).split())
    assert "nothing changed on either venv since the plan of" in out, "the kept plan was used"
    assert (pair / "target" / SITE / "foo" / "__init__.py").read_text() == "V = 2\n"
    assert (pair / "target" / SITE / "bar").exists() == ("remove: [bar]" not in overlay)


def _group_writable_memo(root: Path) -> tuple[Path, str]:
    _memo(root).chmod(0o664)
    return _memo(root), "chmod go-w"


def _world_writable_memo_folder(root: Path) -> tuple[Path, str]:
    folder = root / "state" / "plan-memo"
    folder.chmod(0o777)
    return folder, "chmod go-w"


def _memo_of_another_user(root: Path) -> tuple[Path, str]:
    os.chown(_memo(root), NOBODY, NOBODY)
    return _memo(root), "chown "


def _state_folder_of_another_user(root: Path) -> tuple[Path, str]:
    os.chown(root / "state", NOBODY, NOBODY)
    return root / "state", "chown "


LOOSE = {"group-writable-memo": _group_writable_memo, "world-writable-memo-folder": _world_writable_memo_folder,
         "memo-owned-by-another-user": _memo_of_another_user,
         "state-folder-owned-by-another-user": _state_folder_of_another_user}


@pytest.mark.parametrize("how", sorted(LOOSE))
def test_a_state_file_another_user_could_write_is_refused_naming_it_and_the_fix(pair, capsys, how):  # noqa: F811 - pytest passes the imported fixture by this name
    if os.geteuid() != 0 and "another-user" in how:
        pytest.skip("giving a file to another user needs root")
    plan(pair, capsys)
    loose, fix = LOOSE[how](pair)
    before = _tree(pair / "target")
    for argv in (["apply", str(pair / "m.yaml"), "--yes"], ["plan", str(pair / "m.yaml")]):
        code = main(argv)
        out = " ".join("".join(capsys.readouterr()).split())
        assert code == 1, out
        assert f"{loose}: refusing the plan memo" in out and fix in out and str(loose) in out, out
        assert ("owned by nobody" in out) if "another-user" in how else ("writable by" in out), out
        assert "Traceback" not in out
    assert _tree(pair / "target") == before, "nothing changed on the target"


def test_the_memo_and_its_folders_are_made_private_whatever_the_umask(pair, capsys):  # noqa: F811 - pytest passes the imported fixture by this name
    shutil.rmtree(pair / "state", ignore_errors=True)
    old = os.umask(0o002)
    try:
        plan(pair, capsys)
    finally:
        os.umask(old)
    for path in (pair / "state", pair / "state" / "plan-memo", _memo(pair)):
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    assert "nothing changed on either venv" in plan(pair, capsys)[1], "and the next plan uses it"


def test_a_loose_history_or_state_folder_on_the_target_is_refused_there(pair, capsys):  # noqa: F811 - pytest passes the imported fixture by this name
    assert main(["apply", str(pair / "m.yaml"), "--yes"]) == 0
    capsys.readouterr()
    history = pair / "target" / ".transplant" / "history.jsonl"
    assert history.exists()
    history.chmod(0o662)
    assert main(["history", str(pair / "m.yaml")]) == 1
    out = " ".join("".join(capsys.readouterr()).split())
    assert f"{history} (the history) is writable by its group or others (mode 0662)" in out, out
    assert f"chmod go-w {history}" in out
    history.chmod(0o600)
    (pair / "target" / SITE / "bar" / "__init__.py").write_text("B = 2\n")  # something for an apply to do
    state = pair / "target" / ".transplant"
    os.chown(state, NOBODY, NOBODY)
    before = _tree(pair / "target")
    m = (pair / "m.yaml").read_text().replace("overlay: [foo]", "overlay: [foo, bar]")
    (pair / "m.yaml").write_text(m)
    code = main(["apply", str(pair / "m.yaml"), "--yes"])
    out = " ".join("".join(capsys.readouterr()).split())
    assert code == 1 and f"{state} (transplant's state folder in the venv) is owned by uid {NOBODY}" in out, out
    assert _tree(pair / "target") == before, "nothing changed on the target"


def test_a_loose_verified_log_and_snapshot_index_are_refused(pair, capsys, tmp_path):  # noqa: F811 - pytest passes the imported fixture by this name
    from transplant.donor.snapshot import load_snapshot
    from transplant.errors import StateError
    from transplant.recover.provenance import known_states

    log = pair / "state" / "verified.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps({"host": "local", "venv": str(pair / "target")}) + "\n")
    assert known_states(log), "a private log is read"
    log.chmod(0o646)
    with pytest.raises(StateError, match="the verified log.*writable by others"):
        known_states(log)
    assert main(["snapshot", str(pair / "m.yaml"), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)["id"]
    index = pair / "state" / "snapshots" / "index" / f"{snap}.json"
    assert load_snapshot(snap).id == snap
    index.parent.chmod(0o777)
    with pytest.raises(StateError, match="the snapshot index"):
        load_snapshot(snap)
    m = pair / "m.yaml"
    m.write_text(m.read_text().replace(f"{{host: local, venv: {pair / 'donor'}}}", f"{{snapshot: {snap}}}"))
    before = _tree(pair / "target")
    assert main(["apply", str(m), "--yes"]) != 0
    out = " ".join("".join(capsys.readouterr()).split())
    assert "writable by" in out and "chmod go-w" in out and "Traceback" not in out, out
    assert _tree(pair / "target") == before
