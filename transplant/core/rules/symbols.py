"""``undefined-symbol``: a shared object whose versioned symbols the library it needs does
not define after apply, because one of the two moves and the other stays (pure core).

The libtorch rule covers torch's C++ symbols; this one covers every other library pair the
dynamic loader binds through symbol versions, such as a CUDA library upgraded without its
sibling: cusparse 12.8 needs ``__nvJitLinkCreate_12_8`` (bound to the version
``libnvJitLink.so.12``), an nvjitlink 12.4 that stays defines only ``__nvJitLinkCreate_12_4``
under the same version name, so version names alone (``platform-mismatch``'s check of
``.gnu.version_r``) look fine while ``dlopen`` fails with "undefined symbol".

How: each shared object's DT_NEEDED names are resolved within the environment after apply
(a shared object whose file name or DT_SONAME is that name; several candidates count as
one: a symbol is missing only when none defines it); only pairs where the object and a
candidate come from different sides (one moves from the donor, the other stays on the
target) are checked, so an unchanged pair and a pair the donor runs together cost nothing.
The symbols are each object's undefined, non-weak dynamic symbols bound to a version of that
needed file (``ElfFacts.versioned_undefined``; the C runtime's and libstdc++'s are the
platform rule's). The edge (:mod:`transplant.pipeline.gather`) asks each side's host which of them
its candidate libraries define (:func:`symbol_queries`, answered in
``ElfReport.defined_by``); facts that were not read (an older recorded report) make the
rule find nothing.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from transplant.core.elf_facts import ElfFacts
from transplant.core.plan import Finding
from transplant.core.rules.env import DONOR_RUNS, EnvironmentAfter, describe, severity
from transplant.core.units import count

__all__ = ["SymbolCheck", "symbol_checks", "symbol_queries", "symbol_findings"]

_SHOWN = 3


@dataclass(frozen=True, kw_only=True)
class SymbolCheck:
    """One object's symbols from one needed library, to be checked after apply.

    :ivar path / owner / side: the object's venv-relative path, distribution and side
        (``donor`` when it moves, ``target`` when it stays).
    :ivar needed: the DT_NEEDED name (``libnvJitLink.so.12``).
    :ivar symbols: the names bound to that file's versions, sorted.
    :ivar providers: ``(path, owner, side)`` of each candidate library after apply.
    """

    path: str
    owner: str
    side: str
    needed: str
    symbols: tuple[str, ...]
    providers: tuple[tuple[str, str, str], ...]


def _side(env: EnvironmentAfter, name: str) -> str:
    return "donor" if name in env.overlaid else "target"


def symbol_checks(env: EnvironmentAfter) -> list[SymbolCheck]:
    """The (object, needed library) pairs of the environment after apply where the object and
    at least one candidate provider come from different sides, sorted by object path; []
    when the facts were not gathered."""
    objects: list[tuple[ElfFacts, str]] = []
    providers: dict[str, list[tuple[str, str, str]]] = {}
    for name in sorted(env.after):
        for facts in env.objects(name):
            if facts.error:
                continue
            objects.append((facts, name))
            entry = (facts.path, name, _side(env, name))
            for key in {posixpath.basename(facts.path), facts.soname}:
                if key:
                    providers.setdefault(key, []).append(entry)
    out = []
    for facts, name in objects:
        side = _side(env, name)
        for needed, symbols in sorted((facts.versioned_undefined or {}).items()):
            found = tuple(p for p in providers.get(needed, ()) if p[0] != facts.path)
            if symbols and found and any(p[2] != side for p in found):
                out.append(SymbolCheck(path=facts.path, owner=name, side=side, needed=needed,
                                       symbols=tuple(symbols), providers=found))
    return sorted(out, key=lambda c: (c.path, c.needed))


def symbol_queries(env: EnvironmentAfter) -> dict[str, dict[str, list[str]]]:
    """``{"donor": {library: [names]}, "target": {...}}``: what to ask each side's host
    (``read_elf_facts(defined_by=...)``) for :func:`symbol_findings`; empty dicts when nothing."""
    out: dict[str, dict[str, set[str]]] = {"donor": {}, "target": {}}
    for check in symbol_checks(env):
        for path, _owner, side in check.providers:
            out[side].setdefault(path, set()).update(check.symbols)
    return {side: {p: sorted(names) for p, names in sorted(q.items())} for side, q in out.items()}


def _missing(env: EnvironmentAfter, check: SymbolCheck) -> list[str] | None:
    """The symbols no candidate defines; None when a candidate's answer is not there."""
    reports = {"donor": env.donor_elf, "target": env.target_elf}
    missing = set(check.symbols)
    for path, _owner, side in check.providers:
        report = reports[side]
        answer: Mapping = report.defined_by if report is not None else {}
        if path not in answer or answer[path] is None:
            return None
        missing &= set(answer[path])
    return sorted(missing)


def symbol_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per (object, needed library) whose versioned symbols no candidate library
    defines after apply. Severity by :func:`transplant.core.rules.env.severity` over both
    distributions and both files (info when the donor holds these very files together)."""
    out = []
    for check in symbol_checks(env):
        missing = _missing(env, check)
        if not missing:
            continue
        path, powner, _ = next((p for p in check.providers if p[2] != check.side), check.providers[0])
        dist, pdist = env.after[check.owner], env.after[powner]
        level = severity(env, [check.owner, powner], [check.path, path])
        if check.side == "donor":
            why = f"it moves from the donor while {describe(pdist)} stays"
            theirs, fix_name = env.donor.latest().get(powner), powner
        else:
            why = f"{describe(pdist)} arrives from the donor while {dist.display_name} stays"
            theirs, fix_name = env.donor.latest().get(check.owner), check.owner
        if level == "info":
            hint, why = "nothing to do", DONOR_RUNS
        elif theirs is not None:
            hint = f"add {fix_name!r} to overlay in {env.manifest} (the donor has {describe(theirs)})"
        elif check.side == "target":
            hint = f"add {check.owner!r} to remove: in {env.manifest} (the donor runs without it)"
        else:
            hint = f"install a {pdist.display_name} that defines them, or keep the target's {dist.display_name}"
        shown = ", ".join(missing[:_SHOWN]) + (f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else "")
        out.append(Finding(
            code="undefined-symbol", severity=level, dists=(check.owner, powner),
            message=f"{describe(dist)}: {check.path} needs {count(len(missing), 'symbol')} from {check.needed} that "
                    f"{path} ({describe(pdist)}) does not define after apply ({why}): {shown}; the loader "
                    f"refuses it (\"undefined symbol\")",
            hint=hint, files=(check.path, path),
        ))
    return out
