"""Connections opened early (edge): SSH master connections started side by side, in threads,
before the command that needs them asks, so that opening them overlaps the command's imports
and each other instead of following them one after the other.

:func:`start` begins connecting; :func:`transplant.hosts.connecting.connect` hands the connection to
the first caller asking for that host with the same settings (:func:`take`), or raises the
error connecting gave (the same :class:`transplant.errors.HostError` that connecting then would
have raised). A connection nobody took is closed by :func:`close_unused`. Host keys are checked
exactly as by :func:`transplant.hosts.connecting.connect`: the connection is the same
:class:`transplant.hosts.ssh.SSHHost`, only opened sooner.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

from transplant.core.hostspec import LOCAL, HostSpec
from transplant.hosts.host import Host, LocalHost, SSHOptions
from transplant.hosts.identity import parse_identity, venv_identity
from transplant.hosts.probing import close_prestarted, prestart
from transplant.hosts.ssh import SSHHost

__all__ = ["start", "take", "close_unused"]

_LOCK = threading.Lock()
#: (host spec, SSH settings) -> the connection under way (a Future of an SSHHost).
_WAITING: dict[tuple[HostSpec, SSHOptions], Future] = {}


def start(spec: HostSpec, options: SSHOptions, venv: str | None = None,
          scripts: Sequence[tuple[str, Sequence[str]]] = (), later: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
    """Start opening the master connection to ``spec`` in a thread of its own and return at once.

    ``local`` needs no connection: nothing is started. A host already being opened with the same
    settings is not opened twice. Errors are kept for :func:`take`.

    :param venv: a venv on that host whose identity to ask once connected, before :func:`take`
        hands the connection over (:func:`transplant.hosts.identity.venv_identity`: it only reads;
        remembered by the connection, so the donor-is-not-the-target check takes that answer; the
        first probe of ``scripts`` says it as it starts, else the identity script is run);
        None asks nothing.
    :param scripts: host scripts (``(name, args)`` that wait for their input: see
        :func:`transplant.hosts.probing.prestart`) to start in ``venv`` as soon as the connection is
        open, before its identity is asked, each waiting (the command's first request of that
        script asks it); none without ``venv``.
    :param later: more such scripts, started once the identity is answered (those the command
        asks later, so that their starts do not slow the identity's: over loopback both hosts'
        interpreters share the controller's cores).
    """
    if spec.is_local:
        return
    key = (spec, options)
    with _LOCK:
        if key in _WAITING:
            return
        future: Future = Future()
        _WAITING[key] = future

    def opening() -> None:
        try:
            host = SSHHost(spec, options)
        except BaseException as exc:  # noqa: BLE001 - handed to take(), which raises it in the caller
            future.set_exception(exc)
            return
        if venv is not None:
            said = _prestart(host, venv, scripts, identity=True)  # first: their starts overlap the identity's round trip
            # the identity, asked before the connection is handed over (take() returns it
            # remembered): the plan's probe says it as it starts; else (it said nothing) the
            # identity script is asked, as without it
            line = said.identity(60.0) if said is not None else None
            told = parse_identity(line) if line is not None and line.startswith("transplant-identity ") else None
            try:
                if line is not None and (told is not None or line == "transplant-identity -"):
                    host.remembered(("venv-identity", venv), lambda: told)
                else:  # asks the script and remembers under the same key (never inside remembered():
                    venv_identity(host, venv)  # the key's own future would wait on itself)
            except Exception:  # noqa: BLE001 - not remembered then: the check asks again and reports it
                pass
            _prestart(host, venv, later)
        future.set_result(host)

    threading.Thread(target=opening, name=f"connect {spec}", daemon=True).start()


def _prestart(host: Host, venv: str, scripts: Sequence[tuple[str, Sequence[str]]], identity: bool = False):
    """:func:`transplant.hosts.probing.prestart` each of ``scripts``; one that cannot start is left
    for the command to start when it asks (and to report). With ``identity``, the first probe
    (``--stdin``) also says the venv's identity as it starts: returned (a
    :class:`transplant.hosts.probing.WaitingScript`), else None."""
    said = None
    for name, args in scripts:
        tells = identity and said is None and (name, tuple(args)) == ("probe", ("--stdin",))
        try:
            started = prestart(host, venv, name, args, identity=tells)
        except Exception:  # noqa: BLE001 - not started: the command starts it when it asks
            continue
        if tells:
            said = started
    return said


def take(spec: HostSpec, options: SSHOptions) -> Host | None:
    """The connection :func:`start` opened for ``spec`` with ``options`` (waiting for it to be
    open), now the caller's to close; None when none was started (the caller connects itself).

    :raises HostError: connecting failed (as :class:`transplant.hosts.ssh.SSHHost` raises it).
    """
    with _LOCK:
        future = _WAITING.pop((spec, options), None)
    return None if future is None else future.result()


def close_unused() -> None:
    """Close every connection started and never taken (a command that failed before it asked,
    or a donor replaced by its fallback), and end the local host's scripts started ahead and
    never asked (:func:`transplant.hosts.probing.close_prestarted`); waits for those still opening."""
    close_prestarted(LocalHost(LOCAL))  # the local host's scripts started ahead and never asked
    with _LOCK:
        waiting = list(_WAITING.values())
        _WAITING.clear()
    for future in waiting:
        try:
            host = future.result()
        except BaseException:  # noqa: BLE001 - it never opened: nothing to close
            continue
        host.close()
