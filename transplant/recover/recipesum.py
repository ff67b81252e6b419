"""The state a venv's history built, as one recipe (pure core): the sum of its transactions.

``transplant recover --from HOST:VENV`` rebuilds the state that was verified there, which is
what every committed transaction since the base left, not only the newest one's manifest: a
patch or a distribution an earlier transaction brought is still on that venv. The newest
recipe is the base of the sum (its settings, its verify block); each earlier one adds what the
later ones do not already say:

* ``overlay``: its entries not yet listed (names, globs, ``{closure: ...}`` alike), except a
  name a later ``remove`` matches (the later transaction uninstalled it);
* ``remove`` and ``accept``: its entries not yet listed, except a ``remove`` entry that a later
  overlay entry names again (the later transaction brought it back);
* patches: each of its patch files whose venv path no later transaction wrote, as a
  file-level patch (``{source, dest}``) whose local file is kept apart under
  ``earlier/<transaction id>/`` so two transactions' files of one name never collide.

A recipe is the dict :func:`transplant.recover.provenance.make_recipe` recorded: ``manifest`` (the manifest's
data), ``patches`` (``[{local, dest, venv_path, hash}]``).
"""

from __future__ import annotations

import copy
from fnmatch import fnmatchcase
from collections.abc import Sequence
from typing import Any

__all__ = ["sum_recipes"]


def _entries(manifest: dict[str, Any], key: str) -> list[Any]:
    value = manifest.get(key)
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def sum_recipes(recipes: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One recipe for the state ``recipes`` built, oldest first, each ``(transaction id, recipe)``.

    :returns: a new recipe (the inputs are not changed) with ``manifest`` and ``patches`` summed
        as the module docstring says, and ``summed``: the ids of the transactions it holds.
    :raises ValueError: no recipes.
    """
    if not recipes:
        raise ValueError("no recipes to sum")
    _, newest = recipes[-1]
    out = copy.deepcopy(newest)
    manifest = out.setdefault("manifest", {})
    patches = list(out.get("patches") or [])
    written = {p.get("venv_path") for p in patches if isinstance(p, dict)}
    overlay = _entries(manifest, "overlay")
    remove = _entries(manifest, "remove")
    accept = _entries(manifest, "accept")
    manifest_patches = _entries(manifest, "patches")
    for txid, recipe in reversed(recipes[:-1]):  # newer first: a later transaction's word stands
        data = found if isinstance(found := recipe.get("manifest"), dict) else {}
        later_overlay, later_remove = list(overlay), list(remove)
        overlay += [e for e in _entries(data, "overlay") if e not in overlay
                    and not (isinstance(e, str) and any(fnmatchcase(e, str(r)) for r in later_remove))]
        named = {e for e in later_overlay if isinstance(e, str)}
        remove += [e for e in _entries(data, "remove") if e not in remove and e not in named]
        accept += [e for e in _entries(data, "accept") if e not in accept]
        for p in recipe.get("patches") or []:
            if not isinstance(p, dict) or p.get("venv_path") in written or not isinstance(p.get("local"), str):
                continue
            written.add(p.get("venv_path"))
            local = f"earlier/{txid}/{p['local']}"
            patches.append({**p, "local": local})
            manifest_patches.append({"source": local, "dest": p.get("dest")})
    for key, value in (("overlay", overlay), ("remove", remove), ("accept", accept), ("patches", manifest_patches)):
        if value:
            manifest[key] = value
    out["patches"] = patches
    out["summed"] = [txid for txid, _ in recipes]
    return out
