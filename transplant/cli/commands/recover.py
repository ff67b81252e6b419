"""``transplant recover`` (face): rebuild the last verified state on a new host after a host failure.

The logic lives in :mod:`transplant.recover.status`, :mod:`transplant.recover.rebuild` and
:mod:`transplant.donor.snapshot`; this module parses their options and prints their results.
``recover`` runs the ``plan``, ``apply`` and ``verify`` commands (:mod:`transplant.cli.commands`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from transplant.cli.options import ssh_options, yes_option

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.donor.snapshot import Snapshot
    from transplant.recover.rebuild import Recovery

__all__ = ["HELP", "add_arguments", "handle", "recover_command"]

HELP = "rebuild the last verified state on a new host: plan, apply, verify"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target`` (required), ``--from``, ``--snapshot``, ``--ca``, ``--out``, ``--yes``,
    ``--force`` and the SSH options."""
    parser.add_argument("--target", required=True, metavar="HOST[:VENV]",
                        help="the host to rebuild on (the venv defaults to the source's path)")
    parser.add_argument("--from", dest="source_host", metavar="HOST:VENV",
                        help="a venv whose history holds the state (its newest applied and verified transaction)")
    parser.add_argument("--snapshot", metavar="ID|PATH|oci://REGISTRY/REPO:TAG",
                        help="a snapshot (without --from or --snapshot: the last state this controller saw "
                             "verified, from its host or, when that is gone, its snapshot; else the newest snapshot "
                             "in the store)")
    parser.add_argument("--ca", metavar="PEM",
                        help="CA bundle for an oci:// snapshot's registry (default: the system CAs)")
    parser.add_argument("--out", metavar="DIR", help="the snapshot store (default: the state folder's snapshots/)")
    yes_option(parser, what=" before apply")
    parser.add_argument("--force", action="store_true",
                        help="go on despite error findings, or a source whose applied files drifted")
    ssh_options(parser)



def _recover_default(args: argparse.Namespace, console: Console, store: Path, by_history, by_snapshot):
    """The source when recover is given none: the states this controller saw verified
    (``<state>/verified.jsonl``), newest first: each from its host's history, or from the
    snapshot it was applied from when that host cannot be used; last, the newest snapshot in
    the store."""
    from transplant.controller.state import default_state_dir
    from transplant.core.hostspec import HostSpec
    from transplant.donor.snapshot import list_snapshots, load_snapshot
    from transplant.errors import HostError, TransplantError
    from transplant.hosts.host import SSHOptions
    from transplant.recover.provenance import known_states, verified_log
    from transplant.recover.rebuild import RecoverError

    def say(line: str, style: str | None = None) -> None:
        console.print(line, style=style, markup=False, highlight=False)

    tried = []
    for entry in known_states(verified_log(default_state_dir())):
        where = f"{entry['host']}:{entry['venv']}"
        say(f"a state this controller saw verified: transaction {entry.get('transaction')} on {where}")
        keys = found if isinstance(found := entry.get("ssh"), dict) else {}
        options = SSHOptions.from_files(args.identity_file, args.known_hosts) if (args.identity_file or args.known_hosts) else SSHOptions(
            identity_file=Path(keys["identity_file"]) if keys.get("identity_file") else None,
            known_hosts=Path(keys["known_hosts"]) if keys.get("known_hosts") else None)
        try:
            return by_history(HostSpec.parse(entry["host"]), entry["venv"], options)
        except (HostError, RecoverError) as exc:
            say(f"{where} cannot be used: {exc.message.splitlines()[0]}", "yellow")
            tried.append(f"{where}: {exc.message.splitlines()[0]}")
        if entry.get("snapshot"):
            try:
                snap = load_snapshot(entry["snapshot"])
            except TransplantError as exc:
                say(f"nor the snapshot it was applied from: {exc.message.splitlines()[0]}", "yellow")
                tried.append(exc.message.splitlines()[0])
                continue
            say(f"using the snapshot it was applied from: {entry['snapshot']}")
            return by_snapshot(snap)
    every = list_snapshots(store)
    if not every:
        raise TransplantError("nothing to recover from: " + ("; ".join(tried) if tried else
                              f"no verified state recorded on this controller and no snapshot in {store}"),
                              hint="name a host that holds the state with --from HOST:VENV, or a snapshot with "
                                   "--snapshot")
    say(f"the newest snapshot in {store}: {every[-1].id}")
    return by_snapshot(every[-1])


def recover_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant recover --target HOST[:VENV]``: find the source (``--from``, ``--snapshot``, or
    the states this controller saw verified, then the newest snapshot), write its manifest under
    the state folder, then run plan, apply and verify on it. Returns the exit code of the first
    step that did not succeed (plan blocked 3, apply 1 or 3, verify 3), else 0.

    :raises TransplantError: bad options, nothing to recover from, a refused source.
    """
    from transplant.cli.commands.apply import apply_command
    from transplant.cli.commands.plan import plan_command
    from transplant.cli.commands.verify import verify_command
    from transplant.cli.options import CommandOptions
    from transplant.cli.render import rule
    from transplant.cli.locations import parse_location
    from transplant.controller.state import default_state_dir
    from transplant.core.hostspec import HostSpec
    from transplant.core.manifest import Endpoint
    from transplant.donor.snapshot import default_store, load_snapshot
    from transplant.errors import TransplantError, UsageError
    from transplant.exitcodes import EXIT_BLOCKED, EXIT_OK
    from transplant.hosts.host import SSHOptions
    from transplant.hosts.connecting import connect
    from transplant.recover.rebuild import from_history, from_snapshot

    if args.source_host and args.snapshot:
        raise UsageError("--from and --snapshot exclude each other")
    store = Path(args.out) if args.out else default_store()
    ssh = {k: str(Path(v).absolute()) for k, v in (("identity_file", args.identity_file),
                                                    ("known_hosts", args.known_hosts)) if v}
    spec_text, sep, venv_text = args.target.partition(":/")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in venv_text):
        raise UsageError(f"--target {args.target!r}: the venv path holds a control character (a newline, a tab...)",
                         hint="write HOST or HOST:/path/to/venv on one line")
    try:
        spec = HostSpec.parse(spec_text)
    except ValueError as exc:
        raise UsageError(f"--target {args.target!r}: {exc}", hint="write HOST or HOST:/path/to/venv") from None
    rule(console, "recover: where from")

    def by_history(where: HostSpec, venv: str, options: SSHOptions) -> tuple[Recovery, Endpoint]:
        target = Endpoint(host=spec, venv="/" + venv_text if sep else venv)
        # the manifest's SSH settings are the controller's: the command line's, else those that reached the source
        mine = ssh or {k: str(Path(v).absolute()) for k, v in (("identity_file", options.identity_file),
                                                             ("known_hosts", options.known_hosts)) if v}
        with connect(where, options) as old, console.status(f"reading the history of {where}:{venv}"):
            return from_history(old, venv, target, default_state_dir(), ssh=mine, force=args.force), target

    def by_snapshot(snap: Snapshot, donor: dict | None = None) -> tuple[Recovery, Endpoint]:
        target = Endpoint(host=spec, venv="/" + venv_text if sep else snap.donor_venv)
        return from_snapshot(snap, target, default_state_dir(), ssh=ssh, donor=donor), target

    if args.source_host:
        recovery, target = by_history(*parse_location(args.source_host), SSHOptions.from_files(args.identity_file, args.known_hosts))
    elif args.snapshot and args.snapshot.startswith("oci://"):  # each target pulls from the registry itself
        from transplant.donor.registry_snapshot import open_registry

        ca = str(Path(args.ca).absolute()) if getattr(args, "ca", None) else None
        with open_registry(args.snapshot, ca=ca) as source:
            recovery, target = by_snapshot(source.snapshot, {"snapshot": str(source.reference),
                                                             **({"ca": ca} if ca else {})})
    elif args.snapshot:
        recovery, target = by_snapshot(load_snapshot(args.snapshot, store=store))
    else:
        recovery, target = _recover_default(args, console, store, by_history, by_snapshot)
    console.print(f"rebuilding {recovery.origin} on {target}; the manifest for it: {recovery.manifest}",
                  markup=False, highlight=False)
    options = CommandOptions(manifest=str(recovery.manifest), yes=args.yes, force=args.force)
    if not args.yes and not sys.stdin.isatty():  # apply would ask, and its own hint would skip verify
        raise TransplantError("recover needs confirmation before it applies, and standard input is not a terminal",
                              hint="add --yes to this recover command (it plans, applies and verifies; "
                                   f"nothing was changed on {target})")
    rule(console, "recover: 1/3 plan")
    code = plan_command(options, console)  # type: ignore[arg-type]  # CommandOptions stands in for the parsed Namespace
    if code == EXIT_BLOCKED and not args.force:
        console.print("[bold red]recover stopped[/]: the plan is blocked; fix the findings or add --force")
        return code
    rule(console, "recover: 2/3 apply")
    code = apply_command(options, console)  # type: ignore[arg-type]  # CommandOptions stands in for the parsed Namespace
    if code != EXIT_OK:
        return code
    rule(console, "recover: 3/3 verify")
    code = verify_command(options, console)  # type: ignore[arg-type]  # CommandOptions stands in for the parsed Namespace
    console.print(f"[bold green]recovered[/] {target}" if code == EXIT_OK else "[bold red]recover failed at verify[/]")
    return code


#: ``transplant recover``'s handler, for the command table.
handle = recover_command
