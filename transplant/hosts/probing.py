"""Run a host script in a venv and read its JSON (edge): the inventory probe and friends."""

from __future__ import annotations

import json
import os
import posixpath
import re
import selectors
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transplant import remote
from transplant.collector import collector_paused
from transplant.core.units import clip, human_bytes, visible
from transplant.errors import HostError, ProbeError
from transplant.hosts.controller_cache import ControllerCache, HashGroups
from transplant.hosts.host import Host, LocalHost, kill_group
from transplant.remote._common import IMPORTING, died_of, ended, last_import

if TYPE_CHECKING:  # loaded by take_inventory: an SSH connection opened early starts its host scripts without it
    from transplant.core.inventory import Inventory  # (packaging's requirement parser is slow to import)

__all__ = ["venv_python", "run_script", "fingerprint", "paths_exist", "ScriptSession", "WaitingScript", "take_inventory", "prestart",
           "take_prestarted", "close_prestarted"]


def venv_python(venv: str) -> str:
    """The interpreter of a venv: ``<venv>/bin/python``."""
    return posixpath.join(venv, "bin", "python")


def run_script(
    host: Host,
    venv: str,
    script: str,
    args: Sequence[str] = (),
    *,
    request: Mapping[str, Any] | bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 600.0,
    python: str | None = None,
    waiting: WaitingScript | None = None,
) -> dict[str, Any]:
    """Run the host script ``script`` (see :mod:`transplant.remote`) with the venv's python.

    Without ``request`` the script goes on standard input (``python - ARGS``); with one,
    the script is passed with ``-c`` and the request as JSON on standard input (bytes: sent as
    they are, for a script whose request is several JSON lines).

    :param timeout: seconds; None waits without limit.
    :param python: the interpreter to run instead of the venv's ``bin/python`` (a base
        interpreter, before the venv exists); None runs the venv's own.
    :param waiting: a process of this script started earlier and not yet asked, asked instead
        of starting one (:func:`_reply_line`'s); None takes one :func:`prestart` began, if any.
    :returns: the JSON object the script printed (its last line of output).
    :raises HostError: the host cannot be reached, the venv's python is missing or does
        not start, or the script printed no JSON (its stderr tail is in the message).
    """
    line = _reply_line(host, venv, script, args, request=request, env=env, timeout=timeout, python=python,
                       waiting=waiting)
    return _document(f"{host.label}:{venv}", script, line)


def fingerprint(host: Host, venv: str, paths: str, extra: Sequence[str], *, since_ns: int | None = None,
                timeout: float | None = 120.0, waiting: WaitingScript | None = None) -> dict[str, Any]:
    """The probe's ``fingerprint`` of ``venv`` on ``host`` (one ``lstat`` per input, no file read):
    ``{"inputs": digest, "extra": digest, "count"}`` for the packed input ``paths`` a full probe
    returned (its ``inputs``) and the ``extra`` absolute paths; with ``since_ns`` (ns since the
    epoch, the host's clock) also ``extra_racy``: whether an extra path changed within two seconds
    of it or later. The plan memo's check, and apply's stale-plan check of a kept plan.

    :param waiting: a probe started earlier and not yet asked (:func:`run_script`'s).
    :raises HostError: as :func:`run_script`.
    """
    request: dict[str, Any] = {"paths": paths, "extra": list(extra)}
    if since_ns is not None:
        request["since_ns"] = since_ns
    return run_script(host, venv, "probe", ["--stdin"], request={"fingerprint": request}, timeout=timeout,
                      waiting=waiting)


def paths_exist(host: Host, venv: str, paths: Sequence[str], *, timeout: float | None = 120.0) -> dict[str, bool]:
    """Whether each absolute path exists on ``host`` (stat only, symlinks followed), asked with the
    venv's python in the probe's ``exists`` mode: no distribution or host fact is read, so a
    question asked after the full probe (editable sources, run path folders) costs one interpreter
    start. Paths that are not absolute are not answered.

    :returns: path -> exists, for each absolute path of ``paths``.
    :raises HostError: as :func:`run_script`.
    :raises ProbeError: the answer is not ``{path: bool}`` over the paths asked.
    """
    answer = run_script(host, venv, "probe", ["--stdin"], request={"exists": list(paths)}, timeout=timeout)
    said = answer.get("elsewhere")
    asked = set(paths)
    if not isinstance(said, dict) or any(p not in asked or not isinstance(v, bool) for p, v in said.items()):
        raise ProbeError(f"{host.label}:{venv}: the probe's answer of which paths exist is not one it gives",
                         hint="run the same transplant version on the controller and the hosts")
    return said


def _reply_line(
    host: Host,
    venv: str,
    script: str,
    args: Sequence[str] = (),
    *,
    request: Mapping[str, Any] | bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 600.0,
    python: str | None = None,
    waiting: WaitingScript | None = None,
    keep: Callable[[list[tuple[bytes, memoryview]]], object] | None = None,
) -> str:
    """:func:`run_script`'s reply as the text of the line the script printed, not decoded;
    ``request`` may be given already encoded (JSON bytes, and for the probe the hash groups'
    lines after it).

    :param waiting: a process of this script started earlier (:class:`WaitingScript`), asked
        instead of starting one; when it is gone before being asked, one is started as usual.
    :param keep: called with the probe's ``#hashes`` lines (printed before its reply), as
        :func:`_hash_lines` gives them, before the reply line is cut out (so that the output is
        not held three times over: whole, the groups, the reply); None: they are not looked for.
    :raises HostError: as :func:`run_script` (but for a reply that is not JSON).
    """
    if waiting is None and request is not None and python is None:
        waiting = take_prestarted(host, venv, script, args)  # one :func:`prestart` began for this request
    python = python or venv_python(venv)
    if waiting is not None and request is not None and waiting.script == script:
        line = waiting.ask(request if isinstance(request, bytes) else json.dumps(request).encode(), timeout,
                           keep=keep)
        if line is not None:
            return line
    code = remote.source(script)
    flags = _isolation(script)
    if request is None:
        argv, stdin = [python, *flags, "-", *args], code
    else:
        stdin = request if isinstance(request, bytes) else json.dumps(request).encode()
        argv = [python, *flags, "-c", code.decode(), *args]
    result = host.run(argv, stdin=stdin, env=env, timeout=timeout)
    del stdin
    if keep is not None:
        keep(_hash_lines(result.stdout))
    line = _last_line(result.stdout)
    if line is None:
        raise _no_reply(host, venv, script, python, result.returncode, result.stderr)
    return line


_HASH_LINE = b"#hashes\t"


def _hash_lines(out: bytes) -> list[tuple[bytes, memoryview]]:
    """The ``#hashes\\t<group>\\t<entries>`` lines at the start of ``out`` (the probe prints them
    before its document) as ``(group, entries)``, the entries a view into ``out`` (not copied)."""
    found, at, view = [], 0, memoryview(out)
    while out.startswith(_HASH_LINE, at):
        end = out.find(b"\n", at)
        tab = out.find(b"\t", at + len(_HASH_LINE), end)
        if end < 0 or tab < 0:
            break
        found.append((out[at + len(_HASH_LINE):tab], view[tab + 1:end]))
        at = end + 1
    return found


_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _last_line(out: bytes) -> str | None:
    """The last line of ``out`` that is not blank (as ``str.splitlines`` splits the UTF-8 text,
    errors replaced), or None when there is none; the reply of a large venv's probe is one
    line of tens of MB, so it is cut from the bytes without splitting (or copying) the rest."""
    end = len(out)
    while end and out[end - 1] in b" \t\r\n\x0b\x0c":
        end -= 1
    start = out.rfind(b"\n", 0, end) + 1
    tail = str(memoryview(out)[start:end], "utf-8", "replace")
    if tail.strip() and _OTHER_BREAKS.search(tail) is None:
        return tail
    lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else None


def _isolation(script: str) -> list[str]:
    """The interpreter flags a host script runs with: ``-I -S`` for those of :data:`remote.ISOLATED`
    (no site, whose .pth files are code the venv would run; no PYTHON* variables; no user
    site-packages), none for the others."""
    return ["-I", "-S"] if script in remote.ISOLATED else []


#: A dotted module name, as the imports script is given them (what a hint may put in a command).
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _no_reply(host: Host, venv: str, script: str, python: str, returncode: int | None, stderr: bytes) -> HostError:
    """The error for a host script that printed no reply: the venv's python is missing, or it
    failed (its stderr tail in the message)."""
    label = f"{host.label}:{venv}"
    missing = b"No such file" in stderr or b"not found" in stderr
    if returncode in (126, 127) and missing and b"shared librar" not in stderr:
        return HostError(
            f"{label}: {python} does not exist or points to nothing; is {venv} a venv on {host.label}?",
            hint=f"create it there ({shlex.join(['python3', '-m', 'venv', venv])}), repair it "
                 f"({shlex.join(['python3', '-m', 'venv', '--upgrade', venv])}), or correct the venv path",
            code="interpreter-missing",
        )
    if returncode in (126, 127) and b"Not a directory" in stderr:
        return HostError(
            f"{label}: {venv} (or a folder on the way to {python}) is a file, not a venv folder, on {host.label}",
            hint="name the venv's own folder (the one with pyvenv.cfg and bin/python)",
            code="interpreter-missing",
        )
    text = stderr.decode("utf-8", "replace")

    def by_hand(code: str) -> str:
        line = shlex.join([python, "-c", code])
        return line if host.label == "local" else f"ssh {shlex.quote(host.label)} {shlex.quote(line)}"

    died = died_of(returncode, text)
    if died is not None:  # named (SIGILL: code for CPU features this CPU lacks), never "exit -4"
        importing = last_import(text)
        importing = importing if importing and _MODULE_NAME.fullmatch(importing) else None
        during = f" while importing {importing}" if importing else ""
        # faulthandler's stack less the import machinery's own frames: the line naming the fault
        # and the frames of code that is not the interpreter's
        lines = [line for line in text.strip().splitlines()
                 if line.strip() and not line.startswith(IMPORTING) and 'File "<frozen ' not in line]
        said = "; its stderr: " + clip("\n".join(lines), 500) if lines else ""
        return HostError(f"{label}: the {script} script ended{during}: {ended(-died)}{said}",
                         hint=f"see it end by hand: {by_hand(f'import {importing}')}" if importing else None)
    tail = "\n".join(line for line in text.strip().splitlines() if not line.startswith(IMPORTING))[-800:]
    return HostError(
        f"{label}: the {script} script failed in the venv's python (exit {returncode}): {tail}",
        hint=f"check that the venv's python starts: {by_hand('print(1)')}",
    )


def _document(label: str, script: str, line: str) -> dict[str, Any]:
    """The JSON object of a host script's reply line.

    :raises HostError: the line is not JSON, is nested deeper than the decoder recurses (the C
        decoder stops at the interpreter's recursion limit with a RecursionError: bounded, never
        a crash), or is not an object; the message shows the line's start with its control
        characters made visible.
    """
    try:
        document = json.loads(line)
    except ValueError as exc:
        raise HostError(f"{label}: the {script} script printed something that is not JSON ({exc}): "
                        f"{visible(line, 120)}", hint=_NOT_OURS) from None
    except RecursionError:
        raise HostError(f"{label}: the {script} script printed a JSON document nested too deeply to read "
                        f"({len(line)} characters)", hint=_NOT_OURS) from None
    if not isinstance(document, dict):
        raise HostError(f"{label}: the {script} script printed {type(document).__name__}, expected an object",
                        hint=_NOT_OURS)
    return document


#: The hint of a reply no transplant host script prints.
_NOT_OURS = ("transplant's host scripts print one JSON object per reply; check that the venv's bin/python is a "
             "real Python interpreter and that nothing on the host (a shell start file, a sitecustomize) prints "
             "to standard output")


#: The first line a :class:`ScriptSession` on an SSH host prints on stderr: ``#transplant-pid PID``.
_PID_LINE = b"#transplant-pid"

#: The largest reply line a :class:`ScriptSession` reads (bytes): the real pair's transaction
#: record is 37 MB; a line past this is not a reply of transplant's applier.
REPLY_LIMIT = 256 << 20
#: Once a reply (or a request) started moving, at least :data:`REPLY_PACE` bytes must pass in each
#: :data:`REPLY_STALL` seconds until its line ends (a progress deadline: a host trickling a byte
#: every few seconds is stopped, a slow link is not).
REPLY_STALL = 60.0
REPLY_PACE = 64 << 10


class ScriptSession:
    """One host script process that answers many requests: ``<python> -I -S -c <script>
    --session`` on the host, one JSON line ``{"op", "request"}`` written per request and one
    reply line read back (see :mod:`transplant.remote.applier`), so a transaction sends the
    script and starts the interpreter once, not once per step.

    The process starts at the first request; when it is gone (it crashed, or was killed by a
    timeout) the next request starts a fresh one. :meth:`close` ends its input, so it exits.
    Requests are sent one at a time (a lock serialises threads).

    A reply no applier gives (a line longer than ``limit``, one that stalls once begun, text
    that is not a JSON object, a document nested too deeply, a reply that does not count the
    requests served: see :meth:`request`) ends the process (its process group killed; over SSH
    the local ``ssh``, and the remote process by the pid its shell said on stderr before it ran
    the interpreter) and breaks the session: every later request raises the same error and
    starts nothing, so a host that answers badly is never asked again in this command.

    :ivar started: how many processes this session has started (1 for a session that never
        lost its process).
    :ivar pids: the local process id of each process started, oldest first (the venv's python
        for a local host, ``ssh`` for an SSH host).
    """

    def __init__(self, host: Host, venv: str, script: str = "applier", *, python: str | None = None,
                 limit: int = REPLY_LIMIT, stall: float = REPLY_STALL, pace: int = REPLY_PACE) -> None:
        """:param limit: the longest reply line read, in bytes (:data:`REPLY_LIMIT`).
        :param stall: seconds in which a reply or request under way must move ``pace`` bytes
            (:data:`REPLY_STALL`, :data:`REPLY_PACE`)."""
        self.host, self.venv, self.script = host, venv, script
        self.python = python or venv_python(venv)
        self.label = f"{host.label}:{venv}"
        self.started = 0
        self.pids: list[int] = []
        self.limit, self.stall, self.pace = limit, stall, pace
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._served = 0
        self._broken: HostError | None = None
        self._remote_pid: int | None = None
        self._said_pid = threading.Event()
        self._stderr = bytearray()
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        code = remote.source(self.script).decode()
        flags = _isolation(self.script)
        self._buffer, self._stderr, self._served = b"", bytearray(), 0
        argv = [self.python, *flags, "-c", code, "--session"]
        remote_host = not isinstance(self.host, LocalHost)
        if remote_host:
            # the remote process's pid, said first on its stderr, so that a session broken for a bad
            # reply can end it (killing the local ssh only closes its channel: a program that
            # neither reads nor writes would live on); exec keeps that pid for the interpreter
            argv = ["sh", "-c", f'echo "{_PID_LINE.decode()} $$" >&2; exec "$@"', "sh", *argv]
        self._remote_pid = None
        said = self._said_pid = threading.Event()
        try:
            proc = self.host.spawn(argv)
        except OSError as exc:  # a local interpreter that is missing: as a shell (and SSH) reports it
            raise _no_reply(self.host, self.venv, self.script, self.python,
                            127 if isinstance(exc, FileNotFoundError) else 126,
                            f"{self.python}: {exc.strerror or 'No such file or directory'}".encode()) from None
        self.started += 1
        self.pids.append(proc.pid)
        errors = self._stderr

        def drain() -> None:  # its stderr, kept to the last 8 KiB, so the pipe never fills
            if remote_host:
                first = proc.stderr.readline(128)
                if first.startswith(_PID_LINE + b" ") and first[len(_PID_LINE) + 1:].strip().isdigit():
                    self._remote_pid = int(first[len(_PID_LINE) + 1:])
                else:
                    errors.extend(first)
            said.set()
            for chunk in iter(lambda: proc.stderr.read1(1 << 14), b""):
                errors.extend(chunk)
                del errors[:-8192]

        self._drain = threading.Thread(target=drain, daemon=True, name=f"stderr {self.label}")
        self._drain.start()
        self._proc = proc
        return proc

    def start(self) -> None:
        """Start the process now, before the first request, so that its start overlaps other work
        (an apply starts the applier while it plans); nothing is asked. A failure to start is
        left for the first request to report (it starts a process again)."""
        with self._lock:
            if self._broken is None and (self._proc is None or self._proc.poll() is not None):
                try:
                    self._start()
                except HostError:
                    self._proc = None

    def request(self, op: str, request: Mapping[str, Any], *, timeout: float | None = 3600.0) -> dict[str, Any]:
        """Send one operation and return its reply.

        :param timeout: seconds to wait for the reply (its request's sending included); None
            waits without limit. Past it the local process is killed (over SSH the remote one
            may finish its step on its own). Whatever the timeout, a request or reply that
            started moving must keep moving (``stall``, ``pace``).
        :raises HostError: the process could not start, died without replying (its stderr tail
            in the message; the next request starts a fresh one), timed out, or replied with a
            line longer than ``limit``, one that stalled, something that is not a JSON object,
            one nested too deeply, or one whose ``served`` is not the count of requests this
            process was sent (its output is out of step: another program answers); each of the
            last five also breaks the session (see the class).
        """
        line = (json.dumps({"op": op, "request": dict(request)}) + "\n").encode()
        with self._lock:
            if self._broken is not None:
                raise self._broken
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self._send(proc, line, deadline, timeout)
                del line
                reply = self._read_line(proc, deadline, timeout)
                self._served += 1
                document = _document(self.label, self.script, reply.decode("utf-8", "replace"))
                del reply
                served = document.get("served")
                if "served" not in document:
                    raise HostError(
                        f"{self.label}: the {self.script} script's reply to request {self._served} of its process "
                        f"does not count the requests served, as every reply of transplant's {self.script} does: "
                        f"another program answers", hint=_NOT_OURS)
                if served != self._served or isinstance(served, bool):
                    raise HostError(
                        f"{self.label}: the {self.script} script's reply to request {self._served} of its "
                        f"process counts {visible(json.dumps(served), 40)} requests served; its output is out of "
                        f"step with its requests", hint=_NOT_OURS)
            except _Malformed as exc:
                self._break(proc, exc.error)
                raise exc.error from None
            except HostError as exc:
                if exc.hint is _NOT_OURS:  # not an applier's reply: never asked again
                    self._break(proc, exc)
                raise
            except BaseException:  # interrupted while waiting (Ctrl-C): stopped, as a one-off command is,
                kill_group(proc)   # so that no late reply is ever read as the next request's
                self._proc = None
                raise
        return document

    def abandon(self, error: HostError) -> None:
        """Break the session for a reply its caller found malformed (of another shape than the
        operation's): its process ends, as for a reply :meth:`request` refuses itself, and every
        later request raises ``error`` and starts nothing."""
        with self._lock:
            proc = self._proc
            if proc is not None:
                self._break(proc, error)
            self._broken = error

    def _break(self, proc: subprocess.Popen, error: HostError) -> None:
        """End ``proc`` (its input closed, its process group killed) and keep ``error`` as the
        answer to every later request."""
        self._broken = error
        try:
            proc.stdin.close()
        except OSError:
            pass
        kill_group(proc)
        self._said_pid.wait(timeout=5)
        remote_pid = self._remote_pid
        if remote_pid is not None:  # over SSH: the host's process too, by the pid it said
            try:
                self.host.run(["kill", "-KILL", str(remote_pid)], timeout=30)
            except (HostError, OSError, ValueError):
                pass  # the host is gone: so is the session's channel
        self._drain.join(timeout=5)
        self._proc, self._buffer = None, b""

    def _stalled(self, moving: str) -> _Malformed:
        return _Malformed(HostError(
            f"{self.label}: the {self.script} script's {moving} moved less than {self.pace} bytes in "
            f"{self.stall:g} s; stopped", hint=_NOT_OURS))

    def _send(self, proc: subprocess.Popen, data: bytes, deadline: float | None, timeout: float | None) -> None:
        """Write ``data`` to the process's input without ever blocking past ``deadline`` or a
        stall (a process that reads nothing would otherwise hold the controller in ``write``
        for good); a process that is gone is left for the read to report.

        :raises _Malformed: the process took less than ``pace`` bytes in ``stall`` seconds.
        :raises HostError: ``deadline`` passed (the process is killed).
        """
        fd = proc.stdin.fileno()
        os.set_blocking(fd, False)
        view, sent = memoryview(data), 0
        window, moved = time.monotonic(), 0
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            while sent < len(view):
                try:
                    wrote = os.write(fd, view[sent:sent + (1 << 20)])
                except BlockingIOError:
                    wrote = 0
                except OSError:  # it died (a broken pipe): the read reports why
                    return
                sent += wrote
                moved += wrote
                now = time.monotonic()
                if now - window >= self.stall:
                    if moved < self.pace:
                        raise self._stalled("request (it reads nothing)")
                    window, moved = now, 0
                if wrote:
                    continue
                if deadline is not None and now >= deadline:
                    self._kill(proc)
                    raise HostError(f"{self.label}: the {self.script} script took no request within {timeout:g} s "
                                    f"and was stopped")
                wait = window + self.stall - now
                selector.select(max(0.0, wait if deadline is None else min(wait, deadline - now)))

    def _read_line(self, proc: subprocess.Popen, deadline: float | None, timeout: float | None) -> bytes:
        """The next reply line (without its newline), read until it ends.

        The pieces read are kept apart and only the newest is searched for the newline, so a
        reply of many megabytes (a transaction's record on the real pair: 37 MB) costs one pass,
        not one pass over all that came before for each piece (quadratic in the reply's size).

        Before its first byte a reply may take until ``deadline`` (the step runs on the host);
        once begun it must move ``pace`` bytes in each ``stall`` seconds, and end within
        ``limit`` bytes.

        :raises _Malformed: the line passed ``limit`` bytes, or stalled once begun.
        :raises HostError: the script gave no reply before ``deadline``, or ended first.
        """
        fd = proc.stdout.fileno()
        pieces, end = [self._buffer], self._buffer.find(b"\n")
        size = len(self._buffer)
        window, moved = time.monotonic(), 0
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while end < 0:
                now = time.monotonic()
                if size and now - window >= self.stall:
                    if moved < self.pace:
                        raise self._stalled(f"reply (begun, {size} bytes so far)")
                    window, moved = now, 0
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0:
                    self._kill(proc)
                    raise HostError(f"{self.label}: the {self.script} script gave no reply within {timeout:g} s "
                                    f"and was stopped")
                wait = left
                if size:
                    wait = window + self.stall - now if wait is None else min(wait, window + self.stall - now)
                if not selector.select(None if wait is None else max(0.0, wait)):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self._buffer = b"".join(pieces)
                    self._kill(proc)
                    self._drain.join(timeout=5)
                    raise _no_reply(self.host, self.venv, self.script, self.python, proc.returncode,
                                    bytes(self._stderr))
                if not size:
                    window = time.monotonic()  # the reply begins: its pace is measured from here
                size += len(chunk)
                moved += len(chunk)
                end = chunk.find(b"\n")
                if (size if end < 0 else size - len(chunk) + end) > self.limit:
                    raise _Malformed(HostError(
                        f"{self.label}: the {self.script} script's reply passed {human_bytes(self.limit)} without "
                        f"ending; stopped", hint=_NOT_OURS))
                pieces.append(chunk)
        line, _, self._buffer = b"".join(pieces).partition(b"\n")
        return line

    def _kill(self, proc: subprocess.Popen) -> None:
        try:
            proc.wait(timeout=0.5)  # it is ending anyway (end of output)
        except subprocess.TimeoutExpired:
            kill_group(proc)
        try:
            proc.stdin.close()
        except OSError:
            pass
        self._proc = None

    def close(self, timeout: float = 30.0) -> None:
        """End the process's input and wait for it to exit (killed after ``timeout`` seconds)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc)
            self._drain.join(timeout=5)
            for stream in (proc.stdout, proc.stderr):
                try:
                    stream.close()
                except OSError:
                    pass


class _Malformed(Exception):
    """Raised inside :meth:`ScriptSession.request` for a reply no applier gives (``error``: what
    the caller is told); the session ends its process and breaks on it."""

    def __init__(self, error: HostError) -> None:
        super().__init__(error.message)
        self.error = error


class WaitingScript:
    """A host script started now and asked later: ``<python> [-I -S] -c <script> ARGS``
    on the host with its standard input held open, so that its SSH channel, interpreter start
    and compile overlap other work; :meth:`ask` then writes the request, ends the input and reads
    the reply. Only for scripts that read their request before anything else (the probe with
    ``--stdin``: it reads the venv only once the request came), so what it reports is the venv as
    it is when asked, not when started. Close it (a context manager) when it may go unasked.

    :ivar started: whether a process was started (False: starting failed; :meth:`ask` then
        answers None and the caller runs the script as usual, reporting the error itself).
    """

    def __init__(self, host: Host, venv: str, script: str, args: Sequence[str] = (), *,
                 env: Mapping[str, str] | None = None) -> None:
        """:param env: variables added to the host's environment for the script (as :func:`run_script`'s)."""
        self.label = f"{host.label}:{venv}"
        self.host, self.venv, self.script, self.python = host, venv, script, venv_python(venv)
        self._proc: subprocess.Popen | None = None
        try:
            self._proc = host.spawn([self.python, *_isolation(script), "-c", remote.source(script).decode(), *args],
                                    env=env)
        except (HostError, OSError):
            self._proc = None
        self.started = self._proc is not None
        self._told = False

    def tell(self, data: bytes) -> None:
        """Write ``data`` to the script's standard input now, keeping it open (a first part of its
        request, for a script that reads its request in parts, as ``stage_imports`` does); :meth:`ask`
        sends the rest. Nothing happens when no process is waiting, or it has exited (then :meth:`ask`
        reports it)."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        self._told = True  # asked in part: its reply (or how it failed) is this request's
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def ask(self, request: bytes, timeout: float | None, *,
            keep: Callable[[list[tuple[bytes, memoryview]]], object] | None = None) -> str | None:
        """Send ``request`` (the whole standard input), wait for the script to end and return the
        last line it printed; None when no process is waiting (it never started, was asked
        already, or has exited before being asked: the caller starts one as usual).

        :param timeout: seconds; None waits without limit. Past it the process is killed.
        :param keep: as :func:`_reply_line`'s.
        :raises HostError: it printed no reply (as :func:`run_script`), or timed out.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is not None and not self._told:  # gone before being asked (a lost connection): not this request's failure
            _reap(proc)
            return None
        try:
            out, err = proc.communicate(request, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise HostError(f"{self.label}: the {self.script} script gave no reply within {timeout:g} s and was "
                            f"stopped") from None
        except BaseException:
            kill_group(proc)
            raise
        if keep is not None:
            keep(_hash_lines(out))
        line = _last_line(out)
        if line is None:
            raise _no_reply(self.host, self.venv, self.script, self.python, proc.returncode, err)
        return line

    def ask_document(self, request: bytes, timeout: float | None) -> dict[str, Any] | None:
        """:meth:`ask`, the reply decoded: the JSON object the script printed, or None as :meth:`ask`.

        :raises HostError: as :meth:`ask`, or the reply is not a JSON object.
        """
        line = self.ask(request, timeout)
        return None if line is None else _document(self.label, self.script, line)

    def identity(self, timeout: float) -> str | None:
        """The first line a probe started with ``--identity VENV`` printed (``transplant-identity
        ...``, before it read its request), without its newline; None when the process is gone or
        said nothing within ``timeout`` seconds. Read byte by byte from the pipe itself, so that
        :meth:`ask` later reads exactly what follows."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return None
        fd, line = proc.stdout.fileno(), bytearray()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or len(line) > 512 or not selector.select(left):
                    return None
                byte = os.read(fd, 1)
                if not byte:
                    return None
                line += byte
        return line[:-1].decode("utf-8", "replace")

    def process(self) -> subprocess.Popen | None:
        """The waiting process itself, now the caller's to talk to, reap or kill (a stream side
        started ahead: :class:`transplant.hosts.stream.StartedSides`); None when none is waiting
        (it never started, was taken or asked already, or has exited: then it is reaped)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is not None:
            _reap(proc)
            return None
        return proc

    def close(self) -> None:
        """End an unasked process: its input is closed (the script reads an empty request and
        exits, having read nothing of the venv), killed when it has not exited within 5 s."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _reap(proc)

    def __enter__(self) -> WaitingScript:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


#: Host scripts that read their request before anything else, so that one started early reports
#: the venv as it is when asked (:class:`WaitingScript`): (script, its arguments).
PRESTARTABLE = (("probe", ("--stdin",)), ("elf_facts", ()))


def _waits(script: str, args: Sequence[str]) -> bool:
    """Whether ``script`` with ``args`` reads its whole input (or its first line) before it reads or
    writes anything: :data:`PRESTARTABLE`, and an uncompressed stream's sender (``SRC_ROOT
    --compress none``: it reads its listing to the end first) and receiver (``- --compress none``:
    it reads its folder's line, then the stream's first line, before it makes any folder)."""
    args = tuple(args)
    if (script, args) in PRESTARTABLE:
        return True
    if script == "stream_send":
        return len(args) == 3 and args[0].startswith("/") and args[1:] == ("--compress", "none")
    return script == "stream_receive" and args == ("-", "--compress", "none")


_PRESTARTED = threading.Lock()


def prestart(host: Host, venv: str, script: str, args: Sequence[str] = (), *, identity: bool = False) -> WaitingScript | None:
    """Start ``script`` with ``args`` in ``venv`` on ``host`` now (a :class:`WaitingScript`) and
    keep it on the connection, so that the next :func:`run_script` (or :func:`take_inventory`)
    of that script, venv and arguments with a request asks it instead of starting one: its SSH
    channel, interpreter start, imports and compile (0.1-0.3 s each on a loaded host) overlap
    other work (the apply command starts the plan's probes and the target's ELF script while it
    imports and asks the venvs' identities). Each call starts one more process; each is
    asked at most once. What is kept and never asked is ended by :func:`close_prestarted` (the
    connection's ``close`` calls it): its input ends, it reads an empty request and exits having
    read nothing of the venv.

    Only the scripts that read their request first (:func:`_waits`: :data:`PRESTARTABLE`, so the
    facts are those of when they are asked, as a script started then would report them; and the
    two sides of an uncompressed stream, taken by :class:`transplant.hosts.stream.StartedSides`
    through :meth:`WaitingScript.process`).

    :param identity: the probe (``--stdin``) also says the venv's identity as soon as it starts,
        before it reads its request (``--identity VENV``: :meth:`WaitingScript.identity` reads it),
        so that the donor-is-not-the-target check needs no interpreter of its own.
    :returns: the process started (kept), or None when it could not be started.
    :raises ValueError: another script or other arguments (one that would act before its request).
    """
    if not _waits(script, args) or (identity and (script, tuple(args)) != ("probe", ("--stdin",))):
        raise ValueError(f"{script} {' '.join(args)}: not a host script that waits for its request")
    waiting = WaitingScript(host, venv, script, [*args, "--identity", venv] if identity else args)
    if not waiting.started:
        return None  # starting it failed: the request starts one as usual, and reports the error
    with _PRESTARTED:
        _kept(host).setdefault((venv, script, tuple(args)), []).append(waiting)
    return waiting


#: The processes :func:`prestart` started on the local host: each ``connect("local")`` is a new
#: :class:`transplant.hosts.host.LocalHost`, so they are kept here, not on one of them, for any
#: of them to take; ended by :func:`close_prestarted` of any local host (the command's end).
_LOCAL_KEPT: dict[tuple[str, str, tuple[str, ...]], list[WaitingScript]] = {}


def _kept(host: Host) -> dict[tuple[str, str, tuple[str, ...]], list[WaitingScript]]:
    """Where the processes started ahead on ``host`` are kept (the caller holds :data:`_PRESTARTED`)."""
    if isinstance(host, LocalHost):
        return _LOCAL_KEPT
    return host.__dict__.setdefault("_prestarted", {})


def take_prestarted(host: Host, venv: str, script: str, args: Sequence[str] = (), *,
                    newest: bool = False) -> WaitingScript | None:
    """The oldest process :func:`prestart` started for ``script`` with ``args`` in ``venv`` on
    ``host`` (``newest``: the last one started: for a request asked later than the next one), now
    the caller's to ask (or close); None when none is kept."""
    with _PRESTARTED:
        kept = _kept(host).get((venv, script, tuple(args)))
        return kept.pop(-1 if newest else 0) if kept else None


def close_prestarted(host: Host) -> int:
    """End every process :func:`prestart` started on ``host`` and nobody asked (for a local host:
    every one started on the local host); returns how many."""
    with _PRESTARTED:
        if isinstance(host, LocalHost):
            kept = dict(_LOCAL_KEPT)
            _LOCAL_KEPT.clear()
        else:
            kept = host.__dict__.pop("_prestarted", {})
    unasked = [waiting for scripts in kept.values() for waiting in scripts]
    for waiting in unasked:  # every input ends first, so that they exit side by side
        proc = waiting._proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
    for waiting in unasked:
        waiting.close()
    return len(unasked)


def _reap(proc: subprocess.Popen, stop: Callable[[subprocess.Popen], None] = kill_group) -> None:
    """Close a spawned process's input, wait up to 5 s for it to exit, else ``stop`` it (its
    process group killed, by default); close its pipes. (A waiting script whose input ends prints
    one short error line: it never fills a pipe.)"""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        stop(proc)
    for stream in (proc.stdout, proc.stderr):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass


def take_inventory(
    host: Host,
    venv: str,
    *,
    hash_patterns: Sequence[str] = (),
    files: Sequence[str] = (),
    site_files: Sequence[str] = (),
    record: bool | str = True,
    texts: Sequence[str] = (),
    paths_exist: Sequence[str] = (),
    timeout: float | None = 600.0,
    hash_cache: str | Mapping[str, Any] | None = None,
    compact: bool = True,
    inputs: bool = False,
    waiting: WaitingScript | None = None,
) -> Inventory:
    """Probe a venv and parse its inventory.

    :param hash_patterns: normalised distribution names or globs whose files are hashed
        (``*`` for all); others report RECORD facts only.
    :param files: venv-relative paths to hash as well.
    :param site_files: site-packages-relative paths to hash as well (patch destinations);
        they are reported by their venv-relative path.
    :param record: False skips RECORD files (``Distribution.record`` is None): metadata
        only, for dependency checks; ``"shared"`` looks on disk only at the shared objects
        (``*.so``, ``*.so.N``) RECORD lists: the other entries have their paths alone
        (``exists`` False, no hash, size or mode), for the verify ladder; ``"summary"`` reads RECORD alone, no file on disk, and
        gives per distribution ``record_files`` and ``record_bytes`` (``record`` None).
    :param compact: ask for the probe's compact form (RECORD rows as lists, no ``mtime``:
        about a third of the bytes to print, decode and keep); False keeps the form of
        ``transplant inventory --json --files``. The parsed inventory is the same either way,
        but the fingerprint is of the document as sent, so compare fingerprints only between
        probes of the same form.
    :param texts: site-packages-relative small text files to read (``torch/version.py``).
    :param paths_exist: absolute paths on the host whose existence to report.
    :param hash_cache: the probe's content-hash cache (``remote/probe.py``), so that a file
        whose ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` is unchanged is not read
        again: ``"venv"`` keeps it in the venv's state folder (``.transplant/cache``; for a
        target, which transplant writes anyway), ``"controller"`` in the controller's state
        folder (``hash-cache/``; for a donor, which is never written to: only the groups of the
        distributions this request hashes are sent and only those that changed come back,
        :class:`~transplant.hosts.controller_cache.HashGroups`), None not at all; a mapping is
        sent as the probe's options (tests). ``TRANSPLANT_HASH_CACHE=0`` on the controller
        turns it off everywhere.
    :param inputs: ask the probe for its inputs' digest (``Inventory.inputs``; for the plan
        memo, :mod:`transplant.pipeline.memo`); False: None.
    :param waiting: a probe process started earlier with ``--stdin`` on this host and venv
        (:class:`WaitingScript`), asked instead of starting one; None starts one.
    :raises HostError: as :func:`run_script`.
    :raises ProbeError: the report is of another schema or malformed.
    """
    from transplant.core.inventory import KeptDocument, parse_inventory

    hashing = bool(hash_patterns) or bool(files) or bool(site_files)
    options = _cache_options(host, venv, hash_cache, hashing)
    groups = b""
    if hash_cache == "controller" and options:
        # a donor's known hashes: only the groups of the distributions hashed, as the file's text
        # lines after the request (never decoded here); the probe prints the groups that changed
        groups, legacy = _HASH_GROUPS.select(host, venv, hash_patterns)
        options = {"enabled": True, "store": "reply", **({"known": legacy} if legacy else {})}
        del legacy
    request = {"hash": list(hash_patterns), "files": list(files), "site_files": list(site_files),
               "record": record, "texts": list(texts), "paths_exist": list(paths_exist), "compact": compact,
               "inputs": inputs, "hash_cache": options}
    label = f"{host.label}:{venv}"
    encoded = json.dumps(request).encode() + (b"\n" + groups if groups else b"")
    del request, options, groups

    def keep(printed: list[tuple[bytes, memoryview]]) -> None:
        if printed:
            _HASH_GROUPS.merge(host, venv, printed)

    line = _reply_line(host, venv, "probe", ["--stdin"], request=encoded, timeout=timeout, waiting=waiting,
                       keep=keep if hash_cache == "controller" else None)
    del encoded
    # One reply decoded and parsed at a time (a plan probes both venvs on two threads): the
    # work holds the GIL anyway, and so only one decoded tree is ever in memory.
    with _PARSING, collector_paused():
        document = _document(label, "probe", line)
        noted = document.pop("inputs", None) if isinstance(document, dict) else None
        inventory = parse_inventory(document, label=label)
        if isinstance(noted, dict):
            inventory = replace(inventory, inputs=noted)
        if compact:
            # a plan's inventory keeps its document as text: the decoded tree (several times the
            # memory) goes as soon as it is parsed
            del document
            inventory = replace(inventory, document=KeptDocument(line))
    if posixpath.normpath(inventory.interpreter.prefix) != posixpath.normpath(venv):
        raise ProbeError(
            f"{label}: {venv_python(venv)} runs in {inventory.interpreter.prefix}, not in {venv}",
            hint="name the venv's own folder (the one with pyvenv.cfg), not a symlink to it",
        )
    return inventory


_PARSING = threading.Lock()


def _controller_cache_path(host: Host, venv: str) -> Path:
    """``<controller state>/hash-cache/<sha256 of "host label:venv">.json``."""
    return _HASH_GROUPS.path(host, venv)


def _cache_options(host: Host, venv: str, hash_cache: str | Mapping[str, Any] | None, hashing: bool) -> Any:
    """The probe's ``hash_cache`` request option for :func:`take_inventory`'s ``hash_cache``
    (for ``"controller"`` without its known entries: they travel as lines, :data:`_HASH_GROUPS`)."""
    if hash_cache == "controller":
        return bool(hashing) and os.environ.get("TRANSPLANT_HASH_CACHE", "1") != "0" and \
            {"enabled": True, "store": "reply"}
    return _CONTROLLER_CACHE.options(host, venv, hash_cache if hashing else None)


_CACHE_SCHEMA = "transplant.hashes/1"
#: The probe's request option for a ``hash_cache`` setting (its ``controller`` form is rewritten
#: by :func:`take_inventory`: the groups travel as lines, :data:`_HASH_GROUPS`).
_CONTROLLER_CACHE = ControllerCache("hash-cache", _CACHE_SCHEMA, "hash_cache")
#: The content hashes of a donor, kept on the controller (nothing is written in a donor).
_HASH_GROUPS = HashGroups("hash-cache")
