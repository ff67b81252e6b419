"""The ``status``, ``recover`` and ``snapshot`` commands (face): recovery after a host failure.

The logic lives in :mod:`transplant.status`, :mod:`transplant.recover` and
:mod:`transplant.snapshot`; this module parses their options and prints their results.
``recover`` runs the ``plan``, ``apply`` and ``verify`` commands of :mod:`transplant.cli`.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.text import Text

from .apply import default_state_dir
from .cli import (EXIT_BLOCKED, EXIT_OK, UsageError, _cmd_apply, _cmd_plan, _cmd_verify, _ssh_options,
                  parse_location)
from .errors import HostError, TransplantError
from .hosts import SSHOptions, connect
from .hostspec import HostSpec
from .manifest import Endpoint
from .recipes import verified_log
from .files import load_manifest
from .render import human_bytes
from .reports import snapshots_table, status_table
from .snapshot import default_store

__all__ = ["status_command", "recover_command", "snapshot_command"]


def status_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant status HOST:VENV|MANIFEST``: print what was applied there and the drift (see
    :func:`transplant.status.read_status`); returns 0, or 3 when applied files drifted.

    :raises TransplantError: a bad location, an unreachable host, unreadable records.
    """
    from .status import read_status

    from .locations import resolve_location

    spec, venv, options, label = resolve_location(args.location, args.identity_file, args.known_hosts)
    with connect(spec, options) as host, console.status(f"reading {label}"):
        status = read_status(host, venv, say=lambda line: console.print(line, markup=False))
    for done in status.completed:
        console.print(done.describe(), markup=False)
    if args.json:
        print(json.dumps(status.to_dict(), indent=2, sort_keys=True))
        return EXIT_BLOCKED if status.drift else EXIT_OK
    if not status.transactions:
        console.print(f"{status.where}: transplant has applied nothing here (no committed transaction)", markup=False)
    else:
        console.print(status_table(status))
    for txid in status.unrecorded:
        console.print(f"[yellow]unrecorded[/] transaction {txid}: committed, but its outcome is not in the history yet "
                      f"(its controller died after the commit, or an apply is recording it now); the next apply or "
                      f"status records it")
    for txid in status.interrupted:
        console.print(f"[bold red]interrupted[/] transaction {txid}: finish it with apply --resume or undo it with "
                      f"apply --rollback")
    skipped = status.applied_paths - status.checked
    aside = (f" ({skipped} bytecode file(s) of the {status.applied_paths} applied paths are not compared: Python "
             f"rewrites them at import)") if skipped > 0 else ""
    if status.drift:
        console.print(f"[bold red]drift[/]: {len(status.drift)} of {status.checked} applied paths no longer match"
                      f"{aside}:")
        for line in status.drift[:50]:
            console.print(f"  {line}", markup=False, highlight=False)
    elif status.transactions:
        console.print(f"[bold green]no drift[/]: all {status.checked} applied paths match what was applied{aside}")
    return EXIT_BLOCKED if status.drift else EXIT_OK


def _recover_default(args: argparse.Namespace, console: Console, store: Path, by_history, by_snapshot):
    """The source when recover is given none: the states this controller saw verified
    (``<state>/verified.jsonl``), newest first: each from its host's history, or from the
    snapshot it was applied from when that host cannot be used; last, the newest snapshot in
    the store."""
    from .recipes import known_states
    from .recover import RecoverError
    from .snapshot import list_snapshots, load_snapshot

    say = (lambda line, style=None: console.print(line, style=style, markup=False, highlight=False))
    tried = []
    for entry in known_states(verified_log(default_state_dir())):
        where = f"{entry['host']}:{entry['venv']}"
        say(f"a state this controller saw verified: transaction {entry.get('transaction')} on {where}")
        keys = entry.get("ssh") if isinstance(entry.get("ssh"), dict) else {}
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
    from .recover import Recovery, from_history, from_snapshot
    from .snapshot import Snapshot, load_snapshot

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
    console.rule("recover: where from")

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
        from .registry_snapshot import open_registry

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
    common = dict(target=None, jobs=1, json=False)
    console.rule("recover: 1/3 plan")
    code = _cmd_plan(argparse.Namespace(manifest=str(recovery.manifest), out=None, **common), console)
    if code == EXIT_BLOCKED and not args.force:
        console.print("[bold red]recover stopped[/]: the plan is blocked; fix the findings or add --force")
        return code
    console.rule("recover: 2/3 apply")
    code = _cmd_apply(argparse.Namespace(source=str(recovery.manifest), yes=args.yes, force=args.force, resume=False,
                                         rollback=False, break_lock=False, verify=False, **common), console)
    if code != EXIT_OK:
        return code
    console.rule("recover: 3/3 verify")
    code = _cmd_verify(argparse.Namespace(manifest=str(recovery.manifest), **common), console)
    console.print(f"[bold green]recovered[/] {target}" if code == EXIT_OK else "[bold red]recover failed at verify[/]")
    return code


def snapshot_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant snapshot MANIFEST`` (capture the donor's overlay set), ``--list`` or
    ``--prune [ID...]``, in ``--out`` or :func:`transplant.snapshot.default_store`; returns 0.

    :raises TransplantError: bad options or manifest, an unreachable donor, a damaged store.
    """
    from .snapshot import capture, list_snapshots, prune

    if (args.out or "").startswith("oci://") or getattr(args, "push", None):
        from .registrycli import check_registry_options

        check_registry_options(args)
    if (args.out or "").startswith("oci://"):
        from .registrycli import registry_list_or_prune

        return registry_list_or_prune(args, console)
    store = Path(args.out) if args.out else default_store()
    if args.list or args.prune is not None:
        if args.manifest:
            raise UsageError("--list and --prune take no manifest")
        if args.list:
            snaps = list_snapshots(store)
            if args.json:
                print(json.dumps({"schema": "transplant.snapshots/1", "store": str(store), "snapshots": [
                    {"id": s.id, "path": str(s.path), "created": s.created, "donor": f"{s.donor_host}:{s.donor_venv}",
                     "dists": list(s.dists), "files": len(s.files), "bytes": s.size} for s in snaps]},
                    indent=2, sort_keys=True))
            else:
                if len(str(store)) > 40:
                    console.print(f"store: {store}", soft_wrap=True, markup=False, highlight=False)
                console.print(snapshots_table(snaps, str(store)))
                from .reports import snapshot_dists
                for line in snapshot_dists(snaps):
                    console.print(line, highlight=False)
            return EXIT_OK
        removed, objects, freed = prune(store, args.prune)
        console.print(f"pruned {len(removed)} snapshot(s) and {objects} stored file(s) no snapshot uses "
                      f"({human_bytes(freed)} freed) in {store}", markup=False)
        return EXIT_OK
    if not args.manifest:
        raise UsageError("give a manifest to snapshot its donor (or --list / --prune)")
    manifest = load_manifest(args.manifest)
    if not isinstance(manifest.donor, Endpoint):
        raise TransplantError(f"{manifest.path}: the donor is already a snapshot ({manifest.donor.path})",
                              hint="snapshot a manifest whose donor is a host")
    with ExitStack() as stack:
        with console.status(f"connecting to the donor {manifest.donor.host}"):
            donor = stack.enter_context(connect(manifest.donor.host, _ssh_options(manifest)))
        from .progress import step

        with step(console, f"snapshot of {manifest.donor} into {store}") as update:
            result = capture(manifest, donor, store, step=update)
    snap = result.snapshot
    pushed = None
    if getattr(args, "push", None):
        from .registrycli import push_snapshot

        pushed = push_snapshot(snap, args, console)
    if args.json:
        print(json.dumps({"schema": "transplant.snapshot-result/1", "id": snap.id, "path": str(snap.path),
                          "fetched": result.fetched, "reused": result.reused, "bytes_read": result.bytes_read,
                          "files": len(snap.files), "bytes": snap.size, **(pushed or {})}, indent=2, sort_keys=True))
    else:
        console.print(Text.assemble(("snapshot", "bold green"), (
            f" {snap.id} of {snap.donor_host}:{snap.donor_venv}: {len(snap.dists)} distribution(s), "
            f"{len(snap.files)} files ({human_bytes(snap.size)}); {result.fetched} read from the donor "
            f"({human_bytes(result.bytes_read)} on the wire), {result.reused} already stored; in "
            f"{result.seconds:.1f} s")))
        console.print("use it as the donor:")
        console.print(f"  donor: {{snapshot: {snap.path}}}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK
