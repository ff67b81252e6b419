"""What a verify run proved, in one line a person trusts (pure core).

A stage that did not run says why by its *cause*, a stable code (``manifests/REFERENCE.md``,
"Verify skip causes"):

- ``not-requested``: the manifest (or the command line) does not ask for this stage;
- ``nothing-to-check``: the venv holds nothing this stage checks (no import names, no shared objects);
- ``not-run``: an earlier stage's failure keeps it from running (``interpreter``);
- ``no-driver``: it needs the NVIDIA driver, which this host lacks, and so does the donor's host
  (a driver the donor has and the target lacks is a failure naming both, never a skip);
- ``no-torch``: it runs torch, which the venv does not hold;
- ``no-device``: it needs a GPU, and the host's driver shows none;
- ``no-model``: it needs the model's files (``config.json``), absent on this host;
- ``donor-identical``: it fails in the donor's venv, on the donor's host, with the same error
  class: what the donor runs cannot be checked better here.

A stage that passed may still hold items it could not check (an import that needs the driver,
a shared object that fails identically in the donor): :attr:`StageResult.unchecked`, each
``{"item", "cause", "evidence"}`` with a cause of the same table.

``--strict`` (:func:`strict`) is for GPU hosts where everything must run: a skip of the causes
in :data:`UNCHECKABLE` and a stage with unchecked items become failures; a stage that was
not asked for, or has nothing to check, stays a skip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transplant.verify.judges import CAUSES, StageResult

__all__ = ["CAUSES", "UNCHECKABLE", "strict", "verdict_line", "counts", "causes_of"]

#: The causes that say "cannot be checked here": what ``--strict`` fails.
UNCHECKABLE = frozenset({"no-driver", "no-torch", "no-device", "no-model", "donor-identical"})


def strict(results: Sequence[StageResult]) -> list[StageResult]:
    """The results with every skip of an :data:`UNCHECKABLE` cause, and every stage holding
    unchecked items, turned into a failure whose reason says so (``--strict``); the others as
    they are."""
    out = []
    for r in results:
        if r.status == "skip" and r.cause in UNCHECKABLE:
            out.append(dataclasses.replace(r, status="fail", reason=f"--strict: not checked here "
                                                                     f"({CAUSES[r.cause]}): {r.reason}"))
        elif r.status == "pass" and r.unchecked:
            named = ", ".join(f"{u['item']} ({CAUSES.get(u['cause'], u['cause'])})" for u in r.unchecked[:4])
            more = f" and {len(r.unchecked) - 4} more" if len(r.unchecked) > 4 else ""
            out.append(dataclasses.replace(r, status="fail", reason=f"--strict: {len(r.unchecked)} not checked "
                                                                     f"here: {named}{more}; {r.reason}"))
        else:
            out.append(r)
    return out


def counts(results: Sequence[StageResult]) -> dict[str, int]:
    """``{"pass": N, "fail": N, "skip": N}``."""
    return {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}


def _by_cause(results: Sequence[StageResult], *, stages: bool) -> dict[str, list[str]]:
    """Cause -> the skipped stages' names (``stages``), or the passing stages' unchecked items as
    ``STAGE:ITEM``; in the order of :data:`CAUSES` (a :class:`StageResult` holds no other cause)."""
    found: dict[str, list[str]] = {}
    for r in results:
        if stages and r.status == "skip":
            found.setdefault(r.cause or "not-run", []).append(r.name)
        for u in r.unchecked if not stages and r.status == "pass" else ():
            found.setdefault(str(u["cause"]), []).append(f"{r.name}:{u['item']}")
    return {c: found[c] for c in CAUSES if c in found}


def causes_of(results: Sequence[StageResult]) -> dict[str, list[str]]:
    """Cause -> the names of what it kept from being checked: skipped stages by name, and
    unchecked items as ``STAGE:ITEM``; in the order of :data:`CAUSES`, empty causes left out."""
    skipped, items = _by_cause(results, stages=True), _by_cause(results, stages=False)
    return {c: skipped.get(c, []) + items.get(c, []) for c in CAUSES if c in skipped or c in items}


def verdict_line(results: Sequence[StageResult], *, strict_mode: bool = False) -> str:
    """``verify passed: 7 passed, 0 failed, 3 skipped (not requested: serve; no torch: smoke);
    not checked here: 2 items (fails identically in the donor: imports:flash_mla ...)``."""
    n = counts(results)
    word = "failed" if n["fail"] else "passed"
    line = f"verify {word}{' (--strict)' if strict_mode else ''}: {n['pass']} passed, {n['fail']} failed, " \
           f"{n['skip']} skipped"
    skipped = _by_cause(results, stages=True)
    if skipped:
        line += " (" + "; ".join(f"{CAUSES[c]}: {', '.join(names)}" for c, names in skipped.items()) + ")"
    items = _by_cause(results, stages=False)
    if items:
        total = sum(len(names) for names in items.values())
        parts = [f"{CAUSES[c]}: " + ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                 for c, names in items.items()]
        line += f"; not checked here: {total} item{'s' if total != 1 else ''} ({'; '.join(parts)})"
    return line
