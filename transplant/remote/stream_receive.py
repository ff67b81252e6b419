"""Receive a framed file stream on standard input and write it under a folder, hashing as it writes.

The target side of a stream transfer: run as ``python -I -S -c <this file> ROOT [--compress
MODE]`` on the host to write to, standard input being what ``stream_send.py`` writes (its
standard output, connected by the controller). Each entry is written under ROOT (the
transaction's staged folder), created if missing:

* its path is checked with the rules of ``check_relpath`` (``_common.normal_relpath``); one that
  leaves ROOT is refused;
* folders on the way are opened one by one relative to their parent with ``O_NOFOLLOW`` (and
  made, mode 0755, where missing), so a symlink planted inside ROOT is refused, never followed;
* a file is written to a temporary name in its folder (``O_EXCL | O_NOFOLLOW``), its mode and
  mtime set as the sender's, then renamed over its name (a symlink there is replaced, not
  followed); a symlink is made the same way. A failure removes the temporary file, so nothing is
  left half-written or half-renamed; entries finished before it stay (the caller discards them);
* while the bytes are written their sha256 is computed (RECORD's ``sha256=<urlsafe b64>`` form,
  ``_common.record_hash_of``): the file is never read back;
* a file of 1 MiB or more is written out to disk (``fdatasync``) on a thread of its own while the
  stream goes on (:class:`_Flusher`), and the reply waits until it is: the commit's ``sync`` then
  finds only the small files' bytes left to write.

Progress: ``transplant-progress <bytes written>`` lines on standard error, at most five a second,
and one at the end. Last, one JSON line on standard output: ``{"ok": true, "error": null,
"files": {path: [hash, size, st_dev, st_ino, st_mtime_ns]}, "entries", "bytes", "wire"}`` (a
symlink's hash is ``symlink:<text>``; the stat fields are those of the file as written, which a
rename keeps; ``wire``: bytes read from standard input, null with zstd), or ``{"ok": false,
"error": ..., "eof": bool}`` with exit status 1 (``eof``: the input ended before the end frame,
the sender's side failed). SIGTERM (the controller stopping this side) is an error like any
other: the file being written is removed first. ``--compress zlib`` reads one zlib stream; ``zstd`` reads standard
input through ``zstd -dc`` started here by argv. Stdlib only, Python 3.9+.

ROOT ``-`` (uncompressed only, not with ``--from-ssh``): the folder is the input's first line (an
absolute path and a newline), read before the stream's first line, so that this side can start
before the controller knows the folder (a small apply starts it as soon as it connects).

The direct transfer (``ROOT [--compress MODE] --known-hosts PATH LINES [--identity KEY] --from-ssh
SSH-ARGV...``): this side fetches the stream itself. It writes ``LINES`` (the donor's host key lines,
pinned by the controller) to ``PATH``, a new file (``O_EXCL | O_NOFOLLOW``, mode 0600) that must lie
beside ROOT (in the transaction's folder); with ``--identity``, reads the one-time private key the
donor authorised for this pull alone from standard input first (its length in decimal, a newline,
its bytes: never in argv, which others here can read) into ``KEY`` (a new 0600 file beside ROOT too,
named by ``SSH-ARGV``'s ``-i``), removed as soon as the stream's first line arrived (the login is
done) or the pull failed; reads the NUL-separated list of paths from standard input up to an
empty name (two NULs in a row); starts ``SSH-ARGV`` (an ``ssh`` to the donor that runs
``stream_send``; an argv, no shell here) with that list as its standard input, and reads the stream
from its standard output. Once the stream's first line arrived it says ``transplant-connected`` on
standard error. Standard input stays
open: its end (the controller gone or stopping this side) stops the transfer. The reply gains
``"sender": {"code", "said", "sent"}`` (the ``ssh``'s exit status, the tail of its standard error,
the sender's ``transplant-sent`` figures) and, on failure, ``"unavailable": true`` when no byte of the
stream came (``ssh`` could not connect, log in or start the sender: nothing was written but PATH).
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib

try:
    from _transplant_common import FRAME, STREAM_MAGIC, normal_relpath, record_hash_of
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import FRAME, STREAM_MAGIC, normal_relpath, record_hash_of

_CHUNK = 1 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC


class Refused(Exception):
    """The stream cannot be written; the message says why."""


class EndOfInput(Refused):
    """The input ended before the stream's end frame (the sender failed or was stopped)."""


class _Input:
    """Standard input as plain frames, a zlib stream, or through a ``zstd -dc`` process."""

    def __init__(self, mode, source=0):
        self.fd, self.proc, self.wire = source, None, 0
        self.zlib = zlib.decompressobj() if mode == "zlib" else None
        self.pending = b""
        if mode == "zstd":
            # reads ``source``: our standard input, or the direct transfer's ssh
            self.proc = subprocess.Popen(["zstd", "-dc", "-q"], stdin=source, stdout=subprocess.PIPE)
            self.fd, self.wire = self.proc.stdout.fileno(), None
        self.chunk = memoryview(b"")

    def _fill(self):
        """Next plain bytes into ``chunk``; False at the end of the input."""
        while True:
            if self.zlib is not None and self.pending:
                data = self.zlib.decompress(self.pending, 4 * _CHUNK)
                self.pending = self.zlib.unconsumed_tail
                if data:
                    self.chunk = memoryview(data)
                    return True
                continue
            data = os.read(self.fd, _CHUNK)
            if not data:
                if self.zlib is not None:
                    tail = self.zlib.flush()
                    if tail:
                        self.chunk = memoryview(tail)
                        return True
                return False
            if self.wire is not None:
                self.wire += len(data)
            if self.zlib is None:
                self.chunk = memoryview(data)
                return True
            self.pending = data

    def exact(self, size, what):
        parts = []
        while size:
            if not self.chunk and not self._fill():
                raise EndOfInput("the stream ended inside {}".format(what))
            piece = self.chunk[:size]
            parts.append(bytes(piece))
            self.chunk = self.chunk[len(piece):]
            size -= len(piece)
        return b"".join(parts)

    def copy(self, fd, size, digest, meter, rel, flush=None):
        """Write the next ``size`` bytes of the input to ``fd``, hashing them into ``digest``;
        ``flush(fd)`` (when given) is called after each :data:`_FLUSH_STEP` bytes written."""
        unflushed = 0
        while size:
            if not self.chunk and not self._fill():
                raise EndOfInput("the stream ended inside {} ({} bytes missing)".format(rel, size))
            piece = self.chunk[:size]
            digest.update(piece)
            while piece:
                piece = piece[os.write(fd, piece):]
            taken = min(size, len(self.chunk))
            self.chunk = self.chunk[taken:]
            size -= taken
            meter.add(taken)
            if flush is not None:
                unflushed += taken
                if unflushed >= _FLUSH_STEP:
                    flush(fd)
                    unflushed = 0

    def at_end(self):
        return not self.chunk and not self._fill()

    def close(self):
        if self.proc is not None:
            code = self.proc.wait()
            if code != 0:
                raise Refused("zstd -dc failed (exit {})".format(code))


class _Progress:
    """Bytes written, said on standard error at most five times a second."""

    def __init__(self):
        self.done, self.said = 0, 0.0

    def add(self, count):
        self.done += count
        now = time.monotonic()
        if now - self.said >= 0.2:
            self.say()
            self.said = now

    def say(self):
        sys.stderr.write("transplant-progress {}\n".format(self.done))
        sys.stderr.flush()


class _Folders:
    """Folder descriptors under the root, each opened relative to its parent with O_NOFOLLOW."""

    def __init__(self, root):
        os.makedirs(root, exist_ok=True)
        self.root = os.open(root, _DIR_FLAGS)
        self.open = {}

    def parent(self, rel):
        """(descriptor of ``rel``'s folder, its last name); folders made where missing."""
        parts = rel.split("/")
        where, fd = "", self.root
        for name in parts[:-1]:
            where = where + "/" + name if where else name
            known = self.open.get(where)
            if known is None:
                known = self._open(fd, name, where)
                if len(self.open) >= 256:
                    self.close_some()
                self.open[where] = known
            fd = known
        return fd, parts[-1]

    def _open(self, parent, name, where):
        for _ in range(2):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                except FileExistsError:
                    pass
            except OSError as exc:
                raise Refused("refusing to write through {}: it is a symlink or not a folder inside the staged "
                              "folder ({})".format(where, exc.strerror)) from None
        raise Refused("cannot make the folder {}".format(where))

    def close_some(self):
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()

    def close(self):
        self.close_some()
        os.close(self.root)


#: Files of at least this many bytes are written out to disk (``fdatasync``) by the flusher's
#: thread while the stream goes on, each :data:`_FLUSH_STEP` bytes and once written whole.
_FLUSH_MIN = 1 << 20
_FLUSH_STEP = 32 << 20
#: Write-outs waiting at most (each holds a duplicated descriptor); the writer waits beyond that,
#: so that a disk slower than the input sets the pace instead of the page cache filling up.
_FLUSH_AHEAD = 16


class _Flusher:
    """The larger files' write-out to disk, on a thread of its own, while the stream goes on.

    Without it the staged bytes stayed dirty in the page cache (the kernel starts writing them
    only after 30 s or past 10% of memory) and the commit's ``sync`` wrote them all out after the
    transfer, one after the other, a step of its own on the apply's path. Here each file of at least
    :data:`_FLUSH_MIN` bytes is given to ``fdatasync`` each :data:`_FLUSH_STEP` bytes and when
    written, as dpkg starts each file's write-out as it is unpacked, so the disk works while the
    network and the hashing do. :meth:`finish` waits for every write-out given: the transfer
    says ok only once its larger files are on disk, and a write-out that fails (``EIO``,
    ``ENOSPC``) fails the transfer (nothing was renamed into the venv yet).
    """

    def __init__(self):
        self.waiting, self.error, self.thread = None, None, None

    def add(self, fd):
        """Write out ``fd``'s dirty pages on the thread (a duplicate of ``fd`` is taken and closed there)."""
        if self.thread is None:
            import queue

            self.waiting = queue.Queue(_FLUSH_AHEAD)
            self.thread = threading.Thread(target=self._run, name="flusher", daemon=True)
            self.thread.start()
        self.waiting.put(os.dup(fd))

    def _run(self):
        while True:
            fd = self.waiting.get()
            if fd is None:
                return
            try:
                _DATASYNC(fd)
            except OSError as exc:
                if self.error is None:
                    self.error = exc
            finally:
                os.close(fd)

    def finish(self):
        """Wait for every write-out given; :class:`Refused` when one failed."""
        if self.thread is not None:
            self.waiting.put(None)
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise Refused("writing the staged files out to disk failed: {}".format(self.error))


_DATASYNC = getattr(os, "fdatasync", os.fsync)  # (macOS has no fdatasync)
_FLUSHER = _Flusher()
_SERIAL = [0]


def _temporary(name):
    _SERIAL[0] += 1
    return ".{}.tp-{}-{}.tmp".format(name[:64], os.getpid(), _SERIAL[0])


def _write_file(folder, name, mode, size, mtime_ns, stream, meter, rel):
    """Write ``size`` bytes of the stream to ``name`` in ``folder`` (a temporary name, renamed); its entry."""
    temporary = _temporary(name)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=folder)
    try:
        digest = hashlib.sha256()
        larger = size >= _FLUSH_MIN
        stream.copy(fd, size, digest, meter, rel, _FLUSHER.add if larger else None)
        os.fchmod(fd, mode & 0o7777)
        os.utime(fd, ns=(time.time_ns(), mtime_ns))
        info = os.fstat(fd)
        if larger:
            _FLUSHER.add(fd)
        os.close(fd)
        fd = -1
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
        raise
    return [record_hash_of(digest.digest()), size, info.st_dev, info.st_ino, info.st_mtime_ns]


def _write_link(folder, name, text, mtime_ns):
    temporary = _temporary(name)
    os.symlink(text, temporary, dir_fd=folder)
    try:
        os.utime(temporary, ns=(time.time_ns(), mtime_ns), dir_fd=folder, follow_symlinks=False)
        info = os.lstat(temporary, dir_fd=folder)
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
        raise
    return ["symlink:" + os.fsdecode(text), len(text), info.st_dev, info.st_ino, info.st_mtime_ns]


def receive(root, stream, meter, pull=None):
    """Write every entry of the stream under ``root``; returns {path: entry}."""
    if stream.exact(len(STREAM_MAGIC), "its first line") != STREAM_MAGIC:
        raise Refused("the input is not a transplant file stream")
    if pull is not None:
        pull.connected = True
        pull.forget_key()  # logged in: the key is of no more use here
        sys.stderr.write("transplant-connected\n")
        sys.stderr.flush()
    folders = _Folders(root)
    files = {}
    try:
        while True:
            kind, length, mode, size, mtime_ns = FRAME.unpack(stream.exact(FRAME.size, "a frame header"))
            rel = stream.exact(length, "a path").decode("utf-8", "surrogateescape")
            if kind == b"E":
                if size != len(files):
                    raise Refused("the stream ended after {} entries, its end frame says {}".format(len(files), size))
                break
            if kind == b"X":
                said = stream.exact(min(size, 1 << 16), "an error message").decode("utf-8", "replace")
                raise Refused("the sending side stopped at {}: {}".format(rel, said))
            try:
                rel = normal_relpath(rel)
            except ValueError as exc:
                raise Refused(str(exc)) from None
            folder, name = folders.parent(rel)
            if kind == b"F":
                files[rel] = _write_file(folder, name, mode, size, mtime_ns, stream, meter, rel)
            elif kind == b"L":
                if size > 1 << 16:
                    raise Refused("{}: a symlink text of {} bytes".format(rel, size))
                files[rel] = _write_link(folder, name, stream.exact(size, rel), mtime_ns)
            else:
                raise Refused("unknown frame kind {!r} at {}".format(kind, rel))
        if not stream.at_end():
            raise Refused("bytes after the stream's end frame")
    finally:
        folders.close()
    return files


class Unavailable(Refused):
    """The direct transfer could not start (no ``ssh`` here); nothing was written."""


class _Pull:
    """The direct transfer's ``ssh`` to the donor (see the module docstring)."""

    def __init__(self, root, known, lines, ssh, identity=None):
        self.connected, self.finished, self.proc = False, False, None
        self.tail, self.sent = bytearray(), None
        self.identity = None
        here = os.path.dirname(os.path.normpath(root))
        for path, what in ((known, "the pinned known_hosts file"), (identity, "the one-time key")):
            if path is not None and (not os.path.isabs(path) or os.path.dirname(os.path.normpath(path)) != here or
                                     os.path.normpath(path) == os.path.normpath(root)):
                raise Refused("{} {} must lie beside {}".format(what, path, root))
        _write_new(known, lines.encode("utf-8"))
        listing = bytearray()
        if identity is not None:
            # the one-time private key comes first on standard input (never in argv, which others
            # on this host can read): its length in decimal and a newline, then its bytes
            head = b""
            while not head.endswith(b"\n"):
                byte = os.read(0, 1)
                if not byte or len(head) > 8:
                    raise Refused("the one-time key's length line did not come")
                head += byte
            size = int(head)
            if not 0 < size <= 16384:
                raise Refused("a one-time key of {} bytes".format(size))
            key = bytearray()
            while len(key) < size:
                chunk = os.read(0, size - len(key))
                if not chunk:
                    raise Refused("the one-time key was cut short")
                key.extend(chunk)
            self.identity = identity
            _write_new(identity, bytes(key))
        try:
            while not listing.endswith(b"\0\0"):
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    raise Refused("the list of paths ended without its closing empty name")
                listing.extend(chunk)
            if listing.index(b"\0\0") != len(listing) - 2:
                raise Refused("bytes after the list of paths")
            try:
                self.proc = subprocess.Popen(ssh, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, close_fds=True)
            except OSError as exc:
                raise Unavailable("cannot start {} on this host: {}".format(ssh[0], exc.strerror or exc)) from None
        except BaseException:
            self.forget_key()
            raise
        self.fd = self.proc.stdout.fileno()
        try:  # a 1 MiB pipe (Linux; 64 KiB by default): fewer, larger reads, as the relay's pipe
            import fcntl
            fcntl.fcntl(self.fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except (ImportError, OSError):
            pass
        for target, args in ((self._feed, (bytes(listing[:-1]),)), (self._errors, ()), (self._watch, ())):
            threading.Thread(target=target, args=args, daemon=True).start()

    def _feed(self, listing):
        try:
            self.proc.stdin.write(listing)
            self.proc.stdin.close()
        except OSError:
            pass

    def forget_key(self):
        """Remove the one-time key file (the login is done, or the pull ended); idempotent."""
        identity, self.identity = self.identity, None
        if identity is not None:
            try:
                os.unlink(identity)
            except OSError:
                pass

    def _errors(self):
        for line in iter(self.proc.stderr.readline, b""):
            if line.startswith(b"transplant-sent "):
                try:
                    self.sent = json.loads(line[len(b"transplant-sent "):])
                except ValueError:
                    pass
            else:
                self.tail.extend(line)
                del self.tail[:-4096]

    def _watch(self):
        """Our standard input's end before the transfer finished: the controller is gone, stop."""
        try:
            while os.read(0, 1 << 12):
                pass
        except OSError:
            pass
        if not self.finished:
            os.kill(os.getpid(), signal.SIGTERM)

    def said(self):
        return self.tail.decode("utf-8", "replace").strip()[-2000:]

    def finish(self):
        """Wait for ``ssh``; Refused when it (the sender) failed although the stream was whole."""
        code = self.proc.wait()
        self.finished = True
        if code != 0:
            raise Refused("the sending side ended with exit status {}: {}".format(code, self.said()))

    def stop(self):
        self.finished = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def report(self):
        code = None if self.proc is None else self.proc.poll()
        return {"code": code, "said": self.said(), "sent": self.sent}


def _write_new(path, data):
    """Write ``data`` to ``path``, a new file (``O_EXCL | O_NOFOLLOW``, mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def _options(argv):
    """(root, compression, pull: None or (known_hosts path, its lines, ssh argv, identity path or None))."""
    pull = None
    if "--from-ssh" in argv:
        at = argv.index("--from-ssh")
        argv, ssh = argv[:at], argv[at + 1:]
        identity = None
        if len(argv) >= 2 and argv[-2] == "--identity":
            identity, argv = argv[-1], argv[:-2]
        if len(argv) < 3 or argv[-3] != "--known-hosts" or not ssh:
            raise Refused("usage: stream_receive ROOT [--compress MODE] --known-hosts PATH LINES [--identity PATH] "
                          "--from-ssh ARGV...")
        pull, argv = (argv[-2], argv[-1], ssh, identity), argv[:-3]
        if argv[:1] == ["-"]:
            raise Refused("stream_receive: ROOT - (the folder on the input) does not go with --from-ssh")
    return _plain_options(argv) + (pull,)


def _root_line(stream):
    """ROOT ``-``: the folder is the input's first line (an absolute path, at most 4096 bytes), read
    before the stream; so a receiver can start (and pay its start) before the folder is named."""
    line = b""
    while not line.endswith(b"\n"):
        if len(line) > 4096:
            raise Refused("the folder line before the stream is longer than 4096 bytes")
        line += stream.exact(1, "the folder line before the stream")
    root = line[:-1].decode("utf-8", "surrogateescape")
    if not root.startswith("/") or "\0" in root:
        raise Refused("the folder line before the stream is not an absolute path: {!r}".format(root))
    return root


def _plain_options(argv):
    if len(argv) == 1 and (argv[0] == "-" or not argv[0].startswith("-")):
        return argv[0], "none"
    if len(argv) == 3 and argv[1] == "--compress" and argv[2] in ("none", "zlib", "zstd") and (
            argv[0] != "-" or argv[2] == "none"):
        return argv[0], argv[2]
    raise Refused("usage: stream_receive ROOT|- [--compress none|zlib|zstd] (- only uncompressed)")


class Stopped(Refused):
    """SIGTERM: the controller stops this side (a timeout, Ctrl-C, the other side failed)."""


def _stopped(signum, frame):
    raise Stopped("stopped by the controller (signal {})".format(signum))


def main(argv):
    signal.signal(signal.SIGTERM, _stopped)  # the file being written is removed on the way out
    meter = _Progress()
    pull = None
    try:
        root, mode, pulling = _options(argv)
        if pulling is not None:
            pull = _Pull(root, *pulling)
        stream = _Input(mode, 0 if pull is None else pull.fd)
        if root == "-":
            root = _root_line(stream)
        files = receive(root, stream, meter, pull)
        stream.close()
        _FLUSHER.finish()
        if pull is not None:
            pull.finish()
    except (Refused, OSError, ValueError, UnicodeError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, Refused):
            message = "{}: {}".format(exc.filename, exc.strerror) if exc.filename else str(exc)
        else:
            message = str(exc)
        reply = {"ok": False, "error": message, "eof": isinstance(exc, EndOfInput)}
        if pull is not None:
            pull.forget_key()
            pull.stop()
            reply.update(sender=pull.report(), unavailable=not pull.connected and not isinstance(exc, Stopped))
        elif isinstance(exc, Unavailable):
            reply["unavailable"] = True
        sys.stderr.write("stream_receive: {}\n".format(message))
        sys.stdout.write(json.dumps(reply) + "\n")
        return 1
    meter.say()
    reply = {"ok": True, "error": None, "files": files, "entries": len(files), "bytes": meter.done,
             "wire": stream.wire}
    if pull is not None:
        reply["sender"] = pull.report()
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
