"""Snapshots: a donor's overlay set kept on the controller, so a dead donor is routine (edge).

:func:`capture` probes the donor once (the overlaid distributions hashed), fetches with
rsync only the files whose content the store lacks, and writes an index document
(schema ``transplant.snapshot/1``, with ``digest``: the sha256 of the rest, checked whenever
it is read) beside the store's objects (:mod:`transplant.donor.store`):

* ``donor``: the host and venv it came from; ``overlay``: the manifest's patterns;
  ``dists``: the distributions whose files it holds (every RECORD entry inside the venv,
  the dist-info included, exactly as the donor had them);
* ``inventory``: the donor probe's document, so a plan from the snapshot is the plan the
  donor would give (same fingerprint);
* ``files``: venv-relative path -> ``{hash, size, mode}`` or ``{symlink}``;
* ``patches``: the manifest's patch files (content in the store) and ``manifest``: the
  manifest as data and its folder, for ``transplant recover``.

:class:`SnapshotSource` plays the donor from a snapshot: its inventory comes from the
index, and the files are written (each hash-checked) into a view folder on the controller,
from which rsync copies them to targets and pyelftools reads them (the view looks like a
venv of the controller's own interpreter, so the ELF reader runs there unchanged).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import yaml

from transplant.donor import store as cas
from transplant.core.elf_facts import ElfReport
from transplant.core.closure import expand
from transplant.hosts.elf_facts import read_elf_facts
from transplant.errors import ProbeError, SnapshotError, TransplantError
from transplant.controller.patch_files import read_patch_files
from transplant.controller.state import refuse_loose, private_folder
from transplant.hosts.host import Host, LocalHost
from transplant.core.hostspec import HostSpec
from transplant.core.inventory import Inventory, inside_path, parse_inventory, protected_path
from transplant.core.manifest import Endpoint, Manifest
from transplant.core.planner import selected_names
from transplant.core.inventory import TEXTS
from transplant.hosts.probing import take_inventory
from transplant.hosts.transfer import copy_files
from transplant.reporting import QUIET, Reporter
from transplant.core.units import agree, count
from transplant.verify import recorded

if TYPE_CHECKING:
    from transplant.donor.sources import Stager

__all__ = ["SNAPSHOT_SCHEMA", "SnapshotError", "Snapshot", "CaptureResult", "capture", "load_snapshot",
           "list_snapshots", "prune", "default_store", "SnapshotSource", "TEXTS"]

SNAPSHOT_SCHEMA = "transplant.snapshot/1"


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """One snapshot, read from its index document.

    :ivar id: ``20261130T171500Z-1a2b3c4d`` (sorts by time); :ivar path: the index file.
    :ivar store: the store folder its objects are in (two levels above ``path``).
    :ivar created: seconds since the epoch; :ivar donor_host: the host (``[user@]host[:port]``)
        and :ivar donor_venv: the venv it came from; :ivar overlay: the manifest's patterns.
    :ivar dists: normalised names whose files it holds; :ivar inventory: the donor's, labelled
        ``snapshot <id> of <host>:<venv>``.
    :ivar files: venv-relative path -> ``{"hash", "size", "mode"}`` or ``{"symlink"}``.
    :ivar patches: ``[{"local", "dest", "hash", "size"}]``; :ivar manifest: ``{"data", "dir"}``.
    :ivar donor_verify: the donor's verify results recorded when it was taken
        (:mod:`transplant.verify.recorded`), or None for a snapshot taken without them.
    """

    id: str
    path: Path
    store: Path
    created: float
    donor_host: str
    donor_venv: str
    overlay: tuple[str, ...]
    dists: tuple[str, ...]
    inventory: Inventory
    files: dict[str, dict[str, Any]]
    patches: tuple[dict[str, Any], ...]
    manifest: dict[str, Any]
    donor_verify: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        """Bytes of the files it holds (each counted once per path)."""
        return sum(int(f.get("size") or 0) for f in self.files.values())

    @property
    def digests(self) -> set[str]:
        """Every content it references (files and patches)."""
        return {f["hash"] for f in self.files.values() if "hash" in f} | {p["hash"] for p in self.patches}


@dataclass(frozen=True, kw_only=True)
class CaptureResult:
    """What :func:`capture` did: ``fetched`` distinct contents read from the donor (``bytes_read``
    on the wire, rsync's count), ``reused`` files whose content the store already held, in ``seconds``."""

    snapshot: Snapshot
    fetched: int
    reused: int
    bytes_read: int
    seconds: float
    #: True when the store already held a snapshot of this very content (:func:`_same_content`):
    #: that one is returned and no index is written
    existing: bool = False


def _new_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def _wanted(inventory: Inventory, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The files of the named distributions as the snapshot records them (regular files and symlinks)."""
    latest = inventory.latest()
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        for path, entry in latest[name].files.items():
            if protected_path(path) or entry.error or not entry.exists and entry.symlink is None:
                continue
            if entry.symlink is not None:
                out[path] = {"symlink": entry.symlink}
            elif entry.hash is not None:
                out[path] = {"hash": entry.hash, "size": entry.size or 0, "mode": entry.mode or 0o644}
    return out


def capture(manifest: Manifest, donor: Host, store: Path, *, reporter: Reporter = QUIET,
            timeout: float | None = 600.0) -> CaptureResult:
    """Snapshot the donor's overlay set and the manifest's patches into ``store``.

    :param donor: the connected donor host (``manifest.donor`` names its venv).
    :param store: the store folder (created if missing).
    :param reporter: told each step (a line) as it starts, and the bytes read from the donor.
    :raises HostError: the donor could not be reached or rsync failed (nothing is indexed).
    :raises SnapshotError: the overlay selects nothing, or a file changed while it was read.
    """
    with cas.locked(store, exclusive=False):
        return _capture(manifest, donor, store, reporter=reporter, timeout=timeout)


def _capture(manifest: Manifest, donor: Host, store: Path, *, reporter: Reporter,
             timeout: float | None) -> CaptureResult:
    started = time.monotonic()
    end = manifest.donor
    assert isinstance(end, Endpoint)  # a capture reads a live donor, never another snapshot
    venv = end.venv
    if manifest.closures:
        # no target here: the closure against an empty target, every donor distribution the roots
        # reach (a superset of what any target's plan selects)
        reporter.step(f"reading the donor's metadata for the overlay {agree(len(manifest.closures), 'closure', 'closures')} {', '.join(manifest.closures)}")
        meta = take_inventory(donor, venv, record=False, timeout=timeout)
        manifest, _ = expand(manifest, meta, None)
    reporter.step(f"probing the donor {manifest.donor} (hashing the overlaid distributions)")
    inventory = take_inventory(donor, venv, hash_patterns=manifest.overlay, texts=TEXTS, timeout=timeout,
                               hash_cache="controller")
    names = selected_names(manifest.overlay, inventory)
    if not names:
        raise SnapshotError(f"{manifest.path}: the overlay {list(manifest.overlay)} selects no distribution on "
                            f"{manifest.donor}; nothing to snapshot", hint="check the manifest's overlay")
    files = _wanted(inventory, names)
    by_hash: dict[str, str] = {}
    reused = 0
    for path, facts in sorted(files.items()):
        if "hash" not in facts:
            continue
        if cas.has(store, facts["hash"]):
            reused += 1
        else:
            by_hash.setdefault(facts["hash"], path)
    bytes_read = 0
    if by_hash:
        reporter.step(f"reading {count(len(by_hash), 'file')} from the donor")
        incoming = cas.new_tmp(store)
        try:
            result = copy_files(donor, venv, LocalHost(), str(incoming), sorted(by_hash.values()),
                                staging=store / "tmp", reporter=reporter, timeout=timeout)
            bytes_read = result.bytes
            for digest, path in by_hash.items():
                try:
                    cas.put(store, digest, incoming / path, move=True)
                except cas.StoreError as exc:
                    raise SnapshotError(f"{manifest.donor}: {path} changed while the snapshot was taken "
                                        f"({exc.message})", hint="take the snapshot again") from None
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
    patches = []
    base = Path(manifest.path).resolve().parent
    for patch in read_patch_files(manifest):
        cas.put(store, patch.hash, base / patch.local)
        patches.append({"local": patch.local, "dest": patch.dest, "hash": patch.hash, "size": patch.size})
    data = yaml.safe_load(Path(manifest.path).read_text(encoding="utf-8"))
    reporter.step("running the donor's verify stages in its venv, to stand in for it when it is gone")
    donor_verify = recorded.record(manifest.verify, donor, venv, inventory)
    sid = _new_id()
    document = {
        "schema": SNAPSHOT_SCHEMA, "id": sid, "created": time.time(),
        "donor": {"host": str(end.host), "venv": venv},
        "overlay": list(manifest.overlay), "dists": list(names), "inventory": dict(inventory.document),
        "files": files, "patches": patches, "manifest": {"data": data, "dir": str(base)},
        "donor_verify": donor_verify,
    }
    document["digest"] = _index_digest(document)
    same = _same_content(store, document)
    if same is not None:  # content-addressed: the identical snapshot is not stored twice
        return CaptureResult(snapshot=same, fetched=len(by_hash), reused=reused, bytes_read=bytes_read,
                             seconds=time.monotonic() - started, existing=True)
    index = store / "index"
    private_folder(index)
    tmp = index / f".{sid}.json.tmp"
    tmp.write_text(json.dumps(document, sort_keys=True), encoding="utf-8")
    os.replace(tmp, index / f"{sid}.json")
    snap = load_snapshot(str(index / f"{sid}.json"))
    return CaptureResult(snapshot=snap, fetched=len(by_hash), reused=reused, bytes_read=bytes_read,
                         seconds=time.monotonic() - started)


#: Keys of an index document that differ between two captures of the same content: its own
#: identity and time, the donor's verify results (their timings), and (in ``inventory``) the
#: probe's timing and hash-cache counts.
_OWN_KEYS = ("id", "created", "digest", "donor_verify")
_VOLATILE_INVENTORY_KEYS = ("probe_seconds", "hash_cache")


def _content_key(document: Mapping[str, Any]) -> str:
    """sha256 hex of what a snapshot holds: its index document less :data:`_OWN_KEYS` and the
    inventory's :data:`_VOLATILE_INVENTORY_KEYS` (canonical JSON: sorted keys). Two captures of
    an unchanged donor with the same manifest have the same key."""
    body = {k: v for k, v in document.items() if k not in _OWN_KEYS}
    inventory = body.get("inventory")
    if isinstance(inventory, dict):
        body["inventory"] = {k: v for k, v in inventory.items() if k not in _VOLATILE_INVENTORY_KEYS}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _same_content(store: Path, document: Mapping[str, Any]) -> Snapshot | None:
    """The store's snapshot with the same :func:`_content_key` as ``document``, or None. Only
    index files within 64 bytes of this one's size are read (the volatile keys are all that
    differ); one that does not load (damaged, edited) is never reused."""
    index = store / "index"
    if not index.is_dir():
        return None
    size = len(json.dumps(document, sort_keys=True).encode())
    key = _content_key(document)
    for path in sorted(index.glob("*.json"), reverse=True):  # the newest first
        try:
            if abs(path.stat().st_size - size) > 64:
                continue
            other = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if document.get("donor_verify") and not (isinstance(other, dict) and other.get("donor_verify")):
            continue  # one taken without the donor's verify results is not reused for one with them
        if isinstance(other, dict) and _content_key(other) == key:
            try:
                return load_snapshot(str(path))
            except TransplantError:
                continue
    return None


def _index_digest(document: dict[str, Any]) -> str:
    """sha256 hex of the index document without its ``digest`` key (canonical JSON: sorted keys)."""
    body = {k: v for k, v in document.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def default_store() -> Path:
    """The controller's snapshot store: ``<state folder>/snapshots`` (see
    :func:`transplant.controller.state.default_state_dir`)."""
    from transplant.controller.state import default_state_dir

    return default_state_dir() / "snapshots"


def resolve_path(reference: str, *, base: Path | None, store: Path) -> Path:
    """The index file a manifest's ``snapshot:`` names: a path (relative to ``base``, the
    manifest's folder), or a bare snapshot id looked up in ``store``."""
    path = Path(reference).expanduser()
    if not path.is_absolute() and base is not None and ("/" in reference or reference.endswith(".json")):
        path = base / path
    if path.is_file() or "/" in reference or reference.endswith(".json"):
        return path
    beside = base / path if base is not None and not path.is_absolute() else path
    if beside.is_dir():  # a store folder named bare (snapshot --out DIR wrote it): see _only_index
        return beside
    return store / "index" / f"{reference}.json"


def load_snapshot(path: str, *, base: Path | None = None, store: Path | None = None) -> Snapshot:
    """Read a snapshot's index document.

    :param path: the index file, or a snapshot id (looked up in ``store``).
    :raises SnapshotError: missing, unreadable, not JSON or of another schema; the message
        names the file and the fix.
    :raises StateError: the index, its folder or the store is owned by another user or writable
        by group or others.
    """
    store = store or default_store()
    where = resolve_path(path, base=base, store=store)
    listing = f"transplant snapshot --list --out {store}"
    if where.is_dir():
        where = _only_index(path, where)
    # the store, its index folder and the index: what the index maps is written on a target
    refuse_loose(where, "the snapshot index", state_dir=Path(os.path.abspath(where)).parent.parent)
    try:
        doc = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SnapshotError(f"snapshot {path}: not found (looked for {where})",
                            hint=f"list the snapshots: {listing}; or take one: transplant snapshot MANIFEST") from None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"snapshot {where}: cannot be read ({exc})", hint="take the snapshot again") from None
    if where.resolve().parent.name != "index":
        raise SnapshotError(f"snapshot {where}: an index file is read where the snapshot command wrote it, in a "
                            f"store's index/ folder (STORE/index/ID.json); its files are looked up (and its view "
                            f"written) in that store, never beside a copied index",
                            hint=f"name the file in its store, e.g. {store / 'index'}/ID.json, or the bare snapshot id")
    if not isinstance(doc, dict) or doc.get("schema") != SNAPSHOT_SCHEMA:
        raise SnapshotError(f"snapshot {where}: not a snapshot index (schema {SNAPSHOT_SCHEMA!r} expected)",
                            hint=f"name a file from {store / 'index'}")
    if doc.get("digest") != _index_digest(doc):
        raise SnapshotError(f"snapshot {where}: hash mismatch: the index was changed after it was written "
                            f"(its digest does not match its content); it was not used", hint="take the snapshot again")
    try:
        _check_entries(doc.get("files"), doc.get("patches"))
        donor = doc["donor"]
        HostSpec.parse(donor["host"])
        if not isinstance(donor["venv"], str) or not donor["venv"].startswith("/"):
            raise ValueError(f"the donor venv {donor['venv']!r} is not an absolute path")
        label = f"snapshot {doc['id']} of {donor['host']}:{donor['venv']}"
        inventory = parse_inventory(doc["inventory"], label=label)
        donor_verify = recorded.check_record(doc["donor_verify"]) if doc.get("donor_verify") is not None else None
        return Snapshot(id=str(doc["id"]), path=where, store=where.resolve().parent.parent,
                        created=float(doc["created"]), donor_host=str(donor["host"]), donor_venv=str(donor["venv"]),
                        overlay=tuple(doc["overlay"]), dists=tuple(doc["dists"]), inventory=inventory,
                        files=dict(doc["files"]), patches=tuple(doc["patches"]), manifest=dict(doc["manifest"]),
                        donor_verify=donor_verify)
    except (KeyError, TypeError, ValueError, ProbeError) as exc:
        raise SnapshotError(f"snapshot {where}: damaged index ({type(exc).__name__}: {exc})",
                            hint="take the snapshot again") from None


def _only_index(path: str, folder: Path) -> Path:
    """The index file of the one snapshot a store folder holds (``snapshot --out DIR`` wrote
    DIR; its ``index/`` folder is accepted too).

    :raises SnapshotError: the folder is no store, or holds no snapshot or several (their ids listed).
    """
    index = folder if folder.name == "index" and not (folder / "index").is_dir() else folder / "index"
    if not index.is_dir():
        raise SnapshotError(f"snapshot {path}: {folder} is a folder but not a snapshot store (no index/ folder in it)",
                            hint="name a snapshot id, a store's index/ID.json file, or the folder snapshot --out wrote")
    found = sorted(index.glob("*.json"))
    store = index.parent
    if len(found) == 1:
        return found[0]
    if not found:
        raise SnapshotError(f"snapshot {path}: the store {store} holds no snapshot",
                            hint="take one: transplant snapshot MANIFEST --out " + shlex.quote(str(store)))
    ids = ", ".join(p.stem for p in found)
    raise SnapshotError(f"snapshot {path}: the store {store} holds {len(found)} snapshots ({ids}); say which",
                        hint=f"write donor: {{snapshot: {shlex.quote(str(found[-1]))}}} (the newest id), or list them: "
                             f"transplant snapshot --list --out {shlex.quote(str(store))}")


def _check_entries(files: Any, patches: Any) -> None:
    """Refuse an index whose entries an edit made unsafe or meaningless: a path that is not
    venv-relative (absolute, ``..``, the venv's own files), a hash not in RECORD's sha256
    form (the store names objects by it), a size or mode that is not a number.

    :raises ValueError: the first bad entry, named.
    """
    if not isinstance(files, dict) or not isinstance(patches, list):
        raise ValueError("files must be a mapping and patches a list")
    for path, facts in files.items():
        if not isinstance(path, str) or inside_path(path) != path or protected_path(path):
            raise ValueError(f"the path {path!r} leaves the venv or is the venv's own file")
        if not isinstance(facts, dict):
            raise ValueError(f"{path}: expected {{hash, size, mode}} or {{symlink}}")
        if "symlink" in facts:
            if not isinstance(facts["symlink"], str) or not facts["symlink"]:
                raise ValueError(f"{path}: the symlink target must be text")
            continue
        digest = facts.get("hash")
        cas.object_key(digest if isinstance(digest, str) else "")
        for key in ("size", "mode"):
            if not isinstance(facts.get(key), int) or isinstance(facts.get(key), bool) or facts[key] < 0:
                raise ValueError(f"{path}: {key} must be a whole number >= 0")
    for i, patch in enumerate(patches):
        if not isinstance(patch, dict) or not isinstance(patch.get("local"), str) \
                or inside_path(patch["local"]) != patch["local"]:
            raise ValueError(f"patches[{i}]: its local path must stay inside the manifest's folder")
        digest = patch.get("hash")
        cas.object_key(digest if isinstance(digest, str) else "")


def list_snapshots(store: Path) -> list[Snapshot]:
    """Every readable snapshot in ``store``, oldest first (damaged ones are skipped)."""
    out = []
    for path in sorted((store / "index").glob("*.json")):
        try:
            out.append(load_snapshot(str(path)))
        except SnapshotError:
            continue
    return out


def prune(store: Path, ids: Sequence[str] = ()) -> tuple[list[str], int, int]:
    """Remove the named snapshots, then every object no remaining snapshot references.

    Runs under the store's exclusive lock (:func:`transplant.donor.store.locked`), so a
    :func:`capture` under way (objects stored, index not yet written) is waited for, never
    robbed of its objects.

    :returns: (ids removed, objects removed, bytes freed).
    :raises SnapshotError: an id is not in the store, or an index there cannot be read (its
        objects would look unused): nothing is removed.
    """
    with cas.locked(store, exclusive=True):
        return _prune(store, ids)


def _prune(store: Path, ids: Sequence[str]) -> tuple[list[str], int, int]:
    known: dict[str, Snapshot] = {}
    for path in sorted((store / "index").glob("*.json")):
        try:
            snap = load_snapshot(str(path))
        except SnapshotError as exc:
            raise SnapshotError(f"{exc.message}; pruning would remove the objects it may still use, so nothing "
                                f"was removed", hint=f"move or delete that index file ({path}), then prune again") from None
        known[snap.id] = snap
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise SnapshotError(f"{store}: no snapshot {', '.join(unknown)}; nothing was removed",
                            hint=f"list them: transplant snapshot --list --out {store}")
    for sid in ids:
        known.pop(sid).path.unlink()
    keep = {cas.object_key(d) for s in known.values() for d in s.digests}
    removed = freed = 0
    for name, size in cas.object_sizes(store).items():
        if name not in keep:
            (store / "objects" / name[:2] / name).unlink()
            removed += 1
            freed += size
    return list(ids), removed, freed


class SnapshotSource:
    """A snapshot playing the donor: inventory from its index, bytes from a view folder.

    The view is a folder on the controller (under the store's ``tmp/``) where each file
    asked for is written from the store, hash-checked; it holds a ``pyvenv.cfg`` and a
    ``bin/python`` of the controller's own interpreter, so host scripts that only read
    files (the ELF reader) run on it as on a venv. Thread-safe; :meth:`close` removes it.
    A :class:`transplant.donor.sources.DonorSource`.
    """

    label: str
    venv: str
    live: Host | None = None
    snapshot: Snapshot

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.label = snapshot.inventory.label
        self.venv = snapshot.donor_venv
        self._lock = threading.Lock()
        self._view: Path | None = None
        self._written: set[str] = set()

    def _root(self) -> Path:
        if self._view is None:
            view = cas.new_tmp(self.snapshot.store)
            base = Path(getattr(sys, "_base_executable", sys.executable))
            (view / "bin").mkdir()
            os.symlink(base, view / "bin" / "python")
            (view / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n")
            self._view = view
        return self._view

    def memo_identity(self) -> str | None:
        """``snapshot <id> <store>``: a snapshot's content never changes under its id."""
        return f"snapshot {self.snapshot.id} {self.snapshot.store}" if self.snapshot.id else None

    def inventory(self, *, hash_patterns: Sequence[str], texts: Sequence[str] = (),
                  timeout: float | None = None, record: bool = True, inputs: bool = False) -> Inventory:
        """The donor's inventory as captured (``texts``, ``record`` and ``inputs`` are what the capture
        asked for); every distribution ``hash_patterns`` selects must be one whose files the
        snapshot holds.

        :raises SnapshotError: the overlay selects a distribution the snapshot lacks files for.
        """
        inv = self.snapshot.inventory
        lacking = [n for n in selected_names(hash_patterns, inv) if n not in self.snapshot.dists]
        if lacking:
            raise SnapshotError(
                f"{self.label} holds the files of {', '.join(self.snapshot.dists)} only; the overlay also selects "
                f"{', '.join(lacking)}",
                hint="take a snapshot with this manifest's overlay while the donor is up "
                     "(transplant snapshot MANIFEST), or narrow the overlay")
        return inv

    def files(self, paths: Sequence[str]) -> tuple[Host, str]:
        """Write ``paths`` (venv-relative) into the view; returns (the controller, the view folder)
        for rsync to read them from.

        :raises SnapshotError: a path is not in the snapshot, leaves the view, or cannot be written.
        :raises StoreError: a stored file is missing or fails its hash check.
        """
        with self._lock:
            root = self._root()
            for path in paths:
                if path in self._written:
                    continue
                facts = self.snapshot.files.get(path)
                if facts is None:
                    raise SnapshotError(f"{self.label} does not hold {path}", hint="plan again")
                dest = root / path
                if inside_path(path) != path or protected_path(path) or \
                        not dest.parent.resolve().is_relative_to(root.resolve()):
                    raise SnapshotError(f"{self.snapshot.path}: refusing the path {path!r}: it leaves the venv "
                                        f"(the index was edited)", hint="take the snapshot again")
                try:
                    if "symlink" in facts:
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        os.symlink(facts["symlink"], dest)
                    else:
                        cas.read_into(self.snapshot.store, facts["hash"], dest, mode=facts.get("mode"))
                except OSError as exc:
                    raise SnapshotError(f"{self.snapshot.path}: cannot write {path} into the view ({exc}); the index "
                                        f"names it both as a file and as a folder, or the disk is full",
                                        hint="take the snapshot again") from None
                self._written.add(path)
        return LocalHost(), str(root)

    def elf(self, files: Sequence[str], **kwargs: Any) -> ElfReport:
        """:func:`transplant.hosts.elf_facts.read_elf_facts` on the view (the files written first)."""
        wanted = list(files) + list((kwargs.get("defined") or ((), ()))[0]) + list(kwargs.get("defined_by") or {})
        host, root = self.files([p for p in wanted if p in self.snapshot.files])
        return read_elf_facts(host, root, files, **kwargs)

    def stager(self) -> Stager | None:
        """None: apply streams the files from the view (:meth:`files`)."""
        return None

    def transfer_note(self, target: str) -> str | None:
        """None: the files are streamed as apply's own notes say."""
        return None

    def close(self) -> None:
        """Remove the view folder."""
        if self._view is not None:
            shutil.rmtree(self._view, ignore_errors=True)
            self._view = None
            self._written.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
