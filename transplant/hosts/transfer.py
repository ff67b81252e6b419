"""Copy a list of files between hosts with rsync, run on the controller.

Exactly the listed files move (``--files-from``, NUL-separated, fed on standard input),
each written to a temporary name in its destination directory and renamed into place
(rsync's default; never ``--inplace``), so a file hardlinked elsewhere (a pip or uv cache)
keeps its old bytes under its other names. ``--ignore-times`` makes rsync send every
listed file: the planner, not rsync's size+mtime check, decides what differs.
``--whole-file`` skips rsync's delta algorithm: the listed files differ by content, and on
files that differ entirely the delta pass costs about as much again as the copy.

rsync cannot copy from one remote host to another, so SSH to SSH goes through a staging
folder on the controller (two legs). Local to local, and local to or from SSH, is one leg.
A relay folder is named ``relay-<pid>-<host tag>-<random>`` (the controller's process id and a
tag of its host name), so one left by a controller that was killed is removed by the next
transfer on that controller (:func:`clean_dead_relays`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transplant.errors import HostError, TransplantError
from transplant.remote._common import normal_relpath
from transplant.hosts.host import Host, LocalHost, kill_group
from transplant.reporting import QUIET, Reporter

__all__ = ["TransferResult", "copy_files", "copy_tree", "check_relpath", "clean_dead_relays", "relay_prefix"]

_RSYNC_OPTIONS = (
    "-a",
    "--files-from=-",
    "--from0",
    "--ignore-times",
    "--whole-file",
    "--mkpath",
    "--stats",
    "--info=progress2",
    "--no-human-readable",
)
#: A whole tree (a venv clone): symlinks as symlinks, hardlinks within the tree as hardlinks.
_TREE_OPTIONS = ("-aH", "--whole-file", "--mkpath", "--stats", "--info=progress2", "--no-human-readable")
_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+(\d+)%")
_STAT_LINES = {
    "files": re.compile(r"^Number of regular files transferred: ([\d,]+)", re.M),
    "sent": re.compile(r"^Total bytes sent: ([\d,]+)", re.M),
    "received": re.compile(r"^Total bytes received: ([\d,]+)", re.M),
    "size": re.compile(r"^Total transferred file size: ([\d,]+)", re.M),
}


@dataclass(frozen=True, kw_only=True)
class TransferResult:
    """What one :func:`copy_files` call moved.

    :ivar files: regular files rsync transferred (into the destination).
    :ivar bytes: bytes that crossed the wire, from rsync's ``--stats``: "Total bytes sent"
        when the controller pushes (and for local copies), "Total bytes received" when it
        pulls; the sum of both legs for an SSH to SSH relay. Delta transfer makes it
        smaller than the files' size when the destination holds similar files.
    :ivar seconds: wall-clock time of the whole copy, in seconds.
    :ivar how: ``rsync`` (:func:`copy_files`, :func:`copy_tree`) or ``stream``
        (:func:`transplant.hosts.stream.stream_files`: ``bytes`` is then the stream's length,
        which crossed each wire once, compressed when ``compression`` says so).
    :ivar compression: ``zstd`` or ``zlib`` when the stream was compressed; None otherwise.
    :ivar written: for a stream, path -> (RECORD-form sha256 or ``symlink:<text>``, size in
        bytes, st_dev, st_ino, st_mtime_ns) of each file as the receiver wrote it; empty for rsync.
    """

    files: int
    bytes: int
    seconds: float
    how: str = "rsync"
    compression: str | None = None
    written: Mapping[str, tuple] = field(default_factory=dict)


def check_relpath(relpath: str) -> str:
    """Normalise a path relative to a venv root and refuse one that leaves it.

    :param relpath: POSIX path such as ``lib/python3.11/site-packages/torch/__init__.py``;
        inner ``..`` that stays inside the root is folded away.
    :returns: the normalised path.
    :raises ValueError: empty, absolute, NUL, the root itself, or escapes the root.
    """
    if not isinstance(relpath, str):
        raise TypeError(f"relative paths must be str, got {type(relpath).__name__}: {relpath!r}")
    return normal_relpath(relpath)  # the stream's host scripts check with this same function


def copy_files(
    src: Host,
    src_root: str,
    dst: Host,
    dst_root: str,
    relpaths: Sequence[str],
    *,
    staging: Path,
    reporter: Reporter = QUIET,
    timeout: float | None = None,
) -> TransferResult:
    """Copy ``src_root/<relpath>`` to ``dst_root/<relpath>`` for each relpath, with rsync.

    Missing destination folders are created. Files are written to a temporary name and
    renamed, so other hardlinks to a replaced file keep their content.

    :param src: the host that has the files.
    :param src_root: absolute folder on ``src`` the relpaths are relative to.
    :param dst: the host to write to (may be ``src`` for a copy within one host).
    :param dst_root: absolute folder on ``dst``; created if missing.
    :param relpaths: POSIX paths relative to both roots; an empty list copies nothing.
    :param staging: folder on the controller for the SSH to SSH relay; created if missing,
        a fresh subfolder is used and removed afterwards (other copies do not use it). Relay
        folders that dead controllers left there are removed first (:func:`clean_dead_relays`).
    :param reporter: its ``progress`` is told (bytes done, bytes in all) as rsync reports
        progress, then once (total, total) at the end. Until rsync's final statistics the total
        is estimated from its percentage. A relay counts each leg as half.
    :param timeout: seconds for the whole copy; None waits without limit.
    :returns: files and bytes moved, and the time taken.
    :raises ValueError: a relpath is absolute or escapes the root; a root is not absolute.
    :raises HostError: rsync failed (its exit status and the tail of its stderr are in the
        message) or ran past ``timeout``.
    :raises TransplantError: rsync is not installed on the controller.
    """
    for root in (src_root, dst_root):
        if not root.startswith("/"):
            raise ValueError(f"root folders must be absolute paths, got {root!r}")
    paths = [check_relpath(p) for p in relpaths]
    if not paths:
        return TransferResult(files=0, bytes=0, seconds=0.0)
    listing = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    return _one_or_two_legs(src, src_root, dst, dst_root, listing, _RSYNC_OPTIONS, staging, reporter, timeout)


_RELAY = re.compile(r"relay-([1-9][0-9]{0,9})-([0-9a-f]{8})-[A-Za-z0-9_]{1,32}")


def _host_tag() -> str:
    """8 hex digits naming this controller's host (a state folder may be shared between hosts)."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def relay_prefix() -> str:
    """The name prefix of this process's relay folders: ``relay-<pid>-<host tag>-``."""
    return f"relay-{os.getpid()}-{_host_tag()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no process has: keep the folder
    return True


def clean_dead_relays(staging: Path) -> list[str]:
    """Remove the relay folders under ``staging`` whose controller process is gone.

    Only entries named as :func:`relay_prefix` names them, made on this host (the tag), that
    are real folders (``lstat``: a symlink is never followed nor removed) and whose pid is not
    a running process are removed; nothing else under ``staging`` is touched (other names,
    files, symlinks, another host's relays, a live process's). ``staging`` itself must be a
    real folder, else nothing is done. A folder that cannot be removed is left.

    :returns: the names removed.
    """
    staging = Path(staging)
    try:
        if not stat.S_ISDIR(os.lstat(staging).st_mode):
            return []
        names = os.listdir(staging)
    except OSError:
        return []
    tag, removed = _host_tag(), []
    for name in names:
        match = _RELAY.fullmatch(name)
        if match is None or match.group(2) != tag or _alive(int(match.group(1))):
            continue
        path = staging / name
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            shutil.rmtree(path)  # refuses a symlink; never follows one inside (fd-based where supported)
        except OSError:
            continue
        removed.append(name)
    return removed


def _one_or_two_legs(
    src: Host,
    src_root: str,
    dst: Host,
    dst_root: str,
    listing: bytes,
    options: Sequence[str],
    staging: Path,
    reporter: Reporter,
    timeout: float | None,
) -> TransferResult:
    """One rsync when a side is the controller; else two, relayed through a fresh folder
    under ``staging`` on the controller (removed afterwards). Relay folders of dead
    controllers under ``staging`` are removed first (:func:`clean_dead_relays`)."""
    clean_dead_relays(staging)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    if src.rsync_rsh() is None or dst.rsync_rsh() is None:
        stats = _rsync(src, src_root, dst, dst_root, listing, reporter, (0, 1), deadline, timeout, options)
        return TransferResult(files=stats.files, bytes=stats.wire, seconds=time.monotonic() - started)
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)
    relay = tempfile.mkdtemp(prefix=relay_prefix(), dir=staging)
    try:
        controller = LocalHost()
        first = _rsync(src, src_root, controller, relay, listing, reporter, (0, 2), deadline, timeout, options)
        second = _rsync(controller, relay, dst, dst_root, listing, reporter, (1, 2), deadline, timeout, options)
    finally:
        shutil.rmtree(relay, ignore_errors=True)
    return TransferResult(files=second.files, bytes=first.wire + second.wire, seconds=time.monotonic() - started)


def copy_tree(
    src: Host,
    src_root: str,
    dst: Host,
    dst_root: str,
    *,
    staging: Path,
    exclude: Sequence[str] = (),
    reporter: Reporter = QUIET,
    timeout: float | None = None,
) -> TransferResult:
    """Copy the tree ``src_root`` to ``dst_root`` with ``rsync -aH``: modes, times, symlinks
    as symlinks (never followed), hardlinks between files of the tree as hardlinks.

    SSH to SSH is relayed through a fresh folder under ``staging`` on the controller, as
    :func:`copy_files` does; hardlinks survive both legs.

    :param exclude: names at the top of ``src_root`` not to copy (``.transplant``).
    :returns: files and bytes moved, and the time taken.
    :raises ValueError: a root is not absolute, or an exclude is not a plain name.
    :raises HostError: rsync failed or ran past ``timeout``.
    :raises TransplantError: rsync is not installed on the controller.
    """
    for root in (src_root, dst_root):
        if not root.startswith("/"):
            raise ValueError(f"root folders must be absolute paths, got {root!r}")
    options = list(_TREE_OPTIONS)
    for name in exclude:
        if not name or "/" in name or name in (".", "..") or any(c in name for c in "*?[\\"):
            raise ValueError(f"exclude must be a plain name, got {name!r}")
        options.append(f"--exclude=/{name}")
    return _one_or_two_legs(src, src_root, dst, dst_root, b"", options, staging, reporter, timeout)


def _rsync_env() -> dict[str, str]:
    """The controller's environment for rsync: C locale (its statistics are parsed), and
    without RSYNC_OLD_ARGS / RSYNC_PROTECT_ARGS, which would let the remote shell split a
    path with spaces or shell characters (rsync 3.2.4 and later protect them by default)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RSYNC_OLD_ARGS", "RSYNC_PROTECT_ARGS")}
    env["LC_ALL"] = "C"
    return env


@dataclass(frozen=True)
class _Stats:
    files: int
    wire: int
    size: int


def _rsync(
    src: Host,
    src_root: str,
    dst: Host,
    dst_root: str,
    listing: bytes,
    reporter: Reporter,
    leg: tuple[int, int],
    deadline: float | None,
    timeout: float | None,
    options: Sequence[str] = _RSYNC_OPTIONS,
) -> _Stats:
    """One rsync run from the controller; at most one side is remote."""
    remote = src if src.rsync_rsh() is not None else dst
    rsh = remote.rsync_rsh()
    argv = ["rsync", *options]
    if rsh is not None:
        argv += ["-e", rsh]
    argv += [
        src.rsync_location(src_root.rstrip("/") + "/"),
        dst.rsync_location(dst_root.rstrip("/") + "/"),
    ]
    where = f"rsync from {src.label}:{src_root} to {dst.label}:{dst_root}"
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_rsync_env(),
            start_new_session=True,
        )
    except FileNotFoundError:
        raise TransplantError(
            "rsync is not installed on the controller", hint="apt-get install rsync"
        ) from None

    stdout: list[bytes] = []
    stderr: list[bytes] = []
    index, legs = leg

    def report(done: int, total: int) -> None:
        if total > 0:
            reporter.progress((index * total + min(done, total)) // legs, total)

    def read_stdout() -> None:
        pending = b""
        while True:
            chunk = proc.stdout.read1(1 << 16)
            if not chunk:
                break
            stdout.append(chunk)
            if reporter is QUIET:  # nobody listens: skip parsing
                continue
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            for line in lines:
                match = _PROGRESS.match(line)
                if match:
                    done = int(match.group(1).replace(b",", b""))
                    percent = int(match.group(2))
                    total = done * 100 // percent if percent else 0
                    report(done, max(total, done))

    def read_stderr() -> None:
        while True:
            chunk = proc.stderr.read1(1 << 16)
            if not chunk:
                break
            stderr.append(chunk)

    def feed() -> None:
        try:
            proc.stdin.write(listing)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    threads = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr, feed)]
    for thread in threads:
        thread.start()
    try:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        proc.wait(remaining)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise HostError(f"{where} timed out after {timeout:g} s and was stopped") from None
    except BaseException:
        kill_group(proc)
        raise
    finally:
        for thread in threads:
            thread.join(5)
    err_text = b"".join(stderr).decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        tail = err_text if len(err_text) <= 2000 else "..." + err_text[-2000:]
        hint = None
        # ssh's own failure is 255; when ssh dies after rsync started, rsync reports 12 (protocol stream)
        if proc.returncode == 255 or "Host key verification failed" in err_text or "Permission denied" in err_text:
            hint = f"check that `ssh` reaches {remote.label} with the same key and known_hosts"
        raise HostError(f"{where} failed with exit status {proc.returncode}:\n{tail}", hint=hint)
    text = b"".join(stdout).decode("utf-8", "replace")
    numbers = {}
    for key, pattern in _STAT_LINES.items():
        match = pattern.search(text)
        numbers[key] = int(match.group(1).replace(",", "")) if match else 0
    pull = src is remote and rsh is not None
    stats = _Stats(
        files=numbers["files"],
        wire=numbers["received"] if pull else numbers["sent"],
        size=numbers["size"],
    )
    report(stats.size, stats.size)
    return stats


