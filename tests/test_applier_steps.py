"""The applier's per-step checks on a transaction of many steps: each folder is resolved and
judged once per operation, and every step is still checked on its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transplant.remote import applier


@pytest.fixture()
def prefix(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    site = venv / "lib" / "site"
    site.mkdir(parents=True)
    (site / "a.py").write_text("a\n")
    (site / "pkg").mkdir()  # a folder where a step names a file
    (venv / "ro").mkdir()
    return venv


def test_a_step_naming_a_folder_is_refused_also_after_another_step_in_its_folder(prefix: Path):
    steps = [{"op": "put", "path": "lib/site/a.py"}, {"op": "put", "path": "lib/site/new.py"},
             {"op": "del", "path": "lib/site/pkg"}, {"op": "put", "path": "lib/site/deeper/new.py"}]
    assert applier._writable_problems(str(prefix), steps) == ["lib/site/pkg: is a folder, not a file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a folder without write permission")
def test_an_unwritable_folder_is_said_once(prefix: Path):
    (prefix / "ro").chmod(0o555)
    try:
        steps = [{"op": "put", "path": f"ro/{i}.py"} for i in range(3)] + [{"op": "put", "path": "ro/sub/x.py"}]
        assert applier._writable_problems(str(prefix), steps) == ["ro: not writable by this user"]
    finally:
        (prefix / "ro").chmod(0o755)


def test_a_folder_symlinked_out_of_the_venv_is_refused_for_every_step_and_each_operation(prefix: Path,
                                                                                          tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, prefix / "lib" / "out")
    for _ in range(2):  # the folder cache of one operation never lets a later one through
        with pytest.raises(applier.Refused, match="leaves the venv"):
            applier._resolve(str(prefix), "lib/out/x.py")
        assert applier._resolve(str(prefix), "lib/site/a.py") == str(prefix / "lib" / "site" / "a.py")
    applier._REAL_FOLDERS.clear()


def test_answer_resolves_folders_afresh_for_each_operation(prefix: Path, tmp_path: Path):
    """A folder resolved by one operation and then replaced by a symlink leading out of the venv
    is refused by the next operation (the cache lives for one operation)."""
    steps = [{"op": "put", "path": "lib/site/moved/x.py"}]
    (prefix / "lib" / "site" / "moved").mkdir()
    reply = applier.answer(str(prefix), "begin", {"id": "t1", "steps": steps, "after": {}, "bytes": 0})
    assert reply["ok"] is True, reply
    outside = tmp_path / "outside2"
    outside.mkdir()
    (prefix / "lib" / "site" / "moved").rmdir()
    os.symlink(outside, prefix / "lib" / "site" / "moved")
    reply = applier.answer(str(prefix), "begin", {"id": "t2", "steps": steps, "after": {}, "bytes": 0})
    assert reply["ok"] is False and "leaves the venv" in reply["error"], reply
    assert list(outside.iterdir()) == []


def test_a_file_where_a_step_needs_a_folder_is_refused_before_the_commit(prefix: Path):
    """A file named like a folder a step writes in (``sub`` a file, the step ``sub/x.py``; a stray
    file named like a dist-info folder) is refused by begin, not found by the commit half-way."""
    site = prefix / "lib" / "site"
    (site / "sub").write_text("a file, not a folder\n")
    (site / "pkg-2.0.dist-info").write_text("a stray file\n")
    steps = [{"op": "put", "path": "lib/site/sub/__init__.py"}, {"op": "put", "path": "lib/site/sub/deeper/x.py"},
             {"op": "put", "path": "lib/site/pkg-2.0.dist-info/METADATA"}]
    assert applier._writable_problems(str(prefix), steps) == [
        "lib/site/sub: is a file, not a folder", "lib/site/pkg-2.0.dist-info: is a file, not a folder"]


def test_each_folder_resolves_as_realpath_says(tmp_path: Path):
    """The applier's cached folder resolution (one lstat a folder, from its parent's answer) gives
    exactly ``os.path.realpath`` for folders through symlinks (relative, absolute, chained, to a
    file, dangling, a loop), missing parts and real folders: it decides what leaves the venv."""
    root = tmp_path / "r"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "out" / "deep").mkdir(parents=True)
    (root / "file").write_text("x")
    (root / "a" / "rel").symlink_to("../out")
    (root / "a" / "abs").symlink_to(root / "out" / "deep")
    (root / "a" / "chain").symlink_to("rel/deep")
    (root / "a" / "tofile").symlink_to("../file")
    (root / "a" / "dangling").symlink_to("../nowhere/x")
    (root / "a" / "loop1").symlink_to("loop2")
    (root / "a" / "loop2").symlink_to("loop1")
    names = ["a/b/c", "a/b/c/missing/more", "a/rel", "a/rel/deep", "a/rel/deep/new", "a/abs", "a/abs/x/y",
             "a/chain", "a/chain/z", "a/tofile", "a/tofile/under", "a/dangling", "a/dangling/q", "a/loop1/w",
             "file/x", "nothing/at/all", "a/b/../rel/deep", "a/./b", "a//b"]
    applier._REAL_FOLDERS.clear()
    try:
        for name in names + names:  # the second time from the cache
            folder = f"{root}/{name}"
            assert applier._real_dir(folder) == os.path.realpath(folder), name
    finally:
        applier._REAL_FOLDERS.clear()


def test_a_running_commit_is_named_by_a_numeric_pid_and_none_when_nothing_runs(prefix: Path):
    """``pending``'s ``active`` is what the controller accepts (a number or null): it was the lock
    file's text, which the controller refused while another apply committed."""
    import fcntl

    assert applier.active(str(prefix)) is None
    state = prefix / applier.STATE
    state.mkdir(mode=0o700, exist_ok=True)
    path = state / "active"
    path.write_text("4242")
    assert applier.active(str(prefix)) is None  # written but not held: nothing runs
    with open(path, "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert applier.active(str(prefix)) == 4242
        path.write_text("")  # held, its pid not written yet
        assert applier.active(str(prefix)) == 0
