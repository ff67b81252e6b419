"""Where the donor's facts and bytes come from (edge): a live host, or a snapshot; fallbacks.

A donor source (:class:`DonorSource`) answers every question the pipeline asks of a donor: its
inventory, the ELF facts of some of its files, where rsync reads its files (a host and a
folder) or what stages them on a target, its identity for the plan memo, and whether it is a
live host or a snapshot; nothing asks which class it is. :class:`HostSource` asks the donor
host; :class:`transplant.donor.snapshot.SnapshotSource` answers from a snapshot on the
controller, :class:`transplant.donor.registry_snapshot.RegistrySource` from one in an OCI
registry. :func:`open_donor` tries the manifest's ``donor`` and then each ``donor.fallback``
in order, and says which one it used and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transplant.core.elf_facts import ElfReport
from transplant.hosts.elf_facts import read_elf_facts
from transplant.errors import HostError, NoDonorError, TransplantError
from transplant.hosts.host import Host, SSHOptions
from transplant.hosts.connecting import connect
from transplant.core.hostspec import HostSpec
from transplant.core.inventory import Inventory
from transplant.core.manifest import Endpoint, Manifest, SnapshotRef
from transplant.hosts.probing import take_inventory
from transplant.reporting import QUIET, Reporter

if TYPE_CHECKING:  # a live donor needs no snapshot code
    from transplant.donor.snapshot import Snapshot

__all__ = ["DonorSource", "Stager", "HostSource", "Opened", "open_donor", "as_source", "NoDonorError"]


class Stager(Protocol):
    """Puts a donor's files into a transaction's staging folder on the target itself (a source
    whose targets fetch the bytes themselves: a registry snapshot)."""

    def __call__(self, target: Host, venv: str, staged: str, paths: Sequence[str], *, staging: Path,
                 timeout: float | None = None, reporter: Reporter = QUIET) -> tuple[int, int]:
        """Stage ``paths`` (venv-relative) into the folder ``staged`` on ``target`` (its venv ``venv``);
        ``staging`` is the controller's staging folder for a relay; ``timeout`` in seconds (None: no limit);
        ``reporter`` told a note saying how the files came.

        :returns: (bytes carried through the controller, files staged).
        :raises TransplantError: the files could not be staged (the part verified is kept).
        """
        ...


class DonorSource(Protocol):
    """Everything the pipeline, apply, verify, fleets and recover ask of a donor; no caller asks
    which kind of source it is. Adding a kind of source: implement every member (the test
    ``tests/test_donor_sources.py`` compares each signature with this one) and open it in
    :func:`_open_one`.

    :ivar label: how the donor is named in messages and the recorded recipe.
    :ivar venv: the donor's venv path (on its live host, or the one a snapshot was taken of).
    :ivar live: the connected donor host when the donor is read live (its files streamed from
        it, its probes' inputs kept for the plan memo, the target checked not to be it); None
        for a snapshot.
    :ivar snapshot: the snapshot the facts and bytes come from (its index file recorded in the
        recipe, its recorded verify results standing in for the donor's); None for a live donor.
    """

    @property
    def label(self) -> str: ...

    @property
    def venv(self) -> str: ...

    @property
    def live(self) -> Host | None: ...

    @property
    def snapshot(self) -> Snapshot | None: ...

    def memo_identity(self) -> str | None:
        """The donor's part of the plan memo's key (:mod:`transplant.pipeline.memo`): one line naming
        the donor so that equal lines mean the same donor content whenever both venvs' fingerprints
        agree; None keeps no plan for this source."""
        ...

    def inventory(self, *, hash_patterns: Sequence[str], texts: Sequence[str] = (),
                  timeout: float | None = None, record: bool = True, inputs: bool = False) -> Inventory:
        """The donor venv's inventory, the distributions ``hash_patterns`` selects hashed;
        ``texts`` are venv-relative files whose text it carries; ``timeout`` in seconds (None:
        the probe's default); ``record`` False reads metadata only; ``inputs`` asks for the
        probe's inputs digest (``Inventory.inputs``; a source with nothing to probe leaves it as it is).

        :raises TransplantError: the donor cannot be read (a host error, a damaged snapshot).
        """
        ...

    def elf(self, files: Sequence[str], **kwargs: Any) -> ElfReport:
        """ELF facts of ``files`` (venv-relative), as :func:`transplant.hosts.elf_facts.read_elf_facts`."""
        ...

    def files(self, paths: Sequence[str]) -> tuple[Host, str]:
        """(host, folder) from which rsync reads ``paths`` (venv-relative): the donor host and its
        venv, or the controller and a snapshot's view.

        :raises TransplantError: a path cannot be served (a snapshot lacks it or fails its hash).
        """
        ...

    def stager(self) -> Stager | None:
        """What stages the donor's files on each target itself; None: apply streams them from
        :meth:`files`."""
        ...

    def transfer_note(self, target: str) -> str | None:
        """The line saying how the donor's files reached the target labelled ``target`` (pulled
        from a registry, or relayed), for a fleet's report; None when there is nothing to say."""
        ...


class HostSource:
    """A live donor: a connected host and its venv."""

    label: str
    venv: str
    live: Host
    snapshot: Snapshot | None = None

    def __init__(self, host: Host, venv: str) -> None:
        self.live = host
        self.venv = venv
        self.label = f"{host.label}:{venv}"

    def memo_identity(self) -> str | None:
        """``host <label> <venv>``: the plan memo's fingerprints say whether its content changed."""
        return f"host {self.live.label} {self.venv}"

    def inventory(self, *, hash_patterns: Sequence[str], texts: Sequence[str] = (),
                  timeout: float | None = None, record: bool = True, inputs: bool = False) -> Inventory:
        """The probe's inventory, the ``hash_patterns`` distributions hashed (``record`` False: metadata
        only; ``inputs``: with the probe's inputs digest, :func:`take_inventory`'s)."""
        return take_inventory(self.live, self.venv, hash_patterns=hash_patterns, texts=texts, timeout=timeout,
                              record=record, hash_cache="controller", inputs=inputs)

    def elf(self, files: Sequence[str], **kwargs: Any) -> ElfReport:
        """:func:`transplant.hosts.elf_facts.read_elf_facts` on the donor (its ELF cache kept on the
        controller unless ``elf_cache`` says otherwise: a donor is never written to)."""
        kwargs.setdefault("elf_cache", "controller")
        return read_elf_facts(self.live, self.venv, files, **kwargs)

    def files(self, paths: Sequence[str]) -> tuple[Host, str]:
        """The donor host and its venv: rsync reads the files there."""
        return self.live, self.venv

    def stager(self) -> Stager | None:
        """None: apply streams the files from the donor host."""
        return None

    def transfer_note(self, target: str) -> str | None:
        """None: the files are streamed as apply's own notes say."""
        return None


def as_source(donor: Host | DonorSource, venv: str) -> DonorSource:
    """A source for ``donor``: a :class:`Host` is wrapped in a :class:`HostSource` for ``venv``."""
    return HostSource(donor, venv) if isinstance(donor, Host) else donor


@dataclass(frozen=True, kw_only=True)
class Opened:
    """The donor source in use.

    :ivar manifest: the manifest with ``donor`` the host and venv the facts are of (for a
        snapshot, the donor it was taken from), for the planner and the saved-plan checks.
    :ivar source: the source; :ivar which: ``donor`` or ``donor.fallback[i]``.
    :ivar why: one line: why this source (the ones tried before and why they failed).
    :ivar host: the connected donor host, or None for a snapshot.
    """

    manifest: Manifest
    source: DonorSource
    which: str
    why: str
    host: Host | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"which", "source", "why"}`` for JSON output."""
        return {"which": self.which, "source": self.source.label, "why": self.why}


def _open_one(entry: Endpoint | SnapshotRef, manifest: Manifest, ssh: SSHOptions, stack: ExitStack,
              store: Path | None) -> tuple[Manifest, DonorSource, Host | None]:
    if isinstance(entry, SnapshotRef) and entry.path.startswith("oci://"):
        from transplant.donor.registry_snapshot import open_registry

        registry = stack.enter_context(open_registry(entry.path, ca=entry.ca, base=Path(manifest.path).resolve().parent))
        snap = registry.snapshot
        donor = Endpoint(host=HostSpec.parse(snap.donor_host), venv=snap.donor_venv)
        return dataclasses.replace(manifest, donor=donor), registry, None
    if isinstance(entry, SnapshotRef):
        from transplant.donor.snapshot import SnapshotSource, load_snapshot  # only a snapshot donor needs it

        snap = load_snapshot(entry.path, base=Path(manifest.path).resolve().parent, store=store)
        source = stack.enter_context(SnapshotSource(snap))
        donor = Endpoint(host=HostSpec.parse(snap.donor_host), venv=snap.donor_venv)
        return dataclasses.replace(manifest, donor=donor), source, None
    host = stack.enter_context(connect(entry.host, ssh))
    return dataclasses.replace(manifest, donor=entry), HostSource(host, entry.venv), host


def open_donor(manifest: Manifest, ssh: SSHOptions, stack: ExitStack, *, store: Path | None = None,
               reporter: Reporter = QUIET) -> Opened:
    """Open the manifest's donor, or the first ``donor.fallback`` that works.

    A host is used when it can be reached (the SSH connection opens; a venv that is not
    there is found by the probe later and is an error, not a reason to fall back); a
    snapshot when its index can be read.

    :param stack: connections and snapshot views are closed with it.
    :param store: the default snapshot store (None: the state folder's).
    :param reporter: told a note (a line) for each source that failed.
    :raises NoDonorError: none could be used; each reason is listed. Without fallbacks, the
        donor's own error (HostError, SnapshotError) is raised as it is.
    """
    entries = [("donor", manifest.donor)] + [(f"donor.fallback[{i}]", e) for i, e in enumerate(manifest.fallback)]
    failed: list[str] = []
    for which, entry in entries:
        try:
            effective, source, host = _open_one(entry, manifest, ssh, stack, store)
        except TransplantError as exc:
            if len(entries) == 1:
                if isinstance(exc, HostError) and isinstance(entry, Endpoint):
                    from transplant.hosts.host import side_error
                    raise side_error(which, exc, entry.host) from None
                raise
            line = f"{which} ({entry}) cannot be used: {exc.message.splitlines()[0]}"
            failed.append(line)
            reporter.note(line)
            continue
        if not failed:
            why = "the manifest's donor" + (", a snapshot" if isinstance(entry, SnapshotRef) else "")
        else:
            why = f"{which}, because " + "; ".join(failed)
        return Opened(manifest=effective, source=source, which=which, why=why, host=host)
    raise NoDonorError(f"{manifest.path}: no donor source can be used:\n  " + "\n  ".join(failed),
                       hint="bring the donor back, or add a snapshot or another host under donor.fallback "
                            "(take a snapshot while the donor is up: transplant snapshot MANIFEST)")
