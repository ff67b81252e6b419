"""The environment after apply, as the rules see it (pure core)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.utils import NormalizedName

from ..binaries import ElfFacts, ElfReport, is_shared_object
from ..inventory import Distribution, Inventory

__all__ = ["EnvironmentAfter", "pip", "describe", "severity"]


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
    """

    donor: Inventory
    target: Inventory
    overlaid: tuple[NormalizedName, ...]
    after: Mapping[NormalizedName, Distribution]
    removed: tuple[NormalizedName, ...] = ()
    patch_dests: frozenset[str] = frozenset()
    donor_elf: ElfReport | None = None
    target_elf: ElfReport | None = None
    manifest: str = "the manifest"
    before: Mapping[NormalizedName, Distribution] = field(default_factory=dict)

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
        old, new = self.before.get(name), self.after.get(name)  # type: ignore[call-overload]
        if old is None or new is None:
            return old is not new
        return old.raw_version != new.raw_version or (name in self.overlaid and old.dist_info != new.dist_info)

    def objects(self, name: str) -> list[ElfFacts]:
        """ELF facts of the distribution's shared objects after apply (those that were read)."""
        dist, report = self.after.get(name), self.elf(name)  # type: ignore[call-overload]
        if dist is None or report is None:
            return []
        return [report.files[p] for p in sorted(dist.files) if is_shared_object(p) and p in report.files]


def pip(venv: str) -> str:
    """``<venv>/bin/python -m pip``, shell-quoted."""
    return shlex.join([f"{venv}/bin/python", "-m", "pip"])


def describe(dist: Distribution) -> str:
    """``torch 2.9.0+cu128``."""
    return f"{dist.display_name} {dist.raw_version}"


def severity(env: EnvironmentAfter, names: list[str] | tuple[str, ...]) -> str:
    """``error`` when apply changes any of ``names``, else ``warning`` (the target has it already)."""
    return "error" if any(env.changes(n) for n in names) else "warning"
