"""The environment after apply, as the rules see it (pure core)."""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from packaging.utils import NormalizedName

from transplant.core.elf_facts import ElfFacts, ElfReport, is_shared_object
from transplant.core.inventory import Distribution, FileEntry, Inventory

__all__ = ["EnvironmentAfter", "pip", "describe", "severity", "target_gpus", "DONOR_RUNS"]

#: What a finding's message says when the fault holds identically in the donor. Such a fault lies
#: inside the venv (libtorch symbols between packages, ABI suffixes, the CUDA majors of bundled
#: libraries): it does not change with the host's glibc or libraries, only with the Python that loads it.
DONOR_RUNS = ("the donor runs with exactly this (same files, same versions, on the same Python and machine; "
              "a fault inside the venv does not change with the host's system), so the transplant does not make "
              "it a fault")


@dataclass(frozen=True, kw_only=True)
class EnvironmentAfter:
    """The inputs of the rules.

    :ivar after: normalised name -> the distribution the target will hold after apply
        (the donor's for overlaid names, the target's otherwise; removed names absent).
    :ivar overlaid: the names the overlay moves.
    :ivar removed: the target's names the manifest's ``remove`` list uninstalls.
    :ivar patch_dests: site-packages-relative paths the manifest's patches write.
    :ivar donor_elf / target_elf: ELF facts read on each side (None when not read: the
        binary rules then find nothing).
    :ivar manifest: the manifest's path, for hints.
    :ivar changed: the names whose files apply copies or removes (from the plan's changes);
        None (rules tested on plain data) derives it from versions: added, removed, another
        version, or another dist-info folder.
    :ivar left: venv-relative paths overlaid distributions list but do not carry: another
        distribution wrote them last on both sides (``_written_by_others`` in the planner).
    :ivar relocated: overlaid names whose files the plan moves from the donor's site-packages to
        the target's of another Python minor (pure-Python distributions:
        :func:`transplant.core.rules.interpreter.minor_blockers`); their ``after`` entries are keyed
        by the target's paths. Empty between venvs of one minor.
    :ivar arriving_paths: :attr:`arriving` when the caller built it already (the planner: every
        path of the overlaid distributions, 66,000 on the real pair); None builds it from ``after``.
    """

    donor: Inventory
    target: Inventory
    overlaid: tuple[str, ...]
    after: Mapping[str, Distribution]
    removed: tuple[NormalizedName, ...] = ()
    patch_dests: frozenset[str] = frozenset()
    donor_elf: ElfReport | None = None
    target_elf: ElfReport | None = None
    manifest: str = "the manifest"
    before: Mapping[str, Distribution] = field(default_factory=dict)
    changed: frozenset[str] | None = None
    left: frozenset[str] = frozenset()
    arriving_paths: frozenset[str] | None = None
    relocated: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.before:
            object.__setattr__(self, "before", self.target.latest())

    def side(self, name: str) -> Inventory:
        """The inventory the distribution ``name`` comes from after apply."""
        return self.donor if name in self.overlaid else self.target

    def elf(self, name: str) -> ElfReport | None:
        """The ELF report of the side ``name`` comes from."""
        return self.donor_elf if name in self.overlaid else self.target_elf

    def changes(self, name: str) -> bool:
        """Whether apply changes the distribution ``name`` (added, other version, removed)."""
        if self.changed is not None:
            return name in self.changed
        old, new = self.before.get(name), self.after.get(name)
        if old is None or new is None:
            return old is not new
        return old.raw_version != new.raw_version or (name in self.overlaid and old.dist_info != new.dist_info)

    def objects(self, name: str) -> list[ElfFacts]:
        """ELF facts of the distribution's shared objects after apply (those that were read).

        A staying distribution's file that an overlaid distribution writes too is left out:
        after apply it holds the incoming bytes, reported under the incoming distribution
        (the overlap itself is ``file-owner-conflict``).
        """
        cached = self._objects.get(name)
        if cached is None:
            cached = self._objects[name] = self._read_objects(name)
        return list(cached)

    @cached_property
    def _objects(self) -> dict[str, list[ElfFacts]]:
        return {}

    def _read_objects(self, name: str) -> list[ElfFacts]:
        dist, report = self.after.get(name), self.elf(name)
        if dist is None or report is None:
            return []
        arriving = self.arriving if name not in self.overlaid else frozenset()
        return [report.files[p] for p in sorted(dist.files)
                if p in report.files and p not in arriving and is_shared_object(p)]

    @cached_property
    def library_names(self) -> frozenset[str]:
        """File names and DT_SONAMEs of every file of the environment after apply: the names a
        DT_NEEDED entry finds inside the venv (the host-library and run-path rules share them;
        110,000 files on the real pair, so they are gathered once)."""
        names: set[str] = set()
        for name, dist in self.after.items():
            names.update(posixpath.basename(p) for p in dist.files)
            names.update(f.soname for f in self.objects(name) if f.soname)
        return frozenset(names)

    @cached_property
    def arriving(self) -> frozenset[str]:
        """Venv-relative paths the overlaid distributions write."""
        if self.arriving_paths is not None:
            return self.arriving_paths
        return frozenset(p for n in self.overlaid for p in self.after[n].files)

    @cached_property
    def same_interpreter(self) -> bool:
        """Whether the target's venv runs the donor's kind of Python: the same implementation and
        ``major.minor`` on the same machine type, the facts of the host that decide whether the
        venv's own files load together. The host's glibc and libraries are not among them: only
        the faults that depend on those (symbol versions, DT_NEEDED host libraries) compare them,
        each in its own rule (source: the principle "what the donor runs is not, by itself, an
        error", ARCHITECTURE.md)."""
        d, t = self.donor.interpreter, self.target.interpreter
        return (d.implementation, d.minor, d.machine) == (t.implementation, t.minor, t.machine)

    @cached_property
    def _donor_latest(self) -> list[Distribution]:
        """The donor's distributions (newest of each name), last first."""
        return list(self.donor.latest().values())[::-1]

    def _donor_row(self, path: str) -> str | None:
        """The donor's RECORD hash of ``path``: the last distribution listing it wins (as in a dict
        of every donor file built in order, which would build a large venv's whole file map where
        the rules ask about a dozen); None when none lists it or its row has no hash."""
        for dist in self._donor_latest:
            entry = dist.files.get(path)
            if entry is not None:
                return entry.record_hash
        return None

    def donor_has_file(self, path: str) -> bool:
        """Whether the file at ``path`` after apply holds the donor's bytes at the same path:
        it arrives from the donor, or it stays and its RECORD hash equals the donor's
        (RECORD hashes are the wheel's; ``record-drift`` reports files that differ from them)."""
        if path in self.arriving:
            return True
        entry = self._staying_files.get(path)
        return entry is not None and entry.record_hash is not None and self._donor_row(path) == entry.record_hash

    @cached_property
    def _staying_files(self) -> dict[str, FileEntry]:
        """Venv-relative path -> RECORD entry, over the distributions that stay (first one wins)."""
        out: dict[str, FileEntry] = {}
        for name, dist in self.after.items():
            if name not in self.overlaid:
                for path, entry in dist.files.items():
                    out.setdefault(path, entry)
        return out

    def donor_identical(self, name: str) -> bool:
        """Whether the distribution ``name`` after apply is the donor's own: overlaid, or
        staying at the donor's version with every RECORD hash equal to the donor's (console
        scripts aside: each venv's carry its own interpreter line)."""
        if name in self.overlaid:
            return True
        dist, theirs = self.after.get(name), self.donor.latest().get(name)
        if dist is None or theirs is None or dist.raw_version != theirs.raw_version:
            return False
        scripts = self.target.scripts.rstrip("/") + "/"
        # console scripts are relocated per venv (apply rewrites their head and RECORD row), so their
        # rows say nothing about the distribution's bytes
        mine = {p: e.record_hash for p, e in dist.files.items() if not p.startswith(scripts)}
        return mine == {p: e.record_hash for p, e in theirs.files.items() if not p.startswith(scripts)}

    def donor_runs(self, names: Sequence[str], paths: Sequence[str] = ()) -> bool:
        """Whether a fault about ``names`` (and the files ``paths``) inside the venv holds
        identically in the donor: :attr:`same_interpreter`, every distribution
        :meth:`donor_identical` and every file :meth:`donor_has_file`. Such a fault is at most
        ``info`` (principle: what the donor runs is not, by itself, an error); the host's glibc
        does not count here, since these faults do not depend on it."""
        if not names and not paths:
            return False
        return (self.same_interpreter and all(self.donor_identical(n) for n in names)
                and all(self.donor_has_file(p) for p in paths))


def target_gpus(env: EnvironmentAfter) -> dict[int, str]:
    """The target's GPUs by compute capability as an integer (``9.0`` -> 90, ``12.1`` -> 121) ->
    the name of the last GPU of that capability nvidia-smi listed; GPUs whose capability is not
    ``MAJOR.MINOR`` are left out. Empty without GPUs (the driver's answer decides whether it has
    any: callers that need an answering driver check ``env.target.nvidia.available``)."""
    out: dict[int, str] = {}
    for gpu in env.target.nvidia.gpus:
        cc = (gpu.compute_capability or "").split(".")
        if len(cc) == 2 and cc[0].isdigit() and cc[1].isdigit():
            out[int(cc[0]) * 10 + int(cc[1])] = gpu.name
    return out


def pip(venv: str) -> str:
    """``<venv>/bin/python -m pip``, shell-quoted."""
    return shlex.join([f"{venv}/bin/python", "-m", "pip"])


def describe(dist: Distribution) -> str:
    """``torch 2.9.0+cu128``."""
    return f"{dist.display_name} {dist.raw_version}"


def severity(env: EnvironmentAfter, names: Sequence[str], paths: Sequence[str] = (), *, donor: bool = True) -> str:
    """The severity of a fault about ``names`` (and the files ``paths``): ``info`` when it
    holds identically in the donor (:meth:`EnvironmentAfter.donor_runs`), else ``error`` when
    apply changes any of ``names``, else ``warning`` (the target has it already and apply
    changes nothing about it). Source: manifests/REFERENCE.md, "Findings".

    :param donor: False for a fault that depends on the target's GPUs or driver, which the
        donor's context says nothing about (the donor principle does not apply)."""
    if donor and env.donor_runs(names, paths):
        return "info"
    return "error" if any(env.changes(n) for n in names) else "warning"
