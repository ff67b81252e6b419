"""``transplant apply``, ``rollback`` and ``history`` (face): the transaction on the target, as commands."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from pathlib import Path

from transplant.cli.options import break_lock_option, fleet_options, yes_option
from transplant.errors import ManifestError, TransplantError, UsageError
from transplant.exitcodes import EXIT_BLOCKED, EXIT_FAIL, EXIT_OK

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.cli.session import Session
    from transplant.core.manifest import Manifest
    from transplant.core.plan import Plan
    from transplant.hosts.host import Host

__all__ = ["HELP", "add_arguments", "handle", "apply_command", "rollback_command", "history_command",
           "ApplyInterrupted"]

HELP = "copy exactly what differs, then check the target against the plan"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``MANIFEST|PLAN.json``, the confirmation, transaction and verify options, ``--compress``,
    ``--json`` and the fleet options."""
    parser.add_argument("source", metavar="MANIFEST|PLAN.json",
                        help="a manifest (plans again), or a plan saved with 'plan --out' (refused if the hosts "
                             "changed)")
    yes_option(parser)
    parser.add_argument("--force", action="store_true", help="apply despite error findings")
    parser.add_argument("--resume", action="store_true", help="finish the target's interrupted transaction")
    parser.add_argument("--rollback", action="store_true", help="undo the target's interrupted transaction")
    break_lock_option(parser)
    parser.add_argument("--verify", action="store_true", help="verify each target after applying to it")
    parser.add_argument("--strict", action="store_true", help="with --verify: what could not be checked here fails")
    parser.add_argument("--rollback-on-failure", action="store_true",
                        help="with --verify: roll the transaction back, unattended, when verify fails (fleets, CI)")
    parser.add_argument("--compress", action="store_true",
                        help="compress the file stream (zstd where both hosts have it, else zlib): for a slow link "
                             "between the controller and a host; one target only")
    parser.add_argument("--json", action="store_true", help="with several targets: print the fleet report as JSON")
    fleet_options(parser)



def _finish_interrupted(args: argparse.Namespace, console: Console, session: Session, manifest_path: str,
                        how: str | None, discarded: list[dict] | None = None) -> bool:
    """Handle --resume / --rollback, or refuse while a transaction is interrupted; first record
    the outcome of any commit the target's host script completed after its controller died
    (:func:`transplant.apply.txn.record_completed`) and say so.

    A venv with no state folder (never applied to) is only read: no lock, no folder.

    :param manifest_path: the manifest, for the commands the messages name.
    :param how: ``"resume"``, ``"rollback"``, or None (a plain apply: only check).
    :param discarded: with ``--resume`` of a transaction still staging (discarded: the apply
        starts afresh), its ``started`` history event (``id``, ``plan_donor``, ``plan_target``:
        the fingerprints of the plan the operator confirmed) is appended here.
    :returns: True when the command is done (finished, undone, or nothing to resume), False to
        go on and apply.
    :raises TransplantError: an interrupted transaction without --resume / --rollback;
        --rollback with nothing interrupted (nothing was changed; the hint names
        ``transplant rollback``); a completed commit whose files differ, with --resume.
    """
    from rich.text import Text

    from transplant.apply import txn
    from transplant.apply.execute import new_transaction_id
    from transplant.cli.progress import Shown, printer
    from transplant import testhooks
    from transplant.core.units import count

    m = session.manifest
    target = session.host("target")
    say = printer(console)
    quoted = shlex.quote(manifest_path)
    pending: list[dict] = []
    completed: list[txn.Completed] = []
    outcome = None
    if txn.has_state(target, m.target.venv):
        txid = new_transaction_id()
        # under the lock: a transaction another apply is running now is not "interrupted"
        txn.acquire(target, m.target.venv, txid, f"transplant apply --{how or 'check'}", reporter=Shown(note=say),
                    break_lock=args.break_lock)
        try:
            pending = txn.interrupted(target, m.target.venv, reporter=Shown(note=say))  # waits for a host script still running
            completed = txn.record_completed(target, m.target.venv)
            for done in completed:
                say(done.describe())
            if pending and how:
                outcome = txn.finish(target, m.target.venv, pending[-1]["id"], how, lock=txid,
                                     crash_after=testhooks.crash_after())
                if outcome == "aborted" and discarded is not None:
                    started = [e for e in txn.history(target, m.target.venv)["events"]
                               if e.get("id") == pending[-1]["id"] and e.get("event") == "started"]
                    discarded.append(started[-1] if started else {"id": pending[-1]["id"]})
        finally:
            txn.release(target, m.target.venv, txid)
    differ = [c for c in completed if c.outcome == "differs"]
    if not pending:
        if how == "rollback":
            if completed:
                raise TransplantError(
                    f"{m.target}: nothing was rolled back: no transaction is interrupted; transaction "
                    f"{completed[-1].id}'s commit completed on the target after the controller died (recorded now)",
                    hint=f"undo it: transplant rollback {quoted}")
            raise TransplantError(f"{m.target}: no interrupted transaction to roll back; nothing was changed",
                                  hint=f"to undo the newest applied transaction: transplant rollback {quoted}   "
                                       f"(list them: transplant history {quoted})")
        if how == "resume":
            if differ:
                raise txn.TransactionError(
                    f"{m.target}: transaction {differ[-1].id} was committed by the host after the controller died, "
                    f"but {count(len(differ[-1].mismatches), 'file')} differ from its planned state",
                    mismatches=list(differ[-1].mismatches),
                    hint=f"look at the files listed; undo it with: transplant rollback {quoted} --force")
            if not completed:
                console.print(f"nothing to resume: {m.target} has no interrupted transaction", markup=False)
            return True
        return False
    last = pending[-1]
    if how is None:
        raise TransplantError(
            f"{m.target}: transaction {last['id']} was interrupted ({last['state']}, {last['steps']} steps, "
            f"{last.get('source') or 'unknown source'}); nothing else runs there until it is finished or undone",
            hint=f"finish it: transplant apply {shlex.quote(args.source)} --resume\n"
                 f"      or undo it: transplant apply {shlex.quote(args.source)} --rollback")
    assert outcome is not None  # pending and how: finish ran above
    if outcome == "aborted":
        console.print(f"transaction {last['id']} had not changed anything yet (it was staging); discarded"
                      + ("; applying afresh" if how == "resume" else ""), markup=False)
        return how == "rollback"
    console.print(Text.assemble((outcome, "bold green"), f" transaction {last['id']}: the target matches its "
                                f"{'planned' if outcome == 'applied' else 'earlier'} state hash for hash"))
    return True


class ApplyInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``apply``, with what is true on the target afterwards (``said``, one line,
    read back from the target's records), for the command's last words."""

    def __init__(self, said: str) -> None:
        super().__init__(said)
        self.said = said


@contextmanager
def _truth_on_interrupt(target: Host, venv: str, manifest_path: str) -> Iterator[None]:
    """Turn a Ctrl-C in the block into :class:`ApplyInterrupted` saying what the target's records
    show of the transaction this command began (:func:`_after_interrupt`); a plain
    KeyboardInterrupt when they cannot be read."""
    since = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 1))  # ids sort by time
    try:
        yield
    except KeyboardInterrupt:
        said = _after_interrupt(target, venv, since, manifest_path)
        if said is None:
            raise
        raise ApplyInterrupted(said) from None


def _after_interrupt(target: Host, venv: str, since: str, manifest_path: str) -> str | None:
    """What is true on the target after a Ctrl-C: the newest transaction whose id is not older
    than ``since`` (the command's start), by its recorded state; none: nothing began, and a state
    folder left empty is removed (the applier's ``tidy``: empty folders, and what a killed applier
    left: a lock's temporary file, a begin stopped part-way). A lock this process still holds (a
    Ctrl-C inside the lock's taking or release) is released unless a transaction of this command is
    still open. None when the target cannot be asked within 30 s."""
    import socket

    from transplant.apply import txn

    quoted = shlex.quote(manifest_path)
    try:
        record = txn.call(target, venv, "history", {}, timeout=30)
        mine = [t for t in record.get("transactions", []) if str(t.get("id", "")) >= since]
        last = mine[-1] if mine else {}
        txid, state = last.get("id"), last.get("state")
        if state in (None, "aborted", "committed"):  # nothing of this command runs on: its own lock goes
            held = txn.call(target, venv, "pending", {}, timeout=30).get("lock") or {}
            if (held.get("controller"), held.get("pid")) == (socket.gethostname(), os.getpid()) \
                    and str(held.get("id", "")) >= since:
                txn.call(target, venv, "unlock", {"id": held.get("id")}, timeout=30, check=False)
        if not mine:
            txn.call(target, venv, "tidy", {}, timeout=30)
            return "the target's transaction had not begun: nothing on the target changed"
    except TransplantError:
        return None
    if state == "aborted":
        return (f"transaction {txid} was stopped before its commit and aborted (its staged files discarded, "
                f"recorded in the history): the live venv did not change")
    if state == "committed":
        return (f"transaction {txid} had committed: the target holds the planned state "
                f"(transplant rollback {quoted} undoes it)")
    return (f"transaction {txid} was interrupted ({state}): transplant apply {quoted} --resume finishes it, "
            f"--rollback undoes it")


def apply_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant apply MANIFEST|PLAN.json``: plan (or check the saved plan), confirm, apply; with
    ``--verify``, verify. Returns 0, 3 when blocked (or verify failed), 1 when declined.

    A Ctrl-C once the transaction is applied and recorded (while the connections close, the
    result prints or ``--verify`` runs) says so (:class:`ApplyInterrupted`), not the generic line
    about a transaction that may have begun: there is nothing to resume."""
    from transplant.pipeline.memo import memo_enabled

    if not (args.resume or args.rollback):
        memo_enabled()  # a bad TRANSPLANT_PLAN_MEMO is refused before any host is opened or named
    applied: dict[str, Any] = {}  # once apply_plan returned: "id", "manifest"; "verify" once it began
    try:
        return _apply_command(args, console, applied)
    except KeyboardInterrupt as stop:
        if not applied or getattr(stop, "said", None):
            raise
        quoted = shlex.quote(applied["manifest"])
        raise ApplyInterrupted(f"transaction {applied['id']} had been applied and recorded: the target holds the "
                               f"planned state (transplant rollback {quoted} undoes it)"
                               + (f"; verify did not finish: transplant verify {quoted} runs it"
                                  if applied.get("verify") else "")) from None


def _apply_command(args: argparse.Namespace, console: Console, applied: dict[str, Any]) -> int:
    """:func:`apply_command`'s work; fills ``applied`` (the transaction's id and the manifest's path)
    once the transaction is applied, and sets its ``verify`` when ``--verify`` begins."""
    from rich.text import Text

    from transplant.apply import txn
    from transplant.apply.execute import check_plan_paths
    from transplant.cli.render import print_plan
    from transplant import testhooks
    from transplant.cli.session import Session, run_fleet_action, targets_of
    from transplant.controller.manifest_file import load_manifest
    from transplant.controller.plan_file import load_plan
    from transplant.core.promised_state import drift, plan_differences
    from transplant.core.units import count, human_bytes
    from transplant.hosts.probing import WaitingScript, take_prestarted
    from transplant.pipeline import apply_plan
    from transplant.cli.commands.verify import verify_command

    if args.resume and args.rollback:
        raise UsageError("--resume and --rollback exclude each other")
    source = Path(args.source)
    saved: Plan | None = None
    if source.suffix == ".json":
        if args.target:
            raise UsageError("a saved plan is for its own target; --target goes with a manifest")
        saved = load_plan(source)
        try:
            manifest = load_manifest(saved.manifest)
        except ManifestError as exc:  # say which plan led here: the user named the plan, not the manifest
            exc.message = f"{source} was planned from this manifest: {exc.message}"
            exc.hint = exc.hint or (f"restore {saved.manifest}, or plan again from the manifest you use now: "
                                    f"transplant plan MANIFEST --out {source}")
            raise
    else:
        manifest = load_manifest(source)
    manifest, targets = targets_of(args, manifest)
    if len(targets) > 1:
        flags = [flag for flag, on in (("--resume", args.resume), ("--rollback", args.rollback),
                                       ("--break-lock", args.break_lock),
                                       ("--compress", getattr(args, "compress", False))) if on]
        if flags:
            raise UsageError(f"{' and '.join(flags)} {'acts' if len(flags) == 1 else 'act'} on one target; "
                             f"name it with --target")
        return run_fleet_action("apply", args, console, manifest, targets)
    if args.json:  # before anything runs: a script asking for JSON must not get an apply without it
        raise UsageError("apply --json prints a fleet's report (several targets); with one target, "
                         f"'transplant plan {shlex.quote(args.source)} --json' prints the plan and "
                         f"'transplant history {shlex.quote(manifest.path)} --json' the transaction it applied")
    with ExitStack() as stack:
        session = Session(manifest, console, stack)
        if saved is None and not (args.resume or args.rollback) and session.clone_pending():
            from transplant.cli.commands.clone import clone_base
            clone_base(args, console, manifest, session.base_host(), session.host("target"))
            session.cloned()
        discarded: list[dict] = []
        if args.resume or args.rollback:
            if saved is not None:  # it only names the target: it must be its manifest's
                _check_saved_plan(saved, manifest, source, sides=("target",))
            # one applier process serves the whole command (the lock, the check, the transaction)
            stack.enter_context(txn.session(session.host("target"), session.manifest.target.venv))
            if _finish_interrupted(args, console, session, manifest.path, "resume" if args.resume else "rollback",
                                   discarded):
                return EXIT_OK
            # --resume of a transaction that was still staging: it was discarded; apply afresh
        from transplant.pipeline.gather import refuse_self_target
        early = session.donor()  # before the lock: nothing is written into a donor named twice
        target_host = session.host("target")
        # started now (the probe: taken from those started as the connection opened, when one was),
        # their starts (SSH channel, interpreter, script) overlap the checks and the plan; neither
        # reads or writes anything in the venv before it is asked: the applier serves the
        # transaction's requests, the probe is the stale-plan check, asked under the lock
        stack.enter_context(txn.session(target_host, manifest.target.venv)).start()
        stale_probe = None if session.clone_pending() else stack.enter_context(
            take_prestarted(target_host, manifest.target.venv, "probe", ["--stdin"], newest=True)  # the plan's is older
            or WaitingScript(target_host, manifest.target.venv, "probe", ["--stdin"]))
        if early.host is not None:
            refuse_self_target(replace(session.manifest, target=manifest.target), early.host, target_host)
        # every input is checked (the saved plan against a fresh plan) before anything is locked or written
        opened = session.donor()
        given, manifest = manifest, session.manifest
        if saved is not None:
            _check_saved_plan(saved, manifest, source)
            check_plan_paths(saved, Path(manifest.path).resolve().parent)
        # Ctrl-C from here on: say what is true on the target (and leave no empty state folder)
        stack.enter_context(_truth_on_interrupt(session.host("target"), manifest.target.venv, given.path))
        # the plan memo, as plan's: when neither venv changed since the last plan of this manifest, that plan
        # (the stale-plan check under the lock asks the target's fingerprint again, probing it whole when that
        # differs, and the copy hashes what it writes); none is kept: this apply changes the target it would be about
        recalled: list = []  # the memo's entry when the plan is the kept one: its target fingerprint, asked again
        plan = session.plan(memo="recall" if not args.resume and not args.rollback else False, recalled=recalled)
        stale_inputs = recalled[0].target_inputs if recalled and stale_probe is not None else None
        if saved is not None:
            changed = drift(saved, plan.donor.fingerprint, plan.target.fingerprint)
            if changed:
                what = plan_differences(saved, plan)
                raise TransplantError(
                    f"{source}: refusing a stale plan: " + "; ".join(changed)
                    + (": " + "; ".join(what) if what else " (the planned changes are the same; other files differ)"),
                    hint=f"make a fresh plan: transplant plan {manifest.path} --out {source}")
            if saved != plan:
                raise TransplantError(
                    f"{source}: refusing the plan: its hosts are unchanged, but its changes or findings are not "
                    f"what the manifest gives now (edited by hand, or made by another transplant version)",
                    hint=f"make a fresh plan: transplant plan {manifest.path} --out {source}")
        stack.enter_context(txn.session(session.host("target"), manifest.target.venv))  # one applier process
        _finish_interrupted(args, console, session, given.path, None)  # raises while one is interrupted
        print_plan(console, plan)
        # the gate comes first: an error finding blocks even when nothing is left to copy (the
        # venv holds a state the gate refuses; exit 3, as plan and a fleet's apply say)
        if plan.refused:
            console.print(f"[bold red]apply refused[/]: {', '.join(sorted({f.code for f in plan.refused}))} cannot "
                          f"be forced or accepted; fix it as its hint says")
            return EXIT_BLOCKED
        if plan.blocking and not args.force:
            console.print("[bold red]apply refused[/]: fix the error findings above, accept them in the manifest, "
                          "or pass --force" + ("" if plan.has_changes else " (nothing would be copied)"))
            return EXIT_BLOCKED
        if not plan.has_changes:
            console.print("nothing to change: the target already holds the planned state")
            return verify_command(args, console, manifest=given) if args.verify else EXIT_OK
        confirmed = bool(discarded) and (discarded[-1].get("plan_donor"), discarded[-1].get("plan_target")) == (
            plan.donor.fingerprint, plan.target.fingerprint)
        if confirmed:  # --resume: the operator confirmed this very plan when the transaction started
            console.print(f"resuming: the plan is the one transaction {discarded[-1]['id']} started with "
                          f"(confirmed then); applying it", markup=False)
        elif discarded:
            console.print(f"the plan is not the one transaction {discarded[-1]['id']} started with (the donor or "
                          f"the target changed since): confirm it anew", markup=False)
        if not args.yes and not confirmed:
            if not sys.stdin.isatty():
                raise TransplantError("apply needs confirmation and standard input is not a terminal",
                                      hint=f"add --yes: transplant apply {args.source} --yes")
            answer = console.input(f"apply these changes to {plan.target.label}? \\[y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                console.print("nothing was changed")
                return EXIT_FAIL
        from transplant.cli.progress import ByteProgress

        patch_bytes = sum(cp.size or 0 for c in plan.changes for cp in c.copy if cp.source == "patch")
        with ByteProgress(console, plan.copy_bytes, {"files": plan.copy_bytes - patch_bytes,
                                                     "patches": patch_bytes}) as bar:
            result = apply_plan(plan, manifest, opened, session.host("target"), reporter=bar, break_lock=args.break_lock,
                                crash_after=testhooks.crash_after(), orphan_at=testhooks.orphan_at(),
                                compress=getattr(args, "compress", False), stale_probe=stale_probe,
                                stale_inputs=stale_inputs)
            applied.update(id=result.transaction, manifest=given.path)
    session.forget_plan()  # the kept plan is of the target before this apply
    relayed = f" ({result.transfer})" if result.transfer else ""
    console.print(Text.assemble(("applied", "bold green"), (
        f" transaction {result.transaction}: {count(result.files_copied, 'file')} ({human_bytes(plan.copy_bytes)}) copied, "
        f"{human_bytes(result.bytes_moved)} on the wire{relayed}, {result.files_removed} removed, in "
        f"{result.seconds:.1f} s (" + ", ".join(f"{name} {sec:.1f} s" for name, sec in result.steps)
        + "); the target now matches the plan hash for hash")))
    if args.verify:
        applied["verify"] = True
        code = verify_command(args, console, manifest=given)
        if code == EXIT_BLOCKED:
            return _after_failed_verify(args, console, given, result.transaction)
        return code
    return EXIT_OK


def rollback_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant rollback MANIFEST|HOST:VENV``: say which transactions would be undone and
    their path counts, refuse (nothing changed) where their files changed since (unless
    ``--force``), ask (unless ``--yes``), then roll back."""
    from transplant.apply import txn
    from transplant.core.units import count

    with ExitStack() as stack:
        target, venv, label = _located(args, console, stack)
        stack.enter_context(txn.session(target, venv))  # the question's checks and the rollback: one applier process
        quoted = shlex.quote(args.manifest)
        undone = txn.preview_undo(target, venv, to=args.to, force=args.force,
                                  listing=f"transplant history {quoted}")
        what = "; ".join(f"transaction {txid} ({count(paths, 'path')})" for txid, paths in undone)
        if not args.yes and not sys.stdin.isatty():
            raise TransplantError(f"rollback of {what} on {label} needs confirmation and standard input is not a "
                                  f"terminal", hint=f"add --yes: transplant rollback {quoted} --yes")
        if not args.yes and console.input(f"roll back {what} on {label}? \\[y/N] ").strip().lower() not in ("y", "yes"):
            console.print("nothing was changed")
            return EXIT_FAIL
        _roll_back(console, target, venv, label, quoted, to=args.to, force=args.force, break_lock=args.break_lock)
    return EXIT_OK


def _located(args: argparse.Namespace, console: Console, stack: ExitStack) -> tuple[Host, str, str]:
    """The target a ``rollback`` or ``history`` argument names, connected: ``HOST:VENV`` (with
    ``--identity-file`` and ``--known-hosts``) or a manifest's (with its ssh settings);
    ``(host, venv, label)``."""
    from transplant.cli.locations import is_location, refuse_bare_venv_path, resolve_location
    from transplant.cli.session import Session
    from transplant.controller.manifest_file import load_manifest
    from transplant.hosts.connecting import connect

    if is_location(args.manifest):
        spec, venv, options, label = resolve_location(args.manifest, getattr(args, "identity_file", None),
                                                      getattr(args, "known_hosts", None))
        return stack.enter_context(connect(spec, options)), venv, label
    refuse_bare_venv_path(args.manifest, args.command)
    manifest = load_manifest(args.manifest)
    return Session(manifest, console, stack).host("target"), manifest.target.venv, str(manifest.target)


def _roll_back(console: Console, target: Host, venv: str, label: str, quoted: str, *, to: str | None, force: bool,
               break_lock: bool) -> list[str]:
    """:func:`transplant.pipeline.roll_back` with each step and note shown, then the result said;
    ``quoted``: the manifest or ``HOST:VENV`` as the commands in hints name it."""
    from rich.text import Text

    from transplant.cli.progress import Shown, printer, step
    from transplant.pipeline import roll_back

    with step(console, f"rolling back {label}") as update:
        def say(line: str) -> None:
            console.print(line, markup=False)
            update(line)

        done = roll_back(target, venv, to=to, force=force, break_lock=break_lock,
                         reporter=Shown(step=say, note=printer(console)), listing=f"transplant history {quoted}",
                         undo_interrupted=f"transplant apply {quoted} --rollback")
    console.print(Text.assemble(("rolled back", "bold green"), f" {', '.join(done)}: the target matches the state "
                                f"recorded before {'them' if len(done) > 1 else 'it'} hash for hash"))
    return done


def _after_failed_verify(args: argparse.Namespace, console: Console, manifest: Manifest, transaction: str) -> int:
    """``apply --verify`` whose verify failed: the way back. ``--rollback-on-failure`` rolls the
    transaction back unattended; on a terminal without ``--yes`` the operator is asked; else the
    rollback command is named. Returns 3 (verify failed) either way."""
    from transplant.cli.session import Session

    again = f"transplant rollback {shlex.quote(manifest.path)}"
    if getattr(args, "rollback_on_failure", False):
        console.print(f"verify failed after transaction {transaction}: rolling it back (--rollback-on-failure)",
                      markup=False, highlight=False)
    elif not args.yes and sys.stdin.isatty():
        answer = console.input(f"verify failed after transaction {transaction}: roll it back? \\[y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            console.print(f"transaction {transaction} stays applied; to undo it later: {again}", markup=False,
                          highlight=False)
            return EXIT_BLOCKED
    else:
        console.print(f"verify failed after transaction {transaction}; to undo it: {again} --yes (or apply with "
                      f"--rollback-on-failure to do it unattended)", markup=False, highlight=False)
        return EXIT_BLOCKED
    with ExitStack() as stack:
        session = Session(manifest, console, stack)
        _roll_back(console, session.host("target"), manifest.target.venv, str(manifest.target),
                   shlex.quote(manifest.path), to=None, force=False,
                   break_lock=False)
    return EXIT_BLOCKED


def history_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant history MANIFEST|HOST:VENV``: the transactions recorded in the target venv."""
    from transplant.apply import txn
    from transplant.cli.render import history_table

    with ExitStack() as stack:
        target, venv, label = _located(args, console, stack)
        record = txn.history(target, venv)
    if args.json:
        print(json.dumps({"schema": "transplant.history/1", **record}, indent=2, sort_keys=True))
    else:
        console.print(history_table(record["transactions"], record["events"], label))
    return EXIT_OK


def _check_saved_plan(saved: Plan, manifest: Manifest, source: Path,
                      sides: Sequence[str] = ("donor", "target")) -> None:
    """A saved plan must name the manifest's own hosts and venvs (of ``sides``); anything else is refused.

    :raises TransplantError: naming the plan file, the side, what each names, and the fix.
    """
    for side in sides:
        planned, named = getattr(saved, side), getattr(manifest, side)
        if (planned.host, planned.venv) != (str(named.host), named.venv):
            raise TransplantError(
                f"{source}: the plan's {side} is {planned.host}:{planned.venv}, but its manifest {manifest.path} "
                f"names {named}; refusing it",
                hint=f"make a fresh plan: transplant plan {manifest.path} --out {source}")


#: ``transplant apply``'s handler, for the command table.
handle = apply_command
