"""Verify stage results and how each stage's report is judged (pure core).

A stage is ``pass``, ``fail`` or ``skip``, always with a reason and seconds; a skip is
never counted as a pass (:func:`overall_ok` is False only for failures, and reports
show skips as skips).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import Finding

__all__ = [
    "VERIFY_SCHEMA",
    "StageResult",
    "judge_imports",
    "judge_server_args",
    "judge_smoke",
    "judge_requirements",
    "expect_matches",
    "overall_ok",
]

VERIFY_SCHEMA = "transplant.verify/2"  # 2: the ladder's stages, "counts"
STATUSES = ("pass", "fail", "skip")


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """One verify stage: ``status`` in pass/fail/skip, a one-line ``reason``, wall ``seconds``,
    and ``details`` (stage-specific JSON: imports with versions and files, parsed values...)."""

    name: str
    status: str
    reason: str
    seconds: float
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "status", "reason", "seconds", "details"}``."""
        return {"name": self.name, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 3), "details": dict(self.details)}


def judge_imports(report: Mapping[str, Any], *, driver: bool = True, donor_shared: Collection[str] = ()) -> tuple[str, str]:
    """(status, reason) for the imports script's report
    (``{"imports": [{"name", "ok", "version", "error"}]}``): fail if any import failed.

    An import whose error is that a driver library (:data:`transplant.ladder.DRIVER_SONAMES`,
    e.g. ``libcuda.so.1``) cannot be opened is, on a host without a driver (``driver`` False),
    not checkable here: neither a pass nor a fail; the reason names it. The same rule as
    native-load's (:func:`transplant.ladder.judge_native`): the driver is installed with the
    GPU, never by a wheel, so its absence says nothing about the venv. With ``driver`` True
    (the default, also when the host's driver facts are unknown) it is a failure.
    An import in ``donor_shared`` fails the same way on the donor (same exception class:
    :func:`transplant.ladder.donor_shared_imports`): what the donor runs, a warning in a
    passing stage, not a fault of the transplant.
    Status: fail on any failure; skip when nothing was checkable (or nothing to check);
    else pass.
    """
    from .ladder import missing_driver_library

    items = report.get("imports", [])
    if not items:
        return "skip", "no import names to check (set verify.imports)"
    uncheckable = [(i, missing_driver_library(i.get("error"))) for i in items if not i.get("ok") and not driver]
    uncheckable = [(i, lib) for i, lib in uncheckable if lib]
    skipped = {id(i) for i, _ in uncheckable}
    donor_too = [i for i in items if not i.get("ok") and id(i) not in skipped and i["name"] in set(donor_shared)]
    skipped |= {id(i) for i in donor_too}
    failed = [i for i in items if not i.get("ok") and id(i) not in skipped]
    note = ""
    if uncheckable:
        named = ", ".join(f"{i['name']} (needs {lib})" for i, lib in uncheckable)
        note = f"; not checkable here: {named}, the NVIDIA driver's library, absent on this host"
    if donor_too:
        named = "; ".join(f"{i['name']} ({str(i.get('error'))[:160]})" for i in donor_too[:3])
        more = f"; and {len(donor_too) - 3} more" if len(donor_too) > 3 else ""
        note += (f"; warning: {len(donor_too)} fail the same way on the donor, which runs with them (not a fault "
                 f"of the transplant): {named}{more}")
    if failed:
        first = failed[0]
        return "fail", f"{len(failed)} of {len(items)} imports failed; {first['name']}: {first.get('error')}{note}"
    passed = [i for i in items if i.get("ok")]
    if not passed:
        return "skip", f"no import could be checked{note}"
    parts = ", ".join(f"{i['name']} {i.get('version') or '?'}"
                      + (f" (from {i['outside']}, outside the venv)" if i.get("outside") else "") for i in passed)
    head = f"{len(items)} imports" if len(passed) == len(items) else f"{len(passed)} of {len(items)} imports"
    return "pass", f"{head}: {parts}{note}"


def expect_matches(want: Any, got: Mapping[str, Any] | None) -> bool:
    """Whether a parsed attribute (as the server-args script describes it) matches ``want``.

    An enum matches by its name or value (``DFLASH`` matches ``SpeculativeAlgorithm.DFLASH``);
    numbers compare by value, so ``16`` matches ``16`` and ``16.0``; strings compare exactly.
    """
    if got is None:
        return False
    candidates = [got.get("value"), got.get("name")]
    for have in candidates:
        if have is None and want is not None:
            continue
        if isinstance(want, bool) or isinstance(have, bool):
            if want is have:
                return True
            continue
        if isinstance(want, (int, float)) and isinstance(have, (int, float)):
            if float(want) == float(have):
                return True
            continue
        if have == want or (isinstance(have, str) and have == str(want)):
            return True
    return False


def judge_server_args(expect: Mapping[str, Any], report: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) for the server-args script's report against the manifest's ``expect``."""
    if not report.get("ok"):
        return "fail", f"the parser rejected the arguments: {report.get('error')}"
    values = report.get("values", {})
    wrong = []
    for key, want in expect.items():
        got = values.get(key)
        if not expect_matches(want, got):
            shown = "missing" if got is None else (got.get("name") or got.get("value") or got.get("repr"))
            wrong.append(f"{key}={shown!s} (expected {want!s})")
    if wrong:
        return "fail", "parsed, but " + "; ".join(wrong)
    shown = " ".join(str((values[k].get("name") or values[k].get("value"))) for k in expect)
    return "pass", f"parsed; {shown} ({', '.join(expect)})" if expect else "parsed (no expect map to compare)"


def judge_smoke(report: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) for the smoke script's report (it already applied the manifest's device choice).

    Its sub-checks (triton, sgl_kernel, flashinfer) fail the stage when one fails; a skipped
    one is named as skipped, with its reason, in the reason of a passing stage.
    """
    checks = report.get("checks", [])
    subs = report.get("subchecks", [])
    if not report.get("ok"):
        bad = [c for c in checks if not c.get("ok")]
        if bad:
            c = bad[0]
            return "fail", (f"{c['name']} {c['dtype']} on {report.get('device')}: relative error "
                            f"{c['rel_error']:.2e} above the bound {c['bound']:.0e}")
    failed = [c for c in subs if c.get("status") == "fail"]
    if failed:
        return "fail", "; ".join(f"{c['name']}: {c['reason']}" for c in failed)
    if not report.get("ok"):
        return "fail", str(report.get("reason"))
    if not checks:
        return "fail", "the smoke script ran no check"
    worst = ", ".join(f"{c['name']} {c['dtype']} {c['rel_error']:.1e} <= {c['bound']:.0e}" for c in checks)
    tail = "".join(f"; {c['name']}: {c['status']} ({c['reason']})" for c in subs)
    return "pass", f"{report.get('reason')}; torch {report.get('torch')}; {worst}{tail}"


def judge_requirements(findings: Sequence[Finding]) -> tuple[str, str]:
    """(status, reason) from requirement findings: fail on any error, else pass (warnings counted)."""
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity != "error"]
    if errors:
        shown = "; ".join(f.message if len(f.message) <= 160 else f.message[:157] + "..." for f in errors[:3])
        more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
        return "fail", f"{len(errors)} distribution(s) with unmet requirements the donor satisfies: {shown}{more}"
    tail = "".join(f"; warning: {w.message if len(w.message) <= 120 else w.message[:117] + '...'}" for w in warnings)
    return "pass", "every requirement the donor satisfies is satisfied" + tail


def overall_ok(results: Sequence[StageResult]) -> bool:
    """True when no stage failed (skips do not fail the run, and are never shown as passes)."""
    return not any(r.status == "fail" for r in results)
