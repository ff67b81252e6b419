"""``transplant history`` (face): list the transactions recorded in the target venv. The work is
:func:`transplant.cli.commands.apply.history_command`, beside the apply that records them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from transplant.cli.options import ssh_options

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle"]

HELP = "list the transactions recorded in the target venv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``MANIFEST|HOST:VENV``, ``--json`` and the SSH options."""
    parser.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                        help="the manifest whose target to read, or the venv itself (local:/srv/venv)")
    parser.add_argument("--json", action="store_true", help="print them as JSON (schema transplant.history/1)")
    ssh_options(parser, what=", for HOST:VENV")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``transplant history``: see :func:`transplant.cli.commands.apply.history_command`."""
    from transplant.cli.commands.apply import history_command

    return history_command(args, console)
