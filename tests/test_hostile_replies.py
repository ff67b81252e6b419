"""A target whose applier session answers badly: the target venv's ``bin/python`` is a real script
that runs the real interpreter for every host script but the applier's session, which it answers
with truncated JSON, lines that are not JSON, a document 200,000 levels deep, a line far past the
reply limit, a stalled reply, a process that reads nothing, or ``{"ok": true}`` to everything. Each
gives one clear error naming the host and venv, in bounded time, with every process it started
ended (by the pids it recorded) and nothing on the target changed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from transplant.apply import txn
from transplant.errors import HostError
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import ScriptSession
from transplant.lab.wheels import build_wheel, make_venv

from alpha_pair import alpha_pair

ROOT = Path(__file__).resolve().parent.parent
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"

#: The applier session's stand-in: reads requests (one per line) and answers as MODE says.
HOSTILE = r'''
import json, os, sys, time
mode = sys.argv[1]
out = sys.stdout.buffer
served = 0
if mode == "deaf":  # never reads a request: a controller writing a large one must not block for good
    time.sleep(3600)
for line in sys.stdin.buffer:
    served += 1
    if mode == "truncated":
        out.write(b'{"ok": true, "error": nu\n')
    elif mode == "garbage":
        out.write(b"\x1b]0;owned\x07\x1b[2Jthis is not json\n")
    elif mode == "deep":
        out.write(b"[" * 200000 + b"]" * 200000 + b"\n")
    elif mode == "long":
        chunk = b"x" * (1 << 20)
        for _ in range(64):
            out.write(chunk)
    elif mode == "stall":
        out.write(b'{"ok": true, "served": ')
        out.flush()
        time.sleep(3600)
    elif mode == "ok":
        out.write(b'{"ok": true}\n')
    elif mode == "ok-counted":
        out.write(json.dumps({"ok": True, "served": served}).encode() + b"\n")
    elif mode == "evil-error":  # a failure whose text would repaint and retitle a terminal
        out.write(json.dumps({"ok": False, "served": served,
                              "error": "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202eevil\x9b31m"}).encode() + b"\n")
    elif mode == "out-of-step":
        out.write(json.dumps({"ok": True, "served": served + 1}).encode() + b"\n")
    out.flush()
if sys.argv[2:] != ["exit"]:
    time.sleep(3600)  # its input ended: a well-behaved applier exits; this one is ended by the controller
'''


def _hostile(venv: Path, mode: str, *, every: bool = False, linger: bool = True) -> Path:
    """Make ``venv``'s ``bin/python`` a script that runs :data:`HOSTILE` in ``mode`` for the
    applier's session (``every``: for every applier run, one-shot ones too) and the real
    interpreter (``bin/python-real``, so the venv is still its prefix) for everything else; each
    hostile process appends its pid to ``<venv>/../<name>.pids``; ``linger`` False: it exits when
    its input ends (else it stays until ended). Returns that file."""
    pids = venv.parent / f"{venv.name}.pids"
    script = venv.parent / f"{venv.name}-hostile.py"
    script.write_text(HOSTILE)
    python = venv / "bin" / "python"
    real = venv / "bin" / "python-real"
    os.rename(python, real)
    test = ('case "$a" in *"def session(prefix)"*) hostile=1;; esac' if every else '[ "$a" = --session ] && hostile=1')
    python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        hostile=
        for a in "$@"; do {test}; done
        if [ -n "$hostile" ]; then
          echo $$ >> '{pids}'
          exec '{real}' -I -S '{script}' '{mode}' {'' if linger and not every else 'exit'}
        fi
        exec "$(dirname "$0")/python-real" "$@"
        """))
    python.chmod(0o755)
    return pids


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its exit status is left)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _recorded(pids: Path) -> list[int]:
    return [int(p) for p in pids.read_text().split()] if pids.exists() else []


def _ended(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def tree(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under ``root`` (its state folder included), with its mode and content or link."""
    out = {}
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        info = p.lstat()
        body = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else ""
        out[str(p.relative_to(root))] = (info.st_mode, body)
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A donor with alpha 2.0 and a maker of fresh targets with alpha 1.0, each with its manifest."""
    base = tmp_path_factory.mktemp("hostile")
    target = alpha_pair(base, {"alpha/more.py": "M = 1\n"})

    return base, target


def _apply(base: Path, manifest: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(base / "state"), "COLUMNS": "200"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "transplant", "apply", str(manifest), "--yes"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, time.monotonic() - started


@pytest.mark.parametrize("mode, says", [
    ("truncated", "not JSON"),
    ("garbage", "not JSON"),
    ("deep", "nested too deeply"),
    ("ok", "does not count the requests served, as every reply of transplant's applier does"),
    ("ok-counted", "reply to looking for an interrupted transaction is not one the applier gives"),
    ("out-of-step", "out of step"),
])
def test_an_apply_whose_applier_session_answers_badly_fails_clearly_and_changes_nothing(pair, mode, says):
    base, target = pair
    venv, manifest = target(f"bad-{mode}")
    pids = _hostile(venv, mode)
    before = tree(venv)
    done, took = _apply(base, manifest)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output and "KeyError" not in output, output
    assert f"error: local:{venv}: " in output and says in output, output
    assert "\x1b" not in output and "\x07" not in output  # the garbage's escapes are shown, never sent
    assert took < 60, took
    started = _recorded(pids)
    assert started and _ended(started), (started, [p for p in started if _alive(p)])
    assert len(started) == 1  # broken: never started again for the apply's own clean-up
    assert tree(venv) == before


def _session(base, target, name: str, mode: str, **limits) -> tuple[ScriptSession, Path, Path]:
    venv, _ = target(name)
    pids = _hostile(venv, mode)
    return ScriptSession(LocalHost(), str(venv), "applier", **limits), venv, pids


@pytest.mark.parametrize("mode, limits, says", [
    ("long", {"limit": 4 << 20}, "reply passed 4.0 MiB without ending"),
    ("stall", {"stall": 1.0}, "reply (begun, 23 bytes so far) moved less than 65536 bytes in 1 s"),
])
def test_a_reply_past_its_size_or_stalled_once_begun_is_stopped(pair, mode, limits, says):
    """The limits themselves: a 64 MiB line against a 4 MiB limit, a reply that stops after its
    first bytes against a 1 s progress deadline (the defaults are 256 MiB and 60 s)."""
    base, target = pair
    opened, venv, pids = _session(base, target, f"limit-{mode}", mode, **limits)
    before = tree(venv)
    started = time.monotonic()
    with pytest.raises(HostError, match="local:.*" + says.replace("(", r"\(").replace(")", r"\)")):
        opened.request("pending", {}, timeout=600)
    assert time.monotonic() - started < 20
    assert _ended(opened.pids) and _ended(_recorded(pids))
    with pytest.raises(HostError, match=says.split()[0]):  # broken: the same error, nothing started
        opened.request("pending", {})
    assert opened.started == 1
    opened.close()
    assert tree(venv) == before


def test_a_process_that_reads_no_request_does_not_hold_the_controller(pair):
    """A request of megabytes to a process that never reads: the write stops at the progress
    deadline instead of blocking in ``write`` for good."""
    base, target = pair
    opened, venv, pids = _session(base, target, "deaf", "deaf", stall=1.0)
    started = time.monotonic()
    with pytest.raises(HostError, match=r"request \(it reads nothing\) moved less than"):
        opened.request("check", {"id": "x", "expect": {f"f{i:07}": "sha256=" + "0" * 64 for i in range(100000)}},
                       timeout=600)
    assert time.monotonic() - started < 20
    assert _ended(opened.pids) and _ended(_recorded(pids))
    opened.close()


def test_the_default_limits_are_generous_for_real_replies_and_finite():
    opened = ScriptSession(LocalHost(), "/nonexistent", "applier")
    assert 64 << 20 <= opened.limit <= 1 << 30 and 10 <= opened.stall <= 300 and opened.pace > 0


def test_ok_true_to_every_one_shot_operation_is_a_clear_error(pair):
    """Without a session (one process per operation) the reply's shape is checked the same."""
    base, target = pair
    venv, _ = target("ok-oneshot")
    pids = _hostile(venv, "ok", every=True)
    for op, request in (("history", {}), ("pending", {}), ("txn", {"id": "x"}), ("begin", {"id": "x", "steps": []})):
        with pytest.raises(HostError, match=f"local:{venv}: the applier's reply to .* is not one the applier gives "
                                            r"\(.* is missing, not "):
            txn.call(LocalHost(), str(venv), op, request)
    assert _ended(_recorded(pids), within=15)


@pytest.mark.parametrize("op, reply, problem", [
    ("pending", {"ok": True, "interrupted": [1], "lock": None, "active": None, "exists": True},
     "interrupted is [1], not a list of transactions"),
    ("begin", {"ok": True, "staged": "/x", "free": True, "needed": 1}, "free is true, not a byte count"),
    ("lock", {"ok": False, "error": None}, "a failed reply whose error is null"),
    ("lock", {"ok": 1}, "ok is 1, not true or false"),
    ("history", {"ok": True, "events": [], "transactions": [{"id": "a", "state": 3}]}, "transactions is"),
])
def test_reply_shapes_name_the_key_at_fault(op, reply, problem):
    assert problem in (txn.reply_problem(op, reply) or "")


def test_the_real_applier_replies_pass_their_shape_checks(pair):
    """Every operation an apply and its history use, answered by the real applier: no false alarm."""
    base, target = pair
    venv, manifest = target("real")
    done, _ = _apply(base, manifest)
    assert done.returncode == 0, done.stdout + done.stderr
    with txn.session(LocalHost(), str(venv)) as opened:
        record = txn.history(LocalHost(), str(venv))
        info = txn.call(LocalHost(), str(venv), "txn", {"id": record["transactions"][0]["id"]})
        assert txn.reply_problem("txn", info) is None and opened.started == 1


# -- text from a host reaches the terminal with its control characters shown ---------------------

EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202eevil\x9b31m"
RAW = ("\x1b]0;owned", "\x1b[2J", "\x1b[31mred", "\u202e", "\x9b31m")


def _in_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run ``argv`` with a pseudo-terminal as its standard input, output and error; all it wrote."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env, start_new_session=True)
    os.close(slave)
    got = bytearray()
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        got.extend(chunk)
    os.close(master)
    proc.wait(timeout=120)
    return got.decode("utf-8", "replace")


def test_a_hosts_error_text_is_shown_not_obeyed_on_a_terminal(pair):
    """The applier's error with CSI and OSC sequences, a C1 CSI and a bidirectional override, through
    ``transplant apply`` on a real pseudo-terminal: every one is shown as its escape."""
    base, target = pair
    venv, manifest = target("evil")
    pids = _hostile(venv, "evil-error", linger=False)
    before = tree(venv)
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(base / "state"), "COLUMNS": "200", "TERM": "xterm"}
    out = _in_a_terminal([sys.executable, "-m", "transplant", "apply", str(manifest), "--yes"], env)
    assert "transaction failed: \\x1b]0;owned\\x1b[2J\\x1b[31mred\\u202eevil\\x9b31m" in out, out
    assert not any(raw in out for raw in RAW), repr(out)
    assert _ended(_recorded(pids)) and tree(venv) == before


def _renders(console) -> None:
    """Plain lines, an error, a rich table, a plan-like line and the progress lines, each with host text."""
    from rich.table import Table
    from rich.text import Text

    from transplant.cli.progress import ByteProgress, step
    from transplant.cli.render import history_table

    console.print(f"donor source: host{EVIL}:/venv", markup=False)
    table = Table(title=f"plan: {EVIL}")
    table.add_column("distribution")
    table.add_row(Text(f"dist{EVIL}"))
    console.print(table)
    console.print(history_table([{"id": f"t{EVIL}", "state": "committed", "source": f"h:{EVIL}"}],
                                [{"id": f"t{EVIL}", "event": f"applied{EVIL}", "time": 0}], f"h:{EVIL}"))
    with step(console, f"probing {EVIL}") as update:
        update(f"reading {EVIL}")
    progress = ByteProgress(console, 100, {})
    with progress:
        progress.step(f"copying {EVIL}")
        progress.note(f"note {EVIL}")
        progress.progress(50, 100)


def test_every_renderer_shows_control_characters_off_and_on_a_terminal():
    import io
    import pty
    import threading

    from transplant.cli.app import _console

    plain = io.StringIO()
    _renders(_console(plain, 120))
    master, slave = pty.openpty()
    got = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with os.fdopen(slave, "w") as stream:
        console = _console(stream, 120)
        assert console.is_terminal
        _renders(console)
        stream.flush()
    reader.join(timeout=5)
    os.close(master)
    for out in (plain.getvalue(), got.decode("utf-8", "replace")):
        assert not any(raw in out for raw in RAW), repr(out)
        assert out.count("\\x1b]0;owned") >= 8, out  # each renderer showed it


# -- over SSH: a loopback lab host ------------------------------------------------------------------

SSH_DONOR, SSH_TARGET = "/srv/hostile-donor", "/srv/hostile-target"


def _lab_install(host, venv: str, wheels: list[Path]) -> None:
    python = getattr(sys, "_base_executable", sys.executable)
    host.run(["rm", "-rf", venv])
    host.run([python, "-m", "venv", "--without-pip", venv])
    host.run([python, "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--no-index", "--no-deps",
              "--disable-pip-version-check", *map(str, wheels)])


@pytest.fixture(scope="module")
def lab_pair(lab, tmp_path_factory):
    wheels = tmp_path_factory.mktemp("hostile-ssh")
    new = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})
    old = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    _lab_install(lab.hosts["donor"], SSH_DONOR, [new])
    return lab, old


@pytest.mark.parametrize("mode, says", [("truncated", "not JSON"), ("deep", "nested too deeply"),
                                        ("ok-counted", "is not one the applier gives")])
def test_over_ssh_a_bad_session_is_named_and_its_remote_process_ended(lab_pair, tmp_path, mode, says):
    """The target on a loopback SSH host: the error names the SSH host and venv, and the hostile
    process on the host (which lingers after its input ends, so a closed channel alone would not
    end it) is ended by the pid it ran as."""
    lab, old = lab_pair
    host = lab.hosts["target"]
    venv = f"{SSH_TARGET}-{mode}"
    _lab_install(host, venv, [old])
    inside = host.path(venv)
    # the stand-in, written where the host sees it; its paths are the host's own
    script = host.path(f"{venv}-hostile.py")
    script.write_text(HOSTILE)
    os.rename(inside / "bin" / "python", inside / "bin" / "python-real")
    (inside / "bin" / "python").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do
          if [ "$a" = --session ]; then
            echo $$ >> '{venv}.pids'
            exec '{venv}/bin/python-real' -I -S '{venv}-hostile.py' '{mode}'
          fi
        done
        exec "$(dirname "$0")/python-real" "$@"
        """))
    (inside / "bin" / "python").chmod(0o755)
    before = tree(inside)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{lab.hosts['donor'].spec}", venv: {SSH_DONOR}}}
        target: {{host: "{host.spec}", venv: {venv}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}
        overlay: [alpha]
        """))
    done, took = _apply(tmp_path, manifest)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in output, output
    assert f"error: {host.spec}:{venv}: " in output and says in " ".join(output.split()), output
    assert took < 90, took
    pids = _recorded(host.path(f"{venv}.pids"))
    assert len(pids) == 1 and _ended(pids), pids  # lab hosts share this pid namespace
    assert tree(inside) == before


def test_a_donors_metadata_with_escape_sequences_is_shown_not_obeyed_by_plan_and_inventory(tmp_path):
    """A donor's METADATA whose version and summary hold CSI and OSC sequences: the plan view (its
    table, findings and fixes) and the inventory table on a real pseudo-terminal show them escaped."""
    new = build_wheel(tmp_path / "wheels", "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})
    old = build_wheel(tmp_path / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    donor, target = make_venv(tmp_path / "donor", [new]), make_venv(tmp_path / "target", [old])
    meta = next((donor / SITE).glob("alpha-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 2.0", "Version: 2.0\x1b]0;owned\x07\x1b[2J")
                    .replace("Name: alpha", "Name: alpha\nSummary: \x1b[31mred\u202e"))
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                        f"overlay: [alpha]\n")
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "150", "TERM": "xterm"}
    plan = _in_a_terminal([sys.executable, "-m", "transplant", "plan", str(manifest)], env)
    inventory = _in_a_terminal([sys.executable, "-m", "transplant", "inventory", f"local:{donor}"], env)
    for out in (plan, inventory):
        assert not any(raw in out for raw in RAW), repr(out)
        assert "2.0\\x1b]0;owned" in out, out
    assert "metadata-invalid" in plan and plan.count("\\x1b]0;owned") >= 3, plan  # table, finding, fix
