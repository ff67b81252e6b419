"""What a kept plan (the plan memo's) may hold, given the manifest it was kept for (pure core).

A saved plan (``plan --out``) is checked against a fresh plan of its manifest; the plan memo's
plan is reused precisely so that no fresh plan is made, so it is checked against what the
manifest itself allows, without reading either venv (:func:`kept_plan_problems`):

- its manifest, target and donor are the manifest's (an edited memo cannot retarget the venv);
- its patch changes are exactly the manifest's patch files, each copying the file read on the
  controller now (its hash and size), to the one destination the plan names for it;
- every distribution it changes is one the manifest's overlay selects (its plain patterns, and
  the exact names a closure of the manifest brought), and every distribution it uninstalls one
  that ``remove:`` names and the overlay does not (it cannot remove other distributions);
- a distribution's copies are its donor files (never a controller file), and no copy or removal
  reaches into another installed distribution's metadata folder (one in a site directory: a
  package may vendor a ``.dist-info`` among its own files, as setuptools' ``_vendor`` does);
- a finding is accepted exactly where the manifest's ``accept:`` says (an edit cannot wave an
  error through the gate by marking it accepted).

What the manifest cannot say (which files of a selected distribution its RECORD lists, which
findings the inventories give: a finding removed from the memo is not seen) is the memo's own: the memo is refused outright when another
user could have written it (:func:`transplant.controller.state.refuse_loose`), the copy hashes
every file it writes against the plan, and the stale-plan check under the lock asks the target
again.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from fnmatch import fnmatchcase

from packaging.utils import canonicalize_name

from transplant.core.manifest import Manifest
from transplant.core.plan import Plan
from transplant.core.planner import PatchFile

__all__ = ["kept_plan_problems"]

#: a closure's member as the expanded overlay names it: an exact normalised name (PEP 503)
_EXACT = re.compile(r"[a-z0-9]+([-._][a-z0-9]+)*\Z")


def _metadata_stem(path: str) -> str | None:
    """The ``NAME-VERSION`` stem of the ``.dist-info`` / ``.egg-info`` folder ``path`` lies in (or
    is), or None when it lies in none."""
    for part in path.split("/"):
        for suffix in (".dist-info", ".egg-info"):
            if part.endswith(suffix) and len(part) > len(suffix):
                return part[: -len(suffix)]
    return None


#: the folders installed distributions' metadata lies in (sysconfig's purelib/platlib; Debian's
#: python3 names its own ``dist-packages``)
_SITE_DIRS = ("site-packages", "dist-packages")


def _installed_metadata_stem(path: str, own_site: str | None) -> str | None:
    """The ``NAME-VERSION`` stem of the installed ``.dist-info`` / ``.egg-info`` folder ``path`` lies
    in: one directly in a site directory (a folder named as in :data:`_SITE_DIRS`, or ``own_site``,
    the folder the distribution's own metadata lies in); None when it lies in none, or only in a
    metadata folder a package vendors among its files (``setuptools/_vendor/x-1.0.dist-info``)."""
    parts = path.split("/")
    for i, part in enumerate(parts[1:], 1):
        parent = "/".join(parts[:i])
        if parent != own_site and parts[i - 1] not in _SITE_DIRS:
            continue
        for suffix in (".dist-info", ".egg-info"):
            if part.endswith(suffix) and len(part) > len(suffix):
                return part[: -len(suffix)]
    return None


def _stem_names(stem: str, name: str) -> bool:
    """Whether a metadata folder's stem names the normalised distribution ``name``: its part before a
    version (``foo_bar-1.0`` -> ``foo-bar``; an old folder whose name kept its dashes, ``foo-bar-1.0``,
    too: any leading run of its dash-separated parts)."""
    parts = stem.split("-")
    return any(canonicalize_name("-".join(parts[:i])) == name for i in range(1, len(parts) + 1))


def kept_plan_problems(plan: Plan, manifest: Manifest, patches: Sequence[PatchFile]) -> list[str]:
    """What in ``plan`` the manifest does not allow (the module docstring), one line each, at most 20;
    empty when it holds nothing the manifest would not give.

    :param manifest: the effective manifest the plan was kept for (the donor as opened, the
        target planned against).
    :param patches: the manifest's patch files as read on the controller now.
    """
    problems: list[str] = []
    if plan.manifest != manifest.path:
        problems.append(f"it was made from the manifest {plan.manifest!r}, not {manifest.path!r}")
    for side in ("target", "donor"):
        planned, named = getattr(plan, side), getattr(manifest, side)
        named_end = (str(getattr(named, "host", "")), getattr(named, "venv", None))
        if (planned.host, planned.venv) != named_end:
            problems.append(f"its {side} is {planned.host}:{planned.venv}, but the manifest names {named_end[0]}:{named_end[1]}")
    patterns = tuple(plan.hash_patterns)
    plain = tuple(manifest.overlay)
    extra = patterns[len(plain):]
    if patterns[: len(plain)] != plain or (extra and not manifest.closures) \
            or any(not _EXACT.match(name) or canonicalize_name(name) != name for name in extra):
        problems.append(f"its overlay {list(patterns)} is not the manifest's {list(plain)}"
                        + (" with its closures' exact names" if manifest.closures else ""))
        patterns = plain

    expected = {p.dest: p for p in patches}
    # the one site-packages folder every patch destination lies in (venv-relative, as the target's probe said)
    candidates = sorted({f[: -len(dest) - 1] for f in plan.patch_files for dest in expected if f.endswith("/" + dest)})
    site = next((c for c in candidates if c.endswith(("site-packages", "dist-packages"))
                 and set(plan.patch_files) == {f"{c}/{d}" for d in expected}), None)
    if (site is None and expected) or (not expected and plan.patch_files):
        problems.append(f"its patch destinations {list(plan.patch_files)} are not the manifest's patch files "
                        f"{sorted(expected)} in one site-packages folder")
    wanted_patch = {f"{site}/{d}": p for d, p in expected.items()} if site is not None else {}

    seen: set[tuple[str, str]] = set()
    for change in plan.changes:
        label = f"{change.kind} {change.name}"
        if (change.kind, change.name) in seen:
            problems.append(f"{label} is changed twice")
        seen.add((change.kind, change.name))
        if change.kind == "patch":
            patch = wanted_patch.get(change.name)
            if patch is None:
                problems.append(f"{label}: the manifest has no patch file for it")
                continue
            copies = [(c.path, c.size, c.hash, c.source, c.local, c.head, c.link, c.record_identity, c.donor_path)
                      for c in change.copy]
            want = [] if change.action == "keep" else [
                (change.name, patch.size, patch.hash, "patch", patch.local, None, None, None, None)]
            if copies != want or change.remove:
                problems.append(f"{label}: it does not copy exactly the manifest's {patch.local} "
                                f"({patch.hash}, {patch.size} bytes)")
        elif change.action == "remove":
            if not any(fnmatchcase(change.name, p) for p in manifest.remove):  # (the donor lacks it if overlaid too)
                problems.append(f"{label}: uninstalled, but the manifest's remove: does not name it")
            if change.copy:
                problems.append(f"{label}: an uninstall that copies files")
        else:
            if not any(fnmatchcase(change.name, p) for p in patterns):
                problems.append(f"{label}: the manifest's overlay does not select it")
            stem = None if change.dist_info is None else _metadata_stem(change.dist_info)
            if stem is None or not _stem_names(stem, change.name):
                problems.append(f"{label}: its metadata folder {change.dist_info!r} is not {change.name}'s")
            for copy in change.copy:
                if copy.source != "donor" or copy.local is not None:
                    problems.append(f"{label}: {copy.path} is copied from {copy.local or copy.source!r}, "
                                    f"not from the donor")
        if change.kind == "distribution":
            own_site = None if change.dist_info is None else posixpath.dirname(change.dist_info.rstrip("/"))
            moved = [c.donor_path for c in change.copy if c.donor_path is not None]
            for path in [c.path for c in change.copy] + list(change.remove) + moved:
                stem = _installed_metadata_stem(path, own_site)
                if stem is not None and not _stem_names(stem, change.name):
                    owner = canonicalize_name(stem.split("-", 1)[0])
                    problems.append(f"{label}: {path} lies in another distribution's metadata ({owner})")
                    break
        if len(problems) >= 20:
            break
    for dest in sorted(set(wanted_patch) - {c.name for c in plan.changes if c.kind == "patch"}):
        problems.append(f"the manifest's patch file for {dest} is missing from it")
    for f in plan.findings:  # accepted exactly as the manifest's accept: list says (the planner's rule)
        entry = next((a for a in manifest.accept if a.matches(f.code, f.dists)), None)
        if f.accepted != (entry.reason if entry is not None else None):
            problems.append(f"its {f.severity} {f.code} ({', '.join(f.dists)}) is "
                            + ("marked accepted, but the manifest's accept: does not name it" if entry is None else
                               "not accepted as the manifest's accept: says"))
            break
    return problems[:20]
