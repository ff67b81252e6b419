"""Snapshots in an OCI registry (edge): push, list, prune, and play the donor from one.

A snapshot (:mod:`transplant.donor.snapshot`) is stored as an OCI artifact: an OCI image manifest
(``artifactType`` :data:`ARTIFACT_TYPE`) whose config blob is the snapshot's index document
(byte for byte, so its own ``digest`` still checks) and whose layers are one uncompressed tar
per distribution build (:data:`DIST_TYPE`; members are venv-relative paths, written
deterministically: sorted, mtime 0, owner 0, so the same build always gives the same blob
digest and a registry that has it is not sent it again), plus one tar of the patch files
(:data:`PATCHES_TYPE`, members named by the hex of their sha256).

:class:`RegistrySource` plays the donor: the inventory comes from the config; files the
controller itself reads (the ELF facts of a plan, a relay) are pulled into a cache store
under the state folder (``<state>/oci-cache``), each blob and file checked; apply uses
:meth:`RegistrySource.stage`: each target pulls the blobs it needs straight from the
registry (the ``oci_pull`` host script, the credential passed on its standard input), so
the controller carries none of those bytes; a target that cannot reach the registry gets
them relayed through the controller, and the output says which path was taken.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transplant.donor import store as cas
from transplant.core.elf_facts import ElfReport
from transplant.hosts.host import Host
from transplant.donor.oci import (MANIFEST_TYPE, Client, Reference, RegistryError, file_sha256, find_credentials,
                                  parse_json)
from transplant.hosts.probing import run_script
from transplant.donor.registry_elf import answer, precompute
from transplant.donor.snapshot import Snapshot, SnapshotError, SnapshotSource, load_snapshot
from transplant.hosts.transfer import copy_files
from transplant.reporting import QUIET, Reporter
from transplant import testhooks
from transplant.core.units import count

if TYPE_CHECKING:
    from transplant.donor.sources import Stager

__all__ = ["ARTIFACT_TYPE", "CONFIG_TYPE", "DIST_TYPE", "PATCHES_TYPE", "ELF_TYPE", "PushResult", "push", "open_registry",
           "RegistrySource", "client_for", "list_registry", "prune_registry", "layer_files", "cache_store"]

ARTIFACT_TYPE = "application/vnd.transplant.snapshot.v1+json"
CONFIG_TYPE = "application/vnd.transplant.snapshot.config.v1+json"
DIST_TYPE = "application/vnd.transplant.snapshot.dist.v1.tar"
PATCHES_TYPE = "application/vnd.transplant.snapshot.patches.v1.tar"
ELF_TYPE = "application/vnd.transplant.snapshot.elf.v1+json"
DIST_KEY = "org.transplant.dist"
ID_KEY = "org.transplant.snapshot.id"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def cache_store() -> Path:
    """The controller's cache of pulled snapshots: ``<state folder>/oci-cache`` (a store, see
    :mod:`transplant.donor.store`)."""
    from transplant.controller.state import default_state_dir

    return default_state_dir() / "oci-cache"


def client_for(reference: Reference, ca: Path | None = None) -> Client:
    """A client with the operator's credentials for ``reference``'s registry
    (:func:`transplant.donor.oci.find_credentials`) and ``ca`` (None: the system CAs).

    :raises RegistryError: as :func:`find_credentials` (a credential helper, a bad file)."""
    return Client(reference, ca=ca, credentials=find_credentials(reference.registry))


def layer_files(snap: Snapshot) -> list[tuple[str, list[str]]]:
    """(distribution name, its regular files in the snapshot, sorted) for each distribution, in
    name order; a path two distributions list goes with the first. Symlinks are in no layer
    (the index holds their targets)."""
    latest = snap.inventory.latest()
    seen: set[str] = set()
    out = []
    for name in sorted(snap.dists):
        dist = latest.get(name)
        owned = dist.files if dist is not None else {}
        paths = sorted(p for p in owned if "hash" in snap.files.get(p, {}) and p not in seen)
        seen.update(paths)
        out.append((name, paths))
    rest = sorted(p for p, f in snap.files.items() if "hash" in f and p not in seen)
    if rest:
        out.append(("(unowned)", rest))
    return out


def _write_tar(entries: Sequence[tuple[str, Path, int]], dest: Path) -> tuple[str, int]:
    """A deterministic tar of (member name, source file, mode); returns (``sha256:<hex>``, size)."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, source, mode in entries:
            info = tarfile.TarInfo(name)
            info.size = source.stat().st_size
            info.mode = mode & 0o777
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(source, "rb") as handle:
                tar.addfile(info, handle)
    return "sha256:" + file_sha256(dest), dest.stat().st_size


@dataclass(frozen=True, kw_only=True)
class PushResult:
    """What :func:`push` did: ``reference`` pinned to the manifest ``digest``; ``bytes_uploaded``
    (blobs the registry lacked, plus the manifest), ``uploaded`` and ``present`` blob counts."""

    reference: Reference
    digest: str
    bytes_uploaded: int
    uploaded: int
    present: int
    seconds: float


def push(snap: Snapshot, reference: Reference, client: Client, *, reporter: Reporter = QUIET) -> PushResult:
    """Push a local snapshot to ``reference`` (which must name a tag).

    :param reporter: told each layer as it is sent (a step: its name, whether it was uploaded,
        its size and digest) with the layers done of all (items), then the ELF facts' step.
    :raises RegistryError: the registry refused or could not be reached (a partial push leaves
        only blobs, never a tag on an incomplete manifest).
    :raises SnapshotError: the reference has no tag; :raises StoreError: a stored file is missing.
    """
    if reference.tag is None:
        raise SnapshotError(f"{reference}: a push needs a tag (oci://REGISTRY/REPO:TAG); a digest is what the push "
                            f"returns", hint="add a tag, e.g. :" + snap.id.lower())
    started = time.monotonic()
    sent = uploaded = present = 0
    layers: list[dict[str, Any]] = []
    tmp = cas.new_tmp(snap.store)
    try:
        latest = snap.inventory.latest()
        groups: list[tuple[str, str, list[tuple[str, Path, int]], dict[str, str]]] = []
        for name, paths in layer_files(snap):
            entries = [(p, cas.object_path(snap.store, snap.files[p]["hash"]), snap.files[p]["mode"]) for p in paths]
            version = getattr(latest.get(name), "version", "")
            groups.append((DIST_TYPE, name, entries, {DIST_KEY: name, "org.transplant.version": str(version)}))
        if snap.patches:
            entries = sorted({(cas.object_key(p["hash"]), cas.object_path(snap.store, p["hash"]), 0o644)
                              for p in snap.patches})
            groups.append((PATCHES_TYPE, "patches", entries, {DIST_KEY: "(patches)"}))
        for media, name, entries, notes in groups:
            for _member, source, _mode in entries:
                if not source.is_file():
                    raise cas.StoreError(f"{snap.store}: the stored file {source.name} of {name} is missing",
                                         hint="take the snapshot again")
            path = tmp / "layer.tar"
            digest, size = _write_tar(entries, path)
            got = client.upload_blob(path, digest)
            reporter.step(f"{name}: {'uploaded' if got else 'already in the registry'} ({size} bytes, {digest[:19]})")
            reporter.progress(len(layers) + 1, len(groups))
            sent += got
            uploaded += bool(got)
            present += not got
            path.unlink()
            layers.append({"mediaType": media, "digest": digest, "size": size, "annotations": notes})
        reporter.step("reading the ELF facts of the shared objects once, for plans from the registry")
        (tmp / "elf.json").write_text(json.dumps(precompute(snap), sort_keys=True))
        digest = "sha256:" + file_sha256(tmp / "elf.json")
        got = client.upload_blob(tmp / "elf.json", digest)
        sent += got
        layers.append({"mediaType": ELF_TYPE, "digest": digest, "size": (tmp / "elf.json").stat().st_size,
                       "annotations": {DIST_KEY: "(elf facts)"}})
        config = snap.path.read_bytes()
        (tmp / "config.json").write_bytes(config)
        config_digest = "sha256:" + file_sha256(tmp / "config.json")
        got = client.upload_blob(tmp / "config.json", config_digest)
        sent += got
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config)},
            "layers": layers,
            "annotations": {ID_KEY: snap.id, "org.transplant.donor": f"{snap.donor_host}:{snap.donor_venv}",
                            "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                              time.gmtime(snap.created))},
        }
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        digest = client.put_manifest(reference.tag, body)
        sent += len(body)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PushResult(reference=reference.with_digest(digest), digest=digest, bytes_uploaded=sent, uploaded=uploaded,
                      present=present, seconds=time.monotonic() - started)


def _check_manifest(doc: dict[str, Any], where: str) -> None:
    """:raises SnapshotError: not a transplant snapshot, or a descriptor without a sha256 digest and a
    size in bytes (each blob is read no further than its size)."""
    if doc.get("artifactType") != ARTIFACT_TYPE or not isinstance(doc.get("config"), dict) \
            or doc["config"].get("mediaType") != CONFIG_TYPE or not isinstance(doc.get("layers"), list):
        raise SnapshotError(f"{where}: not a transplant snapshot (artifactType {ARTIFACT_TYPE!r} expected, found "
                            f"{doc.get('artifactType')!r})", hint="name a tag pushed by transplant snapshot --push")
    for n, descriptor in enumerate([doc["config"], *doc["layers"]]):
        if not isinstance(descriptor, dict) or not isinstance(descriptor.get("digest"), str) \
                or not _DIGEST.fullmatch(descriptor["digest"]) or type(descriptor.get("size")) is not int \
                or descriptor["size"] < 0:
            what = "the config" if n == 0 else f"layer {n}"
            raise SnapshotError(f"{where}: {what} of the manifest has no sha256 digest and size in bytes",
                                hint="push the snapshot again")


def open_registry(text: str, *, ca: str | None = None, base: Path | None = None,
                  cache: Path | None = None) -> RegistrySource:
    """Read a registry snapshot's manifest and config (the index document) and return a source.

    :param text: ``oci://REGISTRY/REPO:TAG`` or ``...@sha256:<hex>`` (then the manifest must hash to it).
    :param ca: a CA bundle path (relative to ``base``, the manifest's folder); None: system CAs.
    :param cache: the cache store (None: :func:`cache_store`).
    :raises SnapshotError: a bad reference, not a transplant snapshot, a damaged config.
    :raises RegistryError: unreachable, refused (credentials), missing, or a digest mismatch.
    """
    try:
        reference = Reference.parse(text)
    except ValueError as exc:
        raise SnapshotError(f"snapshot {text}: {exc}", hint="write the reference as oci://REGISTRY/REPO:TAG") from None
    ca_path = None
    if ca:
        ca_path = Path(ca).expanduser()
        if not ca_path.is_absolute() and base is not None:
            ca_path = base / ca_path
        if not ca_path.is_file():
            raise SnapshotError(f"snapshot {text}: the CA bundle {ca_path} does not exist",
                                hint="name a PEM file with ca: (relative to the manifest's folder)")
    client = client_for(reference, ca_path)
    doc, digest = client.get_manifest()
    _check_manifest(doc, str(reference))
    config = client.read_blob(doc["config"]["digest"], size=doc["config"]["size"])
    store = cache or cache_store()
    try:
        sid = parse_json(config, f"{reference}: the config")["id"]
        if not isinstance(sid, str) or not sid or "/" in sid or sid.startswith("."):
            raise ValueError(f"bad id {sid!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{reference}: the config is not a snapshot index ({exc})",
                            hint="push the snapshot again") from None
    index = store / "index"
    index.mkdir(parents=True, exist_ok=True)
    tmp = index / f".{sid}.json.tmp"
    tmp.write_bytes(config)
    os.replace(tmp, index / f"{sid}.json")
    snap = load_snapshot(str(index / f"{sid}.json"), store=store)
    return RegistrySource(snap, client, reference.with_digest(digest), doc["layers"])


@dataclass
class _Pull:
    """One target's pull: ``how`` (``registry`` or ``relay``), bytes received from the registry
    (``registry_bytes``) or relayed by the controller (``relay_bytes``), and the line said."""

    how: str
    registry_bytes: int = 0
    relay_bytes: int = 0
    resumed: int = 0
    line: str = ""


class RegistrySource(SnapshotSource):
    """A registry snapshot playing the donor (see the module docstring).

    :ivar reference: the snapshot pinned to its manifest digest; :ivar pulls: target label ->
        what its apply pulled and how (for the fleet's report and the benchmark).
    """

    def __init__(self, snapshot: Snapshot, client: Client, reference: Reference, layers: list[dict[str, Any]]):
        super().__init__(snapshot)
        self.client = client
        self.reference = reference
        self.label = f"{snapshot.inventory.label} from {reference}"
        by_name = dict(layer_files(snapshot))
        self.layer_of: dict[str, dict[str, Any]] = {}
        self.patch_layer: dict[str, Any] | None = None
        self.elf_layer: dict[str, Any] | None = None
        self._elf_doc: dict[str, Any] | None = None
        for layer in layers:
            name = (layer.get("annotations") or {}).get(DIST_KEY)
            if layer.get("mediaType") == PATCHES_TYPE:
                self.patch_layer = layer
            if layer.get("mediaType") == ELF_TYPE:
                self.elf_layer = layer
            for path in (by_name.get(name, []) if name is not None else []):
                self.layer_of[path] = layer
        lacking = [p for paths in by_name.values() for p in paths if p not in self.layer_of]
        if lacking:
            raise SnapshotError(f"{reference}: no layer holds {', '.join(lacking[:3])}", hint="push the snapshot again")
        self.pulls: dict[str, _Pull] = {}
        self._pull_lock = threading.Lock()
        if self.patch_layer is not None and not all(cas.has(snapshot.store, p["hash"]) for p in snapshot.patches):
            self._fetch_layer(self.patch_layer, {cas.object_key(p["hash"]): p["hash"] for p in snapshot.patches})

    def _fetch_layer(self, layer: dict[str, Any], members: dict[str, str]) -> None:
        """Download one layer to the controller's cache and store ``members`` (name -> RECORD hash)."""
        incoming = cas.new_tmp(self.snapshot.store)
        try:
            blob = incoming / "blob.tar"
            self.client.fetch_blob(layer["digest"], blob, size=int(layer["size"]))
            with tarfile.open(blob, "r:") as tar:
                for member in tar:
                    if member.name in members and member.isfile():
                        dest = incoming / "files" / cas.object_key(members[member.name])
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        with tar.extractfile(member) as src, open(dest, "wb") as out:  # type: ignore[union-attr]  # None only for a non-file: isfile() above
                            shutil.copyfileobj(src, out)
                        cas.put(self.snapshot.store, members[member.name], dest, move=True)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)

    def _ensure(self, paths: Sequence[str]) -> None:
        with self._pull_lock:
            needed: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}
            for path in paths:
                facts = self.snapshot.files.get(path) or {}
                if "hash" in facts and not cas.has(self.snapshot.store, facts["hash"]):
                    layer = self.layer_of[path]
                    needed.setdefault(layer["digest"], (layer, {}))[1][path] = facts["hash"]
            for layer, members in needed.values():
                self._fetch_layer(layer, members)

    def files(self, paths: Sequence[str]) -> tuple[Host, str]:
        """As :meth:`SnapshotSource.files`, the blobs holding ``paths`` pulled to the controller's cache first.

        :raises RegistryError: a blob cannot be pulled or fails its digest."""
        self._ensure([p for p in paths if p in self.snapshot.files])
        return super().files(paths)

    def elf(self, files: Sequence[str], **kwargs: Any) -> ElfReport:
        """ELF facts from the ELF layer read at push time (:mod:`transplant.donor.registry_elf`), so the
        controller pulls no shared object; else (a request it cannot answer, no such layer) as
        :meth:`SnapshotSource.elf`, the files pulled to the controller's cache."""
        if self.elf_layer is not None:
            with self._pull_lock:
                if self._elf_doc is None:
                    data = self.client.read_blob(self.elf_layer["digest"], size=int(self.elf_layer["size"]),
                                                 limit=1 << 30)
                    self._elf_doc = parse_json(data, f"{self.reference}: the ELF facts layer")
            report = answer(self._elf_doc, files, kwargs, label=self.label)
            if report is not None:
                return report
        return super().elf(files, **kwargs)

    def stage(self, target: Host, venv: str, staged: str, paths: Sequence[str], *, staging: Path,
              timeout: float | None = None, reporter: Reporter = QUIET) -> tuple[int, int]:
        """Put ``paths`` (venv-relative) into the transaction's staging folder ``staged`` on
        ``target``: pulled there from the registry by the ``oci_pull`` host script (resuming a
        partial blob kept in ``<venv>/.transplant/blobs``), else, when the target cannot reach
        the registry, relayed through the controller (rsync from the cache).

        :param reporter: told a note (a line) saying how the files came: pulled straight from the
            registry, or relayed because the target cannot reach it.
        :returns: (bytes through the controller, files staged): 0 bytes for a direct pull.
        :raises RegistryError: the pull was refused (credentials, a digest mismatch) or stopped
            part-way; the verified part is kept for the next apply.
        """
        blobs: dict[str, dict[str, Any]] = {}
        links = []
        for path in paths:
            facts = self.snapshot.files.get(path)
            if facts is None:
                raise SnapshotError(f"{self.label} does not hold {path}", hint="plan again")
            if "symlink" in facts:
                links.append([path, facts["symlink"]])
                continue
            layer = self.layer_of[path]
            entry = blobs.setdefault(layer["digest"], {"digest": layer["digest"], "size": int(layer["size"]),
                                                       "files": []})
            entry["files"].append([path, int(facts["mode"])])
        request = {
            "url": self.client.base, "authorization": self.client.pull_authorization(),
            "ca": self.client.ca.read_text() if self.client.ca else None, "timeout": 60,
            "progress": list(self.client.settings.progress),
            "cache": f"{venv.rstrip('/')}/.transplant/blobs", "dest": staged, "blobs": list(blobs.values()),
            "links": links, "stop_after": testhooks.pull_stop_after(),
        }
        reply = run_script(target, venv, "oci_pull", request=request, timeout=timeout)
        for _ in range(2):  # a bearer token that expired during a long pull: a new one, and the pull resumes
            if reply.get("status") != 401 or self.client.scheme != "bearer":
                break
            request["authorization"] = self.client.pull_authorization(fresh=True)
            reply = run_script(target, venv, "oci_pull", request=request, timeout=timeout)
        registry = self.reference.registry
        if reply.get("ok"):
            resumed = f", resuming {reply.get('resumed')} bytes kept from an interrupted pull" if reply.get("resumed") else ""
            line = (f"{target.label} pulled {count(int(reply.get('files') or 0), 'file')} ({reply.get('received')} bytes, "
                    f"{count(len(blobs), 'blob')}) straight from the registry {registry}{resumed}; the controller "
                    f"carried none of them")
            self._note(target, _Pull("registry", registry_bytes=int(reply.get("received") or 0),
                                     resumed=int(reply.get("resumed") or 0), line=line))
            reporter.note(line)
            return 0, len(paths)
        if not reply.get("unreachable"):
            kept = f" ({reply.get('received', 0)} bytes received so far are kept; apply again to resume)" \
                if reply.get("interrupted") else ""
            raise RegistryError(f"{target.label}: the pull from {self.reference} failed: {reply.get('error')}{kept}",
                                hint="push the snapshot again" if reply.get("refused") else
                                "apply again (a partial pull resumes)")
        line = (f"{target.label} cannot reach the registry {registry} ({reply.get('error')}); relaying the files "
                f"through the controller instead")
        reporter.note(line)
        host, root = self.files(paths)
        result = copy_files(host, root, target, staged, list(paths), staging=staging, timeout=timeout)
        self._note(target, _Pull("relay", relay_bytes=result.bytes, line=line))
        return result.bytes, len(paths)

    def memo_identity(self) -> str | None:
        """None: no plan is kept for a registry snapshot (its cache on the controller is not the snapshot)."""
        return None

    def stager(self) -> Stager | None:
        """:meth:`stage`: each target pulls its files from the registry itself."""
        return self.stage

    def transfer_note(self, target: str) -> str | None:
        """The line :meth:`stage` said for ``target`` (pulled straight from the registry, or relayed);
        None when it staged nothing there."""
        with self._pull_lock:
            pull = self.pulls.get(target)
        return pull.line if pull is not None else None

    def _note(self, target: Host, pull: _Pull) -> None:
        with self._pull_lock:
            self.pulls[target.label] = pull


@dataclass(frozen=True, kw_only=True)
class Listed:
    """One tag of a registry repository: its manifest digest and the snapshot's id and donor."""

    tag: str
    digest: str
    id: str | None
    donor: str | None
    created: str | None
    layers: int
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def list_registry(client: Client) -> list[Listed]:
    """Every tag of the client's repository that names a transplant snapshot (others are skipped)."""
    out = []
    for tag in client.tags():
        doc, digest = client.get_manifest(tag)
        if doc.get("artifactType") != ARTIFACT_TYPE:
            continue
        notes = doc.get("annotations") or {}
        out.append(Listed(tag=tag, digest=digest, id=notes.get(ID_KEY), donor=notes.get("org.transplant.donor"),
                          created=notes.get("org.opencontainers.image.created"), layers=len(doc.get("layers") or []),
                          bytes=sum(int(layer.get("size") or 0) for layer in doc.get("layers") or [])))
    return out


def prune_registry(client: Client, tags: Sequence[str]) -> list[tuple[str, str]]:
    """Delete the manifests the named tags point to (by digest; the registry's garbage collector
    frees the blobs no manifest uses). Returns (tag, digest) deleted.

    :raises SnapshotError: a tag is not there, or a tag not named points to the same manifest
        as a named one (a delete by digest would take it too): nothing is deleted;
        :raises RegistryError: deletes are disabled on the registry (the message says how to
        enable them).
    """
    have = set(client.tags())
    missing = [t for t in tags if t not in have]
    if missing:
        raise SnapshotError(f"{client.ref.registry}/{client.ref.repository}: no tag {', '.join(missing)}; nothing was "
                            f"deleted", hint=f"list them: transplant snapshot --list --out "
                                             f"oci://{client.ref.registry}/{client.ref.repository}")
    digests = {tag: client.get_manifest(tag)[1] for tag in sorted(have)}
    # a delete is by digest: it takes every tag of that manifest (the same snapshot pushed twice)
    shared = sorted({other for tag in tags for other, d in digests.items() if d == digests[tag] and other not in tags})
    if shared:
        raise SnapshotError(f"{client.ref.registry}/{client.ref.repository}: {', '.join(shared)} "
                            f"{'holds' if len(shared) == 1 else 'hold'} the same snapshot (the same manifest digest) "
                            f"as a tag named; the registry deletes by digest, which would remove "
                            f"{'it' if len(shared) == 1 else 'them'} too; nothing was deleted",
                            hint="name every tag of that snapshot to delete it: --prune "
                                 + " ".join(sorted(set(tags) | set(shared))))
    done, deleted = [], set()
    for tag in tags:
        digest = digests[tag]
        if digest not in deleted:
            client.delete_manifest(digest)
            deleted.add(digest)
        done.append((tag, digest))
    return done

