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
"""

from __future__ import annotations

import posixpath
import re
import shlex

from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, severity
from transplant.core.units import agree, count

__all__ = ["host_library_findings"]

_SHOWN = 3
#: Libraries the NVIDIA driver installs on the host, judged by the driver rules (``driver-too-old``,
#: ``libcuda-unversioned-missing``); source: the driver's file list (README "Installed Components").
_DRIVER = re.compile(r"^(libcuda\.so|libnvidia-|libnvcuvid\.so|libnvoptix\.so)")


def _provided(env: EnvironmentAfter) -> set[str]:
    """File names and DT_SONAMEs of every file of the environment after apply."""
    names: set[str] = set()
    for name, dist in env.after.items():
        names.update(posixpath.basename(p) for p in dist.files)
        names.update(f.soname for f in env.objects(name) if f.soname)
    return names


def host_library_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per overlaid distribution whose shared objects need libraries the target's
    system lacks. Nothing when the target's library names were not read.

    Severity: for a library the donor's system has: :func:`~transplant.core.rules.env.severity`
    without the donor principle (the fault is the target system's); when the donor's system
    lacks every one of them too: ``info``."""
    target, donor = env.target.system_sonames, env.donor.system_sonames
    if target is None:
        return []
    provided = _provided(env)
    out = []
    for name in sorted(env.overlaid):
        missing: dict[str, list[str]] = {}
        for facts in env.objects(name):
            for needed in facts.needed:
                if "/" in needed or needed in provided or needed in target or _DRIVER.match(needed):
                    continue
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
