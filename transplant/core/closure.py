"""Overlay closures (pure core): a distribution and what its requirements need from the donor.

``overlay: [{closure: sglang}]`` brings ``sglang`` and, transitively, every donor
distribution its Requires-Dist needs that the target lacks or holds at a version the
requirement refuses. Nothing is resolved against an index: the donor's installed set is the
only source, as Nix copies a closure. Requirements are evaluated with the target
interpreter's PEP 508 marker environment, for ``extra == ""`` and each extra the requirement
names (``flashinfer-python[cu13]`` follows flashinfer-python's ``extra == "cu13"``
requirements; ``{closure: "sglang[http2]"}`` names a root's extras). A target build a
requirement accepts stays, and its own requirements are followed too (what it needs must be
there after apply; a target distribution ``remove:`` matches counts as absent). What the donor itself
does not satisfy is returned in :attr:`Closure.unmet` (a plan finding, never a silent skip).

:func:`closure` is a function of the donor's and the target's distributions, the target's
marker environment and the manifest's overlay patterns and ``exclude:`` list; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from transplant.core.inventory import Distribution, Inventory
from transplant.core.manifest import Manifest
from transplant.core.plan import Finding
from transplant.core.requirements import parse_root

__all__ = ["Pulled", "Missing", "Closure", "closure", "expand", "expanded", "closure_findings"]


@dataclass(frozen=True, kw_only=True)
class Pulled:
    """A donor distribution a closure brings.

    :ivar name: normalised name; :ivar version: the donor's version as written.
    :ivar chain: the requirement path that needs it, from the root: ``("sglang 0.5.23",
        "transformers==5.19.0")``; a root's chain is its own ``("sglang 0.5.23",)``.
    :ivar reason: ``not on the target`` or ``the target has 4.57.1``.
    """

    name: NormalizedName
    version: str | None
    chain: tuple[str, ...]
    reason: str

    @property
    def needed_by(self) -> str:
        """``sglang 0.5.23 -> transformers==5.19.0`` (the chain as one line)."""
        return " -> ".join(self.chain)


@dataclass(frozen=True, kw_only=True)
class Missing:
    """A requirement of a closure member that the donor does not satisfy (absent, or at a
    version the requirement refuses): the closure cannot bring it.

    :ivar requirer: normalised name of the member declaring it; :ivar requirement: the entry.
    :ivar donor_version: the donor's version of the required name, None when it has none.
    :ivar chain: the path from the root to the requirer, as in :class:`Pulled`.
    """

    requirer: NormalizedName
    requirement: Requirement
    donor_version: str | None
    chain: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Closure:
    """What the closures of a manifest bring.

    :ivar roots: the root names found on the donor, in manifest order.
    :ivar pulled: every distribution brought beyond the roots and the plain overlay
        patterns, sorted by name.
    :ivar excluded: names ``exclude:`` kept out, each with the chain that would have pulled it.
    :ivar unmet: requirements the donor does not satisfy (see :class:`Missing`).
    :ivar absent_roots: root names the donor lacks.
    """

    roots: tuple[NormalizedName, ...] = ()
    pulled: tuple[Pulled, ...] = ()
    excluded: tuple[tuple[NormalizedName, tuple[str, ...]], ...] = ()
    unmet: tuple[Missing, ...] = ()
    absent_roots: tuple[NormalizedName, ...] = ()

    @property
    def names(self) -> tuple[NormalizedName, ...]:
        """Roots and pulled names: what the closures add to the overlay, sorted."""
        return tuple(sorted({*self.roots, *(p.name for p in self.pulled)}))


def _applies(req: Requirement, markers: Mapping[str, str], extras: Iterable[str]) -> bool:
    if req.marker is None:
        return True
    for extra in ("", *sorted(extras)):
        try:
            if req.marker.evaluate({**markers, "extra": extra}):
                return True
        except UndefinedEnvironmentName:
            return True
    return False


def _accepts(req: Requirement, dist: Distribution | None) -> bool:
    if dist is None:
        return False
    if not req.specifier:
        return True
    return dist.version is not None and req.specifier.contains(dist.version, prereleases=True)


def closure(
    roots: Sequence[str],
    donor: Mapping[str, Distribution],
    target: Mapping[str, Distribution],
    markers: Mapping[str, str],
    *,
    overlay: Sequence[str] = (),
    exclude: Sequence[str] = (),
    remove: Sequence[str] = (),
) -> Closure:
    """The distributions the closures of ``roots`` bring from ``donor`` to ``target``.

    :param roots: closure entries as the manifest writes them (``sglang``, ``sglang[http2]``),
        already validated by :func:`transplant.core.requirements.parse_root`.
    :param donor: the donor's distributions by normalised name (``Inventory.latest()``).
    :param target: the target's, likewise.
    :param markers: the target interpreter's PEP 508 marker environment.
    :param overlay: the manifest's plain overlay patterns (names, globs): the donor
        distributions they select arrive anyway, so a requirement on one is judged against
        the donor's version, and its own requirements are followed too.
    :param exclude: normalised names or globs never pulled (and not followed).
    :param remove: the manifest's ``remove:`` patterns: a target distribution they match counts
        as absent (it goes), so a closure member that needs it brings the donor's build, and
        the overlay then keeps it (the closure is the same before and after apply).
    :returns: a :class:`Closure`; breadth first, so each chain is a shortest one. A cycle
        ends where a member is met again. A requirement whose marker cannot be evaluated
        counts as applying (as in :mod:`transplant.core.requirements`).
    """
    target = {n: d for n, d in target.items() if not any(fnmatchcase(n, p) for p in remove)}

    def excluded(name: str) -> bool:
        return any(fnmatchcase(name, p) for p in exclude)

    def selected(name: str) -> bool:
        return any(fnmatchcase(name, p) for p in overlay)

    found_roots: list[NormalizedName] = []
    absent: list[NormalizedName] = []
    # name -> extras to follow; a member met again with new extras is followed again for them
    followed: dict[NormalizedName, set[str]] = {}
    # a target distribution that stays, followed only for the extras a requirement names on it
    followed_there: dict[NormalizedName, set[str]] = {}
    queue: list[tuple[NormalizedName, frozenset[str], tuple[str, ...], bool]] = []
    for text in roots:
        name, extras = parse_root(text)
        if name not in donor:
            absent.append(name)
            continue
        if name not in found_roots:
            found_roots.append(name)
        queue.append((name, extras, (f"{name} {donor[name].raw_version}",), False))
    pulled: dict[NormalizedName, Pulled] = {}
    kept_out: dict[NormalizedName, tuple[str, ...]] = {}
    unmet: dict[tuple[str, str], Missing] = {}
    while queue:
        name, extras, chain, there = queue.pop(0)
        seen = (followed_there if there else followed).setdefault(name, set())
        todo = set(extras) | {""}
        if todo <= seen:
            continue
        new_extras = todo - seen
        seen |= todo
        dist = (target if there else donor)[name]
        for req in dist.requires_dist:
            if not _applies(req, markers, new_extras - {""}):
                continue
            need = canonicalize_name(req.name)
            have = donor.get(need)
            step = chain + (str(_bare(req)),)
            if need in found_roots or need in pulled or selected(need):
                if not _accepts(req, have):
                    if there:  # a staying target build's pin on what arrives: requirement-unmet's
                        continue
                    unmet.setdefault((name, str(req)), Missing(requirer=name, requirement=req, donor_version=
                                     have.raw_version if have else None, chain=chain))
                elif need not in found_roots and need not in pulled and not excluded(need):
                    # brought by a plain overlay pattern: follow what it needs
                    queue.append((need, _extras(req), step, False))
                elif need in followed and not (_extras(req) <= followed[need]):
                    queue.append((need, _extras(req), step, False))
                continue
            theirs = target.get(need)
            if _accepts(req, theirs) and theirs is not None:
                # it stays; what it needs (with the named extras) must be there too
                queue.append((need, _extras(req), step, True))
                continue
            if excluded(need):
                kept_out.setdefault(need, step)
                continue
            if not _accepts(req, have):
                if there:  # the target's own build lacks it; the donor cannot help: requirement-unmet's
                    continue
                unmet.setdefault((name, str(req)), Missing(requirer=name, requirement=req, donor_version=
                                 have.raw_version if have else None, chain=chain))
                continue
            assert have is not None
            reason = "not on the target" if theirs is None else f"the target has {theirs.raw_version}"
            pulled[need] = Pulled(name=need, version=have.raw_version, chain=step, reason=reason)
            queue.append((need, _extras(req), step, False))
    return Closure(
        roots=tuple(found_roots),
        pulled=tuple(p for _, p in sorted(pulled.items()) if p.name not in found_roots),
        excluded=tuple(sorted(kept_out.items())),
        unmet=tuple(m for _, m in sorted(unmet.items())),
        absent_roots=tuple(absent),
    )


def _extras(req: Requirement) -> frozenset[str]:
    return frozenset(canonicalize_name(e) for e in req.extras)


def _bare(req: Requirement) -> str:
    """The requirement without its marker, for a chain: ``transformers==5.19.0``."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{canonicalize_name(req.name)}{extras}{req.specifier}"


def expand(manifest: Manifest, donor: Inventory, target: Inventory | None) -> tuple[Manifest, Closure | None]:
    """``manifest`` with its closures computed: the overlay becomes the plain patterns, the
    roots and every pulled name (exact names), and ``closures`` is emptied, so the result is
    an ordinary manifest (expanding it again changes nothing).

    :param donor: the donor's inventory (metadata is enough: versions and Requires-Dist).
    :param target: the target's inventory; its marker environment is used. None: no target is
        known (a snapshot), so the closure is taken against an empty target with the donor's
        marker environment: every donor distribution the roots reach, a superset of what any
        target's plan selects.
    :returns: (the expanded manifest, the :class:`Closure`), or (``manifest``, None) when
        it has no closure.
    """
    if not manifest.closures:
        return manifest, None
    markers = (target if target is not None else donor).interpreter.markers
    found = closure(manifest.closures, donor.latest(), target.latest() if target is not None else {}, markers,
                    overlay=manifest.overlay, exclude=manifest.exclude, remove=manifest.remove)
    return expanded(manifest, found), found


def expanded(manifest: Manifest, found: Closure | None) -> Manifest:
    """``manifest`` with the closure ``found`` (:func:`expand`'s, computed once and handed on)
    written into its overlay as exact names, ``closures`` emptied; ``manifest`` itself when
    ``found`` is None (no closure). A manifest already expanded is returned unchanged."""
    if found is None:
        return manifest
    extra = tuple(n for n in found.names if n not in manifest.overlay)
    # an absent root stays in the overlay as an exact name, so the plan reports overlay-no-match
    extra += tuple(n for n in found.absent_roots if n not in manifest.overlay and n not in extra)
    return replace(manifest, overlay=manifest.overlay + extra, closures=())


def closure_findings(found: Closure, manifest: str) -> list[Finding]:
    """``closure-unmet`` (warning) for each requirement of a closure member that the donor does
    not satisfy, and ``closure-excluded`` (info) for each name ``exclude:`` kept out."""
    out = []
    for m in found.unmet:
        have = f"the donor has {m.donor_version}" if m.donor_version else "the donor does not have it"
        out.append(Finding(
            code="closure-unmet", severity="warning", dists=(m.requirer, canonicalize_name(m.requirement.name)),
            message=f"{' -> '.join(m.chain)} requires {m.requirement}, and {have}: the closure cannot bring it "
                    f"(nothing is resolved against an index)",
            hint=f"install a build that meets it on the donor first, or, if the service runs without it, leave it; "
                 f"see requirement-unmet for what the target then lacks ({manifest})",
        ))
    for name, chain in found.excluded:
        out.append(Finding(
            code="closure-excluded", severity="info", dists=(name,),
            message=f"{name} is kept out of the closure by exclude: (needed by {' -> '.join(chain)})",
            hint=f"drop {name!r} from exclude: in {manifest} to bring the donor's build",
        ))
    return out
