"""After an apply stopped very early no state folder stays: the target's lock appears whole or not
at all (an applier killed as it takes the lock, at a Ctrl-C, leaves no lock nobody can read), and
``tidy`` removes what a killed applier left: a lock's temporary file, a begin stopped part-way
(real applier processes in a real venv)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from transplant import remote
from transplant.apply import txn
from transplant.hosts.host import LocalHost
from transplant.lab.wheels import make_venv


def test_an_applier_killed_as_the_lock_appears_leaves_it_readable(tmp_path):
    """Created in place, the lock was empty until its entry was written; killed at that moment (a
    third of the time here, 30 tries) the applier left an empty lock, so the interrupted apply could
    not release it and its state folder stayed (the flaky Ctrl-C test under load)."""
    venv = make_venv(tmp_path / "v")
    state = venv / ".transplant"
    request = json.dumps({"op": "lock", "request": {"id": "t1", "controller": "here", "pid": 1, "command": "apply"}})
    code = remote.source("applier").decode()
    for attempt in range(12):
        subprocess.run(["rm", "-rf", str(state)], check=True)
        proc = subprocess.Popen([str(venv / "bin" / "python"), "-I", "-S", "-c", code, "--session"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        proc.stdin.write(request.encode() + b"\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not (state / "lock").exists() and proc.poll() is None and time.monotonic() < deadline:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
        assert json.loads((state / "lock").read_text())["id"] == "t1", f"try {attempt}: an unreadable lock"


def test_tidy_removes_the_lock_temporary_of_a_killed_applier_not_of_a_running_one(tmp_path):
    venv = str(make_venv(tmp_path / "v"))
    state = tmp_path / "v" / ".transplant"
    (state / "txn").mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id no longer running
    (state / f"lock.{gone.pid}.tmp").write_text("{}")
    (state / f"lock.{os.getpid()}.tmp").write_text("{}")  # an applier still taking the lock
    assert txn.call(LocalHost(), venv, "tidy", {})["removed"] is False
    assert sorted(p.name for p in state.iterdir()) == [f"lock.{os.getpid()}.tmp"]
    (state / f"lock.{os.getpid()}.tmp").unlink()
    assert txn.call(LocalHost(), venv, "tidy", {})["removed"] is True and not state.exists()


def test_the_lock_is_taken_once_and_released(tmp_path):
    """The twin: taking, refusing and releasing the lock work as before, and leave no temporary file."""
    venv = str(make_venv(tmp_path / "v"))
    host = LocalHost()
    entry = {"id": "a", "controller": "here", "pid": os.getpid(), "command": "apply"}
    assert txn.call(host, venv, "lock", entry)["ok"]
    again = txn.call(host, venv, "lock", {**entry, "id": "b"}, check=False)
    assert not again["ok"] and again["held"]["id"] == "a"
    assert sorted(p.name for p in (tmp_path / "v" / ".transplant").iterdir()) == ["lock"]
    assert txn.call(host, venv, "unlock", {"id": "a"})["ok"]
    assert txn.call(host, venv, "lock", {**entry, "id": "b"})["ok"]


def test_tidy_removes_a_begin_killed_part_way_once_the_lock_is_released(tmp_path):
    """An apply stopped inside its begin (the applier killed before the rename into place) left a
    ``.begin-`` folder: the command said nothing began, yet the state folder stayed."""
    venv = str(make_venv(tmp_path / "v"))
    host = LocalHost()
    state = tmp_path / "v" / ".transplant"
    entry = {"id": "20261202T000000Z-aaaa", "controller": "here", "pid": os.getpid(), "command": "apply"}
    assert txn.call(host, venv, "lock", entry)["ok"]
    (state / "txn" / ".begin-20261202T000000Z-aaaa" / "staged").mkdir(parents=True)
    # the twin: while the lock is held a begin may be running: its folder stays
    assert txn.call(host, venv, "tidy", {})["removed"] is False
    assert (state / "txn" / ".begin-20261202T000000Z-aaaa").is_dir()
    assert txn.call(host, venv, "unlock", {"id": entry["id"]})["ok"]
    assert txn.call(host, venv, "tidy", {})["removed"] is True and not state.exists()
