"""``host-library-missing``: an overlaid shared object names in DT_NEEDED a library that neither
the venv after apply nor the target host's system provides (pure core).

The dynamic loader looks a DT_NEEDED name without a slash up by file name: in the object's
RUNPATH or RPATH folders, ``LD_LIBRARY_PATH``, the loader cache and the default folders
(ld.so(8)). Inside the venv, a file of that name (or a shared object whose DT_SONAME it is)
counts as provided wherever it lies, as the symbol rule resolves it; outside, the host's
answer counts (:attr:`transplant.core.inventory.Inventory.system_sonames`). So the verdict
depends on exactly the fact that differs between hosts: a library the donor's system has and
the target's lacks is an error (``dlopen`` fails there with "cannot open shared object file"),
one the donor's system lacks too is ``info`` (nothing on the donor loads that object either:
an optional plugin). The driver's own libraries (``libcuda.so.1``, ``libnvidia-*``) are left
to the driver rules: a host without the driver lacks them all.

``runpath-outside-venv``: an overlaid shared object's run path (DT_RUNPATH, or DT_RPATH without
one) names an absolute folder outside the venv, a path baked in at build time (a donor's home, a
build tree, ``/opt/...``). The planner asks both hosts whether each such folder and
``folder/<DT_NEEDED name>`` exist (:func:`runpath_queries`; the answers are
:attr:`~transplant.core.inventory.Inventory.elsewhere`). A library the donor's loader finds in
such a folder (the run path is searched before the loader cache, ld.so(8)) that the target has
neither there nor in its loader cache, and the venv does not carry, is an error: the object loads
on the donor and ``dlopen`` fails on the target. Such a library is left out of
``host-library-missing`` (the donor does find it). A folder from which none of the object's
libraries loads on the donor (absent there too, or holding none of them) is ``info``: the loader
skips it on both hosts. ``$ORIGIN`` entries name folders relative to the object inside the venv,
which apply carries along, and are not judged here (nor entries with other ``$`` tokens, or
relative ones); an absolute entry inside the donor's venv is not outside it.
"""

from __future__ import annotations

import posixpath
import re
import shlex

from collections.abc import Iterable

from transplant.core.elf_facts import ElfFacts
from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, severity
from transplant.core.units import agree, count

__all__ = ["host_library_findings", "runpath_findings", "runpath_queries", "RUNPATH_QUERIES_MAX"]

_SHOWN = 3
#: Libraries the NVIDIA driver installs on the host, judged by the driver rules (``driver-too-old``,
#: ``libcuda-unversioned-missing``); source: the driver's file list (README "Installed Components").
_DRIVER = re.compile(r"^(libcuda\.so|libnvidia-|libnvcuvid\.so|libnvoptix\.so)")


#: The most paths :func:`runpath_queries` asks a host about (a path not asked is not judged).
RUNPATH_QUERIES_MAX = 2000


def _absolute_folders(facts: ElfFacts) -> list[str]:
    """The object's run path folders that are absolute paths without ``$`` tokens, normalised, in order."""
    return list(dict.fromkeys(posixpath.normpath(f) for f in facts.search_folders if f.startswith("/") and "$" not in f))


def _searched(needed: str) -> bool:
    """Whether the loader looks ``needed`` up in the run path: a name without a slash, not the driver's."""
    return "/" not in needed and not _DRIVER.match(needed)


def runpath_queries(objects: Iterable[ElfFacts]) -> list[str]:
    """The absolute paths to ask each host about for :func:`runpath_findings`: each absolute run
    path folder of ``objects`` and that folder joined with each DT_NEEDED name the loader looks up
    there; sorted, deduplicated, at most :data:`RUNPATH_QUERIES_MAX` (the folders first)."""
    folders: set[str] = set()
    files: set[str] = set()
    for facts in objects:
        absolute = _absolute_folders(facts)
        folders.update(absolute)
        files.update(posixpath.join(f, n) for f in absolute for n in facts.needed if _searched(n))
    return sorted(sorted(folders)[:RUNPATH_QUERIES_MAX] + sorted(files)[:max(0, RUNPATH_QUERIES_MAX - len(folders))])


def _donor_finds(env: EnvironmentAfter, facts: ElfFacts, needed: str) -> str | None:
    """The first absolute run path folder of ``facts`` in which the donor's host has ``needed``."""
    return next((f for f in _absolute_folders(facts) if env.donor.elsewhere.get(posixpath.join(f, needed)) is True),
                None)


def _in_venv(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def runpath_findings(env: EnvironmentAfter) -> list[Finding]:
    """``runpath-outside-venv``, one finding per overlaid distribution and kind (see the module
    docstring): an error (:func:`~transplant.core.rules.env.severity` without the donor principle)
    for libraries its objects find on the donor only in an absolute run path folder outside the
    venv that the target lacks (nor does the target's loader cache or the venv provide them);
    ``info`` for such folders from which nothing loads on the donor. A path neither host was asked
    about (:func:`runpath_queries`, an older probe, a snapshot donor) is not judged; nothing when
    the target's library names were not read."""
    target = env.target.system_sonames
    if target is None:
        return []
    provided = env.library_names
    out = []
    for name in sorted(env.overlaid):
        dist = env.after[name]
        lacking: dict[tuple[str, str], list[str]] = {}
        idle: dict[str, list[str]] = {}
        for facts in env.objects(name):
            folders = [f for f in _absolute_folders(facts) if not _in_venv(f, env.donor.interpreter.prefix)]
            if not folders:
                continue
            wanted = [n for n in facts.needed if _searched(n) and n not in provided]
            used = set()
            for needed in wanted:
                folder = _donor_finds(env, facts, needed)
                if folder is None:
                    continue
                used.add(folder)
                there = [env.target.elsewhere.get(posixpath.join(f, needed)) for f in folders]
                if needed in target or True in there or None in there:
                    continue
                lacking.setdefault((needed, folder), []).append(facts.path)
            for folder in folders:
                asked = [env.donor.elsewhere.get(folder)] + [env.donor.elsewhere.get(posixpath.join(folder, n))
                                                             for n in facts.needed if _searched(n)]
                if folder not in used and None not in asked and (asked[0] is False or not any(asked[1:])):
                    idle.setdefault(folder, []).append(facts.path)
        if lacking:
            pairs = sorted(lacking)
            shown = "; ".join(f"{lib} from {folder} (needed by {lacking[lib, folder][0]}"
                              + (f" and {len(lacking[lib, folder]) - 1} more" if len(lacking[lib, folder]) > 1 else "")
                              + ")" for lib, folder in pairs[:_SHOWN])
            more = f"; and {len(pairs) - _SHOWN} more" if len(pairs) > _SHOWN else ""
            lib, folder = pairs[0]
            out.append(Finding(
                code="runpath-outside-venv", severity=severity(env, [name], donor=False), dists=(name,),
                message=f"{describe(dist)}: its shared objects find {count(len(pairs), 'library', 'libraries')} on the "
                        f"donor's host ({env.donor.hostname}) only through a run path (DT_RUNPATH or DT_RPATH) baked "
                        f"in outside the venv: {shown}{more}; the target's host ({env.target.hostname}) has no such "
                        f"file there, its loader does not find {agree(len(pairs), 'it', 'them')} otherwise and the "
                        f"venv does not carry {agree(len(pairs), 'it', 'them')}; dlopen fails there with \"cannot open "
                        f"shared object file\"",
                hint=f"install {lib} on the target at {posixpath.join(folder, lib)} as on the donor, or where the "
                     f"target's loader finds it (a folder listed in /etc/ld.so.conf.d, then ldconfig); or rebuild "
                     f"{name!r} with a $ORIGIN-relative run path and the library inside the venv; or leave {name!r} "
                     f"out of overlay in {env.manifest}",
                files=tuple(sorted({p for paths in lacking.values() for p in paths}))[:_SHOWN],
            ))
        if idle:
            folders = sorted(idle)
            absent = [f for f in folders if env.donor.elsewhere.get(f) is False]
            objects = sorted({p for paths in idle.values() for p in paths})
            out.append(Finding(
                code="runpath-outside-venv", severity="info", dists=(name,),
                message=f"{describe(dist)}: {count(len(objects), 'shared object')} {agree(len(objects), 'lists', 'list')} "
                        f"in {agree(len(objects), 'its', 'their')} run path (DT_RUNPATH or DT_RPATH) "
                        f"{count(len(folders), 'folder')} outside the venv from which none of "
                        f"{agree(len(objects), 'its', 'their')} libraries loads on the donor's host "
                        f"({env.donor.hostname}): {', '.join(folders[:_SHOWN])}"
                        f"{f' and {len(folders) - _SHOWN} more' if len(folders) > _SHOWN else ''}"
                        + _absent_too(len(absent), len(folders))
                        + "; the loader skips a folder without the library it looks for",
                hint="nothing to do; to drop such a path, rebuild with a $ORIGIN-relative run path "
                     "(patchelf --set-rpath rewrites it in place)",
                files=tuple(objects[:_SHOWN]),
            ))
    return out


def _absent_too(absent: int, folders: int) -> str:
    """What the info finding says of the folders the donor's host lacks as well."""
    if not absent:
        return ""
    if absent == folders:
        return f" (the donor's host has no such {agree(folders, 'folder', 'folders')} either)"
    return f" ({absent} of them the donor's host has not either)"


def host_library_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per overlaid distribution whose shared objects need libraries the target's
    system lacks. Nothing when the target's library names were not read.

    Severity: for a library the donor's system has: :func:`~transplant.core.rules.env.severity`
    without the donor principle (the fault is the target system's); when the donor's system
    lacks every one of them too: ``info``."""
    target, donor = env.target.system_sonames, env.donor.system_sonames
    if target is None:
        return []
    provided = env.library_names
    out = []
    for name in sorted(env.overlaid):
        missing: dict[str, list[str]] = {}
        for facts in env.objects(name):
            for needed in facts.needed:
                if "/" in needed or needed in provided or needed in target or _DRIVER.match(needed):
                    continue
                if _donor_finds(env, facts, needed) is not None:
                    continue  # the donor finds it through a run path folder: runpath_findings judges it
                missing.setdefault(needed, []).append(facts.path)
        if not missing:
            continue
        dist = env.after[name]
        libraries = sorted(missing)
        files = tuple(sorted({p for paths in missing.values() for p in paths}))[:_SHOWN]
        shown = "; ".join(f"{lib} (needed by {missing[lib][0]}"
                          + (f" and {len(missing[lib]) - 1} more" if len(missing[lib]) > 1 else "") + ")"
                          for lib in libraries[:_SHOWN])
        more = f"; and {len(libraries) - _SHOWN} more" if len(libraries) > _SHOWN else ""
        there = [lib for lib in libraries if donor is not None and lib in donor]
        if donor is not None and not there:
            out.append(Finding(
                code="host-library-missing", severity="info", dists=(name,),
                message=f"{describe(dist)}: {count(len(libraries), 'library', 'libraries')} that neither the venv nor "
                        f"the target's system ({env.target.hostname}) provides: {shown}{more}; the donor's system "
                        f"({env.donor.hostname}) lacks {agree(len(libraries), 'it', 'them')} too, so nothing on the donor "
                        f"loads these objects either (an optional plugin)",
                hint="nothing to do", files=files,
            ))
            continue
        known = "" if donor is None else f"; the donor's system ({env.donor.hostname}) has {', '.join(there[:_SHOWN])}"
        out.append(Finding(
            code="host-library-missing", severity=severity(env, [name], donor=False), dists=(name,),
            message=f"{describe(dist)}: the target's system ({env.target.hostname}) lacks "
                    f"{count(len(libraries), 'library', 'libraries')} its shared objects need and the venv does not "
                    f"provide: {shown}{more}{known}; dlopen fails there with \"cannot open shared object file\"",
            hint=f"install the package that provides {', '.join(libraries[:_SHOWN])} on the target (on Debian or "
                 f"Ubuntu: {shlex.join(['apt-file', 'search', libraries[0]])} names it), or leave {name!r} out of "
                 f"overlay in {env.manifest}",
            files=files,
        ))
    return out
