"""``target-record-missing``: a target distribution without RECORD that apply replaces or
removes, and the stale extension module such a replacement leaves behind (pure core).

A distribution installed by conda or another tool may have a dist-info folder without
RECORD, so nobody knows its files. pip refuses to uninstall it ("Cannot uninstall X,
RECORD file not found"; pip's ``UninstallMissingRecord`` error, which adds "Hint: The
package was installed by conda." from INSTALLER). Apply would do worse without this
rule: copy the new version's files over it, remove nothing of the old one, and leave
the old version's files in the package folder, where an old extension module
(``mod.cpython-311-x86_64-linux-gnu.so``) shadows the new ``mod.py`` (Python's path
finder tries extension modules before source files: ``importlib.machinery`` loaders in
``_get_supported_file_loaders`` order). So the plan blocks (error) until the target's
copy is removed by the tool that installed it; with ``--force`` or ``accept:`` apply
goes on, and verify's ``library-provenance`` stage names each imported extension module
that sits beside a ``.py`` of its module name that another RECORD (or none) owns
(:func:`stale_extension_modules`).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from transplant.core.inventory import Distribution, Inventory
from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe
from transplant.core.units import agree, count

__all__ = ["recordless_findings", "stale_extension_modules", "judge_stale_modules"]


def _folders(dist: Distribution, site: str) -> list[str]:
    """Venv-relative top-level package folders and modules of a RECORD-less distribution
    (``top_level.txt``; else the normalised name with ``-`` as ``_``), then its dist-info folder."""
    tops = [t for t in dist.top_level if t and t.isidentifier()] or [dist.name.replace("-", "_")]
    return [f"{site}/{t}" for t in tops] + [dist.dist_info]


def recordless_findings(env: EnvironmentAfter) -> list[Finding]:
    """One error per target distribution without RECORD (with METADATA, and no other dist-info
    folder of its name with a RECORD: a leftover folder beside an installed one is
    ``duplicate-dist-info``'s) that the overlay replaces or the manifest's ``remove`` list uninstalls (``dists`` = its name, ``files`` = its
    ``top_level.txt`` folders and dist-info folder, venv-relative). Severity is always
    *error*: apply would write over files it cannot list and leave the old ones
    (the donor principle does not apply: the donor's copy has a RECORD)."""
    out = []
    site = env.target.site_packages
    by_name = env.target.by_name()
    for name in sorted(set(env.overlaid) | set(env.removed)):
        olds = by_name.get(name, [])
        if any(d.record is not None for d in olds):
            continue  # another folder of the name has a RECORD: a leftover folder is duplicate-dist-info's
        for old in (d for d in olds if d.metadata_present):
            by = f"installed by {old.installer}" if old.installer else "its installer unknown (no INSTALLER)"
            files = _folders(old, site)
            prefix = env.target.interpreter.prefix.rstrip("/")
            doing = "replaces" if name in env.overlaid else "removes (remove:)"
            fix = (f"conda remove --force {name} (in the environment that installed it)"
                   if (old.installer or "").strip().lower() == "conda" else
                   "uninstall it with the tool that installed it")
            out.append(Finding(
                code="target-record-missing", severity="error", dists=(name,),
                message=f"{describe(old)} on the target has no RECORD ({by}), so its files are unknown: the plan "
                        f"{doing} it, but apply could remove none of the old version's files, and an old extension "
                        f"module left in {', '.join(files[:-1])} would shadow the new .py of the same name; pip "
                        f"refuses to uninstall it for the same reason (RECORD file not found)",
                hint=f"on the target, {fix}, or delete its folders "
                     f"({shlex.join(['rm', '-r', *(prefix + '/' + f for f in files)])}), then plan again",
                files=tuple(files),
            ))
    return out


def _relative(path: str, roots: Sequence[str]) -> str | None:
    for root in roots:
        root = root.rstrip("/")
        if root and path.startswith(root + "/"):
            return path[len(root) + 1:]
    return None


def stale_extension_modules(report: Mapping[str, Any], inventory: Inventory) -> list[dict[str, str]]:
    """Imported extension modules that sit beside a ``.py`` of the same module name in one
    folder where no one RECORD lists both (the extension listed by none, or by another
    distribution than the source): the leftover of a distribution replaced without its RECORD.

    A pair one RECORD lists (mypyc-compiled packages ship ``md.py`` beside
    ``md.cpython-311-x86_64-linux-gnu.so``) is the package's own and is not reported.

    :param report: the library-provenance script's report; its ``beside_source`` is a list
        of ``[extension, source]`` real paths (absent in an older script's report: then []).
    :param inventory: the target's inventory after apply (RECORD paths, venv-relative).
    :returns: ``[{"extension", "source", "extension_owner", "source_owner"}]`` with
        venv-relative paths, owners a distribution name or ``""`` (no RECORD lists it), sorted.
    """
    roots = [str(report.get("prefix_real") or ""), str(report.get("prefix") or "")]
    pairs = []
    for pair in report.get("beside_source") or ():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            continue
        ext, src = (_relative(str(p), roots) for p in pair)
        if ext is not None and src is not None:
            pairs.append((ext, src))
    if not pairs:  # the usual case: no RECORD to read (a CUDA stack's RECORDs list 80,000 files)
        return []
    wanted = {path for pair in pairs for path in pair}
    owner: dict[str, str] = {}  # the first distribution whose RECORD lists each wanted path
    for dist in inventory.distributions:
        for path in wanted.intersection(dist.files):
            owner.setdefault(path, dist.name)
    out = []
    for ext, src in pairs:
        mine, theirs = owner.get(ext, ""), owner.get(src, "")
        if mine and mine == theirs:
            continue
        out.append({"extension": ext, "source": src, "extension_owner": mine, "source_owner": theirs})
    return sorted(out, key=lambda s: s["extension"])


def judge_stale_modules(stale: Sequence[Mapping[str, str]], venv: str) -> tuple[str, str] | None:
    """``("fail", reason)`` naming the first stale extension modules and the fix; None when there are none."""
    if not stale:
        return None
    shown = "; ".join(
        f"{s['extension']} ({'listed by no RECORD' if not s['extension_owner'] else 'from ' + s['extension_owner']}) "
        f"is imported instead of {s['source']}" + (f" ({s['source_owner']})" if s["source_owner"] else "")
        for s in stale[:3])
    more = f"; and {len(stale) - 3} more" if len(stale) > 3 else ""
    paths = [posixpath.join(venv, s["extension"]) for s in stale if not s["extension_owner"]]
    fix = f"; remove the {agree(len(paths), 'leftover', 'leftovers')}: {shlex.join(['rm', *paths])}" if paths else ""
    return "fail", (f"{count(len(stale), 'extension module')} {agree(len(stale), 'shadows', 'shadow')} a .py of the same name (target-record-missing: "
                    f"leftovers of a distribution replaced without its RECORD): {shown}{more}{fix}")
