"""The host edge and rsync transfers against real sshd, ssh and rsync (the lab)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from transplant.errors import HostError
from transplant.hosts.host import LOCAL, HostSpec, LocalHost, SSHOptions
from transplant.hosts.ssh import SSHHost
from transplant.hosts.connecting import connect
from transplant.hosts.transfer import TransferResult, check_relpath, copy_files
from transplant.reporting import RecordingReporter

# -- HostSpec (pure) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("local", LOCAL),
        ("gpu1", HostSpec(hostname="gpu1")),
        ("root@127.0.0.10:2222", HostSpec(user="root", hostname="127.0.0.10", port=2222)),
        ("[::1]:22", HostSpec(hostname="::1", port=22)),
        ("user@[::1]", HostSpec(user="user", hostname="::1")),
        ("h.example.com:22", HostSpec(hostname="h.example.com", port=22)),
    ],
)
def test_hostspec_parse_good(text, expected):
    spec = HostSpec.parse(text)
    assert spec == expected
    assert str(spec) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected 'local' or [user@]host[:port], got an empty value"),
        ("root@", "bad host name '' in 'root@'"),
        ("@host", "bad user name '' in '@host'"),
        ("host:", "bad port '' in 'host:'; expected 1..65535"),
        ("host:abc", "bad port 'abc' in 'host:abc'; expected 1..65535"),
        ("host:70000", "bad port '70000' in 'host:70000'; expected 1..65535"),
        ("[::1", "bad IPv6 address in '[::1'; write it as [addr] or [addr]:port"),
        ("-oProxyCommand=x", "bad host name '-oProxyCommand=x' in '-oProxyCommand=x'"),
        ("a b", "bad host name 'a b' in 'a b'"),
        ("root@[::1]x", "unexpected 'x' after the address in 'root@[::1]x'"),
    ],
)
def test_hostspec_parse_bad(text, message):
    with pytest.raises(ValueError) as caught:
        HostSpec.parse(text)
    assert str(caught.value) == message


def test_connect_local_is_a_local_host():
    host = connect(LOCAL, SSHOptions())
    assert isinstance(host, LocalHost)
    assert host.label == "local"
    assert host.rsync_location("/srv/x") == "/srv/x"
    assert host.rsync_rsh() is None


# -- run, the same on the controller and over SSH --------------------------------------

hosts = pytest.mark.hosts  # needs the lab


@pytest.fixture(params=["local", "ssh"])
def any_host(request):
    if request.param == "local":
        yield LocalHost()
    else:
        yield request.getfixturevalue("lab_connect")("donor")


@hosts
def test_run_stdin_roundtrip_5mb(any_host):
    data = os.urandom(5 * 1024 * 1024)
    result = any_host.run(["cat"], stdin=data, timeout=60)
    assert result.returncode == 0
    assert result.stdout == data
    assert result.argv == ("cat",)
    assert result.seconds > 0


@hosts
def test_run_big_stderr_before_reading_stdin_does_not_deadlock(any_host):
    data = os.urandom(3 * 1024 * 1024)
    result = any_host.run(["sh", "-c", "head -c 4000000 /dev/zero >&2; cat"], stdin=data, timeout=60)
    assert result.returncode == 0
    assert result.stdout == data
    assert result.stderr == b"\0" * 4000000


@hosts
def test_run_env_and_awkward_arguments(any_host):
    value = "a b'c\"$HOME;`x`\n\\"
    result = any_host.run(
        ["sh", "-c", 'printf "%s|%s" "$AWKWARD_VALUE" "$1"', "sh", "*; rm -rf /tmp/nope"],
        env={"AWKWARD_VALUE": value},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{value}|*; rm -rf /tmp/nope".encode()


@hosts
def test_run_nonzero_exit_is_returned(any_host):
    result = any_host.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert any_host.run(["/nonexistent/program"]).returncode == 127


@hosts
def test_run_timeout_raises(any_host):
    with pytest.raises(HostError, match=r"sleep 5 timed out after 0.5 s"):
        any_host.run(["sleep", "5"], timeout=0.5)
    assert any_host.run(["true"]).returncode == 0  # still usable


@hosts
def test_run_rejects_bad_env_name(any_host):
    with pytest.raises(ValueError, match="bad environment variable name 'A=B'"):
        any_host.run(["true"], env={"A=B": "x"})


# -- SSH connection failures -----------------------------------------------------------


@hosts
def test_unknown_host_key_is_refused_by_default(lab, lab_connect, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    donor = lab.hosts["donor"]
    with pytest.raises(HostError) as caught:
        lab_connect("donor", known_hosts=empty)
    error = caught.value
    assert str(error).startswith(f"{donor.spec}: host key not in {empty} (offered ssh-ed25519 SHA256:")
    assert str(error).endswith("); refusing to connect to an unverified host")
    assert error.hint == f"ssh-keyscan -p {donor.port} 127.0.0.10 >> {empty}"


@hosts
def test_missing_known_hosts_file_refuses_too(lab_connect, tmp_path):
    with pytest.raises(HostError, match="host key not in"):
        lab_connect("donor", known_hosts=tmp_path / "absent")


@hosts
def test_unverified_mode_accepts_unknown_key(lab_connect, tmp_path):
    host = lab_connect("donor", known_hosts=tmp_path / "absent", verify_host_keys=False)
    assert host.run(["hostname"]).stdout == b"donor\n"


@hosts
def test_changed_host_key_is_refused(lab, lab_connect, tmp_path):
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    target_key = (target.folder / "ssh_host_ed25519_key.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[{donor.address}]:{donor.port} {target_key[0]} {target_key[1]}\n")
    with pytest.raises(HostError) as caught:
        lab_connect("donor", known_hosts=wrong)
    assert "HOST KEY CHANGED" in str(caught.value)
    assert caught.value.hint.endswith(f"ssh-keygen -R '[127.0.0.10]:{donor.port}' -f {wrong}")


@hosts
def test_wrong_identity_is_refused(lab, lab_connect, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    donor = lab.hosts["donor"]
    with pytest.raises(HostError) as caught:
        lab_connect("donor", identity_file=stranger)
    assert str(caught.value) == (
        f"{donor.spec}: authentication failed: the server refused the key {stranger} for user root"
    )
    assert caught.value.hint == f"ssh-copy-id -i {stranger} -p {donor.port} root@127.0.0.10"


@hosts
def test_missing_identity_file(lab_connect, tmp_path):
    with pytest.raises(HostError, match="identity file .*/nope does not exist"):
        lab_connect("donor", identity_file=tmp_path / "nope")


@hosts
def test_refused_port(ssh_options):
    with pytest.raises(HostError) as caught:
        connect(HostSpec.parse("root@127.0.0.9:1"), ssh_options)
    assert str(caught.value) == "root@127.0.0.9:1: cannot connect to port 1: Connection refused"


@hosts
def test_rsync_rsh_is_quoted_for_awkward_paths(lab, ssh_options, tmp_path):
    odd = tmp_path / "known hosts %d 'x'"
    odd.mkdir()
    known = odd / "known_hosts"
    known.write_bytes(lab.known_hosts.read_bytes())
    key = odd / "id %h%%"  # a key whose path holds % (and a blank): ssh must get it, not a token expansion
    key.write_bytes(Path(ssh_options.identity_file).read_bytes())
    key.chmod(0o600)
    host = SSHHost(HostSpec.parse(lab.hosts["donor"].spec), SSHOptions(identity_file=key, known_hosts=known))
    try:
        rsh = host.rsync_rsh()
        assert "StrictHostKeyChecking=yes" in rsh and "BatchMode=yes" in rsh
        # OpenSSH itself, given exactly these words, verifies the key and logs in.
        argv = [*shlex.split(rsh), "root@127.0.0.10", "hostname"]
        assert subprocess.run(argv, capture_output=True, timeout=30).stdout == b"donor\n"
        # and rsync, which splits -e by its own rules, gets the same words.
        (tmp_path / "f").write_text("via rsync")
        copy_files(LocalHost(), str(tmp_path), host, "/srv/odd", ["f"], staging=tmp_path)
        assert lab.hosts["donor"].path("/srv/odd/f").read_text() == "via rsync"
    finally:
        host.close()


# -- copy_files ------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, bytes]) -> list[str]:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(files)


@hosts
def test_copy_local_to_ssh(lab, lab_connect, tmp_path):
    files = {
        "lib/python3.11/site-packages/pkg/__init__.py": b"x = 1\n",
        "lib/python3.11/site-packages/pkg/lib name with spaces.so": os.urandom(300_000),
        "bin/tool": b"#!/bin/sh\n",
    }
    src = tmp_path / "src"
    relpaths = _tree(src, files)
    (src / "bin/tool").chmod(0o755)
    (src / "not-listed").write_bytes(b"stays home")
    recorded = RecordingReporter()
    result = copy_files(
        LocalHost(), str(src), lab_connect("target"), "/srv/l2s/venv", relpaths,
        staging=tmp_path / "staging", reporter=recorded,
    )  # fmt: skip
    seen = [e[1:] for e in recorded.events if e[0] == "progress"]
    assert isinstance(result, TransferResult)
    assert result.files == 3
    assert result.bytes >= 300_000
    dst = lab.hosts["target"].path("/srv/l2s/venv")
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data
    assert os.access(dst / "bin/tool", os.X_OK)
    assert not (dst / "not-listed").exists()
    assert not lab.hosts["donor"].path("/srv/l2s").exists()
    total = sum(len(d) for d in files.values())
    assert seen and seen[-1] == (total, total)


@hosts
def test_copy_ssh_to_local(lab, lab_connect, tmp_path):
    lab.hosts["donor"].run(["sh", "-c", "mkdir -p /srv/s2l/a && echo hello > /srv/s2l/a/f"])
    result = copy_files(
        lab_connect("donor"), "/srv/s2l", LocalHost(), str(tmp_path / "out"), ["a/f"],
        staging=tmp_path / "staging",
    )  # fmt: skip
    assert (tmp_path / "out/a/f").read_bytes() == b"hello\n"
    assert result.files == 1 and result.bytes > 0


@hosts
def test_copy_ssh_to_ssh_relay_keeps_hardlinks_intact(lab, lab_connect, tmp_path):
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    new = os.urandom(200_000)
    donor.run(["mkdir", "-p", "/srv/venv_sglang/lib"])
    donor.path("/srv/venv_sglang/lib/libx.so").write_bytes(new)
    donor.path("/srv/venv_sglang/lib/fresh.py").write_bytes(b"fresh\n")
    # On the target the venv's file is a hardlink into a cache, as uv and pip leave them.
    target.run([
        "sh", "-c",
        "mkdir -p /srv/cache /srv/venv_sglang/lib && echo old > /srv/cache/libx.so"
        " && ln -f /srv/cache/libx.so /srv/venv_sglang/lib/libx.so",
    ])  # fmt: skip
    assert target.path("/srv/venv_sglang/lib/libx.so").stat().st_nlink == 2
    staging = tmp_path / "staging"
    result = copy_files(
        lab_connect("donor"), "/srv/venv_sglang", lab_connect("target"), "/srv/venv_sglang",
        ["lib/libx.so", "lib/fresh.py"], staging=staging,
    )  # fmt: skip
    assert result.files == 2
    assert result.bytes >= 2 * 200_000  # both legs carried it
    assert target.path("/srv/venv_sglang/lib/libx.so").read_bytes() == new
    assert target.path("/srv/venv_sglang/lib/libx.so").stat().st_nlink == 1
    assert target.path("/srv/cache/libx.so").read_bytes() == b"old\n"
    assert target.path("/srv/venv_sglang/lib/fresh.py").read_bytes() == b"fresh\n"
    assert list(staging.iterdir()) == []  # the relay folder is cleaned up


@pytest.mark.parametrize(
    ("relpath", "message"),
    [
        ("../etc/passwd", "refusing '../etc/passwd': it escapes the root"),
        ("a/../../x", "refusing 'a/../../x': it escapes the root"),
        ("/etc/passwd", "refusing absolute path '/etc/passwd': paths must be relative to the root"),
        ("", "bad relative path '': empty or contains NUL"),
        ("a/..", "refusing 'a/..': it names the root itself, not a file in it"),
    ],
)
def test_path_escape_is_refused(relpath, message, tmp_path):
    with pytest.raises(ValueError) as caught:
        copy_files(LocalHost(), str(tmp_path), LocalHost(), str(tmp_path / "d"), ["ok", relpath],
                   staging=tmp_path)
    assert str(caught.value) == message
    assert not (tmp_path / "d").exists()


def test_inner_dotdot_is_folded():
    assert check_relpath("a/./b/../c") == "a/c"


@hosts
def test_rsync_failure_names_hosts_and_stderr(lab_connect, tmp_path):
    with pytest.raises(HostError) as caught:
        copy_files(LocalHost(), str(tmp_path), lab_connect("target"), "/srv/x", ["missing-file"],
                   staging=tmp_path)
    message = str(caught.value)
    assert message.startswith(f"rsync from local:{tmp_path} to root@127.0.0.11:")
    assert "failed with exit status 23" in message
    assert "missing-file" in message


@hosts
def test_rsync_refuses_unknown_host_key(lab, lab_connect, tmp_path):
    (tmp_path / "f").write_text("x")
    known = tmp_path / "known_hosts"
    known.write_bytes(lab.known_hosts.read_bytes())
    target = lab_connect("target", known_hosts=known)
    known.write_text("")  # the master connection checked the key already; a new connection must check it again
    # the master is gone (idle past ControlPersist, killed): rsync's ssh connects afresh, with the same checks
    subprocess.run(shlex.split(target.rsync_rsh()) + ["-O", "exit", "root@127.0.0.11"], check=True,
                   capture_output=True)
    rsync = ["rsync", "-a", "-e", target.rsync_rsh(), str(tmp_path / "f"), target.rsync_location("/srv/strict/")]
    done = subprocess.run(rsync, capture_output=True, timeout=60)
    assert done.returncode != 0 and b"Host key verification failed" in done.stderr, done.stderr
    with pytest.raises(HostError) as caught:  # and the command path (which opens a new master) refuses it too
        copy_files(LocalHost(), str(tmp_path), target, "/srv/strict", ["f"], staging=tmp_path)
    assert "host key not in" in str(caught.value) or "Host key verification failed" in str(caught.value)
    assert not lab.hosts["target"].path("/srv/strict").exists()


@hosts
def test_silent_port_times_out_with_a_clear_message(ssh_options):
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.9", 0))
        silent.listen(5)  # accepts TCP connections, never says a word
        port = silent.getsockname()[1]
        options = SSHOptions(identity_file=ssh_options.identity_file, connect_timeout=1)
        with pytest.raises(HostError) as caught:
            connect(HostSpec.parse(f"root@127.0.0.9:{port}"), options)
    assert str(caught.value) == (
        f"root@127.0.0.9:{port}: no SSH banner from port {port} within 1 s; "
        "is an SSH server listening there?"
    )
