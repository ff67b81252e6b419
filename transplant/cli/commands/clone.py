"""``transplant clone`` and apply's ``target.base`` step (face): run the clone, report what was
rewritten and what still names the old prefix. The CLI's own module keeps only the wiring."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from contextlib import ExitStack
from collections.abc import Callable
from typing import TYPE_CHECKING

from transplant.cli.options import ssh_options
from transplant.errors import TransplantError
from transplant.exitcodes import EXIT_BLOCKED, EXIT_OK

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.clone.cloning import CloneResult
    from transplant.core.hostspec import HostSpec
    from transplant.core.manifest import Manifest
    from transplant.hosts.host import Host

__all__ = ["HELP", "add_arguments", "handle", "clone_report", "clone_command", "clone_base", "pending_note",
           "saved_plan_refusal"]


HELP = "copy a venv to another path or host and rewrite what names its old prefix"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``SRC_HOST:VENV``, ``DEST_HOST:VENV``, ``--replace``, ``--json`` and the SSH options."""
    parser.add_argument("source", metavar="SRC_HOST:VENV", help="the venv to clone, e.g. local:/srv/venv_base")
    parser.add_argument("dest", metavar="DEST_HOST:VENV", help="where the clone goes (absent or an empty folder)")
    parser.add_argument("--replace", action="store_true",
                        help="delete a venv (a folder holding pyvenv.cfg) already at the destination first")
    parser.add_argument("--json", action="store_true", help="print the result (schema transplant.clone/1)")
    ssh_options(parser)


def handle(args: argparse.Namespace, console: Console) -> int:
    """``transplant clone``: :func:`clone_command`; returns 0, or 3 when a text file or symlink
    of the clone still names the old prefix."""
    from transplant.cli.locations import parse_location

    return EXIT_OK if clone_command(args, console, parse_location) else EXIT_BLOCKED

_SHOWN = 20


def _names(paths: tuple[str, ...], limit: int = _SHOWN) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more (--json lists all)" if len(paths) > limit else "")


def clone_report(console: Console, result: CloneResult) -> None:
    """Print a clone's result: the copy, the edits by kind, warnings, and leftovers.

    Text files and symlinks that still name the old prefix are printed as an error (the
    command exits 3); binary files as a warning with their names; bytecode (which needs no
    action) as a one-line note with its count.
    """
    from rich.text import Text

    from transplant.core.units import agree, count, human_bytes

    r, left = result.relocation, result.leftovers
    kinds = Counter(e.kind for e in r.edits)
    edited = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "no file"

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    say(f"copied {count(result.files, 'file')} ({human_bytes(result.bytes)}) from {result.source} to {result.dest} "
        f"with {result.method}")
    say(f"rewrote what named {r.old} ({edited}); repointed {count(len(r.links), 'symlink')}; updated "
        f"{count(len(result.records), 'RECORD file')} for the rewritten files")
    for line in result.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), line))
    other = tuple(p for p in left.binary if p not in left.bytecode)
    if other:
        console.print(Text.assemble(("warning: ", "yellow"), f"{count(len(other), 'binary file')} still "
                                    f"{agree(len(other), 'contains', 'contain')} {r.old}: {_names(other)}"))
    if left.bytecode:  # no action needed: a note, not a warning, and no file list
        one = len(left.bytecode) == 1
        say(f"note: {count(len(left.bytecode), 'bytecode file')} {'records' if one else 'record'} {r.old} as "
            f"{'its' if one else 'their'} source path; nothing to do, Python corrects it at import (--json lists "
            f"{'it' if one else 'them'})")
    if left.errors:
        if left.text:
            console.print(Text.assemble(("error: ", "bold red"), f"{count(len(left.text), 'text file')} of the clone still "
                                        f"{agree(len(left.text), 'names', 'name')} {r.old}: {_names(left.text)}"))
        if left.links:
            console.print(Text.assemble(("error: ", "bold red"), f"{count(len(left.links), 'symlink')} of the clone still "
                                        f"{agree(len(left.links), 'points', 'point')} into {r.old}: {_names(left.links)}"))
        console.print(Text.assemble(("hint: ", "bold"), f"edit those files in {r.new} so they name {r.new}, or "
                                    f"delete the clone (rm -rf {shlex.quote(r.new)}) and fix them in the source first"))
        return
    console.print(Text.assemble(("cloned", "bold green"), f" in {result.seconds:.1f} s: no text file or symlink of "
                                f"{result.dest} names {r.old}"))


def clone_command(args: argparse.Namespace, console: Console,
                  parse_location: Callable[[str], tuple[HostSpec, str]]) -> bool:
    """``transplant clone SRC DEST [--replace] [--json]``.

    :param parse_location: the CLI's ``HOST:VENV`` parser (raises its usage error).
    :returns: True when no text file or symlink of the clone names the old prefix.
    :raises TransplantError: as :func:`transplant.clone.cloning.clone`.
    """
    from transplant.cli.progress import Shown
    from transplant.clone.cloning import clone
    from transplant.controller.state import default_state_dir
    from transplant.hosts.host import SSHOptions
    from transplant.hosts.connecting import connect

    (src_spec, src_venv), (dst_spec, dst_venv) = parse_location(args.source), parse_location(args.dest)
    options = SSHOptions.from_files(args.identity_file, args.known_hosts)
    with ExitStack() as stack:
        src = stack.enter_context(connect(src_spec, options))
        dst = src if dst_spec == src_spec else stack.enter_context(connect(dst_spec, options))
        with console.status("cloning") as status:
            result = clone(src, src_venv, dst, dst_venv, state_dir=default_state_dir(), replace=args.replace,
                           reporter=Shown(note=status.update, step=status.update))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        clone_report(console, result)
    return not result.leftovers.errors


def clone_base(args: argparse.Namespace, console: Console, manifest: Manifest, base_host: Host,
               target_host: Host) -> None:
    """apply's ``target.base`` step: clone the base venv to the (absent) target venv, asking
    first unless ``--yes``.

    :raises TransplantError: the clone was declined or could not be asked for, failed, or left
        text files or symlinks naming the base's prefix (the overlay must not run then).
    """
    from transplant.cli.progress import Shown
    from transplant.clone.cloning import clone
    from transplant.controller.state import default_state_dir

    base, target = manifest.target.base, manifest.target
    assert base is not None
    console.print(f"target.base: {target} does not exist; cloning {base} to it first", markup=False)
    if not args.yes:
        if not sys.stdin.isatty():
            raise TransplantError("apply needs confirmation and standard input is not a terminal",
                                  hint=f"add --yes: transplant apply {shlex.quote(args.source)} --yes")
        if console.input("clone it now (the overlay's plan is shown after)? \\[y/N] ").strip().lower() not in ("y", "yes"):
            raise TransplantError("nothing was changed: the clone was declined")
    with console.status("cloning target.base") as status:
        result = clone(base_host, base.venv, target_host, target.venv, state_dir=default_state_dir(),
                       reporter=Shown(note=status.update, step=status.update))
    clone_report(console, result)
    if result.leftovers.errors:
        raise TransplantError(f"the clone {target} still names {base.venv} in files transplant cannot rewrite "
                              f"(listed above); the overlay was not applied",
                              hint=f"edit those files in {target.venv}, then run the same apply again")


def pending_note(manifest: Manifest) -> str:
    """What ``plan`` says while ``target.base`` will be cloned first."""
    return (f"target.base: {manifest.target} does not exist; apply first clones {manifest.target.base} to it (as "
            f"transplant clone does), then applies the overlay below, planned here against {manifest.target.base}")


def saved_plan_refusal(manifest: Manifest) -> TransplantError:
    """Why ``plan --out`` is refused while ``target.base`` will be cloned first."""
    return TransplantError(f"target.base: {manifest.target} does not exist yet, so a saved plan would not match it "
                           f"after the clone", hint=f"apply the manifest itself (transplant apply "
                           f"{shlex.quote(manifest.path)}), or clone first: transplant clone {manifest.target.base} "
                           f"{manifest.target}")
