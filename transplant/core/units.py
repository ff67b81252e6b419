"""Quantities as people read them (pure core): byte counts in binary units, counted nouns, text
cut to a length at a word boundary."""

from __future__ import annotations

__all__ = ["human_bytes", "count", "agree", "clip", "visible", "visible_lines"]


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


def agree(number: int, one: str, many: str) -> str:
    """``one`` for exactly 1, else ``many``: the verb or pronoun that goes with a count
    (``agree(n, "differs", "differ")``)."""
    return one if number == 1 else many


def clip(text: str, width: int) -> str:
    """``text`` whole when it has at most ``width`` characters, else cut at the last blank
    that leaves room for ``...`` (the cut's trailing punctuation dropped), so that no word is
    cut in two; a text with no blank in its first ``width - 3`` characters is returned whole
    (one long word, a path: cutting it would change what it names).

    :param width: the most characters wanted, ``...`` included (at least 4).
    """
    if len(text) <= width:
        return text
    head = text[:width - 3]
    if text[width - 3].isspace():  # the cut falls on a blank: the last word is whole
        at = len(head)
    else:
        at = head.rfind(" ")
        if at <= 0:
            return text
    return head[:at].rstrip(" ;,:") + "..."


def visible(text: str, limit: int = 300) -> str:
    """``text`` from a host, for a message: at most ``limit`` characters, each control or other
    unprintable character shown as its escape (``\\x1b``), so nothing it holds acts on a terminal."""
    shown = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def visible_lines(text: str) -> str:
    """``text`` whole with each control or other unprintable character but the line break shown as
    its escape (``\\x1b``, ``\\u202e``, a non-UTF-8 byte's ``\\udcff``), so nothing it holds acts on a
    terminal (an escape sequence repaints or retitles it; a bidirectional override reorders what is
    read); text without such characters is returned as it is (one check per line)."""
    if text.isprintable():
        return text
    return "\n".join(line if line.isprintable() else
                     "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in line)
                     for line in text.split("\n"))
