"""Where the controller may write a file or folder a person named (edge): ``plan --out``, ``init
--out``, ``verify --junit``, the snapshot store of ``snapshot --out``. Only a regular file (new, or
one that may be replaced) or a folder where a file can really be made: never a device, a FIFO, a
symlink, or a file or folder of ``/proc`` or ``/sys`` (``/proc/self/mem`` is a "regular file"
whose folder takes no new file)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from transplant.errors import TransplantError

__all__ = ["check_output", "check_output_folder"]


def _try_a_file(folder: Path, what: str, hint: str) -> None:
    """Make a temporary file in ``folder`` and remove it at once.

    :raises TransplantError: no file can be made there (``what`` starts the message)."""
    try:
        fd, trial = tempfile.mkstemp(prefix=".transplant-", suffix=".trial", dir=str(folder))
    except OSError as exc:
        raise TransplantError(f"{what}: no file can be written in the folder {folder} ({exc.strerror or exc})",
                              hint=hint) from None
    os.close(fd)
    os.unlink(trial)


def check_output(path: str | os.PathLike, *, option: str, replace: bool, hint: str) -> None:
    """Refuse ``path`` as the destination of a file the controller writes, before any work.

    The folder is tried for real: a temporary file is made there and removed at once (so a
    read-only file system, a folder of ``/proc`` or ``/sys``, or one this user cannot write is
    found now, not after minutes of planning).

    :param option: the option named in the message (``--out``).
    :param replace: whether an existing regular file may be replaced; False: any existing path
        is refused.
    :param hint: the fix the error suggests.
    :raises TransplantError: the folder is missing or not a folder, no file can be made in it,
        or ``path`` exists and is not a regular file (a device, a FIFO, a socket, a folder, a
        symlink), or exists while ``replace`` is False.
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise TransplantError(f"{option} {path}: cannot be looked at ({exc.strerror})", hint=hint) from None
    if info is not None:
        if not replace:
            raise TransplantError(f"{option} {path}: already exists; it is never overwritten", hint=hint)
        if not stat.S_ISREG(info.st_mode):
            raise TransplantError(f"{option} {path}: exists and is not a regular file; refusing to replace it",
                                  hint=hint)
    if not parent.is_dir():
        raise TransplantError(f"{option} {path}: the folder {parent} does not exist", hint=hint)
    _try_a_file(parent, f"{option} {path}", hint)


def check_output_folder(path: str | os.PathLike, *, option: str, hint: str) -> None:
    """Refuse ``path`` as a folder the controller fills (a snapshot store), before any work: an
    existing one must be a folder where a file can be made; a missing one is made later with its
    missing parents, so the nearest existing folder above it must take a new entry.

    :raises TransplantError: ``path`` or a part of it above is something other than a folder (a
        file, a device), or no file can be made where it is or will be.
    """
    folder = Path(path).absolute()
    nearest = folder
    while not os.path.lexists(nearest) and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise TransplantError(f"{option} {path}: {nearest} exists and is not a folder", hint=hint)
    _try_a_file(nearest, f"{option} {path}", hint)
