"""``transplant inventory HOST:VENV|MANIFEST`` (face): print what a venv holds.

Without ``--files`` (or ``--hash``) the probe reads RECORD alone (``record: "summary"``): per
distribution the rows inside the venv and the sum of RECORD's size column, no file on disk looked
at, so it costs what ``pip inspect`` costs; ``--json`` then gives ``record_summary`` and a null
``record``. With ``--files`` every RECORD file is looked at and listed, as before.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from transplant.cli.render import inventory_table
from transplant.cli.locations import resolve_location
from transplant.exitcodes import EXIT_OK
from transplant.hosts.connecting import connect
from transplant.hosts.probing import take_inventory

__all__ = ["inventory_command"]


def inventory_command(args: argparse.Namespace, console: Console) -> int:
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
