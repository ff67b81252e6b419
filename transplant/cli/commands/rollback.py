"""``transplant rollback`` (face): restore the target to the state before its newest (or every
later) transaction. The work is :func:`transplant.cli.commands.apply.rollback_command`, beside
the apply it undoes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from transplant.cli.options import break_lock_option, ssh_options, yes_option

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle"]

HELP = "restore the target to the state before its newest (or every later) transaction"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``MANIFEST|HOST:VENV``, ``--to``, ``--force``, ``--yes``, ``--break-lock`` and the SSH options."""
    parser.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                        help="the manifest whose target to roll back, or the venv itself (local:/srv/venv, "
                             "root@gpu-07:/root/venv): its transactions are recorded in it")
    parser.add_argument("--to", metavar="ID", help="undo every transaction after this one (see 'transplant history')")
    parser.add_argument("--force", action="store_true", help="roll back even if files changed since the transaction")
    yes_option(parser)
    break_lock_option(parser)
    ssh_options(parser, what=", for HOST:VENV")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``transplant rollback``: see :func:`transplant.cli.commands.apply.rollback_command`."""
    from transplant.cli.commands.apply import rollback_command

    return rollback_command(args, console)
