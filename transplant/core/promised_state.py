"""The state a plan promises (pure core); the target is compared against it by the applier's ``state``."""

from __future__ import annotations

from transplant.core.plan import Change, Plan
from transplant.core.units import agree, count

__all__ = ["expected_state", "drift", "plan_differences", "transaction_steps"]


def expected_state(plan: Plan) -> dict[str, str | None]:
    """venv-relative path -> the content it must have after apply (None: must be absent).

    Content is ``sha256=<urlsafe b64>``, ``symlink:<target>``, for a console script
    whose shebang apply rewrites ``script:<body hash>:<head>``, and for the RECORD of its
    distribution ``record:sha256=<urlsafe b64>`` (see :attr:`transplant.core.plan.FileCopy.record_identity`);
    a path both removed by one change and copied by another (a file moving between
    distributions) must exist.
    """
    state: dict[str, str | None] = {}
    for change in plan.changes:
        for path in change.remove:
            state.setdefault(path, None)
    for change in plan.changes:
        for copy in change.copy:
            state[copy.path] = copy.identity
    return state


def drift(plan: Plan, donor_fingerprint: str, target_fingerprint: str) -> list[str]:
    """Which side changed since the plan was made, given the fingerprints of fresh inventories
    (empty when both match)."""
    out = []
    if donor_fingerprint != plan.donor.fingerprint:
        out.append(f"the donor {plan.donor.label} changed since the plan was made")
    if target_fingerprint != plan.target.fingerprint:
        out.append(f"the target {plan.target.label} changed since the plan was made")
    return out


def plan_differences(saved: Plan, fresh: Plan, *, shown: int = 8) -> list[str]:
    """What differs between a saved plan and the plan made now, one line per change
    (``torch: planned rebuild 2.11.0+cu128 -> 2.11.0+cu130, now keep``), at most ``shown``."""
    def key(plan: Plan) -> dict[tuple[str, str], Change]:
        return {(c.kind, c.name): c for c in plan.changes}

    before, now = key(saved), key(fresh)
    out = []
    for k in sorted(set(before) | set(now)):
        a, b = before.get(k), now.get(k)
        if a == b:
            continue
        name = k[1]
        if a is None:
            assert b is not None  # both absent: equal, passed over above
            out.append(f"{name}: not in the saved plan, now {b.action}")
        elif b is None:
            out.append(f"{name}: planned {a.action}, now nothing to do")
        else:
            was = f"{a.action} {a.from_version or '-'} -> {a.to_version or '-'}"
            new = f"{b.action} {b.from_version or '-'} -> {b.to_version or '-'}"
            out.append(f"{name}: planned {was}, now {new}" if was != new else
                       _differ(name, len(set(a.copy) ^ set(b.copy)) + len(set(a.remove) ^ set(b.remove))))
    if len(out) > shown:
        out = out[:shown] + [f"and {len(out) - shown} more"]
    return out


def _differ(name: str, files: int) -> str:
    """``torch: 3 files differ from the saved plan`` (``1 file differs``)."""
    return f"{name}: {count(files, 'file')} {agree(files, 'differs', 'differ')} from the saved plan"


def _in_dist_info(path: str) -> bool:
    return any(part.endswith(".dist-info") for part in path.split("/")[:-1])


def transaction_steps(plan: Plan) -> list[dict[str, str]]:
    """The ordered steps apply's transaction runs on the target: ``{"op": "put"|"del", "path"}``.

    Per distribution, the dist-info moves last so a half-applied distribution never looks
    installed: the old dist-info files go first (it now looks absent), then the new
    package files are put, then the old package files removed, then the new dist-info put,
    ``METADATA`` last (importlib treats a folder with METADATA as installed). Patch files
    follow. A path some change removes and another copies is only put.
    """
    expected = expected_state(plan)
    steps: list[dict[str, str]] = []
    seen: set[str] = set()

    def add(op: str, paths: list[str]) -> None:
        for path in paths:
            if path not in seen:
                seen.add(path)
                steps.append({"op": op, "path": path})

    for change in plan.changes:
        puts = [c.path for c in change.copy]
        dels = [p for p in change.remove if expected.get(p, "") is None]
        if change.kind != "distribution":
            add("put", puts)
            add("del", dels)
            continue
        info = f"{change.dist_info}/" if change.dist_info else None
        info_puts = sorted((p for p in puts if info and p.startswith(info)), key=lambda p: (p.endswith("/METADATA"), p))
        add("del", [p for p in dels if _in_dist_info(p)])
        add("put", [p for p in puts if p not in set(info_puts)])
        add("del", [p for p in dels if not _in_dist_info(p)])
        add("put", info_puts)
    return steps
