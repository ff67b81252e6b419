"""What the tests across lab hosts with their own systems share: the hosts, the Python build
bound into them, and how to reach them as a user would."""

from __future__ import annotations

import subprocess

from transplant.lab.up import shareable_python

#: The system lab's hosts: name -> Debian release. Two releases whose glibc and Python differ,
#: and a twin of one of them (the clean side of each cross-system judgment).
SYSTEMS = {"bookworm": "bookworm", "trixie": "trixie", "trixie-twin": "trixie"}


def shared_python() -> str | None:
    """The folder of this machine's own Python build when it can be bound into every system host
    at the same path (:func:`transplant.lab.up.shareable_python`): one CPython build on hosts
    whose glibc differs, as on two real GPU hosts. None otherwise."""
    return shareable_python()


def ssh(systems, name: str, command: str) -> str:
    """``command``'s output, run through the host's own sshd as a user would reach it."""
    host = systems.hosts[name]
    done = subprocess.run(
        ["ssh", "-i", str(systems.identity_file), "-o", f"UserKnownHostsFile={systems.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(host.port), f"root@{host.address}",
         command],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
