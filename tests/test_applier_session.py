"""One applier process per apply, rollback and resume: the applier's session mode
serves every step of a transaction, counted for real by the applier's own start log
(``TRANSPLANT_TEST_APPLIER_LOG``), on local venvs built from real wheels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transplant.apply import txn
from transplant.errors import HostError
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import ScriptSession

from alpha_pair import alpha_pair

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A donor with alpha 2.0 (five files) and a maker of fresh targets with alpha 1.0."""
    base = tmp_path_factory.mktemp("sess")
    made = alpha_pair(base, {f"alpha/m{i}.py": f"N = {i}\n" for i in range(4)})

    def target(name: str) -> tuple[Path, str]:
        venv, manifest = made(name)
        return venv, str(manifest)

    return base, target


def transplant(base: Path, *argv: str, **extra: str) -> tuple[int, list[str]]:
    """Run transplant as a process; returns its exit code and the applier processes it started."""
    log = base / "applier.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(base / "state"), "TRANSPLANT_TEST_APPLIER_LOG": str(log),
           "COLUMNS": "200", **extra}
    done = subprocess.run([sys.executable, "-m", "transplant", *argv], cwd=ROOT, env=env, capture_output=True)
    started = log.read_text().splitlines() if log.exists() else []
    return done.returncode, started


def test_an_apply_and_its_rollback_each_start_one_applier_process(pair):
    base, target = pair
    venv, manifest = target("once")
    code, started = transplant(base, "apply", manifest, "--yes")
    assert code == 0
    assert [line.split()[1] for line in started] == ["--session"], started
    assert (venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "alpha"
            / "m3.py").read_text() == "N = 3\n"
    code, started = transplant(base, "rollback", manifest, "--yes")
    assert code == 0
    assert [line.split()[1] for line in started] == ["--session"], started
    [done] = txn.history(LocalHost(), str(venv))["transactions"]
    assert done["state"] == "rolled-back"


def test_a_crashed_commit_is_resumed_through_one_process(pair):
    base, target = pair
    venv, manifest = target("crashed")
    code, started = transplant(base, "apply", manifest, "--yes", TRANSPLANT_TEST_CRASH_AFTER="2")
    assert code == 1
    # the session killed in its commit; the lock is given back by a fresh one
    assert [line.split()[1] for line in started] == ["--session", "--session"], started
    [pending] = txn.interrupted(LocalHost(), str(venv))
    assert pending["state"] == "committing"
    code, started = transplant(base, "apply", manifest, "--yes", "--resume")
    assert code == 0
    assert len(started) == 1, started
    assert not txn.interrupted(LocalHost(), str(venv))


def test_a_session_answers_each_line_and_survives_bad_ones(pair, tmp_path):
    base, target = pair
    venv, _ = target("lines")
    opened = ScriptSession(LocalHost(), str(venv), "applier")
    try:
        assert opened.request("pending", {})["exists"] is False
        assert opened.request("no-such-op", {}) == {"ok": False, "error": "unknown operation 'no-such-op'",
                                                    "served": 2}
        reply = opened.request("lock", {"id": "t1", "controller": "here", "pid": 1, "command": "test"})
        assert reply["ok"] and reply["served"] == 3 and opened.started == 1
    finally:
        opened.close()
    # the input closed mid-transaction: the process ended, the lock stays for the next command to judge
    again = txn.call(LocalHost(), str(venv), "lock", {"id": "t2"}, check=False)
    assert again["ok"] is False and again["held"]["id"] == "t1"


def test_lines_that_are_not_requests_get_an_error_reply_not_a_traceback(pair):
    from transplant import remote

    base, target = pair
    venv, _ = target("garbage")
    lines = b'not json\n[1, 2]\n{"op": "lock", "request": [1]}\n\n{"op": "pending"}\n'
    done = subprocess.run([str(venv / "bin" / "python"), "-I", "-S", "-c", remote.source("applier").decode(),
                           "--session"], input=lines, capture_output=True, timeout=60)
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["ok"] for r in replies] == [False, False, False, True]
    assert "not a JSON object" in replies[0]["error"] and "not a JSON object" in replies[2]["error"]
    assert replies[-1]["served"] == 4


def test_a_session_whose_process_died_starts_afresh(pair):
    """(Death in the middle of a request is the crashed commit above: an error, then a fresh process.)"""
    base, target = pair
    venv, _ = target("died")
    opened = ScriptSession(LocalHost(), str(venv), "applier")
    try:
        assert opened.request("pending", {})["ok"]
        opened._proc.kill()
        opened._proc.wait()
        assert opened.request("pending", {})["served"] == 1 and opened.started == 2
    finally:
        opened.close()


def test_a_missing_interpreter_is_named(tmp_path):
    opened = ScriptSession(LocalHost(), str(tmp_path / "nothing"), "applier")
    with pytest.raises(HostError, match="does not exist or points to nothing"):
        opened.request("pending", {})
    opened.close()


def test_a_reply_of_megabytes_is_read_whole_and_the_next_reply_after_it(pair):
    """A reply line far longer than one read (the real pair's transaction record: 37 MB) arrives
    whole, and the session's next reply is read from where it ended."""
    base, target = pair
    venv, _ = target("long")
    steps = [{"op": "put", "path": f"lib/python3.11/site-packages/pkg/{'deep/' * 8}m{i:05}.py"}
             for i in range(40000)]
    opened = ScriptSession(LocalHost(), str(venv), "applier")
    try:
        assert opened.request("lock", {"id": "t1", "controller": "here", "pid": 1, "command": "test"})["ok"]
        assert opened.request("begin", {"id": "20260101T000000Z-long", "steps": steps, "after": {},
                                        "bytes": 0, "source": "test"})["ok"]
        reply = opened.request("txn", {"id": "20260101T000000Z-long"})
        assert len(json.dumps(reply)) > 4_000_000 and reply["plan"]["steps"] == steps
        assert reply["before"] == {s["path"]: None for s in steps}
        assert opened.request("pending", {})["served"] == 4 and opened.started == 1
    finally:
        opened.close()
