"""``transplant inventory HOST:VENV`` (face): print what a venv holds."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from transplant.cli.render import inventory_table
from transplant.cli.session import parse_location
from transplant.exitcodes import EXIT_OK
from transplant.hosts.host import SSHOptions, connect
from transplant.hosts.probing import take_inventory

__all__ = ["inventory_command"]


def inventory_command(args: argparse.Namespace, console: Console) -> int:
    spec, venv = parse_location(args.location)
    options = SSHOptions.from_files(args.identity_file, args.known_hosts)
    with connect(spec, options) as host, console.status(f"probing {args.location}"):
        inv = take_inventory(host, venv, hash_patterns=args.hash or ())
    if args.json:
        print(json.dumps(inv.document, indent=2, sort_keys=True))
    else:
        console.print(inventory_table(inv))
    return EXIT_OK
