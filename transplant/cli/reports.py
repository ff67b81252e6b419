"""Renderers for snapshots, fleets and status (face): rich tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from transplant.core.units import human_bytes

__all__ = ["snapshots_table", "stamp", "status_table"]


def stamp(seconds: float | None) -> str:
    """``2026-11-30 17:15:00 UTC`` for seconds since the epoch; ``?`` for None or nonsense."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds)) if isinstance(seconds, (int, float)) \
            else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def snapshots_table(snapshots: Sequence[Any], store: str) -> Table:
    """One row per snapshot: id, when, donor, distributions, files, bytes."""
    table = Table(title=f"snapshots in {store}", title_justify="left")
    for column in ("id", "taken", "donor", "distributions", "files", "bytes"):
        table.add_column(column)
    for s in snapshots:
        table.add_row(Text(s.id), stamp(s.created), Text(f"{s.donor_host}:{s.donor_venv}"),
                      Text(", ".join(s.dists)), str(len(s.files)), human_bytes(s.size))
    return table


def status_table(status: Any) -> Table:
    """One row per committed transaction: id, applied when, from where, verified, files."""
    table = Table(title=f"applied in {status.where}", title_justify="left")
    for column in ("transaction", "applied", "from", "verified", "paths"):
        table.add_column(column)
    for t in status.transactions:
        verified = {None: "not verified", True: "passed", False: "failed"}[t.verified]
        table.add_row(Text(t.id), stamp(t.applied), Text(t.source + (f"\nmanifest {t.manifest}" if t.manifest else "")),
                      Text(verified, style={"passed": "green", "failed": "bold red"}.get(verified, "yellow")),
                      str(t.files))
    return table
