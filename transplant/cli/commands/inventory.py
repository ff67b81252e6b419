"""``transplant inventory HOST:VENV|MANIFEST`` (face): print what a venv holds.

Without ``--files`` (or ``--hash``) the probe reads RECORD alone (``record: "summary"``): per
distribution the rows inside the venv and the sum of RECORD's size column, no file on disk looked
at, so it costs what ``pip inspect`` costs; ``--json`` then gives ``record_summary`` and a null
``record``. With ``--files`` every RECORD file is looked at and listed, as before.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from transplant.cli.options import location_argument, ssh_options

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle", "inventory_command"]

HELP = "print what a venv holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``HOST:VENV|MANIFEST``, ``--json``, ``--hash``, ``--files`` and the SSH options."""
    location_argument(parser, example="local:/root/venv_sglang or root@gpu-07:22:/root/venv")
    parser.add_argument("--json", action="store_true",
                        help="print the probe's document (schema transplant.inventory/1; without --files each "
                             "distribution has record_summary {files, bytes} and record null)")
    parser.add_argument("--hash", action="append", metavar="PATTERN", help="hash the files of these distributions")
    parser.add_argument("--files", action="store_true",
                        help="look at every RECORD file on disk (exists, size, mode) and list each in --json; without "
                             "it, files and bytes are counted from RECORD alone, as fast as pip inspect")
    ssh_options(parser)



def inventory_command(args: argparse.Namespace, console: Console) -> int:
    """Print the venv's distributions as a table, or the probe's document (``--json``); returns 0.

    :raises TransplantError: a bad location, an unreachable host, a failed probe.
    """
    import json

    from transplant.cli.locations import resolve_location
    from transplant.cli.render import inventory_table
    from transplant.exitcodes import EXIT_OK
    from transplant.hosts.connecting import connect
    from transplant.hosts.probing import take_inventory

    spec, venv, options, label = resolve_location(args.location, args.identity_file, args.known_hosts)
    with connect(spec, options) as host, console.status(f"probing {label}"):
        # without --files (or --hash) RECORD alone is read: no lstat per file, a small document
        full = bool(getattr(args, "files", False) or args.hash)
        inv = take_inventory(host, venv, hash_patterns=args.hash or (), record=True if full else "summary",
                             compact=False)
    if args.json:
        print(json.dumps(inv.document, indent=2, sort_keys=True))
    else:
        console.print(inventory_table(inv))
    return EXIT_OK


#: ``transplant inventory``'s handler, for the command table.
handle = inventory_command
