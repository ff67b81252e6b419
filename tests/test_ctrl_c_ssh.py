"""Ctrl-C during ``transplant verify`` over SSH: the command ends at once and so do its host scripts
(a real loopback sshd host, a real venv whose imported module sleeps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from transplant import remote
from transplant.errors import HostError
from transplant.hosts.host import LocalHost
from transplant.hosts.connecting import interrupt_stops_commands
from transplant.lab.hosts import _mount_namespace, _processes_in
from transplant.lab.wheels import build_wheel, make_venv

VENV = "/srv/ctrl-c-venv"
SITE = "lib/python3.11/site-packages"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _command(pid: int) -> list[bytes]:
    """The first two and last four arguments of ``pid``; empty when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [arg for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return []
    return argv[:2] + argv[-4:] if argv else []


@pytest.mark.parametrize("form", ["location", "manifest"])
def test_ctrl_c_during_verify_over_ssh_ends_it_and_its_host_scripts(lab, tmp_path, form):
    """With a master connection the local ``ssh`` killed by the interrupt handler left the remote
    import running and the controller waiting for it (55 s of a 60 s import): the master holds the
    command's pipes until the remote command ends."""
    host = lab.hosts["target"]
    pid_file = f"{VENV}/slow.pid"
    slow = f"import os, time\nopen({pid_file!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    wheel = build_wheel(tmp_path / "w", "slowmod", "1.0", {"slowmod/__init__.py": slow})
    python = getattr(sys, "_base_executable", sys.executable)
    host.run(["rm", "-rf", VENV])
    host.run([python, "-m", "venv", "--without-pip", VENV])
    host.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
              "--target", f"{VENV}/{SITE}", str(wheel)])
    namespace = _mount_namespace(host.pid)
    before = set(_processes_in(namespace))
    env = {**os.environ, "COLUMNS": "200", "TRANSPLANT_STATE_DIR": str(tmp_path / "state")}
    if form == "location":  # the imports start before the inventory (no overlay)
        command = ["verify", f"{host.spec}:{VENV}", "--imports", "slowmod", "--identity-file", str(lab.identity_file),
                   "--known-hosts", str(lab.known_hosts)]
    else:  # the names come from the overlay, so the imports start once the inventory is read
        (tmp_path / "m.yaml").write_text(
            f"version: 1\ndonor: {{host: local, venv: {tmp_path / 'nowhere'}}}\n"
            f"target: {{host: \"{host.spec}\", venv: {VENV}}}\n"
            f"ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}\noverlay: [slowmod]\n")
        command = ["verify", str(tmp_path / "m.yaml")]
    proc = subprocess.Popen([sys.executable, "-m", "transplant", *command],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    written = host.path(pid_file)
    deadline = time.monotonic() + 60
    while not (written.exists() and written.read_text()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None and written.read_text(), "the import did not start"
    sleeper = int(written.read_text())
    assert _alive(sleeper)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=10)  # with the fault: the import's 60 s first
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"verify still ran 10 s after Ctrl-C: {out[-2000:]}") from None
    assert proc.returncode == 130 and out.rstrip().endswith("interrupted"), out[-2000:]
    deadline = time.monotonic() + 5

    def left() -> list[int]:
        return [pid for pid in set(_processes_in(namespace)) - before if _alive(pid)]

    while (_alive(sleeper) or left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(sleeper), "the remote import still runs after the controller gave up"
    commands = [_command(pid) for pid in left()]
    assert not [c for c in commands if c], f"processes of ours left on the host: {commands}"


def _slow_venv(tmp_path, seconds: float):
    """A local venv whose module ``slowmod`` writes its pid to ``slow.pid`` in the venv, then sleeps."""
    venv = tmp_path / "v"
    slow = f"import os, time\nopen({str(venv / 'slow.pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep({seconds})\n"
    make_venv(venv, [build_wheel(tmp_path / "w", "slowmod", "1.0", {"slowmod/__init__.py": slow})])
    return venv


def _stage_imports(venv) -> subprocess.Popen:
    """stage_imports importing slowmod in ``venv``, as the controller starts it (``-c SOURCE``, a
    session of its own); the caller writes its request (``{}``) on its standard input."""
    return subprocess.Popen([str(venv / "bin" / "python"), "-c", remote.source("stage_imports").decode(), "slowmod"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def test_a_verify_host_script_ends_once_nothing_reads_its_output(tmp_path):
    """What the remote end of an abandoned SSH command sees (sshd closes its end of the output):
    the script ends at once instead of finishing its import first."""
    venv = _slow_venv(tmp_path, 60)
    proc = _stage_imports(venv)
    proc.stdin.write(b"{}\n")
    proc.stdin.close()
    deadline = time.monotonic() + 30
    while not (venv / "slow.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    sleeper = int((venv / "slow.pid").read_text() or 0)
    assert sleeper == proc.pid and _alive(sleeper)
    proc.stdout.close()  # the reader goes away
    try:
        code = proc.wait(timeout=10)  # with the fault: the import's 60 s
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the script ran on with nothing reading its output") from None
    assert code == -signal.SIGKILL
    proc.stderr.close()


def test_a_verify_host_script_read_to_its_end_is_not_stopped(tmp_path):
    """The twin: a script whose output is read replies as before (the watch only ends an abandoned one)."""
    venv = _slow_venv(tmp_path, 1)
    out, err = _stage_imports(venv).communicate(b"{}\n", timeout=60)
    [result] = json.loads(out.splitlines()[-1])["imports"]
    assert result["name"] == "slowmod" and result["ok"], err


def test_after_an_interrupt_no_host_command_starts_until_the_block_ends(lab_connect):
    """A stage still queued when Ctrl-C came would start its host script afterwards (and over SSH
    open the master connection again, which the interrupt closed)."""
    host = lab_connect("target")
    assert host.run(["true"]).ok
    with interrupt_stops_commands():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        with pytest.raises(HostError, match="interrupted"):
            host.run(["true"])
        with pytest.raises(HostError, match="interrupted"):
            LocalHost().run(["true"])
    # the twin: once the interrupted command is over, commands run again (the master reopens)
    assert host.run(["true"]).ok and LocalHost().run(["true"]).ok
