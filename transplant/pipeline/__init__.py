"""The one pipeline (edge): gather the facts, plan, apply and verify one target, each step returning its outcome.

The single-target commands, fleets (:mod:`transplant.fleet.run`), ``recover`` and
``apply --verify`` all run these steps; what is printed and asked around them is the face's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transplant.collector import collector_paused
from transplant.controller.patch_files import read_patch_files
from transplant.controller.state import default_state_dir
from transplant.core.inventory import Inventory
from transplant.core.manifest import Manifest, VerifySettings
from transplant.core.plan import Plan
from transplant.core.planner import PatchFile, plan as make_plan
from transplant.donor.sources import DonorSource, Opened
from transplant.pipeline.gather import gather
from transplant.hosts.host import Host, SSHOptions
from transplant.hosts.probing import WaitingScript
from transplant.reporting import QUIET, Reporter

if TYPE_CHECKING:  # apply's and verify's modules load when those steps run: a plan needs neither
    from transplant.apply.execute import ApplyResult
    from transplant.verify.judges import StageResult

__all__ = ["plan_target", "apply_plan", "verify_target", "roll_back"]


def plan_target(manifest: Manifest, source: DonorSource, target: Host, *, patches: list[PatchFile] | None = None,
                reporter: Reporter = QUIET, memo: bool | str = False, recalled: list | None = None) -> Plan:
    """Gather the facts of the donor ``source`` and the ``target`` host (:func:`transplant.pipeline.gather.gather`)
    and plan (:func:`transplant.core.planner.plan`).

    :param patches: the manifest's patch files, when already read; None reads them.
    :param reporter: told a short line (a step) as each read starts, and (a note) when the plan
        memo's plan is reused; with ``memo="recall"`` (apply) also, as a note, why it was not
        (``planning afresh: the donor changed since the last plan``).
    :param memo: use and keep the plan memo (:mod:`transplant.pipeline.memo`): when neither venv
        changed since the last plan of the same key, that plan is returned without reading
        anything again. Off when the controller's ``TRANSPLANT_PLAN_MEMO`` is ``0``. ``"recall"``:
        use a kept plan but keep none (apply's: the plan it makes is for the state it then changes,
        so keeping it would cost the probes' inputs and a fingerprint of the extra paths for a memo
        the apply itself makes stale).
    :param recalled: a list the memo's :class:`transplant.pipeline.memo.Recalled` is appended to
        when the plan returned is the kept one (apply asks its target fingerprint again under the
        lock); None: not said.
    :raises TransplantError: as ``gather`` and the planner raise (an unreachable host, a bad probe).
    """
    from transplant.pipeline import memo as memos

    patches = read_patch_files(manifest) if patches is None else patches
    enabled = bool(memo) and memos.memo_enabled()
    key = memos.memo_key(manifest, source, target, patches) if enabled else None
    why = ("TRANSPLANT_PLAN_MEMO=0" if memo and not enabled else
           "the donor is neither a host nor a local snapshot (no plan is kept for it)" if memo and key is None else None)
    if key is not None:
        reporter.step("asking both venvs whether anything changed since the last plan")
        kept = memos.recall(key, source, target, manifest.target.venv, manifest=manifest, patches=patches)
        if not isinstance(kept, str):
            reporter.note(f"nothing changed on either venv since the plan of {memos.planned_when(kept.planned_at)}"
                          f"; nothing was read again (TRANSPLANT_PLAN_MEMO=0 plans afresh)")
            if recalled is not None:
                recalled.append(kept)
            return kept.plan
        why = kept
    if memo == "recall" and why:  # apply: one line on why it plans again rather than reusing a plan
        reporter.note(f"planning afresh: {why}")
    started = time.time()
    keep = key is not None and memo != "recall"
    facts = gather(manifest, source, target, patches, reporter=reporter, inputs=keep)
    with collector_paused():  # the planner's 70,000 new objects beside both inventories
        plan = make_plan(manifest, facts.donor, facts.target, patches, donor_elf=facts.donor_elf,
                         target_elf=facts.target_elf, closure=facts.closure)
    if keep and key is not None:  # keep implies a key; said again for the type checker
        libstdcxx = facts.target_elf.libstdcxx
        extra = [*facts.target.elsewhere, *([libstdcxx.path] if libstdcxx is not None and libstdcxx.path else [])]
        memos.remember(key, plan, started, source=source, target=target, venv=manifest.target.venv,
                       donor_inputs=facts.donor.inputs, target_inputs=facts.target.inputs, target_extra=extra)
    return plan


def apply_plan(plan: Plan, manifest: Manifest, opened: Opened, target: Host, *, reporter: Reporter = QUIET,
               break_lock: bool = False, crash_after: int | None = None,
               orphan_at: int | None = None, compress: bool = False,
               stale_probe: WaitingScript | None = None, stale_inputs: dict | None = None) -> ApplyResult:
    """Carry out ``plan`` on ``target`` as one transaction (:func:`transplant.apply.execute.execute`), the
    donor's files read from ``opened``'s source (a registry snapshot's source stages them on the
    target itself: its ``stager``), the recipe of where the state came from recorded.

    :param reporter: passed to ``execute`` (its steps, the bytes copied, its notes).
    :param compress: compress the file stream (``execute``'s ``compress``).
    :param stale_probe: the target's probe started earlier for the stale-plan check (``execute``'s).
    :param stale_inputs: the memo's target fingerprint when ``plan`` is the kept one (``execute``'s).
    :raises ApplyError: / :raises TransactionError: as ``execute`` (a stale plan, a lock held, a failed step).
    """
    from transplant.apply.execute import execute
    from transplant.recover.provenance import make_recipe

    stager = opened.source.stager()  # a registry snapshot: each target pulls its files itself
    donor_host, donor_root = (None, None) if stager else opened.source.files(
        [cp.read_path for c in plan.changes for cp in c.copy if cp.source == "donor"])
    if donor_host is not None:  # a pull key a killed apply left authorised on this donor goes now, whatever the way
        from transplant.hosts.pullkey import sweep_left

        sweep_left(default_state_dir(), donor_host, reporter)
    return execute(plan, donor=donor_host,  # type: ignore[arg-type]  # None only beside a stager, which reads no donor host
                   target=target, manifest_dir=Path(manifest.path).resolve().parent,
                   state_dir=default_state_dir(), donor_root=donor_root, recipe=make_recipe(manifest, plan, opened),
                   break_lock=break_lock, crash_after=crash_after, orphan_at=orphan_at, stager=stager, reporter=reporter,
                   compress=compress, stale_probe=stale_probe, stale_inputs=stale_inputs)


def verify_target(settings: VerifySettings, target: Host, venv: str, *, ssh: SSHOptions | None,
                  record: bool = True, donor_inventory: Callable[[], Inventory | None] | None = None,
                  strict: bool = False, **stages: Any) -> tuple[list[StageResult], bool]:
    """Run the verify ladder (:func:`transplant.verify.runner.run_stages`) in ``venv`` on ``target`` and,
    when ``record`` is true, record the verdict in the target's history and the controller's
    verified log.

    :param strict: what could not be checked here fails (:func:`transplant.verify.verdict.strict`),
        before the verdict is recorded.
    :param stages: passed on to ``run_stages`` (``reporter``, ``clear_jit_caches``, ``donor_run``, ``started``,
        ``manifest``).
    :returns: the stage results and whether no stage failed.
    """
    from transplant.recover.provenance import record_verified, verified_log
    from transplant.verify.judges import overall_ok
    from transplant.verify.runner import run_stages  # the verify ladder: an apply without --verify needs none

    results = run_stages(settings, target=target, venv=venv, donor_inventory=donor_inventory, **stages)
    if strict:
        from transplant.verify.verdict import strict as strictly

        results = strictly(results)
    ok = overall_ok(results)
    if record:
        record_verified(target, venv, ok, time.time(), log=verified_log(default_state_dir()), ssh=ssh)
    return results, ok


def roll_back(target: Host, venv: str, *, to: str | None = None, force: bool = False, break_lock: bool = False,
              reporter: Reporter = QUIET, listing: str = "transplant history MANIFEST",
              undo_interrupted: str = "transplant apply MANIFEST --rollback") -> list[str]:
    """Roll back the newest committed transaction of ``venv`` on ``target`` (or every one after
    ``to``) under the target's lock, after recording the outcome of transactions a host script
    finished alone (each told to ``reporter`` as a note); returns the ids rolled back.

    :param listing: the command that lists the transactions, and :param undo_interrupted: the one
        that undoes an interrupted transaction, for the hints.
    :raises TransactionError: a transaction is interrupted, the target drifted since (unless
        ``force``), or as :func:`transplant.apply.txn.undo`; :raises LockError: the lock is held
        (unless ``break_lock``)."""
    from transplant.apply import txn
    from transplant.apply.execute import new_transaction_id
    from transplant.errors import TransactionError

    lock = new_transaction_id()
    txn.acquire(target, venv, lock, "transplant rollback", reporter=reporter, break_lock=break_lock)
    try:
        interrupted = txn.interrupted(target, venv)
        for completed in txn.record_completed(target, venv):
            reporter.note(completed.describe())
        if interrupted:
            raise TransactionError(f"{target.label}:{venv}: a transaction is interrupted; undo it first",
                                   hint=undo_interrupted)
        return txn.undo(target, venv, to=to, force=force, lock=lock, reporter=reporter, listing=listing)
    finally:
        txn.release(target, venv, lock)
