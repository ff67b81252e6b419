"""Which names a distribution's modules are imported by (pure core): ``top_level.txt``, else RECORD."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from transplant.core.inventory import Distribution

__all__ = ["import_names", "record_tops", "SHARED_OBJECT"]

#: A shared object's file name: ``*.so`` or ``*.so.N[.M...]`` (the ELF soname convention).
SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


def record_tops(dist: Distribution) -> list[str]:
    """Top-level import names from RECORD: packages (folders holding ``.py`` files, PEP 420
    namespaces included), ``x.py`` modules and ``x.<suffix>.so`` extension modules."""
    tops: set[str] = set()
    for entry in dist.record or ():
        path = entry.record_path
        if path.startswith("../") or path.startswith("/"):
            continue
        head, sep, rest = path.partition("/")
        if sep:
            if head.endswith((".dist-info", ".data")) or head == "__pycache__":
                continue
            if rest.endswith(".py") and head.isidentifier():
                tops.add(head)
        elif path.endswith(".py") and path[:-3].isidentifier():
            tops.add(path[:-3])
        elif SHARED_OBJECT.search(path):
            name = path.split(".", 1)[0]
            if name.isidentifier():
                tops.add(name)
    return sorted(tops)


def import_names(dists: Iterable[Distribution], extra: Sequence[str] = ()) -> list[str]:
    """Import names to check: ``extra`` (``verify.imports``) first, in order, then each
    distribution's ``top_level.txt`` names (else its RECORD's top-level packages and modules),
    without duplicates. Names that are not identifiers (``tests/data``) are left out.
    """
    out: list[str] = []
    for name in extra:
        if name not in out:
            out.append(name)
    for dist in dists:
        names = [t for t in dist.top_level if t.isidentifier()] or record_tops(dist)
        for name in names:
            if name not in out:
                out.append(name)
    return out
