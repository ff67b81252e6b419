"""``transplant snapshot`` (face): keep the donor's overlay set on the controller; list and prune snapshots."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle", "snapshot_command"]

HELP = "keep the donor's overlay set on the controller, for when the donor is gone"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``[MANIFEST]``, ``--out``, ``--list``, ``--prune``, ``--push``, ``--ca``, ``--json``."""
    parser.add_argument("manifest", nargs="?", help="the manifest whose donor and overlay to capture")
    parser.add_argument("--out", metavar="DIR",
                        help="the snapshot store (default: the state folder's snapshots/); with --list or --prune "
                             "also a registry repository, oci://REGISTRY/REPO (--prune then takes tags)")
    parser.add_argument("--list", action="store_true", help="list the snapshots in the store")
    parser.add_argument("--prune", nargs="*", metavar="ID", help="remove these snapshots, then every stored file no "
                        "snapshot uses")
    parser.add_argument("--push", metavar="oci://REGISTRY/REPO:TAG",
                        help="also push the snapshot to an OCI registry (one blob per distribution build)")
    parser.add_argument("--ca", metavar="PEM", help="CA bundle for the registry (default: the system CAs)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")



def snapshot_command(args: argparse.Namespace, console: Console) -> int:
    """``transplant snapshot MANIFEST`` (capture the donor's overlay set), ``--list`` or
    ``--prune [ID...]``, in ``--out`` or :func:`transplant.donor.snapshot.default_store`; returns 0.

    :raises TransplantError: bad options or manifest, an unreachable donor, a damaged store.
    """
    import json
    from contextlib import ExitStack
    from pathlib import Path

    from rich.text import Text

    from transplant.cli.reports import snapshots_table
    from transplant.cli.warm import ssh_options
    from transplant.controller.manifest_file import load_manifest
    from transplant.core.manifest import Endpoint
    from transplant.core.units import count, human_bytes
    from transplant.donor.snapshot import capture, default_store, list_snapshots, prune
    from transplant.errors import TransplantError, UsageError
    from transplant.exitcodes import EXIT_OK
    from transplant.hosts.connecting import connect

    if (args.out or "").startswith("oci://") or getattr(args, "push", None):
        from transplant.cli.commands.registry import check_registry_options

        check_registry_options(args)
    if (args.out or "").startswith("oci://"):
        from transplant.cli.commands.registry import registry_list_or_prune

        return registry_list_or_prune(args, console)
    store = Path(args.out).absolute() if args.out else default_store()  # rsync takes absolute roots
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
                from transplant.cli.reports import snapshot_dists
                for line in snapshot_dists(snaps):
                    console.print(line, highlight=False)
            return EXIT_OK
        removed, objects, freed = prune(store, args.prune)
        console.print(f"pruned {count(len(removed), 'snapshot')} and {count(objects, 'stored file')} no snapshot uses "
                      f"({human_bytes(freed)} freed) in {store}", markup=False)
        return EXIT_OK
    if not args.manifest:
        raise UsageError("give a manifest to snapshot its donor (or --list / --prune)")
    manifest = load_manifest(args.manifest)
    if not isinstance(manifest.donor, Endpoint):
        raise TransplantError(f"{manifest.path}: the donor is already a snapshot ({manifest.donor.path})",
                              hint="snapshot a manifest whose donor is a host")
    from transplant.controller.output_file import check_output_folder

    check_output_folder(store, option="--out", hint="name a folder you can write for the store, e.g. --out "
                                                    "snapshots (or leave --out out: the state folder's)")
    with ExitStack() as stack:
        with console.status(f"connecting to the donor {manifest.donor.host}"):
            donor = stack.enter_context(connect(manifest.donor.host, ssh_options(manifest)))
        from transplant.cli.progress import Shown, step

        with step(console, f"snapshot of {manifest.donor} into {store}") as update:
            result = capture(manifest, donor, store, reporter=Shown(step=update))
    snap = result.snapshot
    pushed = None
    if getattr(args, "push", None):
        from transplant.cli.commands.registry import push_snapshot

        pushed = push_snapshot(snap, args, console)
    if args.json:
        print(json.dumps({"schema": "transplant.snapshot-result/1", "id": snap.id, "path": str(snap.path),
                          "existing": result.existing,
                          "fetched": result.fetched, "reused": result.reused, "bytes_read": result.bytes_read,
                          "files": len(snap.files), "bytes": snap.size, **(pushed or {})}, indent=2, sort_keys=True))
    else:
        if result.existing:
            console.print(f"the store already holds this very content as snapshot {snap.id}: reused, "
                          f"no second index written", markup=False, highlight=False)
        console.print(Text.assemble(("snapshot", "bold green"), (
            f" {snap.id} of {snap.donor_host}:{snap.donor_venv}: {count(len(snap.dists), 'distribution')}, "
            f"{count(len(snap.files), 'file')} ({human_bytes(snap.size)}); {result.fetched} read from the donor "
            f"({human_bytes(result.bytes_read)} on the wire), {result.reused} already stored; in "
            f"{result.seconds:.1f} s")))
        console.print("use it as the donor:")
        console.print(f"  donor: {{snapshot: {snap.path}}}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK


#: ``transplant snapshot``'s handler, for the command table.
handle = snapshot_command
