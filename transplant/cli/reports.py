"""Renderers for snapshots, fleets and status (face): rich tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from transplant.core.units import human_bytes

__all__ = ["snapshots_table", "snapshot_dists", "stamp", "status_table"]


def stamp(seconds: float | None) -> str:
    """``2026-11-30 17:15:00 UTC`` for seconds since the epoch; ``?`` for None or nonsense."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds)) if isinstance(seconds, (int, float)) \
            else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def snapshots_table(snapshots: Sequence[Any], store: str) -> Table:
    """One row per snapshot: id (never cut), when, distributions (count), files, bytes; the donor and
    the names follow below the table (:func:`snapshot_dists`)."""
    table = Table(title="snapshots in the store (its path above)" if len(store) > 40 else f"snapshots in {store}",
                  title_justify="left")
    longest = max((len(s.id) for s in snapshots), default=2)
    table.add_column("id", no_wrap=True, min_width=longest)  # an id is typed back whole (--prune ID, donor: {snapshot: ID})
    for column in ("taken (UTC)", "dists", "files", "bytes"):
        table.add_column(column, no_wrap=True)
    for s in snapshots:
        # the donor and the distributions are said below the table (snapshot_dists): a path and
        # names are never cut or folded inside a cell
        taken = stamp(s.created).removesuffix(" UTC")[:16]
        table.add_row(Text(s.id), taken, str(len(s.dists)), str(len(s.files)), human_bytes(s.size))
    return table


def snapshot_dists(snapshots: Sequence[Any]) -> list[Text]:
    """One line per snapshot below its table: ``ID from DONOR: name, name, ...`` (wrapped between words only)."""
    return [Text(f"{s.id}", style="bold") + Text(f" from {s.donor_host}:{s.donor_venv}: " + ", ".join(s.dists))
            for s in snapshots]


def status_table(status: Any) -> Group:
    """One row per committed transaction: id, applied when, from where, verified, files."""
    table = Table(title=f"applied in {status.where}", title_justify="left")
    longest = max((len(t.id) for t in status.transactions), default=11)
    table.add_column("transaction", no_wrap=True, min_width=longest)  # typed back whole (rollback --to ID)
    for column in ("applied", "verified", "paths"):
        table.add_column(column, no_wrap=column in ("verified", "paths"))
    for t in status.transactions:
        verified = {None: "not verified", True: "passed", False: "failed"}[t.verified]
        table.add_row(Text(t.id), stamp(t.applied),
                      Text(verified, style={"passed": "green", "failed": "bold red"}.get(verified, "yellow")),
                      str(t.files))
    # where each came from (host and venv paths, the manifest's path) below the table, whole
    lines = [Text(f"{t.id} from {t.source}" + (f", manifest {t.manifest}" if t.manifest else ""))
             for t in status.transactions]
    return Group(table, *lines)
