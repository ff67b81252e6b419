"""transplant/core/data/families.json against the registry: every release the table names exists.

The listing is tests/data/registry-listing.json, written by scripts/registry-listing from
``pip --isolated index versions`` (date and command in the file). An entry the registry
does not have is a fact the table invented: the rule would flag real pairs and its hints
would name releases pip cannot install.
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from transplant.core.data import family_table

LISTING = json.loads((Path(__file__).parent / "data" / "registry-listing.json").read_text(encoding="utf-8"))
COMPANIONS = ("torchvision", "torchaudio", "triton")


def _exists(name: str, release: str, listing: dict) -> bool:
    """Whether the listing has ``release`` of ``name``: ``2.9`` is any 2.9.x, ``3.1.0`` exactly 3.1.0."""
    want = Version(release).release
    return any(Version(v).release[:len(want)] == want for v in listing["packages"][name]["versions"])


def absent(table: dict, listing: dict) -> list[str]:
    """``torch 2.14 -> torchaudio 2.14`` for every release the table names that the listing lacks
    (the torch release of each row too)."""
    out = []
    for torch, row in table["torch"].items():
        if not _exists("torch", torch, listing):
            out.append(f"torch {torch}")
        for name in COMPANIONS:
            if name in row and not _exists(name, row[name], listing):
                out.append(f"torch {torch} -> {name} {row[name]}")
    return out


def test_listing_is_recorded_with_its_date_and_commands():
    assert LISTING["date"] and LISTING["interpreter"]
    for name in ("torch", *COMPANIONS):
        entry = LISTING["packages"][name]
        assert entry["command"].endswith(f"index versions {name}") and "--isolated" in entry["command"]
        assert entry["versions"], name


def test_every_release_in_the_table_is_on_the_registry():
    assert absent(family_table(), LISTING) == []


def test_an_invented_entry_is_caught():
    # the table's old entries: torchaudio was never released past 2.11
    table = {"torch": {"2.14": {"torchvision": "0.29", "torchaudio": "2.14"},
                       "2.9": {"torchvision": "0.24", "torchaudio": "2.9", "triton": "3.5"},
                       "2.99": {"triton": "9.9.0"}}}
    assert absent(table, LISTING) == ["torch 2.14 -> torchaudio 2.14", "torch 2.99", "torch 2.99 -> triton 9.9.0"]
