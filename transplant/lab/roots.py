"""Debian root filesystems for lab hosts with systems of their own (their glibc, Python, libraries).

A root is built once per machine with ``debootstrap --variant=minbase`` from the Debian mirror
that apt already uses here (read from apt's sources, never written into this code), and kept
under ``~/.cache/transplant/lab/<release>``; hosts mount it read-only as the lower layer of an
overlay, so a host's changes never reach the cached root. A root is complete when its stamp
file is there: a build that was interrupted leaves only a ``.partial-*`` folder, removed by the
next build.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from transplant.errors import TransplantError

__all__ = ["RELEASES", "PACKAGES", "Release", "default_cache", "apt_mirror", "build_root", "INSTALL_HINT"]

#: The packages every lab root holds beyond minbase: sshd to reach it, Debian's own Python with
#: ``venv`` (the usual venv on Debian and Ubuntu GPU hosts), rsync (apply's transfers).
PACKAGES = ("openssh-server", "python3", "python3-venv", "rsync")
INSTALL_HINT = "apt-get install debootstrap debian-archive-keyring"
STAMP = ".transplant-root"
#: How long one debootstrap may take, in seconds (measured: about 45 s each on a 2-core machine).
BUILD_TIMEOUT = 900


@dataclass(frozen=True)
class Release:
    """A Debian release a lab root is built from.

    :ivar name: the suite's code name (``bookworm``).
    :ivar glibc: the glibc version its ``libc6`` ships (Debian's package pages).
    :ivar python: the ``major.minor`` of its ``python3`` (Debian's package pages).
    """

    name: str
    glibc: str
    python: str


#: The releases the lab builds; source of each version: packages.debian.org (libc6, python3).
RELEASES = {
    "bookworm": Release("bookworm", glibc="2.36", python="3.11"),
    "trixie": Release("trixie", glibc="2.41", python="3.13"),
}

_URIS = re.compile(r"^URIs:\s*(\S+)", re.MULTILINE)
_LINE = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", re.MULTILINE)


def default_cache() -> Path:
    """``~/.cache/transplant/lab`` (``$XDG_CACHE_HOME`` when set): where roots are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "transplant" / "lab"


def apt_mirror(etc: Path = Path("/etc/apt")) -> str:
    """The first Debian archive (not the security archive) apt uses here, from
    ``sources.list.d/*.sources`` (deb822) or ``sources.list`` (one-line form).

    :raises TransplantError: no such archive is configured.
    """
    texts = []
    folder = etc / "sources.list.d"
    if folder.is_dir():
        texts += [p.read_text(errors="replace") for p in sorted(folder.glob("*.sources"))]
        texts += [p.read_text(errors="replace") for p in sorted(folder.glob("*.list"))]
    if (etc / "sources.list").is_file():
        texts.append((etc / "sources.list").read_text(errors="replace"))
    for text in texts:
        for uri in _URIS.findall(text) + _LINE.findall(text):
            if uri.rstrip("/").endswith("/debian") and uri.startswith(("http://", "https://")):
                return uri
    raise TransplantError(
        f"no Debian archive found in {etc}/sources.list.d or {etc}/sources.list",
        hint="configure apt with a Debian mirror (a 'URIs: .../debian' line), then run again",
    )


def _remove_partial(folder: Path) -> None:
    """Remove an interrupted build, which debootstrap may have left with /proc or /sys mounted
    inside: refuse while anything is mounted under it (a recursive delete would follow it)."""
    mounts = Path("/proc/self/mounts").read_text().split("\n")
    prefix = str(folder) + "/"
    inside = [line.split()[1] for line in mounts if len(line.split()) > 1 and
              (line.split()[1] + "/").startswith(prefix)]
    if inside:
        raise TransplantError(
            f"{folder} (an interrupted lab root build) still has mounts inside: {', '.join(inside[:3])}",
            hint=f"unmount them (umount -R {folder}), check with findmnt, then run again",
        )
    shutil.rmtree(folder)


def _stamp(release: str) -> str:
    """What a complete root's stamp file says: its release and the packages it was built with."""
    return f"{release} {' '.join(PACKAGES)}\n"


def _complete(root: Path, release: str) -> bool:
    """Whether ``root`` is a finished build of ``release`` with today's :data:`PACKAGES`."""
    try:
        return (root / STAMP).read_text() == _stamp(release)
    except OSError:
        return False


def build_root(release: str, cache: Path | None = None, *, mirror: str | None = None) -> Path:
    """The cached root of ``release``, built first when missing (one build at a time per release).

    :param release: a key of :data:`RELEASES`.
    :param cache: the folder of roots; None is :func:`default_cache`.
    :param mirror: the Debian archive URL; None reads it from apt (:func:`apt_mirror`).
    :returns: the root's folder (``<cache>/<release>``), which holds :data:`PACKAGES`.
    :raises TransplantError: an unknown release, debootstrap missing, or its build failed (the
        message has the end of its log).
    :raises ValueError: ``release`` is not a plain name.
    """
    if release not in RELEASES:
        raise TransplantError(f"no lab root for release {release!r}", hint=f"use one of {', '.join(RELEASES)}")
    cache = (cache or default_cache()).absolute()
    root = cache / release
    if _complete(root, release):
        return root
    debootstrap = shutil.which("debootstrap", path=os.pathsep.join(["/usr/sbin", os.environ.get("PATH", "")]))
    if debootstrap is None:
        raise TransplantError("building a lab root needs debootstrap, not found", hint=INSTALL_HINT)
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{release}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(root, release):  # another process built it meanwhile
            return root
        for old in cache.glob(f"{release}.partial-*"):
            _remove_partial(old)
        if root.exists():  # unfinished, or built with another package list: built again
            _remove_partial(root)
        partial = cache / f"{release}.partial-{os.getpid()}"
        log = cache / f"{release}.log"
        with open(log, "wb") as out:
            result = subprocess.run(
                [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", release, str(partial),
                 mirror or apt_mirror()],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT,
            )
        if result.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            raise TransplantError(
                f"debootstrap of {release} failed with status {result.returncode}; the end of {log}:\n"
                + "\n".join(tail),
                hint="check the mirror in /etc/apt and the network to it, then run again",
            )
        (partial / STAMP).write_text(_stamp(release))
        partial.rename(root)
    return root
