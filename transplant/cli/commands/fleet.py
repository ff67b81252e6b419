"""The fleet side of plan, apply and verify (face): many targets, one donor read, per-host report."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from transplant.cli.progress import Shown
from transplant.errors import TransplantError
from transplant.exitcodes import EXIT_BLOCKED, EXIT_CHANGES, EXIT_FAIL, EXIT_OK
from transplant.fleet.run import DonorRead, TargetResult, check_fleet, fleet_exit, run_fleet, serve_from_snapshot
from transplant.donor.snapshot import default_store
from transplant.hosts.host import SSHOptions
from transplant.core.manifest import Endpoint, Manifest
from transplant.cli.render import print_plan, rule, stages_table
from transplant.core.units import count, human_bytes
from transplant.donor.sources import Opened

__all__ = ["run_fleet_command", "fleet_table", "fleet_json"]

_CODE_WORDS = {"plan": {EXIT_OK: "no changes", EXIT_CHANGES: "changes", EXIT_BLOCKED: "blocked", EXIT_FAIL: "failed"},
               "apply": {EXIT_OK: "ok", EXIT_BLOCKED: "blocked", EXIT_FAIL: "failed"},
               "verify": {EXIT_OK: "passed", EXIT_BLOCKED: "verify failed", EXIT_FAIL: "failed"}}


def _outcome(action: str, r: TargetResult) -> str:
    if action == "apply" and r.stages is not None and r.code == EXIT_BLOCKED:
        return "verify failed"
    return _CODE_WORDS[action].get(r.code, str(r.code))


def _line(action: str, r: TargetResult) -> str:
    """One line per finished target: outcome, what moved, the error."""
    parts = [f"{r.target}: {_outcome(action, r)}"]
    if r.applied is not None:
        parts.append(f"transaction {r.applied.transaction}, {count(r.applied.files_copied, 'file')}, "
                     f"{human_bytes(r.applied.bytes_moved)} on the wire")
    if r.note:
        parts.append(r.note)
    if r.stages is not None:
        parts.append("verify " + ", ".join(f"{s.name} {s.status}" for s in r.stages))
    if r.error:
        parts.append(r.error.splitlines()[0])
    return "; ".join(parts) + f" ({r.seconds:.1f} s)"


def fleet_table(action: str, results: Sequence[TargetResult]) -> Table:
    """One row per target: outcome, changes, transaction, verify, error."""
    table = Table(title=f"{action} on {len(results)} targets", title_justify="left")
    table.add_column("target", overflow="fold")
    for column in ("result", "changes", "applied", "verify", "error / note"):
        table.add_column(column)
    for r in results:
        style = "bold green" if r.code in (EXIT_OK, EXIT_CHANGES) else "bold red"
        changes = "-" if r.plan is None else str(sum(1 for c in r.plan.changes if not c.is_noop))
        applied = "-" if r.applied is None else f"{count(r.applied.files_copied, 'file')} ({human_bytes(r.applied.bytes_moved)})"
        verify = "-" if r.stages is None else ", ".join(f"{s.name} {s.status}" for s in r.stages)
        note = (r.error or r.note or "") + (f"\nhint: {r.hint}" if r.hint else "")
        table.add_row(Text(str(r.target)), Text(_outcome(action, r), style=style), changes, Text(applied),
                      Text(verify), Text(note))
    return table


def fleet_json(action: str, opened: Opened, read: DonorRead, results: Sequence[TargetResult]) -> dict[str, Any]:
    """The fleet report (schema ``transplant.fleet/1``)."""
    return {
        "schema": "transplant.fleet/1", "action": action, "exit": fleet_exit(results),
        "donor": {**opened.to_dict(), "bytes_read": read.bytes, "files_read": read.files, "snapshot": read.snapshot},
        "targets": [{
            "target": str(r.target), "code": r.code, "result": _outcome(action, r), "error": r.error, "hint": r.hint,
            "note": r.note or None, "seconds": round(r.seconds, 3),
            "changes": None if r.plan is None else sum(1 for c in r.plan.changes if not c.is_noop),
            "blocking": None if r.plan is None else [f.code for f in r.plan.blocking],
            "applied": None if r.applied is None else {"transaction": r.applied.transaction,
                                                       "files": r.applied.files_copied, "bytes": r.applied.bytes_moved},
            "stages": None if r.stages is None else [{"name": s.name, "status": s.status, "reason": s.reason}
                                                     for s in r.stages],
        } for r in results],
    }


def run_fleet_command(action: str, args: argparse.Namespace, console: Console, manifest: Manifest,
                      targets: Sequence[Endpoint], opened: Opened, ssh: SSHOptions, stack: ExitStack) -> int:
    """Run ``action`` on every target and report per host; returns the fleet's exit code.

    For apply without ``--yes``, every target is planned first and one confirmation asked.
    :raises FleetError: a target named twice or that is a donor, ``--jobs`` below 1: nothing ran.
    :raises TransplantError: the donor (or its snapshot) could not be read: nothing ran.
    """
    donors = [e for e in (manifest.donor, *manifest.fallback) if isinstance(e, Endpoint)]
    jobs = check_fleet(targets, donors, getattr(args, "jobs", 4))
    read = DonorRead()
    donor_inventory = None
    shown = None
    if action == "verify":
        donor_inventory = _once(lambda: _donor_inventory(opened))
    else:
        with console.status("reading the donor once") as status:
            opened, read = serve_from_snapshot(opened, default_store(), stack,
                                               reporter=Shown(step=status.update))
    console.print(f"donor source: {opened.source.label} ({opened.why}); read from the donor: {count(read.files, 'file')}, "
                  f"{human_bytes(read.bytes)}", markup=False, highlight=False)
    if action == "apply" and not args.yes:
        if not sys.stdin.isatty():
            raise TransplantError("apply needs confirmation and standard input is not a terminal",
                                  hint=f"add --yes: transplant apply {args.source} --yes")
        planned = run_fleet("plan", manifest, targets, opened, ssh, jobs=jobs)
        _print_plans(console, planned)
        console.print(fleet_table("plan", planned))
        if console.input(f"apply to these {len(targets)} targets? \\[y/N] ").strip().lower() not in ("y", "yes"):
            console.print("nothing was changed")
            return EXIT_FAIL
        # apply the plans that were shown (a target changed since is refused as stale), not later ones
        shown = {r.target: r.plan for r in planned if r.plan is not None}
    with console.status(f"{action} on {len(targets)} targets, {jobs} at a time"):
        results = run_fleet(action, manifest, targets, opened, ssh, jobs=jobs, force=getattr(args, "force", False),
                            verify_after=getattr(args, "verify", False), donor_inventory=donor_inventory,
                            strict=getattr(args, "strict", False),
                            rollback_on_failure=getattr(args, "rollback_on_failure", False),
                            done=lambda r: console.print(_line(action, r), markup=False, highlight=False),
                            plans=shown)
    if action == "plan" or (action == "apply" and args.yes):
        _print_plans(console, results)
    for r in results:
        if r.stages is not None and r.code != 0:
            console.print(stages_table(r.stages, f"verify {r.target}"))
    console.print(fleet_table(action, results))
    code = fleet_exit(results)
    if code == 2 and not getattr(args, "detailed_exitcode", False):
        code = 0  # changes are a success of plan unless --detailed-exitcode asks for 2
    failed = [r for r in results if r.code not in (0, 2)]
    console.print(f"[bold green]{action}: all {len(results)} targets succeeded[/]" if not failed else
                  f"[bold red]{action}: {len(failed)} of {len(results)} targets did not succeed[/]")
    if getattr(args, "json", False):
        print(json.dumps(fleet_json(action, opened, read, results), indent=2, sort_keys=True))
    return code


def _once(read: Callable[[], Any]) -> Callable[[], Any]:
    """``read`` called at most once, whichever worker asks first; the others wait for its answer."""
    lock = threading.Lock()
    box: list[Any] = []

    def get() -> Any:
        with lock:
            if not box:
                box.append(read())
        return box[0]

    return get


def _donor_inventory(opened: Opened):
    try:
        return opened.source.inventory(hash_patterns=(), record=False)
    except TransplantError:
        return None


def _print_plans(console: Console, results: Sequence[TargetResult]) -> None:
    for r in results:
        if r.plan is not None:
            rule(console, str(r.target))
            print_plan(console, r.plan)
