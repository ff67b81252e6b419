"""Clone a venv to another path or host and relocate it (edge).

1. Read the source: its inventory (interpreter, ``pyvenv.cfg``, editable installs) and a
   scan of every file and symlink naming its prefix (``transplant/remote/relocate.py``).
2. Decide the edits (:func:`transplant.core.relocation.decide`).
3. Ask the destination's base interpreter (``pyvenv.cfg``'s ``home``) for its version, the
   destination folder's state, and whether the editable sources and the venv's outside
   symlink targets exist there. Any problem stops here: nothing has been written.
4. Copy: on one host ``cp -a --reflink=auto`` (a reflink where the filesystem has them, a
   copy otherwise, so editing the clone never changes the source; symlinks and hardlinks
   within the venv kept); across hosts ``rsync -aH`` with the SSH settings, relayed through
   the controller's state folder between two SSH hosts. The source's ``.transplant/`` state
   folder (locks, transactions, backups) is not copied.
5. Relocate on the destination, with the clone's own interpreter (``-I -S``), then scan the
   clone again (:func:`transplant.core.relocation.judge`): every file but those the source scan
   vouched for (read whole, not naming the prefix, older than the scan) and that the clone holds
   with the same path, size and mtime.

A failure after the copy began removes the destination again (it was absent or an empty
folder, which is made again, or a venv ``replace`` allowed to go); nothing outside the destination venv and the controller's state
folder is written. A clone killed where it cannot clean up (SIGKILL, a power cut) leaves its
marker, :data:`MARKER`, at the top of the destination: it is written before anything is copied and
removed once the clone is relocated, so the next clone says "an interrupted clone is here; --replace
removes it" (not "exists and is not empty"), ``--replace`` removes it, ``target.base`` does not
take it for the finished venv, and a source holding it is refused.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from transplant.errors import HostError, TransplantError
from transplant.hosts.host import Host
from transplant.core.inventory import Inventory
from transplant.hosts.probing import run_script, take_inventory
from transplant.core.relocation import Leftovers, Relocation, check_clone_paths, check_venv_path, decide, outside_venv, judge, \
    missing_parents, preflight
from transplant.core.rules.venvfiles import editable_sources, pth_paths
from transplant.hosts.transfer import copy_tree
from transplant.reporting import QUIET, Reporter
from transplant.core.units import agree, count

__all__ = ["CloneResult", "clone", "venv_exists", "STATE", "MARKER"]

#: transplant's state folder inside a venv; never copied into a clone.
STATE = ".transplant"
#: The file at the top of a clone's destination while the clone is under way (the host script's
#: ``relocate.MARKER``): written before the copy, removed once the clone is relocated.
MARKER = ".transplant-cloning"

@dataclass(frozen=True, kw_only=True)
class CloneResult:
    """What :func:`clone` did.

    :ivar source: ``HOST:VENV``; :ivar dest: ``HOST:VENV``.
    :ivar method: ``cp --reflink=auto`` (one host) or ``rsync -aH`` (two hosts).
    :ivar files: regular files in the source (``.transplant/`` not counted);
        :ivar bytes: their size in bytes.
    :ivar relocation: the edits and relinks decided before the copy.
    :ivar records: RECORD files whose rows got new hashes for edited files.
    :ivar leftovers: what the scan of the clone still found naming the source's prefix.
    :ivar warnings: lines such as a different micro version of Python.
    :ivar seconds: wall-clock time of the whole clone, in seconds.
    """

    source: str
    dest: str
    method: str
    files: int
    bytes: int
    relocation: Relocation
    records: tuple[str, ...]
    leftovers: Leftovers
    warnings: tuple[str, ...]
    seconds: float

    def to_dict(self) -> dict:
        """The result as JSON data (schema ``transplant.clone/1``)."""
        r = self.relocation
        return {
            "schema": "transplant.clone/1", "source": self.source, "dest": self.dest, "method": self.method,
            "files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 3),
            "edited": [{"path": e.path, "kind": e.kind, "head": e.head_new} for e in r.edits],
            "relinked": [{"path": ln.path, "target": ln.target} for ln in r.links],
            "records": list(self.records),
            "leftovers": {"text": list(self.leftovers.text), "binary": list(self.leftovers.binary),
                          "links": list(self.leftovers.links)},
            "warnings": list(self.warnings), "ok": not self.leftovers.errors,
        }


def _label(host: Host, venv: str) -> str:
    return f"{host.label}:{venv}"


def _relocate_call(host: Host, venv: str, op: str, request: dict, *, python: str | None = None,
                   timeout: float | None) -> dict:
    answer = run_script(host, venv, "relocate", [op], request=request, python=python, timeout=timeout)
    if "error" in answer:
        raise HostError(f"{_label(host, venv)}: relocate {op} failed: {answer['error']}")
    return answer


@dataclass(frozen=True, kw_only=True)
class _Source:
    """What is read from the source before a clone: its inventory, the prefix its files name
    (``venv`` as given, or its real path when ``venv`` is reached through a symlink and only
    that is named), the host scan for that prefix, the editable sources and ``.pth`` folders
    outside it (sorted)."""

    inventory: Inventory
    prefix: str
    scan: dict
    editable: list[str]
    pth: list[str]


def _read_source(host: Host, venv: str, timeout: float | None) -> _Source:
    """:raises TransplantError: the venv is reached through a symlink and its files name both paths."""
    # the scan and the probe read the venv side by side (two interpreters, one for each host core)
    with ThreadPoolExecutor(max_workers=1) as pool:
        scanning = pool.submit(_relocate_call, host, venv, "scan", {"root": venv, "old": venv}, timeout=timeout)
        # RECORD's paths name an editable install's finder and .pth files; no other file is looked at on disk
        inv = take_inventory(host, venv, record="shared", timeout=timeout)
        scanned = scanning.result()
    prefix = venv
    real = (scanned.get("identity") or {}).get("real", venv)
    if real != venv:  # a venv made at its real path names that, not the symlinked path given here
        other = _relocate_call(host, venv, "scan", {"root": venv, "old": real}, timeout=timeout)
        if other["hits"] or other["links"]:
            if scanned["hits"] or scanned["links"]:
                raise TransplantError(
                    f"cannot clone {_label(host, venv)}: it is reached through a symlink, and its files name both "
                    f"{venv} and its real path {real}; nothing was copied",
                    hint=f"make the venv name one path (recreate it), then clone {_label(host, real)}")
            prefix, scanned = real, other
    sources = {p for d in inv.distributions for p in editable_sources(d, inv)}
    editable = outside_venv(sorted(sources), prefix)
    folders = {p for rel, text in inv.texts.items() if rel.endswith(".pth") and text for p in pth_paths(text)}
    pth = [p for p in outside_venv(sorted(folders), prefix) if p not in editable]
    return _Source(inventory=inv, prefix=prefix, scan=scanned, editable=editable, pth=pth)


def _destination_check(host: Host, dest: str, home: str | None, minor: str, paths: list[str], source: dict | None,
                       timeout: float | None) -> tuple[dict | None, list[str]]:
    """The ``check`` answer from the first base interpreter under ``home`` that starts, and what was tried
    (``source``: the source scan's ``identity``, for the overlap test)."""
    if not home:
        return None, []
    major = minor.split(".")[0]
    tried = [posixpath.join(home, name) for name in (f"python{minor}", f"python{major}", "python")]
    for python in tried:
        try:
            answer = _relocate_call(host, dest, "check", {"dest": dest, "paths": paths, "source": source}, python=python,
                                    timeout=timeout)
        except HostError as exc:
            if exc.code == "interpreter-missing":
                continue
            raise
        return answer, tried
    return None, tried


def clone(
    src: Host,
    src_venv: str,
    dst: Host,
    dst_venv: str,
    *,
    state_dir: Path,
    replace: bool = False,
    reporter: Reporter = QUIET,
    timeout: float | None = 3600.0,
) -> CloneResult:
    """Clone ``src:src_venv`` to ``dst:dst_venv`` and relocate it, as the module docstring says.

    :param src: the source's host; :param dst: the destination's (the same object, or one
        with the same spec, for a clone on one host).
    :param state_dir: the controller's state folder (the relay between two SSH hosts).
    :param replace: delete a venv (a folder holding ``pyvenv.cfg``) at the destination first;
        without it an existing non-empty destination is refused.
    :param reporter: told a line per step as it starts, a note per warning, and the bytes
        copied (``rsync``, between two hosts).
    :param timeout: seconds for each host command and for the copy.
    :returns: what was done and what the clone still names of the old prefix (the caller
        decides whether leftovers fail the command).
    :raises TransplantError: a bad path, a destination that may not be written, another
        Python at the destination, a missing editable source (all before anything is
        copied); a failed copy or relocation (the destination is removed again).
    :raises HostError: a host could not be reached.
    """
    started = time.monotonic()
    same_host = src is dst or (src.spec == dst.spec)
    try:
        check_venv_path(src_venv, "the source venv")
        check_venv_path(dst_venv, "the destination venv")
        check_clone_paths(src_venv, dst_venv, same_host=same_host)
    except ValueError as exc:
        raise TransplantError(f"cannot clone: {exc}",
                              hint="give absolute, normalised paths: transplant clone HOST:/path/venv HOST:/new/venv"
                              ) from None
    source, dest = _label(src, src_venv), _label(dst, dst_venv)
    reporter.step(f"reading the source {source}")
    facts = _read_source(src, src_venv, timeout)
    scanned, interp = facts.scan, facts.inventory.interpreter
    relocation = decide(facts.prefix, dst_venv, scanned)
    reporter.step(f"checking the destination {dest}")
    home = (interp.pyvenv_cfg or {}).get("home")
    wanted = sorted(set(facts.editable) | set(facts.pth) | {e["target"] for e in scanned["external"]})
    answer, tried = _destination_check(dst, dst_venv, home, interp.minor, wanted, scanned.get("identity"), timeout)
    problems, warnings = preflight(source=source, dest=dest, dest_venv=dst_venv, pyvenv_cfg=interp.pyvenv_cfg,
                                   implementation=interp.implementation, version=str(interp.version), check=answer,
                                   tried=tried, editable=facts.editable, external=scanned["external"],
                                   lock=scanned["lock"], replace=replace, size=scanned["bytes"], pth=facts.pth)
    if MARKER in scanned.get("top", ()):
        problems.append(f"{source} is itself an interrupted clone (it holds the {MARKER} marker): its files may be "
                        f"half-copied or not relocated; fix: clone it again from its own source with --replace")
    if problems:
        raise TransplantError(f"cannot clone {source} to {dest}; nothing was copied:\n"
                              + "\n".join(f"  - {p}" for p in problems))
    for line in warnings:
        reporter.note(f"warning: {line}")
    assert answer is not None  # no problems means the destination answered
    if answer["dest_state"] in ("venv", "interrupted"):
        reporter.step(f"removing the {'venv' if answer['dest_state'] == 'venv' else 'interrupted clone'} at {dest} "
                      f"(--replace)")
        _run(dst, ["rm", "-rf", "--one-file-system", "--", dst_venv], "remove the old destination venv", timeout)
    made = missing_parents(dst_venv, answer.get("parent") or posixpath.dirname(dst_venv))
    if made:
        reporter.step(f"creating the missing {agree(len(made), 'folder', 'folders')} above the destination: {', '.join(made)}")
        _run(dst, ["mkdir", "-p", "--", made[-1]], "create the destination's parent folder", timeout)
    if answer["dest_state"] != "empty":  # outside the try: a folder made by someone else meanwhile is not ours
        _run(dst, ["mkdir", "--", dst_venv], "create the destination", timeout)
    method = "cp --reflink=auto" if same_host else "rsync -aH"
    reporter.step(f"copying {scanned['files']} files ({method})")
    marker = posixpath.join(dst_venv, MARKER)
    try:
        # before anything is copied: a clone killed from here on leaves a destination that says what it is
        _run(dst, ["touch", "--", marker], "mark the clone in progress", timeout)
        if same_host:
            entries = [posixpath.join(src_venv, name) for name in scanned["top"]]
            if entries:
                _run(dst, ["cp", "-a", "--reflink=auto", "-t", dst_venv, "--", *entries], "copy the venv", timeout)
        else:
            copy_tree(src, src_venv, dst, dst_venv, staging=Path(state_dir) / "relay", exclude=(STATE, MARKER),
                      reporter=reporter, timeout=timeout)
        reporter.step(f"relocating {count(len(relocation.edits), 'file')} and {count(len(relocation.links), 'symlink')} to {dst_venv}")
        # The clone is scanned again after the relocation, but a file the source scan read whole and
        # found not naming the prefix is not read again where the clone's file has the same path, size
        # and mtime (its vouch token): cp -a and rsync -a copy bytes as they are and keep the mtime, so
        # that file holds the source's bytes as scanned, unless the source was written after the scan,
        # which moves its mtime (the scan vouches only for files older than its start). What the
        # relocation rewrote, anything written into the clone since (another mtime, a new path), a
        # copy that did not keep the time and whatever the source scan could not read are all read.
        request = {**relocation.to_request(dst_venv), "vouched": _vouched(scanned)}
        done = _relocate_call(dst, dst_venv, "relocate", request, timeout=timeout)
        _run(dst, ["rm", "-f", "--", marker], "remove the clone's in-progress marker", timeout)  # done: a venv now
    except BaseException as exc:
        try:
            dst.run(["rm", "-rf", "--one-file-system", "--", dst_venv], timeout=timeout)
            if answer["dest_state"] == "empty":  # as it was
                dst.run(["mkdir", "--", dst_venv], timeout=timeout)
            for folder in reversed(made):  # the folders made above it, if still empty (rmdir removes nothing else)
                dst.run(["rmdir", "--", folder], timeout=timeout)
        except TransplantError:
            pass
        if isinstance(exc, TransplantError):
            raise TransplantError(f"cloning {source} to {dest} failed, and the partial clone was removed: "
                                  f"{exc.message}", hint=exc.hint) from exc
        raise
    return CloneResult(source=source, dest=dest, method=method, files=scanned["files"], bytes=scanned["bytes"],
                       relocation=relocation, records=tuple(done["records"]), leftovers=judge(done["scan"]),
                       warnings=tuple(warnings), seconds=time.monotonic() - started)


_TOKEN = re.compile(r"[0-9a-f]{16}\Z")


def _vouched(scan: dict) -> list[str]:
    """The source scan's vouch tokens (16 hex digits each), checked; anything else is dropped
    (a file without its token is read again: slower, never wrong)."""
    tokens = scan.get("vouched")
    if not isinstance(tokens, list):
        return []
    return [t for t in tokens if isinstance(t, str) and _TOKEN.match(t)]


def venv_exists(host: Host, venv: str) -> bool:
    """True when ``venv/pyvenv.cfg`` exists on ``host`` and no clone's :data:`MARKER` does
    (``target.base`` clones only while it does not: an interrupted clone is not the venv, and the
    clone then says so).

    :raises HostError: the host cannot be reached.
    """
    return host.run(["sh", "-c", 'test -e "$1" && test ! -e "$2"', "sh", posixpath.join(venv, "pyvenv.cfg"),
                     posixpath.join(venv, MARKER)]).returncode == 0


def _run(host: Host, argv: list[str], what: str, timeout: float | None) -> None:
    result = host.run(argv, timeout=timeout)
    if not result.ok:
        raise HostError(f"{host.label}: could not {what}: {shlex.join(argv[:6])}{' ...' if len(argv) > 6 else ''} "
                        f"exited {result.returncode}: {result.stderr_tail(800)}")
