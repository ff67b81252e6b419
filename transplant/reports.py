"""Renderers for snapshots, fleets and status (face): rich tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from .render import human_bytes

__all__ = ["snapshots_table", "stamp"]


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
