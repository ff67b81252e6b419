"""Fleets: plan, apply and verify one manifest on many targets in parallel (edge).

The donor is read once, whatever the number of targets: for plan and apply, a live donor
is first captured into a snapshot on the controller (:func:`transplant.donor.snapshot.capture`:
one probe and one rsync of the files the store lacks), and every target is then served
from that snapshot's view folder; verify reads the donor's inventory once for every
target's requirements stage. Each target runs in its own worker (at most ``jobs`` at a
time) with its own SSH connection; one target's failure is its own result and never
stops or hides another's (the habit of Fabric's ``Group`` results).
"""

from __future__ import annotations

import dataclasses
import posixpath
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from transplant.apply.execute import ApplyResult
from transplant.core.inventory import Inventory
from transplant.core.manifest import Endpoint, Manifest
from transplant.core.plan import Plan
from transplant.donor.snapshot import SnapshotSource, capture
from transplant.donor.sources import Opened
from transplant.errors import FleetError, TransplantError
from transplant.exitcodes import EXIT_BLOCKED, EXIT_CHANGES, EXIT_FAIL, EXIT_OK
from transplant.hosts.host import SSHOptions
from transplant.hosts.connecting import connect
from transplant.pipeline import apply_plan, plan_target, roll_back, verify_target
from transplant.verify.judges import StageResult
from transplant.reporting import QUIET, Prefixed, Reporter

__all__ = ["TargetResult", "DonorRead", "FleetError", "check_fleet", "serve_from_snapshot", "run_target", "run_fleet",
           "fleet_exit"]



def _place_key(end: Endpoint) -> tuple[str, int, str]:
    """Where a venv really is: host name (case folded), port (None is SSH's 22), venv path
    normalised; the login name is left out (two users on one host share its files)."""
    host = end.host
    return host.hostname.lower(), 22 if host.port is None else host.port, posixpath.normpath(end.venv)


def check_fleet(targets: Sequence[Endpoint], donors: Sequence[Endpoint], jobs: int) -> int:
    """Refuse a fleet that would run two applies on one venv, or write into a donor.

    :param donors: the donor and its fallback hosts (snapshots are not endpoints).
    :param jobs: the concurrency limit asked for (``--jobs``).
    :returns: the number of workers to start: ``jobs``, at most one per target.
    :raises FleetError: ``jobs`` below 1; a venv named twice (``root@h:/v`` and ``h:22:/v/``
        are one venv); a target that is a donor's venv.
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise FleetError(f"--jobs {jobs}: the number of targets worked on at a time must be 1 or more",
                         hint="write e.g. --jobs 4")
    seen: dict[tuple[str, int, str], Endpoint] = {}
    for t in targets:
        key = _place_key(t)
        if key in seen:
            raise FleetError(f"targets {seen[key]} and {t} are one venv on one host; two applies at once would "
                             f"race on it", hint="name each host and venv once (targets: or --target)")
        seen[key] = t
    for d in donors:
        if _place_key(d) in seen:
            raise FleetError(f"target {seen[_place_key(d)]} is the donor venv {d}", hint="name another host or venv")
    return max(1, min(jobs, len(targets)))


@dataclass(kw_only=True)
class TargetResult:
    """One target's outcome.

    :ivar code: the exit code the single-target command would give (plan 0/2/3, apply
        0/3, verify 0/3, 1 when it could not do its job).
    :ivar error: the error message (and ``hint``) when ``code`` is 1 for a failure.
    :ivar plan: the plan made (plan, apply), or None; :ivar applied: the apply result, or
        None; :ivar stages: the verify results, or None when verify did not run.
    :ivar seconds: wall-clock time of this target's work.
    """

    target: Endpoint
    code: int = EXIT_OK
    error: str | None = None
    hint: str | None = None
    plan: Plan | None = None
    applied: ApplyResult | None = None
    stages: list[StageResult] | None = None
    seconds: float = 0.0
    note: str = ""


@dataclass(kw_only=True)
class DonorRead:
    """What was read from the donor for the whole fleet: ``bytes`` of file content on the
    wire (rsync's count; 0 when every file was already in the store), ``files`` distinct
    contents fetched, ``snapshot`` the index file that served the targets (None for verify)."""

    bytes: int = 0
    files: int = 0
    snapshot: str | None = None


def serve_from_snapshot(opened: Opened, store: Path, stack: ExitStack,
                        reporter: Reporter = QUIET) -> tuple[Opened, DonorRead]:
    """A live donor is captured once into ``store`` and replaced by that snapshot; a snapshot
    source is kept as it is.

    :param reporter: passed to :func:`capture` (its steps, the bytes read from the donor).
    :raises HostError: the donor could not be read; :raises SnapshotError: as :func:`capture`.
    """
    live, snap = opened.source.live, opened.source.snapshot
    if live is None:
        return opened, DonorRead(snapshot=str(snap.path) if snap is not None else None)
    result = capture(opened.manifest, live, store, reporter=reporter)
    source = stack.enter_context(SnapshotSource(result.snapshot))
    read = DonorRead(bytes=result.bytes_read, files=result.fetched, snapshot=str(result.snapshot.path))
    why = (f"{opened.why}; " + (f"the identical stored snapshot {result.snapshot.id} (not stored again)"
                                 if result.existing else f"captured once as snapshot {result.snapshot.id}")
           + ", which serves every target")
    return dataclasses.replace(opened, source=source, why=why), read


def run_target(action: str, manifest: Manifest, target: Endpoint, opened: Opened, ssh: SSHOptions, *,
               force: bool = False, verify_after: bool = False,
               donor_inventory: Callable[[], Inventory | None] | None = None, plan: Plan | None = None,
               reporter: Reporter = QUIET, strict: bool = False, rollback_on_failure: bool = False) -> TargetResult:
    """Plan, apply or verify one target (``action``: ``plan``, ``apply`` or ``verify``) with the
    steps of :mod:`transplant.pipeline`.

    :param force: apply despite error findings; :param verify_after: verify after apply.
    :param donor_inventory: for verify, the donor's inventory (read once for the fleet).
    :param plan: for apply, the plan shown to (and confirmed by) the user; None plans afresh.
        Apply refuses it as stale when the target changed since (``transplant.apply.execute``).
    :param reporter: told this target's steps, progress and notes (plan, apply, verify).
    :param strict: verify's ``--strict``; :param rollback_on_failure: after an apply whose verify
        failed, roll that transaction back (its id in the result's note).
    :returns: the result; errors are caught into it, never raised.
    """
    started = time.monotonic()
    result = TargetResult(target=target)
    m = dataclasses.replace(manifest, target=target, targets=(target,))
    try:
        with connect(target.host, ssh) as host:
            if action in ("plan", "apply"):
                if plan is None:
                    plan = plan_target(m, opened.source, host, reporter=reporter)
                result.plan = plan
                result.code = EXIT_BLOCKED if plan.blocking else EXIT_CHANGES if plan.has_changes else EXIT_OK
                if action == "apply":
                    if plan.refused:
                        result.note = "refused: " + ", ".join(sorted({f.code for f in plan.refused})) + \
                            " cannot be forced"
                    elif plan.blocking and not force:
                        result.note = "blocked by error findings (--force overrides)"
                    else:
                        result.code = EXIT_OK
                        if plan.has_changes:
                            result.applied = apply_plan(plan, m, opened, host, reporter=reporter)
                            pulled = opened.source.transfer_note(host.label)
                            if pulled is not None:
                                result.note = pulled
                        else:
                            result.note = "nothing to change"
            if action == "verify" or (action == "apply" and verify_after and result.code == EXIT_OK):
                result.stages, ok = verify_target(m.verify, host, target.venv, ssh=ssh, donor_inventory=donor_inventory,
                                                  reporter=reporter, strict=strict)
                result.code = EXIT_OK if ok else EXIT_BLOCKED
                if not ok and rollback_on_failure and result.applied is not None:
                    done = roll_back(host, target.venv, reporter=reporter)
                    result.note = f"verify failed: rolled back {', '.join(done)} (--rollback-on-failure)"
    except TransplantError as exc:
        result.code, result.error, result.hint = EXIT_FAIL, exc.message, exc.hint
    except Exception as exc:  # noqa: BLE001 - one target's fault must not hide the others' results
        result.code, result.error = EXIT_FAIL, f"{type(exc).__name__}: {exc}"
        result.hint = "an unexpected error on this target only; run it alone to see the traceback"
    result.seconds = time.monotonic() - started
    return result


def run_fleet(action: str, manifest: Manifest, targets: Sequence[Endpoint], opened: Opened, ssh: SSHOptions, *,
              jobs: int = 4, force: bool = False, verify_after: bool = False,
              donor_inventory: Callable[[], Inventory | None] | None = None,
              done: Callable[[TargetResult], None] | None = None,
              plans: Mapping[Endpoint, Plan] | None = None, reporter: Reporter = QUIET,
              strict: bool = False, rollback_on_failure: bool = False) -> list[TargetResult]:
    """:func:`run_target` for every target, at most ``jobs`` at a time; results in ``targets`` order.

    :param done: called (from a worker thread, one call at a time) as each target finishes.
    :param plans: for apply, the plan of each target as it was shown (see ``run_target``'s ``plan``).
    :param reporter: told every target's reports, each note and step prefixed with the target
        (``HOST:VENV: ``, :class:`transplant.reporting.Prefixed`); targets run side by side, so
        their reports interleave.
    :raises FleetError: as :func:`check_fleet` (nothing ran).
    """
    workers = check_fleet(targets, [], jobs)
    lock = threading.Lock()

    def one(target: Endpoint) -> TargetResult:
        res = run_target(action, manifest, target, opened, ssh, force=force, verify_after=verify_after,
                         donor_inventory=donor_inventory, plan=(plans or {}).get(target), strict=strict,
                         rollback_on_failure=rollback_on_failure,
                         reporter=reporter if reporter is QUIET else Prefixed(reporter, f"{target}: "))
        if done is not None:
            with lock:
                done(res)
        return res

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, targets))


def fleet_exit(results: Sequence[TargetResult]) -> int:
    """The fleet's exit code: 0 when every target gave 0; else the worst code, 1 (a target
    failed) before 3 (blocked, or a verify stage failed) before 2 (plan: changes to make)."""
    codes = {r.code for r in results}
    for code in (EXIT_FAIL, EXIT_BLOCKED, EXIT_CHANGES):
        if code in codes:
            return code
    return EXIT_OK
