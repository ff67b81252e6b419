"""Send files as one framed stream on standard output: the source side of a stream transfer.

Run on the host that has the files as ``python -I -S -c <this file> ROOT [--compress MODE]
[--listing-sha256 HEX]`` (the digest: the direct pull's forced command on the donor, which serves
only the list of paths whose raw bytes hash to it; any other list is refused before a byte is sent).
Standard input is the list of paths to send, relative to ROOT, NUL-separated. Standard output
gets ``STREAM_MAGIC`` and one frame per path (``_common.FRAME``: kind, path length, mode, size,
mtime_ns; then the path, then ``size`` bytes), then the end frame ``E`` with the number of
entries. Each path is checked with the rules of ``check_relpath`` (``_common.normal_relpath``:
no absolute path, no ``..`` out of ROOT) and its last component is never followed: a symlink
is sent as a symlink (``L``, its text), a regular file as its bytes (``F``, moved by
``os.sendfile`` from the file into standard output where the kernel allows it, else read and
written); anything else, or a path that cannot be read (it vanished since the plan), ends the
stream with an ``X`` frame naming the path and why, and exit status 1.

``--compress``: ``none`` (default); ``zlib`` (one zlib stream at level 1, stdlib); ``zstd``
(the frames go through ``zstd -1 -T0 -c`` started here by argv, its output copied to standard
output). At the end one line on standard error: ``transplant-sent {"wire", "entries", "bytes"}``
(bytes written to standard output, that is on the wire; entries sent; their content bytes).
Errors go to standard error, exit status 1. Stdlib only, Python 3.9+.
"""

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import zlib

try:
    from _transplant_common import FRAME, STREAM_MAGIC, normal_relpath
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import FRAME, STREAM_MAGIC, normal_relpath

_CHUNK = 1 << 20


class Failed(Exception):
    """The stream cannot go on; the message says why (the path first)."""


class _Output:
    """Standard output, as plain frames, a zlib stream, or through a ``zstd`` process; counts
    ``wire``, the bytes written to standard output."""

    def __init__(self, mode):
        self.mode, self.wire, self.proc, self.pump = mode, 0, None, None
        self.fd = 1
        self.zlib = zlib.compressobj(1) if mode == "zlib" else None
        if mode == "zstd":
            self.proc = subprocess.Popen(["zstd", "-1", "-T0", "-c", "-q"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
            self.fd = self.proc.stdin.fileno()
            self.pump_error = None
            self.pump = threading.Thread(target=self._pump, daemon=True)
            self.pump.start()

    def _pump(self):
        source = self.proc.stdout.fileno()
        try:
            while True:
                data = os.read(source, _CHUNK)
                if not data:
                    return
                self.wire += _write_all(1, data)
        except OSError as exc:
            self.pump_error = exc

    def write(self, data):
        if self.zlib is not None:
            data = self.zlib.compress(data)
            if not data:
                return
        written = _write_all(self.fd, data)
        if self.proc is None:
            self.wire += written

    def frame(self, kind, rel, mode, size, mtime_ns):
        name = rel.encode("utf-8", "surrogateescape")
        self.write(FRAME.pack(kind, len(name), mode, size, mtime_ns) + name)

    def file(self, fd, size, rel):
        """Send ``size`` bytes of the open file ``fd``; Failed when it ends sooner (it shrank)."""
        offset = 0
        if self.zlib is None:
            while offset < size:
                try:
                    sent = os.sendfile(self.fd, fd, offset, min(size - offset, 1 << 30))
                except OSError as exc:
                    if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        break  # no sendfile between these two: read and write the rest
                    raise
                if sent == 0:
                    raise Failed("{}: the file shrank while it was sent ({} of {} bytes); it changed since the "
                                 "plan".format(rel, offset, size))
                offset += sent
                if self.proc is None:
                    self.wire += sent
        while offset < size:
            data = os.pread(fd, min(_CHUNK, size - offset), offset)
            if not data:
                raise Failed("{}: the file shrank while it was sent ({} of {} bytes); it changed since the "
                             "plan".format(rel, offset, size))
            self.write(data)
            offset += len(data)

    def close(self):
        if self.zlib is not None:
            tail = self.zlib.flush()
            self.zlib = None
            if tail:
                self.wire += _write_all(self.fd, tail)
        if self.proc is not None:
            self.proc.stdin.close()
            self.pump.join()
            code = self.proc.wait()
            if code != 0 or self.pump_error is not None:
                raise Failed("zstd failed (exit {}{})".format(
                    code, ", " + str(self.pump_error) if self.pump_error else ""))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return len(data)


def send(root, paths, out):
    """Write every path's frame and bytes; returns (entries, content bytes)."""
    out.write(STREAM_MAGIC)
    entries = content = 0
    for raw in paths:
        rel = raw.decode("utf-8", "surrogateescape")
        try:
            rel = normal_relpath(rel)
        except ValueError as exc:
            _refuse(out, rel, str(exc))
        full = os.path.join(root, rel)
        try:
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                text = os.readlink(os.fsencode(full))
                out.frame(b"L", rel, 0o777, len(text), info.st_mtime_ns)
                out.write(text)
            elif stat.S_ISREG(info.st_mode):
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
                try:
                    info = os.fstat(fd)
                    out.frame(b"F", rel, stat.S_IMODE(info.st_mode), info.st_size, info.st_mtime_ns)
                    out.file(fd, info.st_size, rel)
                finally:
                    os.close(fd)
                content += info.st_size
            else:
                _refuse(out, rel, "{}: not a regular file or a symlink".format(rel))
        except (FileNotFoundError, NotADirectoryError):
            _refuse(out, rel, "{}: no such file in {} (it vanished since the plan)".format(rel, root))
        except PermissionError as exc:
            _refuse(out, rel, "{}: cannot be read: {}".format(rel, exc.strerror))
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET):
                raise
            _refuse(out, rel, "{}: {}".format(rel, exc.strerror or exc))
        entries += 1
    out.frame(b"E", "", 0, entries, 0)
    return entries, content


def _refuse(out, rel, message):
    """End the stream with an ``X`` frame naming ``rel`` (the receiver stops there), then fail."""
    data = message.encode("utf-8", "replace")
    try:
        out.frame(b"X", rel, 0, len(data), 0)
        out.write(data)
        out.close()
    except (OSError, Failed):
        pass
    raise Failed(message)


def _options(argv):
    """(root, compression, the listing's sha256 hex or None)."""
    usage = "usage: stream_send ROOT [--compress none|zlib|zstd] [--listing-sha256 HEX]"
    digest = None
    if len(argv) >= 2 and argv[-2] == "--listing-sha256":
        digest, argv = argv[-1], argv[:-2]
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise Failed(usage)
    if not argv or argv[0].startswith("-"):
        raise Failed(usage)
    root, mode = argv[0], "none"
    if argv[1:2] == ["--compress"] and len(argv) == 3 and argv[2] in ("none", "zlib", "zstd"):
        mode = argv[2]
    elif len(argv) != 1:
        raise Failed(usage)
    return root, mode, digest


def main(argv):
    try:
        root, mode, digest = _options(argv)
        listing = sys.stdin.buffer.read()
        # the direct pull's one-time key runs this as its forced command with the planned list's digest:
        # any other list (another file of the donor) is refused before a byte is sent
        if digest is not None and hashlib.sha256(listing).hexdigest() != digest:
            raise Failed("refused: the list of paths asked for is not the one this pull was authorised for; "
                         "nothing was sent")
        paths = [p for p in listing.split(b"\0") if p]
        out = _Output(mode)
        entries, content = send(root, paths, out)
        out.close()
    except Failed as exc:
        sys.stderr.write("stream_send: {}\n".format(exc))
        return 1
    except OSError as exc:
        if exc.errno in (errno.EPIPE, errno.ECONNRESET):
            sys.stderr.write("stream_send: the receiving side closed the stream\n")
        else:
            sys.stderr.write("stream_send: {}\n".format(exc))
        return 1
    sys.stderr.write("transplant-sent " + json.dumps({"wire": out.wire, "entries": entries, "bytes": content}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
