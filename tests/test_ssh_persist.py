"""Master connections kept between commands (for the no-op plan over SSH): the second command
with the same settings rides the first one's master (no new SSH login, counted in the real
loopback sshd's log), a known_hosts file edited since is never ridden past, and
``TRANSPLANT_SSH_PERSIST=0`` gives each command its own connections again."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.errors import TransplantError
from transplant.hosts import ssh_persist
from transplant.lab.wheels import build_wheel

VENV = "/srv/persist-venv"
SITE = "lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def venvs(lab, tmp_path_factory):
    """foo 2.0 in the donor's venv, foo 1.0 in the target's."""
    wheels = tmp_path_factory.mktemp("persist-wheels")
    python = getattr(sys, "_base_executable", sys.executable)
    sets = {"donor": build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"}),
            "target": build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n"})}
    for name, wheel in sets.items():
        host = lab.hosts[name]
        host.run(["rm", "-rf", VENV])
        host.run([python, "-m", "venv", "--without-pip", VENV])
        host.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                  "--target", f"{VENV}/{SITE}", str(wheel)])
    time.sleep(2.1)  # older than the probe's racy window
    return lab


@pytest.fixture
def state(monkeypatch):
    """A state folder of its own with a short path (a control socket's path is at most 90 bytes);
    the masters kept there are ended after the test."""
    folder = Path(tempfile.mkdtemp(prefix="tp-", dir="/tmp"))
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(folder))
    monkeypatch.delenv("TRANSPLANT_SSH_PERSIST", raising=False)
    monkeypatch.delenv("TRANSPLANT_PLAN_MEMO", raising=False)
    yield folder
    for socket in _sockets(folder):
        subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "kept"], capture_output=True, timeout=30)
    shutil.rmtree(folder, ignore_errors=True)


def _sockets(folder: Path) -> list[Path]:
    ssh = folder / "ssh"
    return sorted(p for p in ssh.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)) if ssh.is_dir() else []


def _manifest(lab, folder: Path) -> tuple[Path, Path]:
    """A manifest over both lab hosts, with its own copy of the lab's known_hosts: (manifest, known_hosts)."""
    known = folder / "known_hosts"
    known.write_bytes(lab.known_hosts.read_bytes())
    m = folder / "m.yaml"
    m.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{lab.hosts['donor'].spec}", venv: {VENV}}}
        target: {{host: "{lab.hosts['target'].spec}", venv: {VENV}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {known}}}
        overlay: [foo]
        """))
    return m, known


def _logins(lab) -> tuple[int, int]:
    """SSH logins the donor's and the target's sshd accepted so far (their logs)."""
    return tuple(lab.hosts[n].log.read_text(errors="replace").count("Accepted publickey") for n in ("donor", "target"))


def _plan(m: Path, capsys) -> tuple[int, str, str]:
    code = main(["plan", str(m), "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_second_command_rides_the_first_ones_master_and_prints_the_same(venvs, state, tmp_path, capsys):
    lab = venvs
    m, _ = _manifest(lab, tmp_path)
    before = _logins(lab)
    code, first, err = _plan(m, capsys)
    assert code == 0, err
    after_first = _logins(lab)
    assert [a - b for a, b in zip(after_first, before, strict=True)] == [1, 1], "the first command logs in on each host"
    folder = state / "ssh"
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700 and len(_sockets(state)) == 2, \
        "each host's master is kept, its socket in a private folder of the state folder"
    code, second, err = _plan(m, capsys)
    assert code == 0, err
    assert _logins(lab) == after_first, "the second command logged in nowhere: it rode the kept masters"
    assert "nothing changed on either venv" in err and second == first


def test_a_known_hosts_file_edited_since_is_never_ridden_past(venvs, state, tmp_path, capsys):
    lab = venvs
    m, known = _manifest(lab, tmp_path)
    assert _plan(m, capsys)[0] == 0
    kept, logins = _sockets(state), _logins(lab)
    known.write_text("")  # the host keys dropped (a host reinstalled, a key revoked): nothing may ride the old check
    code, _, err = _plan(m, capsys)
    assert code == 1 and "host key not in" in err, err  # (--json: the error on stderr too)
    assert _logins(lab) == logins, "refused before logging in"
    known.write_bytes(lab.known_hosts.read_bytes())  # the same file as when the masters were opened: ridden again
    assert _plan(m, capsys)[0] == 0
    assert _logins(lab) == logins and _sockets(state) == kept


def test_with_persist_0_each_command_logs_in_and_keeps_nothing(venvs, state, tmp_path, capsys, monkeypatch):
    lab = venvs
    monkeypatch.setenv("TRANSPLANT_SSH_PERSIST", "0")
    m, _ = _manifest(lab, tmp_path)
    for _ in range(2):
        before = _logins(lab)
        code, _, err = _plan(m, capsys)
        assert code == 0, err
        assert [a - b for a, b in zip(_logins(lab), before, strict=True)] == [1, 1]
    assert _sockets(state) == []


@pytest.mark.parametrize("value", ["off", "false", "", "2"])
def test_a_persist_setting_that_is_not_0_or_1_is_refused(monkeypatch, value):
    monkeypatch.setenv("TRANSPLANT_SSH_PERSIST", value)
    with pytest.raises(TransplantError) as caught:
        ssh_persist.persist_enabled()
    assert "TRANSPLANT_SSH_PERSIST" in caught.value.message


def test_the_socket_path_is_keyed_by_the_known_hosts_bytes_and_kept_only_in_a_private_folder(tmp_path, monkeypatch):
    state = Path(tempfile.mkdtemp(prefix="tp-", dir="/tmp"))
    try:
        monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(state))
        known = tmp_path / "known_hosts"
        known.write_text("[127.0.0.11]:2222 ssh-ed25519 AAAA\n")
        first = ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2222, [known], [])
        assert first is not None and first.parent == state / "ssh"
        assert stat.S_IMODE(first.parent.lstat().st_mode) == 0o700
        assert ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2222, [known], []) == first
        assert ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2223, [known], []) != first
        known.write_text("")
        assert ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2222, [known], []) != first
        os.chmod(state / "ssh", 0o755)  # others could reach its sockets: not used
        assert ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2222, [known], []) is None
    finally:
        shutil.rmtree(state, ignore_errors=True)
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / ("x" * 80)))  # too long for a socket
    assert ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2222, [], []) is None


def test_a_socket_left_by_a_master_that_died_is_removed_and_not_taken_for_one(tmp_path):
    import socket

    path = Path(tempfile.mkdtemp(prefix="tp-", dir="/tmp")) / "s"
    try:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))
            listener.listen(1)
            assert ssh_persist.answers(path)
        assert path.exists() and not ssh_persist.answers(path)  # closed: nothing listens any more
        assert not path.exists()
        assert not ssh_persist.answers(path)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


def test_a_relative_or_tilde_state_folder_gives_an_absolute_socket_path(monkeypatch):
    """ssh expands a leading ``~`` of ControlPath to the login's home: the folder checked for
    mode 0700 must be the one ssh binds in, so the socket path is made absolute first."""
    from transplant.hosts import ssh_persist

    short = Path(tempfile.mkdtemp(prefix="tp", dir="/tmp"))  # (a socket path has at most 107 bytes)
    try:
        monkeypatch.chdir(short)
        monkeypatch.setenv("HOME", str(short / "h"))
        for state in ("~/s", "rel/s"):
            monkeypatch.setenv("TRANSPLANT_STATE_DIR", state)
            path = ssh_persist.control_path("Host *\n", "root@127.0.0.11", 2222, [], [])
            assert path is not None and path.is_absolute(), path
            assert path.parent.is_dir() and path.parent.stat().st_mode & 0o777 == 0o700
        assert (short / "h" / "s" / "ssh").is_dir() and (short / "rel" / "s" / "ssh").is_dir()
        assert not (short / "~").exists()
    finally:
        shutil.rmtree(short)
