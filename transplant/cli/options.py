"""Option groups several commands share (face), and the options one command gives another.

``recover`` runs ``plan``, ``apply`` and ``verify`` with :class:`CommandOptions` (the attributes
those commands read), never with a hand-built ``argparse.Namespace``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["fleet_options", "ssh_options", "yes_option", "break_lock_option", "location_argument", "CommandOptions"]


def fleet_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", metavar="HOST:VENV",
                   help="a target (repeat for several; replaces the manifest's target / targets)")
    p.add_argument("--jobs", type=_positive, default=4, metavar="N", help="targets worked on at a time (default 4)")


def _positive(text: str) -> int:
    """``--jobs``: a whole number of at least 1 (argparse turns the error into a usage error, exit 64)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value}")
    return value


def ssh_options(p: argparse.ArgumentParser, *, what: str = "") -> None:
    """``--identity-file`` and ``--known-hosts``, for a command that reaches hosts over SSH;
    ``what`` says which of its arguments they serve (``", for HOST:VENV"``), when not all."""
    p.add_argument("--identity-file", help=f"SSH private key{what} (default: ssh-agent and ~/.ssh/id_*)")
    p.add_argument("--known-hosts", help=f"known_hosts file to check host keys against{what} "
                   "(default ~/.ssh/known_hosts)")


@dataclass(kw_only=True)
class CommandOptions:
    """The options of ``plan``, ``apply`` and ``verify`` for one manifest and one target, as
    another command runs them: ``manifest`` / ``source`` the manifest's path; no saved plan, no
    JSON, no resume or rollback; ``yes`` and ``force`` as given."""

    manifest: str
    yes: bool = False
    force: bool = False
    out: str | None = None
    json: bool = False
    target: list[str] | None = None
    jobs: int = 1
    resume: bool = False
    rollback: bool = False
    break_lock: bool = False
    verify: bool = False

    @property
    def source(self) -> str:
        """``apply``'s name for the manifest."""
        return self.manifest


def yes_option(p: argparse.ArgumentParser, *, what: str = "") -> None:
    """``--yes``: no confirmation asked (``what`` says before which step, when not all)."""
    p.add_argument("--yes", action="store_true", help=f"do not ask for confirmation{what}")


def break_lock_option(p: argparse.ArgumentParser) -> None:
    """``--break-lock``, for a command that changes a target venv under its lock."""
    p.add_argument("--break-lock", action="store_true",
                   help="take the target's lock even if another controller holds it (only when that one is gone)")


def location_argument(p: argparse.ArgumentParser, *, example: str) -> None:
    """The positional ``HOST:VENV|MANIFEST`` of a command that reads one venv
    (:func:`transplant.cli.locations.parse_location`, or a manifest's target); ``example`` shows the form."""
    p.add_argument("location", metavar="HOST:VENV|MANIFEST",
                   help=f"e.g. {example}, or a manifest (its target, reached with its ssh settings)")
