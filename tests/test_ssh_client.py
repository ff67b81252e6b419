"""SSH as the operator's own ssh does it, on real loopback sshd hosts: an ssh_config alias with a
ProxyJump through a second sshd (a bastion) for every command (probe, applier, rsync), hashed
known_hosts entries, @cert-authority host certificates, and a wrong host key refused on the
command path and on the rsync path alike (one client: the system OpenSSH)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import lab_skip_reason
from transplant.cli.app import main
from transplant.errors import HostError
from transplant.hosts.host import HostSpec, LocalHost, SSHOptions
from transplant.hosts.connecting import connect
from transplant.lab import Lab
from transplant.lab.wheels import build_wheel, make_venv
from transplant.hosts.transfer import copy_files

pytestmark = pytest.mark.skipif(lab_skip_reason() is not None, reason=lab_skip_reason() or "")
SITE = "lib/python3.11/site-packages"
VENV = "/srv/jumped-venv"


@pytest.fixture(scope="module")
def jump_lab():
    """Three hosts: a bastion, a gpu reached through it, and a host with a CA-signed key."""
    directory = Path(tempfile.mkdtemp(prefix="transplant-jump-", dir="/tmp"))
    try:
        with Lab(directory / "lab", ("bastion", "gpu", "certhost")) as lab:
            yield lab, directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _config(lab: Lab, folder: Path, *, jump: bool = True) -> Path:
    bastion, gpu = lab.hosts["bastion"], lab.hosts["gpu"]
    text = textwrap.dedent(f"""\
        Host gpu-alias
          HostName {gpu.address}
          Port {gpu.port}
          User root
          IdentityFile {lab.identity_file}
        """) + (f"  ProxyJump root@{bastion.address}:{bastion.port}\n" if jump else "") + \
        f"Host {bastion.address}\n  IdentityFile {lab.identity_file}\n"
    path = folder / "ssh_config"
    path.write_text(text)
    return path


def _logins(host) -> int:
    return host.log.read_text(errors="replace").count("Accepted publickey")


def test_an_alias_with_proxyjump_works_for_commands_and_rsync(jump_lab, tmp_path):
    lab, _ = jump_lab
    bastion = lab.hosts["bastion"]
    options = SSHOptions(known_hosts=lab.known_hosts, config=_config(lab, tmp_path), connect_timeout=10)
    before = _logins(bastion)
    with connect(HostSpec.parse("gpu-alias"), options) as host:
        assert host.run(["hostname"]).stdout == b"gpu\n"
        assert host.run(["cat"], stdin=b"x" * (3 << 20)).stdout == b"x" * (3 << 20)
        (tmp_path / "f").write_text("through the bastion")
        copy_files(LocalHost(), str(tmp_path), host, "/srv/jumped", ["f"], staging=tmp_path)
    assert lab.hosts["gpu"].path("/srv/jumped/f").read_text() == "through the bastion"
    assert _logins(bastion) > before, "the connection went through the bastion (ProxyJump)"
    # the twin: the same alias without ProxyJump logs in directly, the bastion sees nothing
    direct = SSHOptions(known_hosts=lab.known_hosts, config=_config(lab, tmp_path, jump=False))
    before = _logins(bastion)
    with connect(HostSpec.parse("gpu-alias"), direct) as host:
        assert host.run(["hostname"]).stdout == b"gpu\n"
    assert _logins(bastion) == before


def test_the_bastion_key_is_checked_too(jump_lab, tmp_path):
    lab, _ = jump_lab
    gpu = lab.hosts["gpu"]
    only_gpu = tmp_path / "known_hosts"  # the gpu's key, not the bastion's
    only_gpu.write_text("".join(line + "\n" for line in lab.known_hosts.read_text().splitlines()
                                if f"{gpu.address}]" in line))
    options = SSHOptions(known_hosts=only_gpu, config=_config(lab, tmp_path))
    with pytest.raises(HostError) as caught:
        connect(HostSpec.parse("gpu-alias"), options)
    assert "host key not in" in str(caught.value) or "Host key verification failed" in str(caught.value)


def test_an_env_var_names_the_config_and_the_manifest_ssh_config_reaches_every_command(jump_lab, tmp_path, capsys,
                                                                                        monkeypatch):
    lab, _ = jump_lab
    config = _config(lab, tmp_path)
    monkeypatch.setenv("TRANSPLANT_SSH_CONFIG", str(config))
    with connect(HostSpec.parse("gpu-alias"), SSHOptions(known_hosts=lab.known_hosts)) as host:
        assert host.run(["hostname"]).stdout == b"gpu\n"
    monkeypatch.delenv("TRANSPLANT_SSH_CONFIG")
    # plan, apply (probe, applier, rsync) and status through the alias, from the manifest's ssh.config
    wheels = tmp_path / "wheels"
    new = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})
    old = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    donor = make_venv(tmp_path / "donor", [new])
    gpu = lab.hosts["gpu"]
    python = getattr(sys, "_base_executable", sys.executable)
    gpu.run(["rm", "-rf", VENV])
    gpu.run([python, "-m", "venv", "--without-pip", VENV])
    gpu.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
             "--target", f"{VENV}/{SITE}", str(old)])
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: gpu-alias, venv: {VENV}}}\n"
                 f"ssh: {{config: {config}, known_hosts: {lab.known_hosts}}}\noverlay: [alpha]\n")
    assert main(["apply", str(m), "--yes"]) == 0, capsys.readouterr().out
    assert gpu.path(f"{VENV}/{SITE}/alpha/__init__.py").read_text() == "V = 2\n"
    capsys.readouterr()
    assert main(["status", str(m), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["transactions"]) == 1
    assert main(["status", f"gpu-alias:{VENV}"]) == 1, "without the manifest's ssh.config the alias is unknown"


def test_hashed_known_hosts_entries_are_read(jump_lab, tmp_path):
    lab, _ = jump_lab
    gpu = lab.hosts["gpu"]
    hashed = tmp_path / "known_hosts"
    hashed.write_bytes(lab.known_hosts.read_bytes())
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert gpu.address not in hashed.read_text(), "every name is hashed"
    options = SSHOptions(identity_file=lab.identity_file, known_hosts=hashed)
    with connect(HostSpec.parse(gpu.spec), options) as host:
        assert host.run(["hostname"]).stdout == b"gpu\n"
    # the twin: a hashed entry of the gpu's name with another host's key is a changed key, refused
    other = (lab.hosts["bastion"].folder / "ssh_host_ed25519_key.pub").read_text().split()
    wrong = tmp_path / "wrong"
    wrong.write_text(f"[{gpu.address}]:{gpu.port} {other[0]} {other[1]}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(wrong)], check=True, capture_output=True)
    with pytest.raises(HostError, match="HOST KEY CHANGED"):
        connect(HostSpec.parse(gpu.spec), SSHOptions(identity_file=lab.identity_file, known_hosts=wrong))


def _rsync_hostname(host, tmp_path) -> subprocess.CompletedProcess:
    """rsync's path alone: a fresh ssh with the host's rsync -e words (no master to ride)."""
    (tmp_path / "probe").write_text("p")
    words = shlex.split(host.rsync_rsh())
    at = words.index(next(w for w in words if w.startswith("ControlPath=")))
    words = words[:at - 1] + words[at + 1:]  # "-o ControlPath=...": no master to ride
    return subprocess.run(["rsync", "-a", "-e", shlex.join(words), str(tmp_path / "probe"),
                           host.rsync_location("/srv/")], capture_output=True, timeout=60)


def test_cert_authority_host_certificates(jump_lab, tmp_path):
    lab, _ = jump_lab
    cert = lab.hosts["certhost"]
    ca = tmp_path / "ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    key = cert.folder / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "certhost", "-h", "-n", cert.address,
                    str(key) + ".pub"], check=True, capture_output=True)
    cert.stop_sshd()
    with open(cert.sshd_config, "a") as handle:
        handle.write(f"HostCertificate {key}-cert.pub\n")
    cert.start_sshd()
    trusted = tmp_path / "known_hosts"  # no plain key of the host: only the authority
    trusted.write_text(f"@cert-authority [{cert.address}]:* {ca.with_suffix('.pub').read_text().strip()}\n")
    options = SSHOptions(identity_file=lab.identity_file, known_hosts=trusted)
    with connect(HostSpec.parse(cert.spec), options) as host:
        assert host.run(["hostname"]).stdout == b"certhost\n"
        (tmp_path / "probe").write_text("p")
        done = _rsync_hostname(host, tmp_path)
        assert done.returncode == 0, done.stderr  # rsync's path trusts the same authority
    # the twin: another authority is not trusted, on the command path and on the rsync path
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    untrusted = tmp_path / "untrusted"
    untrusted.write_text(f"@cert-authority [{cert.address}]:* {stranger.with_suffix('.pub').read_text().strip()}\n")
    bad = SSHOptions(identity_file=lab.identity_file, known_hosts=untrusted)
    with pytest.raises(HostError, match="@cert-authority"):
        connect(HostSpec.parse(cert.spec), bad)
    from transplant.hosts.ssh import SSHHost
    probe = SSHHost.__new__(SSHHost)  # the rsync words alone, with no connection made
    probe.spec, probe.options, probe.label = HostSpec.parse(cert.spec), bad, cert.spec
    done = _rsync_hostname(probe, tmp_path)
    probe.close()
    assert done.returncode != 0 and b"Host key verification failed" in done.stderr, done.stderr
