"""``scripts/lab``: bring the system lab's hosts up and keep them up until interrupted.

Each host runs its own Debian system (see :mod:`transplant.lab.systems`); this machine's own
Python build is bound into every host at its own path when it is a self-contained build (not
the system's ``/usr``), so venvs of one CPython can sit on hosts whose glibc differs. The lab
folder gets an ``ssh_config`` with one ``Host`` entry per lab host (its address, port, the
lab's key and known_hosts), to be named with ``ssh -F`` or included from ``~/.ssh/config``;
a manifest then names the hosts by name, like any other host.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from transplant.errors import TransplantError
from transplant.lab.roots import RELEASES
from transplant.lab.systems import SystemLab, SystemHost

__all__ = ["main", "ssh_config", "shareable_python"]

DEFAULT_HOSTS = ("bookworm=bookworm", "trixie=trixie")


def shareable_python() -> str | None:
    """This machine's Python build folder when it is self-contained (pyenv's, a source build
    under ``/opt``), so it can be bound into hosts of other releases; None for the system's own."""
    base = os.path.realpath(sys.base_prefix)
    if base.split("/")[1] in ("usr", "bin", "lib", "etc", "") or "," in base or ":" in base:
        return None
    return base


def ssh_config(lab: SystemLab) -> str:
    """``Host`` entries for every host of ``lab``: ``ssh -F <lab>/ssh_config NAME`` reaches it."""
    blocks = []
    for name, host in lab.hosts.items():
        blocks.append("\n".join([
            f"Host {name}",
            f"    HostName {host.address}",
            f"    Port {host.port}",
            "    User root",
            f"    IdentityFile {lab.identity_file}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {lab.known_hosts}",
            "    StrictHostKeyChecking yes",
        ]))
    return "\n\n".join(blocks) + "\n"


def _parse_hosts(items: list[str]) -> dict[str, str]:
    hosts: dict[str, str] = {}
    for item in items:
        name, sep, release = item.partition("=")
        if not sep or release not in RELEASES:
            raise TransplantError(f"lab host {item!r} is not NAME=RELEASE",
                                  hint=f"e.g. donor=bookworm; releases: {', '.join(RELEASES)}")
        hosts[name] = release
    return hosts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", nargs="*", metavar="NAME=RELEASE",
                        help=f"hosts to start (default: {' '.join(DEFAULT_HOSTS)}); releases: {', '.join(RELEASES)}")
    parser.add_argument("--dir", type=Path, help="the lab folder (default: a new one under /tmp)")
    args = parser.parse_args(argv)
    try:
        hosts = _parse_hosts(args.hosts or list(DEFAULT_HOSTS))
        directory = args.dir or Path(tempfile.mkdtemp(prefix="transplant-lab-", dir="/tmp"))
        build = shareable_python()
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        with SystemLab(directory, hosts, binds={build: build} if build else None) as lab:
            config = lab.directory / "ssh_config"
            config.write_text(ssh_config(lab))
            for name, host in lab.hosts.items():
                assert isinstance(host, SystemHost)
                release = RELEASES[host.release]
                print(f"{name}: Debian {host.release} (glibc {release.glibc}, python3 {release.python}) "
                      f"at root@{host.address}:{host.port}", flush=True)
            print(f"ssh config: {config} (ssh -F {config} {next(iter(lab.hosts))})", flush=True)
            if build:
                print(f"this machine's Python build is at {build} on every host", flush=True)
            print("up; Ctrl-C stops the hosts", flush=True)
            stop.wait()
        print("stopped", flush=True)
    except TransplantError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
