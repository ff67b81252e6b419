"""Reading one of the controller's files as a bounded regular file (edge): a FIFO is never
waited on, a device never read, a file over its limit refused before it is parsed.

Shared by the file formats that read a document: :mod:`transplant.controller.manifest_file` and
:mod:`transplant.controller.plan_file`.
"""

from __future__ import annotations

import os
import stat

__all__ = ["NotRegular", "read_regular"]


class NotRegular(Exception):
    """Not a regular file, or larger than the limit; the message says which (``is a FIFO (named
    pipe), not a regular file``, ``is 2000000 bytes, over the limit of 1048576 bytes``)."""


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Opened without blocking (a FIFO given as the file never waits for a writer) and checked
    with fstat on the open file before anything is read.

    :raises FileNotFoundError: it does not exist.
    :raises OSError: it cannot be opened or read.
    :raises NotRegular: it is not a regular file, or it is larger than ``limit`` (the message says which).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise NotRegular(f"is {kind}, not a regular file")
        if info.st_size > limit:
            raise NotRegular(f"is {info.st_size} bytes, over the limit of {limit} bytes")
        chunks, size = [], 0
        while size <= limit:
            block = os.read(fd, min(1 << 20, limit + 1 - size))
            if not block:
                break
            chunks.append(block)
            size += len(block)
        if size > limit:
            raise NotRegular(f"grew past the limit of {limit} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)
