"""Shared fixtures: the loopback SSH lab (real sshd, ssh and rsync) and how to reach it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from transplant.hosts.host import HostSpec, SSHOptions
from transplant.hosts.ssh import SSHHost
from transplant.hosts.connecting import connect
from transplant.lab import Lab
from transplant.lab.wheels import build_wheel, make_venv
from transplant.lab.systems import SystemLab

from system_hosts import SYSTEMS, shared_python


def lab_skip_reason() -> str | None:
    """Why the lab cannot run here (not root, or no unshare); None when it can.

    Anything else missing (sshd, rsync) is not a skip: the lab raises, and the tests fail.
    """
    if os.geteuid() != 0:
        return "the lab needs root (bind mounts in new mount namespaces)"
    if shutil.which("unshare") is None:
        return "the lab needs unshare (util-linux)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C delivered as usual, even to a suite started in the background of a non-interactive
    shell (``.ci/run &``): bash starts such a job with SIGINT ignored, every process it starts
    inherits that, and Python keeps an ignored SIGINT ignored, so the tests of what Ctrl-C does
    (the commands they start, and this process) would see no interrupt at all."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _state_folder(tmp_path_factory) -> None:
    """transplant's state folder (relay staging, snapshots, the log of verified states) for the
    whole session: a temporary one, never the user's (a test may still set its own)."""
    os.environ.setdefault("TRANSPLANT_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """A running lab with hosts ``donor`` and ``target``, for the whole session."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="transplant-lab-", dir="/tmp"))
    try:
        with Lab(directory, ("donor", "target")) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def systems() -> Iterator[SystemLab]:
    """Lab hosts with their own Debian systems (:data:`SYSTEMS`), for the whole session; this
    machine's Python build is bound into each at its own path when :func:`shared_python` allows."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="transplant-systems-", dir="/tmp"))
    build = shared_python()
    try:
        with SystemLab(directory, SYSTEMS, binds={build: build} if build else None) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def ssh_options(lab) -> SSHOptions:
    """SSH settings that reach the lab: its client key and known_hosts, verification on."""
    return SSHOptions(identity_file=lab.identity_file, known_hosts=lab.known_hosts, connect_timeout=5.0)


@pytest.fixture
def lab_connect(lab, ssh_options) -> Iterator[Callable[..., SSHHost]]:
    """``lab_connect("donor")`` -> a connected SSHHost, closed after the test.

    Keyword arguments replace fields of ``ssh_options`` (``known_hosts=...``).
    """
    opened = []

    def open_host(name: str, **changes) -> SSHHost:
        options = dataclasses.replace(ssh_options, **changes)
        host = connect(HostSpec.parse(lab.hosts[name].spec), options)
        opened.append(host)
        return host

    yield open_host
    for host in opened:
        host.close()


@pytest.fixture
def foo_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local donor (foo 2.0), a target (foo 1.0), a manifest; the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    make_venv(tmp_path / "donor", [build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"})])
    make_venv(tmp_path / "target", [build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n"})])
    (tmp_path / "m.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {tmp_path / 'donor'}}}
        target: {{host: local, venv: {tmp_path / 'target'}}}
        overlay: [foo]
        """))
    return tmp_path
