"""Quantities as people read them (pure core): byte counts in binary units, counted nouns."""

from __future__ import annotations

__all__ = ["human_bytes", "count"]


def human_bytes(count: int | None) -> str:
    """``1.5 MiB`` style text for a byte count (binary units, IEC 80000-13); ``-`` for None."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``, ``0 changes``: ``number`` and the noun, singular only for exactly 1.

    :param plural: the plural when it is not ``noun + "s"``.
    """
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
