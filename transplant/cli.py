"""The command line (face): parse arguments, call the library, map errors to exit codes.

Exit codes: ``plan`` 0 planned (with or without changes), 3 blocked by an error finding,
and with ``--detailed-exitcode`` (as Terraform's ``-detailed-exitcode``) 2 for changes and no
blocking finding; ``apply`` 0 done (or nothing to do, or ``--resume`` with nothing to
resume), 3 blocked, 1 also for ``--rollback`` with nothing interrupted; ``verify`` 0 no
stage failed, 3 a stage failed; ``clone`` 0 done, 3 done but a text file or symlink of the clone still
names the old prefix; every command 1 when it could not do its job
(unreachable host, bad manifest, failed apply) and 64 for a command-line mistake. With
``--json``, such an error is also printed on standard output as
``{"schema": "transplant.error/1", "error", "hint", "code"}`` (``code``: the finding code the
error stands for, such as ``interpreter-missing``, or null).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import os
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.text import Text

from . import __version__
from .apply import check_plan_paths, default_state_dir, execute, new_transaction_id
from .errors import HostError, TransplantError
from .files import check_plan_destination, load_manifest, load_plan, read_patch_files, save_plan
from .hosts import Host, SSHOptions, connect
from .hostspec import HostSpec
from .manifest import Endpoint, Manifest
from .model import Plan
from . import txn
from .gather import gather
from .planner import plan as make_plan
from .probing import take_inventory
from .render import history_table, human_bytes, inventory_table, print_plan
from .state import drift, plan_differences
from .recipes import make_recipe
from .sources import Opened, open_donor

__all__ = ["main", "EXIT_USAGE"]

EXIT_OK, EXIT_FAIL, EXIT_CHANGES, EXIT_BLOCKED, EXIT_USAGE = 0, 1, 2, 3, 64


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code 2 would read as "changes"
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _ssh_options(manifest: Manifest) -> SSHOptions:
    base = Path(manifest.path).resolve().parent

    def resolve(value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    return SSHOptions(identity_file=resolve(manifest.ssh.identity_file), known_hosts=resolve(manifest.ssh.known_hosts),
                      connect_timeout=manifest.ssh.connect_timeout, verify_host_keys=manifest.ssh.verify_host_keys,
                      config=resolve(manifest.ssh.config))


class _Session:
    """Connections and inventories for one command, closed at the end.

    ``manifest`` becomes the effective one once the donor is opened (:meth:`donor`): its
    ``donor`` is then the host and venv the facts are of (a snapshot's original donor).
    """

    def __init__(self, manifest: Manifest, console: Console, stack: ExitStack) -> None:
        self.manifest = manifest
        self.console = console
        self.stack = stack
        self.ssh = _ssh_options(manifest)
        self._hosts: dict[str, Host] = {}
        self._pending: bool | None = None
        self._donor: Opened | None = None

    def clone_pending(self) -> bool:
        """True when ``target.base`` is set and the target venv does not exist yet (see :mod:`transplant.cloning`)."""
        if self._pending is None:
            from .cloning import venv_exists

            self._pending = self.manifest.target.base is not None and \
                not venv_exists(self.host("target"), self.manifest.target.venv)
        return self._pending

    def cloned(self) -> None:
        """Say that ``target.base`` was cloned: the target venv exists now."""
        self._pending = False

    def base_host(self) -> Host:
        """The host of ``target.base`` (the target's connection when it is the same host, else a new one)."""
        base = self.manifest.target.base
        assert base is not None
        if base.host == self.manifest.target.host:
            return self.host("target")
        if "base" not in self._hosts:
            with self.console.status(f"connecting to the base {base.host}"):
                self._hosts["base"] = self.stack.enter_context(connect(base.host, self.ssh))
        return self._hosts["base"]

    def host(self, side: str) -> Host:
        if side == "donor":
            opened = self.donor()
            if opened.host is None:
                raise TransplantError(f"the donor is {opened.source.label}, not a host")
            return opened.host
        if side not in self._hosts:
            spec = getattr(self.manifest, side).host
            with self.console.status(f"connecting to the {side} {spec}"):
                try:
                    self._hosts[side] = self.stack.enter_context(connect(spec, self.ssh))
                except HostError as exc:
                    from .locations import side_error
                    raise side_error(side, exc, spec) from None
        return self._hosts[side]

    def donor(self, *, quiet: bool = False) -> Opened:
        """Open the donor source (the manifest's donor, else its first fallback that works) and say which."""
        if self._donor is None:
            say = (lambda line: self.console.print(line, style="yellow", markup=False, highlight=False))
            with self.console.status("opening the donor"):
                self._donor = open_donor(self.manifest, self.ssh, self.stack, say=say)
            self.manifest = self._donor.manifest
            if not quiet:
                self.console.print(f"donor source: {self._donor.source.label} ({self._donor.why})", markup=False,
                                   highlight=False)
        return self._donor

    def plan(self) -> Plan:
        """Gather facts from the donor and the target (see :mod:`transplant.gather`), and plan."""
        source = self.donor().source
        m = self.manifest
        patches = read_patch_files(m)
        target_host = self.host("target")
        if self.clone_pending():  # plan against the base: the clone will hold its files
            assert m.target.base is not None
            m, target_host = replace(m, target=m.target.base), self.base_host()
        with self.console.status("probing") as status:
            facts = gather(m, source, target_host, patches, step=lambda line: status.update(line))
        return make_plan(m, facts.donor, facts.target, patches, donor_elf=facts.donor_elf,
                         target_elf=facts.target_elf)


def _targets(args: argparse.Namespace, manifest: Manifest) -> tuple[Manifest, list[Endpoint]]:
    """The targets: ``--target`` (repeatable) replaces the manifest's ``target`` / ``targets``.

    :returns: the manifest with its first target as ``target``, and every target.
    """
    given = getattr(args, "target", None) or []
    targets = [Endpoint(host=spec, venv=venv) for spec, venv in map(parse_location, given)] or \
        list(manifest.targets or (manifest.target,))
    for t in targets:
        if t == manifest.donor or t in manifest.fallback:
            raise UsageError(f"--target {t}: that is a donor of {manifest.path}", hint="name another host or venv")
    if len(set(targets)) != len(targets):
        raise UsageError("a target is given twice", hint="name each host and venv once")
    return dataclasses.replace(manifest, target=targets[0], targets=tuple(targets)), targets


def _fleet(action: str, args: argparse.Namespace, console: Console, manifest: Manifest,
           targets: list[Endpoint]) -> int:
    """plan / apply / verify on several targets (see :mod:`transplant.fleetcli`)."""
    from .fleetcli import run_fleet_command

    with ExitStack() as stack:
        session = _Session(manifest, console, stack)
        opened = session.donor(quiet=True)
        return run_fleet_command(action, args, console, session.manifest, targets, opened, session.ssh, stack)


def _refuse_inside_venvs(path: str, manifest: Manifest) -> None:
    """A file the controller writes (``--out``) must not land inside a local donor or target venv."""
    resolved = Path(path).resolve()
    for side in ("donor", "target"):
        end = getattr(manifest, side)
        if not isinstance(end, Endpoint):
            continue
        venv = Path(end.venv).resolve()
        if end.host.is_local and (resolved == venv or venv in resolved.parents):
            raise TransplantError(f"--out {path}: that is inside the {side} venv {end.venv}",
                                  hint="save plans outside the venvs, e.g. --out plan.json")


def _cmd_plan(args: argparse.Namespace, console: Console) -> int:
    manifest, targets = _targets(args, load_manifest(args.manifest))
    if len(targets) > 1:
        if args.out:
            raise UsageError("--out saves the plan of one target; drop it, or name one --target")
        return _fleet("plan", args, console, manifest, targets)
    if args.out:
        check_plan_destination(args.out, manifest=manifest.path)
        _refuse_inside_venvs(args.out, manifest)
    with ExitStack() as stack:
        session = _Session(manifest, console, stack)
        pending = session.clone_pending()
        if pending and args.out:
            from .clonecmd import saved_plan_refusal
            raise saved_plan_refusal(manifest)
        plan = session.plan()
        opened = session.donor()
    if pending:
        from .clonecmd import pending_note
        console.print(pending_note(manifest), markup=False, style="bold")
    if args.out:
        save_plan(plan, args.out, manifest=manifest.path)
    if args.json:
        print(json.dumps({**plan.to_dict(), "donor_source": opened.to_dict()}, indent=2, sort_keys=True))
    else:
        print_plan(console, plan)
        if args.out:
            console.print(f"plan saved to {args.out}; apply it with: transplant apply {args.out}", markup=False)
    if plan.blocking:
        return EXIT_BLOCKED
    changes = plan.has_changes or pending
    return EXIT_CHANGES if changes and getattr(args, "detailed_exitcode", False) else EXIT_OK


def _finish_interrupted(args: argparse.Namespace, console: Console, session: "_Session", manifest_path: str,
                        how: str | None) -> bool:
    """Handle --resume / --rollback, or refuse while a transaction is interrupted; first record
    the outcome of any commit the target's host script completed after its controller died
    (:func:`transplant.txn.record_completed`) and say so.

    A venv with no state folder (never applied to) is only read: no lock, no folder.

    :param manifest_path: the manifest, for the commands the messages name.
    :param how: ``"resume"``, ``"rollback"``, or None (a plain apply: only check).
    :returns: True when the command is done (finished, undone, or nothing to resume), False to
        go on and apply.
    :raises TransplantError: an interrupted transaction without --resume / --rollback;
        --rollback with nothing interrupted (nothing was changed; the hint names
        ``transplant rollback``); a completed commit whose files differ, with --resume.
    """
    m = session.manifest
    target = session.host("target")
    say = (lambda line: console.print(line, markup=False))
    quoted = shlex.quote(manifest_path)
    pending: list[dict] = []
    completed: list[txn.Completed] = []
    outcome = None
    if txn.has_state(target, m.target.venv):
        txid = new_transaction_id()
        # under the lock: a transaction another apply is running now is not "interrupted"
        txn.acquire(target, m.target.venv, txid, f"transplant apply --{how or 'check'}", say=say,
                    break_lock=args.break_lock)
        try:
            pending = txn.interrupted(target, m.target.venv, say=say)  # waits for a host script still running
            completed = txn.record_completed(target, m.target.venv)
            for done in completed:
                say(done.describe())
            if pending and how:
                outcome = txn.finish(target, m.target.venv, pending[-1]["id"], how, lock=txid,
                                     crash_after=_crash_after())
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
                    f"but {len(differ[-1].mismatches)} files differ from its planned state",
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
    if outcome == "aborted":
        console.print(f"transaction {last['id']} had not changed anything yet (it was staging); discarded",
                      markup=False)
        return how == "rollback"
    console.print(Text.assemble((outcome, "bold green"), f" transaction {last['id']}: the target matches its "
                                f"{'planned' if outcome == 'applied' else 'earlier'} state hash for hash"))
    return True


def _crash_after() -> int | None:
    """Testing hook: ``TRANSPLANT_TEST_CRASH_AFTER=N`` makes the target's commit or rollback
    kill itself (SIGKILL) before step N, for the fault-injection tests."""
    value = os.environ.get("TRANSPLANT_TEST_CRASH_AFTER")
    return int(value) if value and value.isdigit() else None


def _orphan_at() -> int | None:
    """Testing hook: ``TRANSPLANT_TEST_ORPHAN_AT=N`` makes the target's commit wait before step N
    until this controller is gone (the test kills it), then finish alone."""
    value = os.environ.get("TRANSPLANT_TEST_ORPHAN_AT")
    return int(value) if value and value.isdigit() else None


def _cmd_apply(args: argparse.Namespace, console: Console) -> int:
    if args.resume and args.rollback:
        raise UsageError("--resume and --rollback exclude each other")
    source = Path(args.source)
    saved: Plan | None = None
    if source.suffix == ".json":
        if args.target:
            raise UsageError("a saved plan is for its own target; --target goes with a manifest")
        saved = load_plan(source)
        manifest = load_manifest(saved.manifest)
    else:
        manifest = load_manifest(source)
    manifest, targets = _targets(args, manifest)
    if len(targets) > 1:
        if args.resume or args.rollback or args.break_lock:
            raise UsageError("--resume, --rollback and --break-lock act on one target; name it with --target")
        return _fleet("apply", args, console, manifest, targets)
    with ExitStack() as stack:
        session = _Session(manifest, console, stack)
        if saved is None and not (args.resume or args.rollback) and session.clone_pending():
            from .clonecmd import clone_base
            clone_base(args, console, manifest, session.base_host(), session.host("target"))
            session.cloned()
        if args.resume or args.rollback:
            if saved is not None:  # it only names the target: it must be its manifest's
                _check_saved_plan(saved, manifest, source, sides=("target",))
            if _finish_interrupted(args, console, session, manifest.path, "resume" if args.resume else "rollback"):
                return EXIT_OK
            # --resume of a transaction that was still staging: it was discarded; apply afresh
        from .gather import refuse_self_target
        early = session.donor()  # before the lock: nothing is written into a donor named twice
        if early.host is not None:
            refuse_self_target(replace(session.manifest, target=manifest.target), early.host, session.host("target"))
        # every input is checked (the saved plan against a fresh plan) before anything is locked or written
        opened = session.donor()
        given, manifest = manifest, session.manifest
        if saved is not None:
            _check_saved_plan(saved, manifest, source)
            check_plan_paths(saved, Path(manifest.path).resolve().parent)
        plan = session.plan()
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
        _finish_interrupted(args, console, session, given.path, None)  # raises while one is interrupted
        print_plan(console, plan)
        if not plan.has_changes:
            console.print("nothing to change: the target already holds the planned state")
            return _cmd_verify(args, console, manifest=given) if args.verify else EXIT_OK
        if plan.refused:
            console.print(f"[bold red]apply refused[/]: {', '.join(sorted({f.code for f in plan.refused}))} cannot "
                          f"be forced or accepted; fix it as its hint says")
            return EXIT_BLOCKED
        if plan.blocking and not args.force:
            console.print("[bold red]apply refused[/]: fix the error findings above, or pass --force")
            return EXIT_BLOCKED
        if not args.yes:
            if not sys.stdin.isatty():
                raise TransplantError("apply needs confirmation and standard input is not a terminal",
                                      hint=f"add --yes: transplant apply {args.source} --yes")
            answer = console.input(f"apply these changes to {plan.target.label}? \\[y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                console.print("nothing was changed")
                return EXIT_FAIL
        from .progress import ByteProgress

        patch_bytes = sum(cp.size or 0 for c in plan.changes for cp in c.copy if cp.source == "patch")
        with ByteProgress(console, plan.copy_bytes, {"files": plan.copy_bytes - patch_bytes,
                                                     "patches": patch_bytes}) as bar:
            report = bar.report
            stager = getattr(opened.source, "stage", None)  # a registry snapshot: targets pull themselves
            donor_host, donor_root = (None, None) if stager else opened.source.files(
                [cp.path for c in plan.changes for cp in c.copy if cp.source == "donor"])
            result = execute(plan, donor=donor_host, target=session.host("target"),
                             manifest_dir=Path(manifest.path).resolve().parent, state_dir=default_state_dir(),
                             progress=report, say=lambda line: console.print(line, markup=False),
                             break_lock=args.break_lock, crash_after=_crash_after(), orphan_at=_orphan_at(),
                             donor_root=donor_root, stager=stager,
                             recipe=make_recipe(manifest, plan, opened))
    relayed = " (relayed through the controller, so each byte crossed twice)" if opened.host is not None and not (
        manifest.donor.host.is_local or manifest.target.host.is_local) else ""
    console.print(Text.assemble(("applied", "bold green"), (
        f" transaction {result.transaction}: {result.files_copied} files ({human_bytes(plan.copy_bytes)}) copied, "
        f"{human_bytes(result.bytes_moved)} on the wire{relayed}, {result.files_removed} removed, in "
        f"{result.seconds:.1f} s (" + ", ".join(f"{name} {sec:.1f} s" for name, sec in result.steps)
        + "); the target now matches the plan hash for hash")))
    if args.verify:
        return _cmd_verify(args, console, manifest=given)
    return EXIT_OK


def _cmd_rollback(args: argparse.Namespace, console: Console) -> int:
    manifest = load_manifest(args.manifest)
    with ExitStack() as stack:
        session = _Session(manifest, console, stack)
        target, venv = session.host("target"), manifest.target.venv
        if not args.yes and not sys.stdin.isatty():
            raise TransplantError("rollback needs confirmation and standard input is not a terminal",
                                  hint=f"add --yes: transplant rollback {shlex.quote(args.manifest)} --yes")
        if not args.yes and console.input(f"roll back {manifest.target}? \\[y/N] ").strip().lower() not in ("y", "yes"):
            console.print("nothing was changed")
            return EXIT_FAIL
        txid = new_transaction_id()
        txn.acquire(target, venv, txid, "transplant rollback", say=lambda line: console.print(line, markup=False))
        try:
            interrupted = txn.interrupted(target, venv)
            for completed in txn.record_completed(target, venv):
                console.print(completed.describe(), markup=False)
            if interrupted:
                raise TransplantError(f"{manifest.target}: a transaction is interrupted; undo it first",
                                      hint=f"transplant apply {shlex.quote(args.manifest)} --rollback")
            from .progress import step

            with step(console, f"rolling back {manifest.target}") as update:
                def say(line: str) -> None:
                    console.print(line, markup=False)
                    update(line)

                done = txn.undo(target, venv, to=args.to, force=args.force, lock=txid, say=say,
                                listing=f"transplant history {shlex.quote(args.manifest)}")
        finally:
            txn.release(target, venv, txid)
    console.print(Text.assemble(("rolled back", "bold green"), f" {', '.join(done)}: the target matches the state "
                                f"recorded before {'them' if len(done) > 1 else 'it'} hash for hash"))
    return EXIT_OK


def _cmd_history(args: argparse.Namespace, console: Console) -> int:
    manifest = load_manifest(args.manifest)
    with ExitStack() as stack:
        record = txn.history(_Session(manifest, console, stack).host("target"), manifest.target.venv)
    if args.json:
        print(json.dumps({"schema": "transplant.history/1", **record}, indent=2, sort_keys=True))
    else:
        console.print(history_table(record["transactions"], record["events"], str(manifest.target)))
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


def _cmd_verify(args: argparse.Namespace, console: Console, manifest: Manifest | None = None) -> int:
    from .verify_cli import is_location, verify_command  # keeps this file's share of verify small

    if manifest is None and not is_location(args.manifest):
        manifest, targets = _targets(args, load_manifest(args.manifest))
        if len(targets) > 1:
            if getattr(args, "junit", None) or getattr(args, "clear_jit_caches", False):
                raise UsageError("--junit and --clear-jit-caches act on one target; name it with --target")
            return _fleet("verify", args, console, manifest, targets)
    return verify_command(args, console, session_class=_Session, parse_location=parse_location, manifest=manifest)


class UsageError(TransplantError):
    """A command-line mistake (exit code 64)."""


def parse_location(text: str) -> tuple[HostSpec, str]:
    """Split ``HOST:VENV`` (``root@gpu:22:/root/venv``, ``local:/srv/venv``) at the ``:`` before the venv's ``/``.

    :raises UsageError: no ``:/`` in the text, a control character in the venv path, or a bad host part.
    """
    host, sep, venv = text.partition(":/")
    fix = "write e.g. local:/root/venv_sglang or root@gpu-07:/root/venv_sglang"
    if not sep:
        raise UsageError(f"{text!r}: expected HOST:VENV with an absolute venv path", hint=fix)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in venv):
        raise UsageError(f"{text!r}: the venv path holds a control character (a newline, a tab...)", hint=fix)
    try:
        return HostSpec.parse(host), "/" + venv
    except ValueError as exc:
        raise UsageError(f"{text!r}: {exc}", hint=fix) from None


def _cmd_inventory(args: argparse.Namespace, console: Console) -> int:
    from .locations import resolve_location

    spec, venv, options, label = resolve_location(args.location, args.identity_file, args.known_hosts)
    with connect(spec, options) as host, console.status(f"probing {label}"):
        inv = take_inventory(host, venv, hash_patterns=args.hash or ())
    if args.json:
        print(json.dumps(inv.document, indent=2, sort_keys=True))
    else:
        console.print(inventory_table(inv))
    return EXIT_OK


def _cmd_init(args: argparse.Namespace, console: Console) -> int:
    from .initcmd import init_command

    init_command(args, console, parse_location)
    return EXIT_OK


def _cmd_clone(args: argparse.Namespace, console: Console) -> int:
    from .clonecmd import clone_command

    return EXIT_OK if clone_command(args, console, parse_location) else EXIT_BLOCKED


def _cmd_status(args: argparse.Namespace, console: Console) -> int:
    from .recovercli import status_command

    return status_command(args, console)


def _cmd_recover(args: argparse.Namespace, console: Console) -> int:
    from .recovercli import recover_command

    return recover_command(args, console)


def _cmd_snapshot(args: argparse.Namespace, console: Console) -> int:
    from .recovercli import snapshot_command

    return snapshot_command(args, console)


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from .demo import run_demo  # the demo pulls in the lab; keep it off the other commands' path

    return run_demo(console, workdir=Path(args.workdir) if args.workdir else None, keep=args.keep)


def _fleet_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", metavar="HOST:VENV",
                   help="a target (repeat for several; replaces the manifest's target / targets)")
    p.add_argument("--jobs", type=int, default=4, metavar="N", help="targets worked on at a time (default 4)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``transplant``."""
    parser = _Parser(prog="transplant", description="Move working CUDA Python environments between GPU hosts.")
    parser.add_argument("--version", action="version", version=f"transplant {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("plan", help="inventory both venvs and show what apply would change")
    p.add_argument("manifest", help="the manifest (YAML; see manifests/REFERENCE.md)")
    p.add_argument("--json", action="store_true", help="print the plan document (schema transplant.plan/1)")
    p.add_argument("--out", help="save the plan as JSON for a later 'transplant apply FILE'")
    p.add_argument("--detailed-exitcode", action="store_true",
                   help="exit 2 when there are changes (0 none, 3 blocked, 1 failed), as Terraform's")
    _fleet_options(p)
    p.set_defaults(func=_cmd_plan)
    a = sub.add_parser("apply", help="copy exactly what differs, then check the target against the plan")
    a.add_argument("source", metavar="MANIFEST|PLAN.json",
                   help="a manifest (plans again), or a plan saved with 'plan --out' (refused if the hosts changed)")
    a.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    a.add_argument("--force", action="store_true", help="apply despite error findings")
    a.add_argument("--resume", action="store_true", help="finish the target's interrupted transaction")
    a.add_argument("--rollback", action="store_true", help="undo the target's interrupted transaction")
    a.add_argument("--break-lock", action="store_true",
                   help="take the target's lock even if another controller holds it (only when that one is gone)")
    a.add_argument("--verify", action="store_true", help="verify each target after applying to it")
    a.add_argument("--json", action="store_true", help="with several targets: print the fleet report as JSON")
    _fleet_options(a)
    a.set_defaults(func=_cmd_apply)
    r = sub.add_parser("rollback", help="restore the target to the state before its newest (or every later) transaction")
    r.add_argument("manifest", help="the manifest whose target to roll back")
    r.add_argument("--to", metavar="ID", help="undo every transaction after this one (see 'transplant history')")
    r.add_argument("--force", action="store_true", help="roll back even if files changed since the transaction")
    r.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    r.set_defaults(func=_cmd_rollback)
    h = sub.add_parser("history", help="list the transactions recorded in the target venv")
    h.add_argument("manifest", help="the manifest whose target to read")
    h.add_argument("--json", action="store_true", help="print them as JSON (schema transplant.history/1)")
    h.set_defaults(func=_cmd_history)
    v = sub.add_parser("verify", help="prove the target venv works: the verify ladder, interpreter to a served request")
    v.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                   help="the manifest whose target and verify settings to use, or a venv (local:/srv/venv) to "
                        "check without one")
    v.add_argument("--json", action="store_true", help="print the results (schema transplant.verify/2)")
    v.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE")
    v.add_argument("--imports", metavar="NAMES", help="comma-separated import names (without a manifest: the "
                   "distributions providing them are checked too)")
    v.add_argument("--clear-jit-caches", action="store_true",
                   help="remove the triton, flashinfer and torch-inductor cache folders of the target's user")
    v.add_argument("--identity-file", help="SSH private key, for HOST:VENV (default: ssh-agent and ~/.ssh/id_*)")
    v.add_argument("--known-hosts", help="known_hosts file, for HOST:VENV (default ~/.ssh/known_hosts)")
    _fleet_options(v)
    v.set_defaults(func=_cmd_verify)
    n = sub.add_parser("init", help="probe a donor and a target and write a starting manifest")
    n.add_argument("--donor", required=True, metavar="HOST:VENV", help="the venv that works, e.g. root@ct129:/root/venv")
    n.add_argument("--target", required=True, metavar="HOST:VENV", help="the venv to bring it to")
    n.add_argument("--overlay", action="append", metavar="NAME",
                   help="a distribution to bring with what it needs (a closure), or a glob (default: sglang)")
    n.add_argument("--out", required=True, metavar="FILE", help="the manifest to write (never overwritten)")
    n.add_argument("--identity-file", help="SSH private key (default: ssh-agent and ~/.ssh/id_*)")
    n.add_argument("--known-hosts", help="known_hosts file to check host keys against (default ~/.ssh/known_hosts)")
    n.set_defaults(func=_cmd_init)
    i = sub.add_parser("inventory", help="print what a venv holds")
    i.add_argument("location", metavar="HOST:VENV|MANIFEST",
                   help="e.g. local:/root/venv_sglang or root@gpu-07:22:/root/venv, or a manifest (its target, "
                        "reached with its ssh settings)")
    i.add_argument("--json", action="store_true", help="print the probe's document (schema transplant.inventory/1)")
    i.add_argument("--hash", action="append", metavar="PATTERN", help="hash the files of these distributions")
    i.add_argument("--identity-file", help="SSH private key (default: ssh-agent and ~/.ssh/id_*)")
    i.add_argument("--known-hosts", help="known_hosts file to check the host key against (default ~/.ssh/known_hosts)")
    i.set_defaults(func=_cmd_inventory)
    c = sub.add_parser("clone", help="copy a venv to another path or host and rewrite what names its old prefix")
    c.add_argument("source", metavar="SRC_HOST:VENV", help="the venv to clone, e.g. local:/srv/venv_base")
    c.add_argument("dest", metavar="DEST_HOST:VENV", help="where the clone goes (absent or an empty folder)")
    c.add_argument("--replace", action="store_true",
                   help="delete a venv (a folder holding pyvenv.cfg) already at the destination first")
    c.add_argument("--json", action="store_true", help="print the result (schema transplant.clone/1)")
    c.add_argument("--identity-file", help="SSH private key (default: ssh-agent and ~/.ssh/id_*)")
    c.add_argument("--known-hosts", help="known_hosts file to check host keys against (default ~/.ssh/known_hosts)")
    c.set_defaults(func=_cmd_clone)
    s = sub.add_parser("snapshot", help="keep the donor's overlay set on the controller, for when the donor is gone")
    s.add_argument("manifest", nargs="?", help="the manifest whose donor and overlay to capture")
    s.add_argument("--out", metavar="DIR", help="the snapshot store (default: the state folder's snapshots/); with "
                   "--list or --prune also a registry repository, oci://REGISTRY/REPO (--prune then takes tags)")
    s.add_argument("--list", action="store_true", help="list the snapshots in the store")
    s.add_argument("--prune", nargs="*", metavar="ID", help="remove these snapshots, then every stored file no "
                   "snapshot uses")
    s.add_argument("--push", metavar="oci://REGISTRY/REPO:TAG",
                   help="also push the snapshot to an OCI registry (one blob per distribution build)")
    s.add_argument("--ca", metavar="PEM", help="CA bundle for the registry (default: the system CAs)")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=_cmd_snapshot)
    st = sub.add_parser("status", help="what was applied to a venv, from where, when, and what drifted since")
    st.add_argument("location", metavar="HOST:VENV|MANIFEST",
                    help="e.g. root@gpu-07:/root/venv_sglang, or a manifest (its target, reached with its ssh settings)")
    st.add_argument("--json", action="store_true", help="print it as JSON (schema transplant.status/1)")
    st.add_argument("--identity-file", help="SSH private key (default: ssh-agent and ~/.ssh/id_*)")
    st.add_argument("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")
    st.set_defaults(func=_cmd_status)
    rc = sub.add_parser("recover", help="rebuild the last verified state on a new host: plan, apply, verify")
    rc.add_argument("--target", required=True, metavar="HOST[:VENV]",
                    help="the host to rebuild on (the venv defaults to the source's path)")
    rc.add_argument("--from", dest="source_host", metavar="HOST:VENV",
                    help="a venv whose history holds the state (its newest applied and verified transaction)")
    rc.add_argument("--snapshot", metavar="ID|PATH|oci://REGISTRY/REPO:TAG",
                    help="a snapshot (without --from or --snapshot: the last state this controller saw verified, "
                         "from its host or, when that is gone, its snapshot; else the newest snapshot in the store)")
    rc.add_argument("--ca", metavar="PEM", help="CA bundle for an oci:// snapshot's registry (default: the system CAs)")
    rc.add_argument("--out", metavar="DIR", help="the snapshot store (default: the state folder's snapshots/)")
    rc.add_argument("--yes", action="store_true", help="do not ask for confirmation before apply")
    rc.add_argument("--force", action="store_true",
                    help="go on despite error findings, or a source whose applied files drifted")
    rc.add_argument("--identity-file", help="SSH private key (default: ssh-agent and ~/.ssh/id_*)")
    rc.add_argument("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")
    rc.set_defaults(func=_cmd_recover)
    d = sub.add_parser("demo", help="replay the seed story on loopback test hosts, then rebuild a host with the donor gone")
    d.add_argument("--workdir", help="where the demo keeps its hosts (default: a temporary folder)")
    d.add_argument("--keep", action="store_true",
                   help="leave the work folder with its manifests and venvs (the hosts are stopped either way)")
    d.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``transplant``; returns the exit code (see the module docstring)."""
    args = build_parser().parse_args(argv)
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout
    wide = None if stream.isatty() or "COLUMNS" in os.environ else 120  # piped: no 80-column squeeze
    console = _Console(file=stream, width=wide)
    try:
        code = args.func(args, console)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except TransplantError as exc:
        _print_error(console, exc)
        if getattr(args, "json", False):
            print(json.dumps({"schema": "transplant.error/1", "error": exc.message, "hint": exc.hint,
                              "code": exc.code}))
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAIL
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except EOFError:  # end of input at a [y/N] question (Ctrl-D): a "no"
        console.print("no answer (end of input): nothing was changed", markup=False)
        return EXIT_FAIL


class _Console(Console):
    """rich's Console, but a closed pipe is raised to :func:`main` (rich would exit with 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _closed_pipe() -> int:
    """The reader of our output went away (``transplant plan | head``): not an error, exit 0 quietly.

    As the Python documentation (``signal``, "Note on SIGPIPE") recommends: point standard
    output at /dev/null so that the interpreter's final flush does not fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured in tests)
            pass
    os.close(devnull)
    return EXIT_OK


def _print_error(console: Console, exc: TransplantError) -> None:
    """``error: <message>``, the files that differ (apply), and ``hint: <fix>``; no markup from the text."""
    text = Text()
    text.append(f"error [{exc.code}]: " if exc.code else "error: ", style="bold red")
    first, *problems = exc.message.split("\n")
    text.append(first)
    console.print(text, highlight=False)
    # the problem lines (a manifest's "- key: ...; fix: ...") carry snippets to paste: one line each,
    # never wrapped by the console (the terminal may fold them, newline-free)
    for line in problems + [f"  {line}" for line in getattr(exc, "mismatches", [])[:50]]:
        console.print(Text(line), highlight=False, soft_wrap=True)
    if exc.hint:  # a command to paste: never wrapped by the console (the terminal may fold it, newline-free)
        console.print(Text.assemble(("hint: ", "bold"), exc.hint), highlight=False, soft_wrap=True)
