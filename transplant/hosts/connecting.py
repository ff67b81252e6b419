"""Reaching a host (edge): the local one or one over SSH, and Ctrl-C stopping what runs on them.

Above both kinds of host: :mod:`transplant.hosts.host` (the :class:`~transplant.hosts.host.Host`
interface and the local host) and :mod:`transplant.hosts.ssh` (the SSH host, built on it) know
nothing of each other's users; :func:`connect` picks one for a
:class:`~transplant.core.hostspec.HostSpec`, taking a connection :mod:`transplant.hosts.early`
began opening, and :func:`interrupt_stops_commands` stops the commands of both kinds and closes
the SSH master connections.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from transplant.core.hostspec import HostSpec
from transplant.hosts import early
from transplant.hosts.host import _STOPPING, Host, LocalHost, SSHOptions, stop_commands
from transplant.hosts.ssh import SSHHost, end_masters

__all__ = ["connect", "interrupt_stops_commands"]


def connect(spec: HostSpec, ssh: SSHOptions | None = None) -> Host:
    """A :class:`~transplant.hosts.host.LocalHost` for ``local``, else a connected :class:`SSHHost`.

    :param spec: the host to reach.
    :param ssh: SSH settings; None uses the defaults (``~/.ssh``, host keys verified).

    A connection :func:`transplant.hosts.early.start` began opening for the same host and settings
    (an apply starts opening both at its start) is taken instead of opening another (it is the same SSHHost, host keys checked alike).

    :raises HostError: an SSH host could not be reached or refused us; the message names it.
    """
    if spec.is_local:
        return LocalHost(spec)
    opened = early.take(spec, ssh or SSHOptions())
    return opened if opened is not None else SSHHost(spec, ssh or SSHOptions())



@contextmanager
def interrupt_stops_commands() -> Iterator[None]:
    """Within the block, Ctrl-C (SIGINT) first stops every tracked host command
    (:func:`transplant.hosts.host.stop_commands`) and closes every SSH master connection
    (:func:`transplant.hosts.ssh.end_masters`), then raises KeyboardInterrupt as Python's own
    handler does. For commands that only read (verify): their stages run in worker threads, which
    would otherwise keep waiting for their host scripts (up to each one's timeout) before the
    interrupt could end the command. Over SSH, killing the local ``ssh`` is not enough: the
    master connection holds the command's pipes (it was passed them) until the remote command
    ends, so the master is closed too; the remote command then finds nothing reading its output
    (the read-only host scripts end then: ``end_when_unread`` in ``transplant/remote/_common.py``).
    From the interrupt to the block's end no host command starts (:func:`transplant.hosts.host.stopping`). Outside the
    main thread the block runs unchanged (signals go to the main one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def stop(signum: int, frame: FrameType | None) -> None:
        _STOPPING.set()  # first: a command starting now is stopped by tracked() if this misses it
        stop_commands()
        end_masters()
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _STOPPING.clear()
