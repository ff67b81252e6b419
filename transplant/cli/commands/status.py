"""``transplant status HOST:VENV|MANIFEST`` (face): what was applied to a venv, from where, when, and what drifted."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from transplant.cli.options import location_argument, ssh_options

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle", "status_command"]

HELP = "what was applied to a venv, from where, when, and what drifted since"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``HOST:VENV|MANIFEST``, ``--json`` and the SSH options."""
    location_argument(parser, example="root@gpu-07:/root/venv_sglang")
    parser.add_argument("--json", action="store_true", help="print it as JSON (schema transplant.status/1)")
    ssh_options(parser)



def status_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant status HOST:VENV|MANIFEST``: print what was applied there and the drift (see
    :func:`transplant.recover.status.read_status`); returns 0, or 3 when applied files drifted.

    :raises TransplantError: a bad location, an unreachable host, unreadable records.
    """
    import json
    import shlex

    from rich.text import Text

    from transplant.cli.locations import is_location, resolve_location
    from transplant.cli.progress import Shown, printer
    from transplant.cli.reports import status_table
    from transplant.core.units import agree, count
    from transplant.exitcodes import EXIT_BLOCKED, EXIT_OK
    from transplant.hosts.connecting import connect
    from transplant.recover.status import read_status

    spec, venv, options, label = resolve_location(args.location, args.identity_file, args.known_hosts)
    with connect(spec, options) as host, console.status(f"reading {label}"):
        status = read_status(host, venv, reporter=Shown(note=printer(console)))
    for done in status.completed:
        console.print(done.describe(), markup=False)
    if args.json:
        print(json.dumps(status.to_dict(), indent=2, sort_keys=True))
        return EXIT_BLOCKED if status.drift else EXIT_OK
    if not status.transactions and status.rolled_back:
        console.print(f"{status.where}: nothing transplant applied is in place: "
                      f"{agree(len(status.rolled_back), 'transaction', 'transactions')} "
                      f"{', '.join(status.rolled_back)} {agree(len(status.rolled_back), 'was', 'were')} applied and "
                      f"rolled back (transplant history {status.where} lists them)", markup=False)
    elif not status.transactions:
        console.print(f"{status.where}: transplant has applied nothing here (no committed transaction)", markup=False)
    else:
        console.print(status_table(status))
    for txid in status.unrecorded:
        console.print(f"[yellow]unrecorded[/] transaction {txid}: committed, but its outcome is not in the history yet "
                      f"(its controller died after the commit, or an apply is recording it now); the next apply or "
                      f"status records it")
    # the manifest that applied it, when the command was given one (a HOST:VENV names none)
    named = "<manifest>" if is_location(args.location) else shlex.quote(args.location)
    for txid in status.interrupted:
        console.print(Text.assemble(("interrupted", "bold red"), f" transaction {txid}: finish it with 'transplant "
                                    f"apply {named} --resume' or undo it with 'transplant apply {named} --rollback'"))
    skipped = status.applied_paths - status.checked
    aside = (f" ({count(skipped, 'bytecode file')} of the {count(status.applied_paths, 'applied path')} "
             f"{agree(skipped, 'is', 'are')} not compared: Python rewrites {agree(skipped, 'it', 'them')} at import)") if skipped > 0 else ""
    rows = (f" and {count(status.record_checked, 'other file')} of the applied distributions "
            f"(by their RECORD rows)") if status.record_checked else ""
    if status.drift:
        console.print(f"[bold red]drift[/]: {len(status.drift)} of {status.checked} applied paths{rows} no longer "
                      f"match{aside}:")
        for line in status.drift[:50]:
            console.print(f"  {line}", markup=False, highlight=False)
    elif status.transactions:
        console.print(f"[bold green]no drift[/]: all {status.checked} applied paths{rows} match what was "
                      f"applied{aside}")
    return EXIT_BLOCKED if status.drift else EXIT_OK


#: ``transplant status``'s handler, for the command table.
handle = status_command
