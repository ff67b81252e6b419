"""Copy a list of files between hosts as one stream, hashed as it is written (edge).

:func:`stream_files` starts the host script ``stream_send`` on the source host and
``stream_receive`` on the destination host (:meth:`Host.spawn`, argv lists), and gives the
sender's standard output to the receiver as its standard input: one ``os.pipe`` whose ends are
the two processes' (or their local ``ssh`` clients'), so the kernel moves the bytes, both legs
run at once, and nothing is written on the controller's disk. Local to local, local to SSH, SSH
to local and SSH to SSH all take this one path. The receiver writes each file to a temporary
name under the destination folder and renames it, and computes its sha256 and stat identity
while writing (see :mod:`transplant.remote.stream_receive`): an apply trusts those hashes
instead of reading the staged files again.

Compression (for a slow controller link) is ``zstd -1`` when the ``zstd`` program is on both
hosts, else zlib level 1 from the standard library; off by default (a fast LAN gains nothing).
:func:`copy_files` (rsync) stays the fallback when the stream cannot start.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from transplant import remote
from transplant.errors import HostError
from transplant.hosts.host import Host, LocalHost
from transplant.hosts.transfer import TransferResult, check_relpath
from transplant.reporting import QUIET, Reporter

__all__ = ["UNAVAILABLE", "stream_files", "compression_for", "StartedSides", "start_sides"]

#: Seconds the other side gets to finish once one side failed, before it is killed.
_GRACE = 10.0
_PIPE_SIZE = 1 << 20


#: The ``code`` of the :class:`HostError` for a stream that could not start on one side (no
#: interpreter there, ``ssh`` or the program could not be started): nothing was written, and the
#: caller may copy with rsync instead.
UNAVAILABLE = "stream-unavailable"


def compression_for(src: Host, dst: Host) -> str:
    """``zstd`` when the ``zstd`` program runs on both hosts, else ``zlib`` (stdlib, always there).

    :raises HostError: a host cannot be reached.
    """
    for host in (src, dst):
        if host.run(["zstd", "-V"], timeout=60).returncode != 0:
            return "zlib"
    return "zstd"


def _python(host: Host, given: str | None) -> str:
    if given is not None:
        return given
    if isinstance(host, LocalHost):
        return sys.executable
    raise ValueError(f"{host.label}: name the interpreter that runs the stream's host script there")


def _grow(fd: int) -> None:
    """Make the pipe 1 MiB (Linux; 64 KiB by default), so each side reads and writes in larger slices."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_SIZE)
    except OSError:
        pass


class _Side:
    """One side's process and what it said: standard error's tail, and its special lines."""

    def __init__(self, name: str, host: Host, root: str, proc: subprocess.Popen) -> None:
        self.name, self.host, self.root, self.proc = name, host, root, proc
        self.tail = bytearray()
        self.sent: dict | None = None
        self.out = bytearray()
        self.connected = False  # a direct stream's receiver: its ssh hop to the donor said it connected

    @property
    def where(self) -> str:
        return f"{self.host.label}:{self.root}"

    def error_text(self) -> str:
        lines = [line for line in self.tail.decode("utf-8", "replace").splitlines() if line.strip()]
        text = "\n".join(lines).strip()
        return text if len(text) <= 2000 else "..." + text[-2000:]


def _argvs(src: Host, src_root: str, src_python: str | None, dst: Host, dst_root: str, dst_python: str | None,
           mode: str) -> tuple[list[str], list[str]]:
    """The sender's and the receiver's argv."""
    flags = ["-I", "-S"]
    send = [_python(src, src_python), *flags, "-c", remote.source("stream_send").decode(), src_root, "--compress", mode]
    receive = [_python(dst, dst_python), *flags, "-c", remote.source("stream_receive").decode(), dst_root,
               "--compress", mode]
    return send, receive


#: The receiver's ROOT argument when it is started before the folder is known: the folder is
#: then the first line of its input (``stream_receive``'s ``-``; uncompressed only).
ROOT_ON_INPUT = "-"


class StartedSides:
    """Both sides of an uncompressed stream started ahead of the copy (for a small apply
    their SSH channels and interpreter starts cost more than its bytes, so they overlap the plan,
    the lock and the transaction's begin), each waiting: the sender reads its whole listing before it
    reads any file, the receiver (ROOT :data:`ROOT_ON_INPUT`) reads its folder's name and then the
    stream's first line before it opens or makes any folder, so nothing is read or written before
    :func:`stream_files` gives them their input. The bytes then pass through the controller (a
    thread copies the sender's output to the receiver's input, after the folder's line), which
    costs nothing for a handful of files. :meth:`close` ends them unused (their inputs end: the
    sender lists nothing, the receiver refuses an empty input, neither has touched a file).

    :param sender: ``stream_send SRC_ROOT --compress none`` started on ``src``, pipes open.
    :param receiver: ``stream_receive - --compress none`` started on the destination host, pipes open.
    """

    def __init__(self, src: Host, src_root: str, dst: Host, *, sender: subprocess.Popen | None,
                 receiver: subprocess.Popen | None) -> None:
        self.where = (src, src_root, dst)
        self.sender, self.receiver = sender, receiver

    def take(self, src: Host, src_root: str, dst: Host) -> tuple[subprocess.Popen, subprocess.Popen] | None:
        """(sender, receiver), now the caller's, when both are still waiting and were started for
        these hosts and source folder; else None (and both are ended)."""
        sides, self.sender, self.receiver = (self.sender, self.receiver), None, None
        ready = all(p is not None and p.poll() is None for p in sides) and \
            self.where[0] is src and self.where[1] == src_root and self.where[2] is dst
        if not ready:
            for proc in sides:
                if proc is not None:
                    _end(proc)
            return None
        return sides  # type: ignore[return-value]  # both not None: "ready" says so

    def close(self) -> None:
        """End both sides when they were not taken (each reaped)."""
        sides, self.sender, self.receiver = (self.sender, self.receiver), None, None
        for proc in sides:
            if proc is not None and proc.stdin is not None:
                try:
                    proc.stdin.close()  # both inputs end first: the two exit side by side
                except OSError:
                    pass
        for proc in sides:
            if proc is not None:
                _end(proc)

    def __enter__(self) -> StartedSides:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def side_argv(side: str, root: str) -> tuple[str, ...]:
    """The host script arguments of an uncompressed stream side started ahead: the sender's
    (``SRC_ROOT --compress none``) or the receiver's (``- --compress none``; ``root`` unused)."""
    return (root, "--compress", "none") if side == "stream_send" else (ROOT_ON_INPUT, "--compress", "none")


def start_sides(src: Host, src_root: str, dst: Host, *, src_python: str | None = None,
                dst_python: str | None = None, sender: subprocess.Popen | None = None,
                receiver: subprocess.Popen | None = None) -> StartedSides:
    """Both sides of an uncompressed stream, started ahead (:class:`StartedSides`): ``sender`` and
    ``receiver`` when given (started earlier, still waiting), each other one started now. A side
    that cannot start leaves none (the copy then starts them itself, and reports why it cannot)."""
    send, receive = _argvs(src, src_root, src_python, dst, ROOT_ON_INPUT, dst_python, "none")
    started = StartedSides(src, src_root, dst, sender=sender, receiver=receiver)
    try:
        if started.receiver is None:
            started.receiver = _spawn(dst, receive, "receiving", ROOT_ON_INPUT)
        if started.sender is None:
            started.sender = _spawn(src, send, "sending", src_root)
    except HostError:
        started.close()
    return started


def _end(proc: subprocess.Popen) -> None:
    """End a waiting side: :func:`transplant.hosts.probing._reap` with :func:`_stop` (SIGTERM first,
    so a receiver removes a file it was writing)."""
    from transplant.hosts.probing import _reap

    _reap(proc, _stop)


def stream_files(
    src: Host,
    src_root: str,
    dst: Host,
    dst_root: str,
    relpaths: Sequence[str],
    *,
    src_python: str | None = None,
    dst_python: str | None = None,
    compress: bool | str = False,
    total: int = 0,
    reporter: Reporter = QUIET,
    timeout: float | None = None,
    link: Callable[[int, int], None] | None = None,
    ahead: StartedSides | None = None,
) -> TransferResult:
    """Copy ``src_root/<relpath>`` to ``dst_root/<relpath>`` for each relpath, as one stream.

    Regular files keep their mode and mtime, symlinks stay symlinks (never followed on either
    side); missing folders under ``dst_root`` are made; each file is written to a temporary name
    and renamed (other hardlinks of a replaced file keep their bytes), and a symlink inside
    ``dst_root`` is never written through.

    :param src: the host that has the files; :param dst: the host to write to (may be ``src``).
    :param src_root: / :param dst_root: absolute folders the relpaths are relative to
        (``dst_root`` is made if missing).
    :param relpaths: POSIX paths; duplicates are sent once; an empty list copies nothing.
    :param src_python: / :param dst_python: the interpreter (3.9+, stdlib only) that runs the
        host script on that side; None: this process's own for a :class:`LocalHost`, required for
        an SSH host (a venv's ``bin/python``).
    :param compress: True compresses the stream (:func:`compression_for` says how), ``"zstd"`` or
        ``"zlib"`` with that one; False sends it plain.
    :param total: the bytes the files hold (from the plan), for ``reporter``; 0 when not known.
    :param reporter: its ``progress`` is told (bytes written on ``dst``, ``total``) at most five
        times a second, then once at the end.
    :param timeout: seconds for the whole copy; None waits without limit.
    :param link: None (always, but in the benchmark): the sender's output is the receiver's input
        and the kernel moves the bytes. A function ``link(source_fd, sink_fd)`` that copies from
        one to the other until the end of the source: the controller copies the stream through it
        on a thread of its own (the benchmark's rate-limited copy stands for a slow link); both
        descriptors are closed after it returns.
    :param ahead: both sides started ahead for these hosts and folders (:func:`start_sides`),
        taken when the stream is uncompressed, ``link`` is None and both still wait: the bytes then
        pass through a thread of the controller; None (or sides not taken: ended) starts both here.
    :returns: files written, ``bytes``: the stream's length as it crossed each wire (compressed
        when compressed; the same bytes cross both wires of an SSH to SSH stream and count once),
        seconds, ``how`` ``stream``, ``compression``, and ``written``: path -> (RECORD-form sha256
        or ``symlink:<text>``, size, st_dev, st_ino, st_mtime_ns) of each file as written.
    :raises ValueError: a relpath is absolute or escapes the root; a root is not absolute; no
        interpreter for an SSH side.
    :raises HostError: with ``code`` :data:`UNAVAILABLE`: a side could not start (nothing was written).
    :raises HostError: a side failed (which one, its exit status and the tail of its standard
        error are in the message: a file that vanished, a path refused) or ran past ``timeout``;
        both sides are stopped then.
    """
    for root in (src_root, dst_root):
        if not root.startswith("/"):
            raise ValueError(f"root folders must be absolute paths, got {root!r}")
    paths = list(dict.fromkeys(check_relpath(p) for p in relpaths))
    if not paths:
        return TransferResult(files=0, bytes=0, seconds=0.0, how="stream")
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    if compress not in (True, False, "zstd", "zlib"):
        raise ValueError(f"compress must be True, False, 'zstd' or 'zlib', got {compress!r}")
    mode = compress if isinstance(compress, str) else compression_for(src, dst) if compress else "none"
    listing = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    taken = ahead.take(src, src_root, dst) if ahead is not None and mode == "none" and link is None else None
    if ahead is not None and taken is None:
        ahead.close()
    if taken is not None:
        return _finish(src, dst, paths, total, reporter, deadline, timeout, started_at=started, sides=[
            _Side("receiving", dst, dst_root, taken[1]), _Side("sending", src, src_root, taken[0])], listing=listing,
            relayed=dst_root)
    send, receive = _argvs(src, src_root, src_python, dst, dst_root, dst_python, mode)
    sides: list[_Side] = []
    first_read, first_write = os.pipe()
    _grow(first_read)
    if link is None:  # sender -> pipe -> receiver
        receiver_in, sender_out, relay = first_read, first_write, []
    else:  # sender -> first pipe -> link (on the controller) -> second pipe -> receiver
        second_read, second_write = os.pipe()
        _grow(second_read)
        receiver_in, sender_out, relay = second_read, first_write, [first_read, second_write]
    try:
        sides.append(_Side("receiving", dst, dst_root, _spawn(dst, receive, "receiving", dst_root, stdin=receiver_in)))
        sides.append(_Side("sending", src, src_root, _spawn(src, send, "sending", src_root, stdout=sender_out)))
    except BaseException:
        for side in sides:
            _stop(side.proc)
        for fd in relay:
            os.close(fd)
        raise
    finally:
        os.close(receiver_in)
        os.close(sender_out)
    return _finish(src, dst, paths, total, reporter, deadline, timeout, started_at=started, sides=sides,
                   listing=listing, link=(link, relay) if link is not None else None, mode=mode)


def _finish(src: Host, dst: Host, paths: list[str], total: int, reporter: Reporter, deadline: float | None,
            timeout: float | None, *, started_at: float, sides: list[_Side], listing: bytes, relayed: str | None = None,
            link: tuple | None = None, mode: str = "none") -> TransferResult:
    """Feed, watch and wait for both sides (``[receiver, sender]``), then check what was written.

    :param relayed: the receiver's folder, when the sides have their own pipes to the controller
        (started ahead): a thread writes it, then copies the sender's output to the receiver's input."""
    receiver, sender = sides
    threads = _watch(sender, receiver, listing, total, reporter)
    if link is not None:
        threads.append(_linked(link[0], *link[1]))
    if relayed is not None:
        threads.append(_piped(sender.proc, receiver.proc, relayed.encode("utf-8", "surrogateescape") + b"\n"))
    try:
        _wait(sides, deadline, timeout, src, dst)
    except BaseException:
        for side in sides:
            _stop(side.proc)
        raise
    finally:
        for thread in threads:
            thread.join(5)
    reply = _reply(receiver)
    _raise_failure(sender, receiver, reply)
    assert reply is not None  # _raise_failure raised without one
    written = {rel: tuple(entry) for rel, entry in reply["files"].items()}
    missing = [p for p in paths if p not in written]
    if missing:
        raise HostError(f"stream to {receiver.where}: {len(missing)} listed files were not written, first {missing[0]}")
    wire = (sender.sent or {}).get("wire")
    if not isinstance(wire, int):
        wire = reply.get("wire") or 0
    done = int(reply.get("bytes") or 0)
    reporter.progress(done, max(total, done))
    return TransferResult(files=len(written), bytes=wire, seconds=time.monotonic() - started_at, how="stream",
                          compression=None if mode == "none" else mode, written=written)


def _piped(sender: subprocess.Popen, receiver: subprocess.Popen, first: bytes) -> threading.Thread:
    """Start a thread that writes ``first`` (the receiver's folder line), then copies the sender's
    standard output to the receiver's standard input until the sender's ends, then closes the
    receiver's input (a receiver gone: the copy stops, and its own error says why)."""

    def run() -> None:
        source, sink = sender.stdout, receiver.stdin
        try:
            sink.write(first)
            for chunk in iter(lambda: source.read1(1 << 20), b""):
                sink.write(chunk)
            sink.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                sink.close()
            except OSError:
                pass

    thread = threading.Thread(target=run, daemon=True, name="stream relay")
    thread.start()
    return thread


def _stop(proc: subprocess.Popen) -> None:
    """Stop a side's process group: SIGTERM first (a local receiver then removes the file it was
    writing; over SSH the remote side sees its input end and does the same), SIGKILL after 2 s;
    reaped. Its pipes are left to the threads reading them."""
    for how, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, how)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _linked(link: Callable[[int, int], None], source: int, sink: int) -> threading.Thread:
    """Start a thread that runs ``link(source, sink)``, then closes both."""

    def run() -> None:
        try:
            link(source, sink)
        except OSError:
            pass  # a side stopped: its own error says why
        finally:
            os.close(source)
            os.close(sink)

    thread = threading.Thread(target=run, daemon=True, name="stream link")
    thread.start()
    return thread


def _spawn(host: Host, argv: list[str], name: str, root: str, *, stdin: int | None = None,
           stdout: int | None = None) -> subprocess.Popen:
    try:
        return host.spawn(argv, stdin=stdin, stdout=stdout)
    except OSError as exc:  # a local interpreter that is missing
        raise HostError(f"stream: the {name} side ({host.label}:{root}) could not start {argv[0]}: "
                        f"{exc.strerror or exc}", code=UNAVAILABLE) from None
    except HostError as exc:
        raise HostError(f"stream: the {name} side could not start: {exc.message}", hint=exc.hint,
                        code=UNAVAILABLE) from None


def progress_line(line: bytes, reporter: Reporter, total: int) -> bool:
    """Whether ``line`` (a host script's stderr line) is a ``transplant-progress BYTES`` line; if so,
    ``reporter.progress`` is told the bytes done (at most ``total``, when ``total`` is known). A
    malformed progress line counts as one, and is dropped."""
    if not line.startswith(b"transplant-progress "):
        return False
    try:
        done = int(line.split()[1])
    except (IndexError, ValueError):
        return True
    reporter.progress(min(done, total) if total else done, total)
    return True


def _watch(sender: _Side, receiver: _Side, listing: bytes, total: int, reporter: Reporter) -> list[threading.Thread]:
    """Threads that feed the sender its listing and read both sides' output, started."""

    def feed() -> None:
        try:
            sender.proc.stdin.write(listing)
            sender.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def read_errors(side: _Side) -> None:
        pending = b""
        for chunk in iter(lambda: side.proc.stderr.read1(1 << 16), b""):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if progress_line(line, reporter, total):
                    continue
                if line.startswith(b"transplant-sent "):
                    try:
                        side.sent = json.loads(line[len(b"transplant-sent "):])
                    except ValueError:
                        pass
                else:
                    side.tail.extend(line + b"\n")
                    del side.tail[:-8192]
        side.tail.extend(pending)

    def read_reply() -> None:
        for chunk in iter(lambda: receiver.proc.stdout.read1(1 << 20), b""):
            receiver.out.extend(chunk)

    threads = [threading.Thread(target=feed, daemon=True, name="stream listing"),
               threading.Thread(target=read_errors, args=(sender,), daemon=True, name="stream sender stderr"),
               threading.Thread(target=read_errors, args=(receiver,), daemon=True, name="stream receiver stderr"),
               threading.Thread(target=read_reply, daemon=True, name="stream receiver reply")]
    for thread in threads:
        thread.start()
    return threads


def _wait(sides: list[_Side], deadline: float | None, timeout: float | None, src: Host, dst: Host) -> None:
    """Wait for both sides; once one failed, the other gets :data:`_GRACE` seconds, then is killed.

    :raises HostError: past the deadline (both sides are killed first).
    """
    failed_at = None
    while True:
        running = [s for s in sides if s.proc.poll() is None]
        if not running:
            return
        now = time.monotonic()
        if failed_at is None and any(s.proc.returncode not in (None, 0) for s in sides):
            failed_at = now
        if failed_at is not None and now - failed_at > _GRACE:
            for side in running:
                _stop(side.proc)
            return
        if deadline is not None and now > deadline:
            for side in sides:
                _stop(side.proc)
            raise HostError(f"stream from {src.label} to {dst.label} timed out after {timeout:g} s and was stopped")
        time.sleep(0.02)


def _reply(receiver: _Side) -> dict | None:
    lines = [line for line in bytes(receiver.out).splitlines() if line.strip()]
    if not lines:
        return None
    try:
        reply = json.loads(lines[-1])
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _raise_failure(sender: _Side, receiver: _Side, reply: dict | None) -> None:
    """Raise the error of the side that failed first in cause (a sender that stopped, a receiver
    that refused); nothing when both succeeded."""
    send_code, receive_code = sender.proc.returncode, receiver.proc.returncode
    received = reply is not None and reply.get("ok") is True and isinstance(reply.get("files"), dict)
    if send_code == 0 and receive_code == 0 and received:
        return
    for side, code in ((sender, send_code), (receiver, receive_code)):
        said = side.error_text()
        if code in (126, 127) and ("No such file" in said or "not found" in said or "Permission denied" in said):
            raise HostError(f"stream: the {side.name} side ({side.where}) could not start its interpreter "
                            f"(exit {code}): {said}", code=UNAVAILABLE)
    receiver_error = (reply or {}).get("error") or receiver.error_text() or f"exit status {receive_code}"
    sender_caused = send_code != 0 and (reply is None or reply.get("eof") or "the sending side stopped" in
                                        str(receiver_error) or receive_code == 0)
    if sender_caused or (send_code != 0 and received):
        said = sender.error_text() or f"it ended with exit status {send_code}"
        hint = _ssh_hint(sender, send_code) or "if the source changed since the plan (a file gone or rewritten), plan again, then apply"
        echoed = "the sending side stopped" in str(receiver_error)  # the receiver only repeats the sender's words
        raise HostError(f"stream from {sender.where}: the sending side failed (exit {send_code}): {said}"
                        + ("" if received or echoed else
                           f"\n(the receiving side on {receiver.host.label}: {receiver_error})"),
                        hint=hint)
    raise HostError(f"stream to {receiver.where}: the receiving side failed (exit {receive_code}): {receiver_error}",
                    hint=_ssh_hint(receiver, receive_code))


def _ssh_hint(side: _Side, code: int | None) -> str | None:
    if code == 255 and not isinstance(side.host, LocalHost):
        return f"check that `ssh` reaches {side.host.label} with the same key and known_hosts"
    return None
