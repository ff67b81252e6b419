"""The registry side of the ``snapshot`` command (face): ``--push``, and ``--list`` / ``--prune``
with ``--out oci://REGISTRY/REPO``. The logic lives in :mod:`transplant.donor.registry_snapshot`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from transplant.cli.progress import Shown
from transplant.errors import UsageError
from transplant.exitcodes import EXIT_OK
from transplant.donor.oci import Reference
from transplant.donor.registry_snapshot import client_for, list_registry, prune_registry, push
from transplant.core.units import count, human_bytes
from transplant.donor.snapshot import Snapshot

__all__ = ["check_registry_options", "push_snapshot", "registry_list_or_prune"]


def check_registry_options(args: argparse.Namespace) -> None:
    """Refuse option mixes that mean nothing (before any donor is read).

    :raises UsageError: ``--push`` with ``--list``/``--prune``, a bad reference, a registry ``--out``
        without ``--list``/``--prune``.
    """
    if args.push and (args.list or args.prune is not None):
        raise UsageError("--push takes a manifest to snapshot, not --list or --prune",
                         hint="list a registry with: transplant snapshot --list --out oci://REGISTRY/REPO")
    if args.push:
        try:
            ref = Reference.parse(args.push)
        except ValueError as exc:
            raise UsageError(f"--push: {exc}") from None
        if ref.tag is None:
            raise UsageError(f"--push {args.push}: name a tag (oci://REGISTRY/REPO:TAG)")
    if (args.out or "").startswith("oci://"):
        if not (args.list or args.prune is not None):
            raise UsageError("--out oci://... is for --list and --prune; push a snapshot with --push oci://REGISTRY/REPO:TAG")
        try:
            Reference.parse(args.out, need_version=False)
        except ValueError as exc:
            raise UsageError(f"--out: {exc}") from None


def _ca(args: argparse.Namespace) -> Path | None:
    if not args.ca:
        return None
    path = Path(args.ca).expanduser()
    if not path.is_file():
        raise UsageError(f"--ca {args.ca}: no such file", hint="name a PEM file of CA certificates")
    return path


def push_snapshot(snap: Snapshot, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Push ``snap`` to ``args.push``; prints a line (unless ``--json``) and returns the JSON keys
    ``pushed`` (the pinned reference), ``bytes_uploaded``, ``blobs_uploaded``, ``blobs_present``.

    :raises RegistryError: the registry refused or could not be reached."""
    ref = Reference.parse(args.push)
    client = client_for(ref, _ca(args))
    with console.status(f"pushing to {ref}") as status:
        result = push(snap, ref, client, reporter=Shown(step=status.update))
    if not args.json:
        console.print(f"pushed {snap.id} to {result.reference}: {human_bytes(result.bytes_uploaded)} uploaded, "
                      f"{count(result.uploaded, 'blob')} sent, {result.present} already in the registry; use it as the "
                      f"donor: donor: {{snapshot: {result.reference}}}", markup=False, highlight=False)
    return {"pushed": str(result.reference), "bytes_uploaded": result.bytes_uploaded,
            "blobs_uploaded": result.uploaded, "blobs_present": result.present}


def registry_list_or_prune(args: argparse.Namespace, console: Console) -> int:
    """``snapshot --list --out oci://REGISTRY/REPO`` (the tags that hold snapshots) or
    ``--prune TAG... --out oci://...`` (their manifests deleted by digest); returns 0.

    :raises TransplantError: bad options, an unreachable registry, deletes disabled there."""
    if args.manifest:
        raise UsageError("--list and --prune take no manifest")
    ref = Reference.parse(args.out, need_version=False)
    client = client_for(ref, _ca(args))
    if args.list:
        found = list_registry(client)
        if args.json:
            print(json.dumps({"schema": "transplant.snapshots/1", "store": args.out, "snapshots": [
                {"tag": s.tag, "digest": s.digest, "id": s.id, "donor": s.donor, "created": s.created,
                 "layers": s.layers, "bytes": s.bytes, "reference": f"{args.out.rstrip('/')}@{s.digest}"}
                for s in found]}, indent=2, sort_keys=True))
            return EXIT_OK
        table = Table(title=f"snapshots in {args.out}")
        for column in ("tag", "id", "donor", "created", "blobs", "size", "digest"):
            table.add_column(column)
        for s in found:
            table.add_row(s.tag, s.id or "", s.donor or "", s.created or "", str(s.layers), human_bytes(s.bytes),
                          s.digest[:19])
        console.print(table)
        return EXIT_OK
    if not args.prune:
        raise UsageError("--prune with a registry takes the tags to delete",
                         hint=f"list them: transplant snapshot --list --out {args.out}")
    done = prune_registry(client, args.prune)
    for tag, digest in done:
        console.print(f"deleted {tag} ({digest}) from {args.out}", markup=False, highlight=False)
    console.print("the registry frees blobs no manifest uses when its garbage collector runs", markup=False)
    return EXIT_OK
