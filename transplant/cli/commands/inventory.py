"""``transplant inventory HOST:VENV|MANIFEST`` (face): print what a venv holds."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from transplant.cli.render import inventory_table
from transplant.cli.locations import resolve_location
from transplant.exitcodes import EXIT_OK
from transplant.hosts.host import connect
from transplant.hosts.probing import take_inventory

__all__ = ["inventory_command"]


def inventory_command(args: argparse.Namespace, console: Console) -> int:
    spec, venv, options, label = resolve_location(args.location, args.identity_file, args.known_hosts)
    with connect(spec, options) as host, console.status(f"probing {label}"):
        inv = take_inventory(host, venv, hash_patterns=args.hash or ())
    if args.json:
        print(json.dumps(inv.document, indent=2, sort_keys=True))
    else:
        console.print(inventory_table(inv))
    return EXIT_OK
