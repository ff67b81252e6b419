"""Apply a plan to the target as a transaction (edge).

The target is locked; new files are staged inside the venv's state folder
(``<venv>/.transplant/txn/<id>/staged``) and only then renamed into place, in the order
of :func:`transplant.core.promised_state.transaction_steps` (per distribution the dist-info last), each
replaced or removed file kept as a hardlink backup; last, every path the plan touched must
equal the planned state hash for hash (a file streamed in is hashed once, as it is written, and
taken at that hash while its stat identity holds: see :func:`_stage` and the applier's ``check``). An interrupted transaction
is finished (``--resume``) or undone (``--rollback``) by :mod:`transplant.apply.txn`; every
transaction stays recorded in ``<venv>/.transplant/`` for ``transplant history`` and
``transplant rollback``.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transplant.errors import ApplyError, HostError, TransplantError
from transplant.hosts.host import Host, LocalHost
from transplant.core.inventory import inside_path, protected_path
from transplant.hosts.probing import take_inventory
from transplant.core.plan import FileCopy, Plan, moved_roots
from transplant.apply import txn
from transplant.core.promised_state import expected_state, transaction_steps
from transplant.hosts.probing import WaitingScript, fingerprint, take_prestarted, venv_python
from transplant.hosts.stream import UNAVAILABLE, StartedSides, side_argv, start_sides, stream_files
from transplant.hosts.transfer import TransferResult, copy_files
from transplant.core.units import count, human_bytes
from transplant.reporting import QUIET, Reporter

__all__ = ["ApplyResult", "ApplyError", "execute", "check_plan_paths", "new_transaction_id"]

@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    """What apply did: files and bytes copied (bytes as they crossed the wire), files removed, seconds,
    ``steps``: (step name, seconds) for ``prepare`` (lock, begin), ``transfer`` (the copy; the
    stale-plan probe runs beside it), ``staged check`` (the stale-plan probe's answer where it
    outlasted the copy, script heads, RECORD rows, links, the staged files against the plan),
    ``commit`` and ``check``, and
    ``transfer``: how the donor's files moved, in words (``streamed ... through the controller``;
    empty when none moved or a registry stager staged them)."""

    transaction: str
    files_copied: int
    bytes_moved: int
    files_removed: int
    seconds: float
    steps: tuple[tuple[str, float], ...] = ()
    transfer: str = ""


def check_plan_paths(plan: Plan, manifest_dir: Path) -> None:
    """Refuse a plan with any path that leaves its root, before anything is written.

    Every copied and removed path must be relative to the venv and stay inside it once
    normalised (a copy's ``donor_path`` too, ending in the same file name as its ``path``:
    :func:`transplant.core.plan.moved_roots`); every patch source must be a regular file inside the manifest's folder
    (symlinks resolved).

    :raises ApplyError: naming the first bad path and the change it belongs to.
    """
    base = manifest_dir.resolve()
    for change in plan.changes:
        paths = [c.path for c in change.copy] + list(change.remove)
        if change.dist_info is not None:
            paths.append(change.dist_info)
        for path in paths:
            if inside_path(path) != path:
                raise ApplyError(f"refusing the plan: {change.name}: path {path!r} is not a normalised path "
                                 f"inside the venv", hint=_REPLAN)
            if protected_path(path):
                raise ApplyError(f"refusing the plan: {change.name}: path {path!r} is part of the venv itself",
                                 hint=_REPLAN)
        for copy in change.copy:
            if copy.donor_path is not None:
                where = copy.donor_path
                if copy.source != "donor" or inside_path(where) != where or protected_path(where):
                    raise ApplyError(f"refusing the plan: {change.name}: donor path {where!r} of {copy.path} is not "
                                     f"a normalised path inside the donor venv", hint=_REPLAN)
                if moved_roots(where, copy.path) is None:
                    raise ApplyError(f"refusing the plan: {change.name}: {copy.path} is read from {where!r}, which "
                                     f"does not end in the same file name: no transfer can place it", hint=_REPLAN)
            if copy.source == "donor":
                continue
            if copy.source != "patch" or copy.local is None or inside_path(copy.local) != copy.local:
                raise ApplyError(f"refusing the plan: {change.name}: bad patch source {copy.local!r}", hint=_REPLAN)
            source = (base / copy.local).resolve()
            if base not in source.parents or not source.is_file():
                raise ApplyError(f"refusing the plan: patch source {copy.local!r} is not a file inside {base}",
                                 hint=_REPLAN)


_REPLAN = "make a fresh plan from the manifest: transplant plan MANIFEST --out plan.json"


def _stage_patches(plan: Plan, manifest_dir: Path, staging: Path) -> list[str]:
    paths = []
    for change in plan.changes:
        for copy in change.copy:
            if copy.source != "patch" or copy.local is None:
                continue
            source = (manifest_dir / copy.local).resolve()
            dest = staging / copy.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
            paths.append(copy.path)
    return paths


def new_transaction_id() -> str:
    """``20261130T143000Z-1a2b3c4d``: sorts by time, unique per apply."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def execute(
    plan: Plan,
    *,
    donor: Host,
    target: Host,
    manifest_dir: Path,
    state_dir: Path,
    reporter: Reporter = QUIET,
    timeout: float | None = None,
    break_lock: bool = False,
    crash_after: int | None = None,
    orphan_at: int | None = None,
    donor_root: str | None = None,
    recipe: dict | None = None,
    stager: Callable[..., tuple[int, int]] | None = None,
    compress: bool = False,
    stale_probe: WaitingScript | None = None,
    stale_inputs: dict | None = None,
) -> ApplyResult:
    """Carry out ``plan`` as a transaction on the target (see :mod:`transplant.remote.applier`).

    Lock the target; record the outcome of a commit its host script completed after its
    controller died (:func:`transplant.apply.txn.record_completed`, said through ``reporter``); refuse
    while an earlier transaction there is interrupted, and refuse a
    stale plan (the target, probed again as the plan read it, has another fingerprint); check free
    space and writability and record the state before (nothing is written before these
    pass); copy every new file into the transaction's staging folder inside the venv's
    state folder (one stream from the donor, hashed as it is written: :func:`transplant.hosts.stream.stream_files`;
    between two SSH hosts, 100 MiB or more, the target pulls it directly: :mod:`transplant.hosts.direct`;
    rsync where the stream cannot start or ``TRANSPLANT_TRANSFER=rsync``); rewrite console-script shebangs there, and set those scripts'
    rows in their staged RECORD to the files as written (sha256 and size); then commit: the
    ordered renames and removals of :func:`transplant.core.promised_state.transaction_steps`, each
    replaced or removed file kept as a hardlink backup. Last, every touched path must equal the
    plan. A streamed file is hashed once, by the receiver as it writes it: the staged check and the
    final one take that hash for a file whose stat identity has not changed since (see the
    applier's ``check`` and ``state``), and hash every other. A failure before the commit discards the
    staging (the live venv never changed); a failure during it leaves a transaction that
    ``apply --resume`` finishes or ``apply --rollback`` undoes.

    :param donor: connected donor host; :param target: connected target host.
    :param manifest_dir: folder the patch sources are relative to.
    :param state_dir: the controller's state folder (staging for relayed copies).
    :param reporter: told the steps ``files`` and ``patches`` (each with its bytes done of all
        while it is copied; only those that copy something), ``commit`` and ``check`` as they
        start, a note saying how each copy went (streamed, which way, how many bytes, compressed
        or not; or rsync and why), and a note for each notice (a stale lock broken, a commit
        completed earlier).
    :param timeout: seconds for each transfer; None waits without limit.
    :param break_lock: take the lock even when another controller holds it.
    :param crash_after: testing hook: the commit kills itself (SIGKILL) before that step.
    :param orphan_at: testing hook: the commit waits before that step until this process is
        gone (a test kills it), then goes on alone.
    :param donor_root: the folder on ``donor`` the files are read from; None: the plan's
        donor venv (a snapshot's view folder on the controller otherwise).
    :param recipe: what the target's history keeps of where this state came from (the
        manifest as data, its patch files, the snapshot), for ``transplant status`` and
        ``transplant recover``; None records none.
    :param stager: puts the donor files into the staging folder instead of rsync from ``donor``
        (a registry snapshot: :meth:`transplant.donor.registry_snapshot.RegistrySource.stage`, called as
        ``stager(target, venv, staged, paths, staging=, timeout=, reporter=)`` -> (bytes through the
        controller, files)); None streams the files from ``donor``.
    :param compress: compress the stream (zstd where both hosts have it, else zlib): for a slow
        link between the controller and a host; False sends it plain.
    :param stale_probe: a probe of the target venv started before the lock and not yet asked
        (:class:`transplant.hosts.probing.WaitingScript`, started while the plan gathered): the
        stale-plan check sends it its request under the lock (the probe reads the venv only then),
        so the check is the same and only the process's start is saved; None starts one under the lock.
    :param stale_inputs: when ``plan`` is the plan memo's (:class:`transplant.pipeline.memo.Recalled`'s
        ``target_inputs``: the packed input paths, their digest, the extra paths and theirs), the
        stale-plan check asks the probe for that fingerprint (one ``lstat`` per input) instead of a
        full inventory: equal, the target is what the plan read (the memo's own rule); else the
        full check runs as without it. None: the full check.
    :raises ApplyError: a path in the plan leaves its root (checked before any write), the
        target is no longer the one the plan was made against (checked under the lock,
        before any write: a stale plan), the target lacks space or cannot be written (nothing changed), an earlier transaction
        is interrupted, or the target differs from the plan afterwards (``mismatches``).
    :raises TransactionError: the target is locked, or a transaction step failed.
    :raises HostError: a host could not be reached or rsync failed (nothing changed).
    """
    check_plan_paths(plan, manifest_dir)
    if stager is not None and any(cp.donor_path is not None for c in plan.changes for cp in c.copy):
        raise ApplyError(f"{plan.target.label}: this plan moves files from the donor's site-packages to the target's "
                         f"of another Python minor, and a registry snapshot's stager places each file at the "
                         f"snapshot's own path only; nothing was changed",
                         hint="apply from the live donor or from a local snapshot (transplant snapshot), which stream "
                              "each file to its place")
    how = transfer_way()  # a bad TRANSPLANT_TRANSFER is said before the lock, the probe or the transaction
    if plan.refused:
        first = plan.refused[0]
        raise ApplyError(f"{plan.target.label}: apply refused, whatever --force or accept: say: {first.message}",
                         hint=first.hint)
    started = time.monotonic()
    txid = new_transaction_id()
    ahead = _stream_ahead(plan, donor, donor_root or plan.donor.venv, target, how=how, stager=stager,
                          compress=compress)
    try:
        return _execute(plan, donor=donor, target=target, manifest_dir=manifest_dir, state_dir=state_dir,
                        reporter=reporter, timeout=timeout, break_lock=break_lock, crash_after=crash_after,
                        orphan_at=orphan_at, donor_root=donor_root, recipe=recipe, stager=stager, compress=compress,
                        stale_probe=stale_probe, stale_inputs=stale_inputs, how=how, txid=txid, started=started,
                        ahead=ahead)
    finally:
        if ahead is not None:
            ahead.close()


#: A transfer of fewer bytes than this starts its stream's two sides before the lock
#: (:func:`_stream_ahead`); larger ones start them when they copy (and may go direct).
AHEAD_MAX_BYTES = 16 << 20


def _stream_ahead(plan: Plan, donor: Host, donor_root: str, target: Host, *, how: str,
                  stager: Callable[..., tuple[int, int]] | None, compress: bool) -> StartedSides | None:
    """For a small transfer (the donor's files under :data:`AHEAD_MAX_BYTES`, uncompressed, streamed:
    no stager, ``how`` ``stream`` or ``relay``), the stream's sender on the donor and its receiver
    on the target, started ahead and waiting (:class:`transplant.hosts.stream.StartedSides`: neither
    reads nor writes a file before the copy gives them their input; the receiver learns the staged
    folder then): those the command started as it connected
    (:func:`transplant.hosts.probing.prestart`), else both started now, so that their SSH channels
    and interpreter starts overlap the lock, the stale-plan check and the begin instead of following them.
    None: nothing started (a larger or another kind of copy starts its own sides when it copies).
    """
    copies = [cp for c in plan.changes for cp in c.copy if cp.source == "donor"]
    if any(cp.donor_path is not None for cp in copies):  # moved files: one copy per folder pair (_stage)
        return None
    if not copies or stager is not None or compress or how not in ("stream", "relay") or \
            sum(cp.size or 0 for cp in copies) >= AHEAD_MAX_BYTES:
        return None
    sender = take_prestarted(donor, plan.donor.venv, "stream_send", side_argv("stream_send", donor_root))
    receiver = take_prestarted(target, plan.target.venv, "stream_receive", side_argv("stream_receive", ""))
    return start_sides(donor, donor_root, target,
                       src_python=None if isinstance(donor, LocalHost) else venv_python(plan.donor.venv),
                       dst_python=None if isinstance(target, LocalHost) else venv_python(plan.target.venv),
                       sender=None if sender is None else sender.process(),
                       receiver=None if receiver is None else receiver.process())


def _execute(plan: Plan, *, donor: Host, target: Host, manifest_dir: Path, state_dir: Path, reporter: Reporter,
             timeout: float | None, break_lock: bool, crash_after: int | None, orphan_at: int | None,
             donor_root: str | None, recipe: dict | None, stager: Callable[..., tuple[int, int]] | None,
             compress: bool, stale_probe: WaitingScript | None, how: str, txid: str, started: float,
             ahead: StartedSides | None, stale_inputs: dict | None = None) -> ApplyResult:
    """:func:`execute` once its inputs are checked (``ahead``: the stream's sides started ahead, or None)."""
    venv = plan.target.venv
    steps: list[tuple[str, float]] = []
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps.append((name, now - mark))
        mark = now

    txn.acquire(target, venv, txid, f"transplant apply {plan.manifest}", reporter=reporter, break_lock=break_lock)
    # under the lock, the stale-plan probe (its own host script) runs on a thread of its own while
    # the applier answers whether a transaction is interrupted, begins this one and the files
    # stream into its staged folder: its answer is awaited before anything is renamed into the venv
    # (a stale plan discards the staged files), so it costs the apply no time of its own
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        stale = pool.submit(_refuse_stale, plan, target, stale_probe, stale_inputs)
        pending = txn.interrupted(target, venv)
        for completed in txn.record_completed(target, venv):
            reporter.note(completed.describe())
        if pending:
            raise ApplyError(
                f"{plan.target.label}: transaction {pending[-1]['id']} was interrupted ({pending[-1]['state']}); "
                f"finish it or undo it first",
                hint=f"transplant apply {shlex.quote(plan.manifest)} --resume   (or --rollback)")
        expected = expected_state(plan)
        order = transaction_steps(plan)
        reply = txn.call(target, venv, "begin", {
            "id": txid, "steps": order, "after": expected, "bytes": plan.copy_bytes,
            "source": f"donor {plan.donor.label}"}, check=False)
        if not reply.get("ok"):
            raise _begin_error(plan, reply)
        txn.call(target, venv, "record", {"entry": {
            "id": txid, "event": "started", "time": time.time(), "source": f"donor {plan.donor.label}",
            "plan_donor": plan.donor.fingerprint, "plan_target": plan.target.fingerprint,
            **({"recipe": recipe} if recipe is not None else {})}})
        lap("prepare")
        try:
            moved, copied, written, transfer = _stage(
                plan, donor, donor_root or plan.donor.venv, target, reply["staged"], manifest_dir, state_dir, reporter,
                timeout, how=how, stager=stager, compress=compress, ahead=ahead)
            lap("transfer")
            stale.result()  # the target is still the one planned against (else nothing is renamed)
            scripts = [{"path": cp.path, "head": cp.head, "body_hash": cp.body_hash}
                       for c in plan.changes for cp in c.copy if cp.head is not None]
            if scripts:
                txn.call(target, venv, "heads", {"id": txid, "scripts": scripts})
            records = [{"path": cp.path, "scripts": list(cp.record_scripts)}
                       for c in plan.changes for cp in c.copy if cp.record_identity is not None]
            if records:
                txn.call(target, venv, "records", {"id": txid, "records": records})
            links = [{"path": cp.path, "target": cp.link} for c in plan.changes for cp in c.copy if cp.link]
            if links:
                txn.call(target, venv, "links", {"id": txid, "links": links})
            puts = {p: want for p, want in expected.items() if want is not None}
            checked = txn.call(target, venv, "check", {"id": txid, "expect": puts, "written": written}, check=False)
            if not checked.get("ok"):
                error = str(checked.get("error"))
                if "leads outside the transaction's folder" in error:  # the target's own staging was tampered with
                    raise ApplyError(f"{plan.target.label}: {error}: something on the target changed the "
                                     f"transaction's staged folder during the copy",
                                     hint=f"find what writes in {venv}/.transplant on the target, then apply again")
                raise ApplyError(f"{plan.target.label}: {error}: the donor (or a patch) changed "
                                 f"between plan and copy", hint="plan again, then apply",
                                 mismatches=list(checked.get("differ") or []))
        except BaseException as exc:
            txn.call(target, venv, "discard", {"id": txid, "lock": txid}, check=False)
            txn.call(target, venv, "record", {"entry": {"id": txid, "event": "aborted", "time": time.time()}},
                     check=False)
            if isinstance(exc, TransplantError):
                raise ApplyError(f"{exc.message}\n(transaction {txid} was aborted before its commit: its staged "
                                f"files were discarded and the live venv did not change)", hint=exc.hint,
                                 mismatches=getattr(exc, "mismatches", None)) from exc
            raise
        lap("staged check")
        extra = {key: value for key, value in (("crash_after", crash_after), ("orphan_at", orphan_at))
                 if value is not None}
        reporter.step("commit")
        try:
            done = txn.call(target, venv, "commit", {"id": txid, "lock": txid, **extra})
        except TransplantError as exc:
            raise TransplantError(f"{exc.message}\n({_after_failed_commit(target, venv, txid)})",
                                  hint=_FINISH.format(manifest=shlex.quote(plan.manifest))) from exc
        lap("commit")
        reporter.step("check")
        mismatches = txn.check_state(target, venv, expected, known=checked.get("verified"))
        lap("check")
        outcome = "applied" if not mismatches else "differs"
        if mismatches:  # keep it interrupted: --rollback undoes it, --resume retries
            txn.call(target, venv, "mark", {"id": txid, "state": "committing"})
        txn.call(target, venv, "record", {"entry": {
            "id": txid, "event": outcome, "time": time.time(), "files_copied": copied, "bytes_moved": moved,
            "files_removed": done.get("removed", 0)}})
    finally:
        pool.shutdown(wait=True)  # the stale-plan probe is done with the target before the lock goes
        txn.release(target, venv, txid)
    if mismatches:
        raise ApplyError(
            f"{plan.target.label}: after apply, {count(len(mismatches), 'file')} "
            f"{'differs' if len(mismatches) == 1 else 'differ'} from the plan; transaction {txid} "
            f"stays open", hint=_FINISH.format(manifest=shlex.quote(plan.manifest)), mismatches=mismatches)
    return ApplyResult(transaction=txid, files_copied=copied, bytes_moved=moved,
                       files_removed=int(done.get("removed", 0)), seconds=time.monotonic() - started,
                       steps=tuple(steps), transfer=transfer)


def _after_failed_commit(target: Host, venv: str, txid: str) -> str:
    """Where transaction ``txid`` stands after its commit request failed, in words, as the
    target's own record says (read in a fresh applier process: the session's may be gone):
    still ``staging`` (the commit never began: the live venv did not change), ``committed``
    (the check after it did not run), else part-way through its commit (also when the record
    cannot be read)."""
    try:
        reply = txn.call(target, venv, "history", {}, check=False, timeout=60.0)
    except TransplantError:
        reply = {}
    state = next((t.get("state") for t in reply.get("transactions") or () if isinstance(t, dict)
                  and t.get("id") == txid), None)
    if state == "staging":
        return f"transaction {txid} stopped before its commit began: the live venv did not change"
    if state == "committed":
        return f"transaction {txid} committed; the check of the files after it did not run"
    return f"transaction {txid} is interrupted part-way through its commit"


def _refuse_stale(plan: Plan, target: Host, waiting: WaitingScript | None = None,
                  inputs: dict | None = None) -> None:
    """Under the lock: the target must still be the one the plan was made against.

    The target is probed again exactly as the plan read it (the overlaid distributions
    hashed, the patch destinations, the texts the rules read; nothing else is hashed) and
    its fingerprint compared with the plan's, so an apply that landed between plan and lock
    (another manifest, a prompt left waiting) or a hand edit is never committed over.

    For a plan the plan memo kept, ``inputs`` (the memo's target fingerprint) is asked first:
    one ``lstat`` of each file and folder the plan's probe read, as the memo's own check is, and
    when every identity (and the extra paths' outside the venv) is the one the plan was made
    with, nothing the plan read changed (a write gives a file another ctime, and the memo keeps
    no plan whose inputs were written within two seconds of its probe). Any difference, or a
    reply it cannot read, leads to the full probe above, which decides.

    :param waiting: a probe process started earlier and waiting for its request (it has read
        nothing of the venv yet): asked now, under the lock; None starts one.
    :param inputs: ``{"paths", "digest", "extra_paths", "extra"}`` of
        :class:`transplant.pipeline.memo.Recalled`'s ``target_inputs``; None: the full probe only.
    :raises ApplyError: the target changed since the plan was made (nothing was written).
    """
    from transplant.core.inventory import TEXTS

    if inputs is not None:
        extra = list(inputs.get("extra_paths") or [])
        try:
            answer = fingerprint(target, plan.target.venv, inputs["paths"], extra, timeout=600.0, waiting=waiting)
        except (TransplantError, KeyError, TypeError):
            answer = {}
        waiting = None  # asked (or gone): the full probe below starts its own
        if answer.get("inputs") == inputs.get("digest") is not None and (
                not extra or answer.get("extra") == inputs.get("extra")):
            return
    now = take_inventory(target, plan.target.venv, hash_patterns=plan.hash_patterns, files=plan.patch_files,
                         texts=TEXTS, hash_cache="venv", waiting=waiting)
    if now.fingerprint != plan.target.fingerprint:
        manifest = shlex.quote(plan.manifest)
        raise ApplyError(
            f"{plan.target.label}: refusing a stale plan: the target changed since the plan was made (another apply "
            f"landed, or its files were edited); nothing was changed",
            hint=f"plan again against the target as it is now: transplant plan {manifest}   "
                 f"(or apply the manifest again: transplant apply {manifest})")


_FINISH = ("undo it: transplant apply {manifest} --rollback   (or finish it once the cause is fixed: "
           "transplant apply {manifest} --resume)")


def _begin_error(plan: Plan, reply: dict) -> ApplyError:
    """The error for a transaction the target refused to begin (nothing was written)."""
    if reply.get("error") == "not enough space":
        from transplant.core.units import human_bytes

        return ApplyError(
            f"{plan.target.label}: not enough space for the transaction: it needs {human_bytes(reply['needed'])} "
            f"(the new files, staged beside the venv before any is renamed into place, plus a margin) and "
            f"{human_bytes(reply['free'])} is free; nothing was changed",
            hint="free space on the target's filesystem, then apply again")
    if reply.get("unwritable"):
        clashes = [p for p in reply["unwritable"] if str(p).endswith((": is a folder, not a file",
                                                                     ": is a file, not a folder"))]
        hint = "make those folders writable (or remount them read-write), then apply again"
        if clashes and len(clashes) == len(reply["unwritable"]):
            hint = "move each of them away (a file and a folder cannot share a path; nothing of transplant's " \
                   "is there), then apply again"
        elif clashes:
            hint = "make those folders writable (or remount them read-write) and move the files or folders named " \
                   "away, then apply again"
        return ApplyError(f"{plan.target.label}: {reply['error']}; nothing was changed", hint=hint)
    return ApplyError(f"{plan.target.label}: the transaction could not begin: {reply.get('error')}; nothing was "
                      f"changed")


#: The environment variable that chooses how apply copies files: ``stream`` (the default: direct SSH to
#: SSH where it can and is worth it, else the relay stream), ``direct``, ``relay`` or ``rsync``.
TRANSFER_ENV = "TRANSPLANT_TRANSFER"
#: Its values (:func:`transfer_way`).
TRANSFER_WAYS = ("stream", "direct", "relay", "rsync")


def _stage(plan: Plan, donor: Host, donor_root: str, target: Host, staged: str, manifest_dir: Path, state_dir: Path,
           reporter: Reporter, timeout: float | None, *, how: str, stager: Callable[..., tuple[int, int]] | None = None,
           compress: bool = False, ahead: StartedSides | None = None) -> tuple[int, int, dict[str, list], str]:
    """Copy the plan's new files into the transaction's staging folder on the target.

    :returns: (bytes on the wire, files, path -> ``[sha256, size, st_dev, st_ino, st_mtime_ns]`` of
        each file a stream wrote (for the applier's ``check``; empty for rsync), how the donor's
        files moved in words).

    :param how: one of :data:`TRANSFER_WAYS`, as :func:`transfer_way` read it once for the apply.
    :param ahead: the donor files' stream sides started ahead (:func:`_stream_ahead`), or None.
    """
    staging = state_dir / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    donor_copies = [cp for c in plan.changes for cp in c.copy if cp.source == "donor"]
    donor_files = [cp.path for cp in donor_copies]
    moved = copied = 0
    written: dict[str, list] = {}
    transfer = ""

    def move(what: str, src: Host, src_root: str, src_python: str | None, paths: list[str], total: int,
             started: StartedSides | None = None) -> str:
        nonlocal moved, copied
        result, why = _transfer(what, how, src, src_root, src_python, target, staged, paths, staging=staging,
                                total=total, reporter=reporter, timeout=timeout, compress=compress,
                                target_python=venv_python(plan.target.venv), state_dir=state_dir, ahead=started)
        moved += result.bytes
        copied += len(paths)
        written.update({path: list(entry) for path, entry in result.written.items()})
        way, amounts = _described(result, src, target)
        if why:
            way += f" (not direct: {why})"
        elif how == "rsync" or (how == "direct" and result.how == "direct") or (
                how == "relay" and not isinstance(src, LocalHost) and not isinstance(target, LocalHost)):
            way += f", as {TRANSFER_ENV}={how} asks"
        if compress and result.how == "rsync":
            amounts += ", not compressed (--compress applies to the stream only)"
        reporter.note(f"{what}: {way}, {amounts}")
        return way

    if donor_files and stager is not None:
        moved, copied = stager(target, plan.target.venv, staged, donor_files, staging=staging, timeout=timeout, reporter=reporter)
    elif donor_files:
        reporter.step("files")
        donor_python = None if isinstance(donor, LocalHost) else venv_python(plan.donor.venv)
        groups = _by_folders(donor_copies)
        for (donor_folder, target_folder), group in groups.items():
            if not donor_folder:
                transfer = move("files", donor, donor_root, donor_python, [cp.path for cp in group],
                                sum(cp.size or 0 for cp in group), ahead)
                continue
            # a moved pure-Python distribution's files: read below the donor's folder, written below the
            # target's (the relay stream or rsync; the direct pull writes beside the staged folder only)
            way = "relay" if how in ("stream", "direct") else how
            paths = [_below(cp) for cp in group]
            result, _ = _transfer("files", way, donor, posixpath.join(donor_root, donor_folder), donor_python, target,
                                  posixpath.join(staged, target_folder), paths, staging=staging,
                                  total=sum(cp.size or 0 for cp in group), reporter=reporter, timeout=timeout,
                                  compress=compress, target_python=venv_python(plan.target.venv), state_dir=None)
            moved += result.bytes
            copied += len(paths)
            written.update({posixpath.join(target_folder, path): list(entry) for path, entry in result.written.items()})
            way_said, amounts = _described(result, donor, target)
            reporter.note(f"files moved from the donor's {donor_folder} to the target's {target_folder}: "
                          f"{way_said}, {amounts}")
            transfer = transfer or way_said
    patch_dir = Path(tempfile.mkdtemp(prefix="patches-", dir=staging))
    try:
        patch_paths = _stage_patches(plan, manifest_dir, patch_dir)
        if patch_paths:
            reporter.step("patches")
            move("patches", LocalHost(), str(patch_dir), None, patch_paths,
                 sum((patch_dir / p).stat().st_size for p in patch_paths))
    finally:
        shutil.rmtree(patch_dir, ignore_errors=True)
    return moved, copied, written, transfer


def _by_folders(copies: list[FileCopy]) -> dict[tuple[str, str], list[FileCopy]]:
    """The donor's copies grouped by (the donor's folder, the target's folder) of
    :func:`transplant.core.plan.moved_roots`: ``("", "")`` for those read and written at one path
    (first, in plan order), then one group for each folder pair moved files lie in."""
    groups: dict[tuple[str, str], list[FileCopy]] = {("", ""): []}
    for cp in copies:
        roots = None if cp.donor_path is None else moved_roots(cp.donor_path, cp.path)
        groups.setdefault(("", "") if roots is None else roots[:2], []).append(cp)
    if not groups[("", "")]:
        del groups[("", "")]
    return groups


def _below(copy: FileCopy) -> str:
    """The path of a moved copy below its two folders (:func:`transplant.core.plan.moved_roots`)."""
    roots = moved_roots(copy.read_path, copy.path)
    assert roots is not None  # grouped by them: check_plan_paths refused any other
    return roots[2]


def transfer_way() -> str:
    """How apply copies files, from ``TRANSPLANT_TRANSFER``: ``stream`` (unset or empty: the default:
    SSH to SSH the target pulls from the donor directly when it can and the files hold at least
    :data:`transplant.hosts.direct.DIRECT_MIN_BYTES`, else the stream relayed through the controller),
    ``direct`` (direct whenever it can, whatever the size), ``relay`` (always the relayed stream) or
    ``rsync``.

    :raises ApplyError: it names another way (checked before anything is locked or written).
    """
    how = os.environ.get(TRANSFER_ENV, "") or "stream"
    if how not in TRANSFER_WAYS:
        raise ApplyError(f"environment variable {TRANSFER_ENV}={how!r}: not a way to copy files",
                         hint=f"set it to stream (the default), direct, relay or rsync, or unset it: unset {TRANSFER_ENV}")
    return how


def _transfer(what: str, how: str, src: Host, src_root: str, src_python: str | None, target: Host, staged: str,
              paths: list[str], *, staging: Path, total: int, reporter: Reporter, timeout: float | None,
              compress: bool, target_python: str, state_dir: Path | None = None,
              ahead: StartedSides | None = None) -> tuple[TransferResult, str | None]:
    """One copy into the staged folder: direct SSH to SSH (:mod:`transplant.hosts.direct`) when ``how``
    allows it, the relayed stream, or rsync when ``how`` says so or the stream cannot start (said
    through ``reporter``).

    :returns: (what moved, why the copy is not direct: None when direct was not a question: not SSH
        to SSH, or ``how`` chose the way).
    """
    why = None
    if how in ("stream", "direct") and state_dir is not None and src_python is not None:
        why, result = _direct(what, how, src, src_root, src_python, target, staged, paths, total=total,
                              reporter=reporter, timeout=timeout, compress=compress, target_python=target_python,
                              state_dir=state_dir)
        if result is not None:
            return result, None
    if how != "rsync":
        try:
            return stream_files(src, src_root, target, staged, paths, src_python=src_python,
                                dst_python=None if isinstance(target, LocalHost) else target_python,
                                compress=compress, total=total, reporter=reporter, timeout=timeout,
                                ahead=ahead), why
        except HostError as exc:
            if exc.code != UNAVAILABLE:
                raise
            reporter.note(f"{what}: the stream could not start ({exc.message}); copying with rsync instead")
    return copy_files(src, src_root, target, staged, paths, staging=staging, reporter=reporter, timeout=timeout), why


def _direct(what: str, how: str, src: Host, src_root: str, src_python: str, target: Host, staged: str,
            paths: list[str], *, total: int, reporter: Reporter, timeout: float | None, compress: bool,
            target_python: str, state_dir: Path) -> tuple[str | None, TransferResult | None]:
    """Try the direct SSH to SSH copy (:func:`transplant.hosts.direct.stream_direct`).

    :returns: (None, what moved); or (why not, in words, None): the relay follows; or (None, None):
        donor and target are not both SSH hosts, so direct is no question.
    :raises HostError: the direct copy started and failed (not the relay's to retry: files may be written).
    """
    from transplant.hosts import direct
    from transplant.hosts.ssh import SSHHost

    if not (isinstance(src, SSHHost) and isinstance(target, SSHHost)):
        return None, None
    if how == "stream" and total < direct.DIRECT_MIN_BYTES:  # decided before any ssh -G: a small apply pays nothing
        return (f"{human_bytes(total)} is under {human_bytes(direct.DIRECT_MIN_BYTES)}, where the relay costs less "
                f"than direct's extra connections; {TRANSFER_ENV}=direct forces it"), None
    way, why = direct.route(src, target)
    if way is None:
        return why, None
    try:
        return None, direct.stream_direct(src, src_root, target, staged, paths, route=way, state_dir=state_dir,
                                          pin=direct.pin_path(staged), src_python=src_python,
                                          dst_python=target_python, compress=compress, total=total,
                                          reporter=reporter, timeout=timeout)
    except HostError as exc:
        if exc.code != UNAVAILABLE:
            raise
        reporter.note(f"{what}: the direct copy could not start ({exc.message}); relaying through the controller")
        return f"it could not start: {exc.message}", None


def _described(result: TransferResult, src: Host, dst: Host) -> tuple[str, str]:
    """How a copy went, in words: (the way the bytes took, how many and whether compressed)."""
    local_src, local_dst = isinstance(src, LocalHost), isinstance(dst, LocalHost)
    if result.how == "rsync":
        way = ("copied with rsync, relayed through a folder on the controller's disk, each byte crossing twice"
               if not (local_src or local_dst) else "copied with rsync")
        return way, f"{human_bytes(result.bytes)} on the wire"
    if result.how == "direct":
        way = (f"streamed {src.label} -> {dst.label} directly: {dst.label} pulled from {src.label} over its own ssh "
               f"(with a one-time key the donor authorised for this pull alone, the donor's pinned host key), "
               f"nothing through the controller")
    elif local_src and local_dst:
        way = "streamed on this machine"
    elif local_src:
        way = f"streamed from the controller to {dst.label}"
    elif local_dst:
        way = f"streamed from {src.label} to the controller"
    else:
        way = f"streamed {src.label} -> {dst.label} through the controller, both legs at once, no controller disk"
    size = sum(entry[1] for entry in result.written.values())
    amounts = f"{human_bytes(size)} in {count(result.files, 'file')}"
    if result.compression:
        amounts += f", {result.compression}-compressed to {human_bytes(result.bytes)} on the wire"
    return way, amounts + ", hashed as written"
