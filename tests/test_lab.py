"""The lab itself: real sshd processes in private namespaces on loopback addresses."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from transplant.errors import HostError, TransplantError
from transplant.hosts.host import HostSpec, SSHOptions
from transplant.hosts.connecting import connect

pytestmark = pytest.mark.hosts


def test_each_host_sees_its_own_srv(lab, lab_connect):
    for name, host in lab.hosts.items():
        host.run(["sh", "-c", 'printf %s "$1" > /srv/marker', "sh", f"I am {name}"])
    for name, host in lab.hosts.items():
        result = lab_connect(name).run(["cat", "/srv/marker"])
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"I am {name}".encode()
        assert host.path("/srv/marker").read_text() == f"I am {name}"
    # The controller's own /srv is untouched.
    assert not Path("/srv/marker").exists()


def test_hostnames_differ(lab_connect):
    names = {name: lab_connect(name).run(["hostname"]).stdout.strip() for name in ("donor", "target")}
    assert names == {"donor": b"donor", "target": b"target"}


def test_hosts_have_distinct_loopback_addresses(lab):
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    assert donor.address == "127.0.0.10" and target.address == "127.0.0.11"
    assert donor.spec == f"root@127.0.0.10:{donor.port}"
    assert lab.known_hosts.read_text().splitlines()[0].startswith(f"[127.0.0.10]:{donor.port} ssh-ed25519 ")


def test_path_maps_only_srv(lab):
    donor = lab.hosts["donor"]
    assert donor.path("/srv") == donor.root
    assert donor.path("/srv/venv_sglang/bin/python") == donor.root / "venv_sglang/bin/python"
    assert donor.root == lab.directory / "hosts" / "donor" / "srv"
    for bad in ("/etc/passwd", "srv/x", "/srv/../etc", "/srvx"):
        with pytest.raises(ValueError, match="is not under /srv"):
            donor.path(bad)


def test_run_check_raises_with_output(lab):
    with pytest.raises(subprocess.CalledProcessError) as caught:
        lab.hosts["donor"].run(["sh", "-c", "echo oops >&2; exit 4"])
    assert caught.value.returncode == 4
    assert caught.value.stderr == b"oops\n"
    assert lab.hosts["donor"].run(["false"], check=False).returncode == 1


def test_folder_in_use_is_refused(lab):
    from transplant.lab import Lab

    with pytest.raises(TransplantError, match="in use by another running lab"):
        Lab(lab.directory, ("donor",))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _in_namespace(pid_namespace: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/mnt") == pid_namespace:
                found.append(int(entry))
        except OSError:
            pass
    return found


def test_second_lab_coexists_and_a_host_can_go_down(lab, tmp_path):
    from transplant.lab import Lab

    with Lab(tmp_path / "lab2", ("spare",)) as other:
        spare = other.hosts["spare"]
        assert (spare.address, spare.port) not in {(h.address, h.port) for h in lab.hosts.values()}
        spare.run(["sh", "-c", "echo kept > /srv/kept"])
        options = SSHOptions(identity_file=other.identity_file, known_hosts=other.known_hosts)
        spec = HostSpec.parse(spare.spec)
        with connect(spec, options) as host:
            assert host.run(["hostname"]).stdout == b"spare\n"
            namespace = os.readlink(f"/proc/{spare.pid}/ns/mnt")
            # An open session with a running command: stopping must take it down too.
            outcome = []

            def sleeper():
                try:
                    outcome.append(host.run(["sleep", "30"]))
                except HostError as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=sleeper)
            thread.start()
            deadline = time.monotonic() + 10
            while not any(_comm(pid) == "sleep" for pid in _in_namespace(namespace)):
                assert time.monotonic() < deadline, "sleep never started"
                time.sleep(0.02)
            listener = spare.pid
            spare.stop_sshd()
            thread.join(10)
            assert not thread.is_alive()
            assert spare.pid is None
            assert _in_namespace(namespace) == []
            assert not os.path.exists(f"/proc/{listener}")
            assert isinstance(outcome[0], HostError), outcome
            assert "connection lost while running sleep 30" in str(outcome[0])
            with pytest.raises(HostError) as caught:
                host.run(["true"])
            assert str(caught.value) == f"{spare.spec}: cannot connect to port {spare.port}: Connection refused"

        with pytest.raises(HostError) as caught:
            connect(spec, options)
        assert str(caught.value) == f"{spare.spec}: cannot connect to port {spare.port}: Connection refused"

        # setup still works while the host is down (fresh namespaces, same /srv)
        assert spare.run(["cat", "/srv/kept"]).stdout == b"kept\n"

        spare.start_sshd()
        with connect(spec, options) as host:
            assert host.run(["cat", "/srv/kept"]).stdout == b"kept\n"
        pid = spare.pid
    assert spare.pid is None
    assert not os.path.exists(f"/proc/{pid}")
