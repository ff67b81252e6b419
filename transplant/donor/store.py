"""A content-addressed file store on the controller (edge): the bytes behind snapshots.

Layout of a store folder::

    objects/<2 hex>/<64 hex>    one file per distinct content, named by its sha256, read-only
    index/<snapshot id>.json    one document per snapshot (see :mod:`transplant.donor.snapshot`)
    tmp/                        files on their way in (same filesystem, so a rename is atomic)

Content is named by the same sha256 RECORD uses (``sha256=<urlsafe base64>``, PEP 376 /
the wheel spec); :func:`object_key` turns it into the hex file name. A file is hashed when
it is written (:func:`put`: it must have the hash it is stored under, else it is refused) and
again whenever it is read (:func:`read_into`: a changed object is reported, never used). A
content already stored is not stored again.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from transplant.remote._common import record_hash_of  # RECORD's hash form, one definition
from transplant.errors import StoreError
from transplant.controller.state import private_folder

__all__ = ["StoreError", "object_key", "object_path", "has", "put", "read_into", "new_tmp", "object_sizes",
           "locked"]

_BLOCK = 1 << 20
_HEX = re.compile(r"[0-9a-f]{64}")


def object_key(digest: str) -> str:
    """The hex name of a RECORD-form hash: ``sha256=<urlsafe b64, no padding>`` -> 64 hex digits.

    :raises ValueError: not a sha256 in RECORD's form.
    """
    algorithm, _, encoded = digest.partition("=")
    if algorithm != "sha256" or not encoded:
        raise ValueError(f"not a RECORD sha256 hash: {digest!r}")
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"not a RECORD sha256 hash: {digest!r}") from None
    if len(raw) != 32:
        raise ValueError(f"not a RECORD sha256 hash: {digest!r}")
    return raw.hex()


_record_hash = record_hash_of


def object_path(store: Path, digest: str) -> Path:
    """Where the content with RECORD hash ``digest`` lives in ``store``."""
    key = object_key(digest)
    return store / "objects" / key[:2] / key


def has(store: Path, digest: str) -> bool:
    """Whether ``store`` holds a file for ``digest`` (its bytes are checked when read, not here)."""
    return object_path(store, digest).is_file()


def new_tmp(store: Path) -> Path:
    """A fresh folder under ``store/tmp`` for files on their way in (the caller removes it)."""
    private_folder(store / "tmp")
    return Path(tempfile.mkdtemp(prefix="in-", dir=store / "tmp"))


def _hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
            size += len(block)
    return _record_hash(digest.digest()), size


def put(store: Path, digest: str, source: Path, *, move: bool = False) -> bool:
    """Store the file ``source`` under ``digest``, checking that it has that content.

    :param move: rename ``source`` into the store (it must be on the store's filesystem,
        e.g. under :func:`new_tmp`) instead of copying it.
    :returns: True when stored now, False when the store already held that content (then
        ``source`` is left alone).
    :raises StoreError: ``source`` does not hash to ``digest`` (nothing is stored).
    """
    final = object_path(store, digest)
    if final.is_file():
        return False
    found, _size = _hash_file(source)
    if found != digest:
        raise StoreError(f"{source}: its content hashes to {found}, not {digest}; it was not stored",
                         hint="the file changed while it was read; take the snapshot again")
    final.parent.mkdir(parents=True, exist_ok=True)
    if move:
        os.chmod(source, 0o444)
        os.replace(source, final)
    else:
        tmp = new_tmp(store)
        try:
            shutil.copyfile(source, tmp / "object")
            if _hash_file(tmp / "object")[0] != digest:
                raise StoreError(f"{source}: changed while it was copied into the store; it was not stored")
            os.chmod(tmp / "object", 0o444)
            os.replace(tmp / "object", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def read_into(store: Path, digest: str, dest: Path, *, mode: int | None = None) -> int:
    """Copy the content ``digest`` from ``store`` to ``dest`` (a new file), hashing it on the way.

    :param mode: permission bits for ``dest`` (None: 0o644); setuid, setgid and sticky bits
        are dropped (a store never hands out privileges).
    :returns: bytes copied.
    :raises StoreError: the object is missing, or its bytes do not hash to ``digest`` (a
        damaged or tampered store); ``dest`` is removed then.
    """
    source = object_path(store, digest)
    fix = (f"remove the damaged file ({source}) and take the snapshot again from its donor "
           f"(transplant snapshot MANIFEST), or use another snapshot")
    digest_now = hashlib.sha256()
    size = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(source, "rb") as src, open(dest, "wb") as out:
            for block in iter(lambda: src.read(_BLOCK), b""):
                digest_now.update(block)
                out.write(block)
                size += len(block)
    except FileNotFoundError:
        dest.unlink(missing_ok=True)
        raise StoreError(f"{store}: the stored file for {digest} is missing", hint=fix) from None
    found = _record_hash(digest_now.digest())
    if found != digest:
        dest.unlink(missing_ok=True)
        raise StoreError(f"{source}: hash mismatch: the store holds it for {digest}, but its content hashes to "
                         f"{found} (the file was changed after it was stored); it was not used", hint=fix)
    os.chmod(dest, 0o644 if mode is None else mode & 0o777)
    return size


@contextlib.contextmanager
def locked(store: Path, *, exclusive: bool):
    """Hold the store's lock (``store/lock``, flock(2)) for the ``with`` block: shared for
    writers that add objects then an index (captures may run together), exclusive for
    prune, which must not remove objects a capture has stored but not yet indexed."""
    private_folder(store)
    with open(store / "lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def object_sizes(store: Path) -> dict[str, int]:
    """Every object file in ``store``: hex name -> size in bytes. Only files laid out as
    objects count (``objects/<2 hex>/<64 hex>``, not symlinks); anything else there is left
    alone by prune, which removes by these names."""
    root = store / "objects"
    if not root.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in root.glob("*/*")
            if _HEX.fullmatch(p.name) and p.parent.name == p.name[:2] and p.is_file() and not p.is_symlink()}
