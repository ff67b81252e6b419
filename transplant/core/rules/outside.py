"""``outside-venv``: distributions the target's interpreter imports from folders outside the
venv (pure core).

A ``*.pth`` file may put another folder on ``sys.path`` and ``include-system-site-packages =
true`` adds the base interpreter's site-packages: what they hold is imported beside the venv's
torch, though apply never writes there. The planner adds those distributions to the
environment after apply where the venv lacks the name (the venv's own site-packages comes
first on ``sys.path``), so the requirement, CUDA-major and torch-family rules judge them too;
this rule says which they are and where they live (info). Source: ``site`` module
documentation (``.pth`` path lines; ``include-system-site-packages`` in ``venv``).
"""

from __future__ import annotations

from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe
from transplant.core.units import agree, count

__all__ = ["outside_findings"]

_SHOWN = 6


def outside_findings(env: EnvironmentAfter) -> list[Finding]:
    """One info finding per outside folder with distributions visible after apply (``dists`` =
    their names, ``files`` = the folder); those the venv shadows (same name inside) are left out."""
    out = []
    for folder, why in env.target.outside_folders.items():
        seen = [d for d in env.target.outside if d.dist_info.startswith(folder.rstrip("/") + "/")
                and env.after.get(d.name) is d]
        if not seen:
            continue
        names = ", ".join(describe(d) for d in seen[:_SHOWN]) + (f" and {len(seen) - _SHOWN} more"
                                                                 if len(seen) > _SHOWN else "")
        out.append(Finding(
            code="outside-venv", severity="info", dists=tuple(d.name for d in seen),
            message=f"{count(len(seen), 'distribution')} {agree(len(seen), 'is', 'are')} imported from {folder}, outside the venv ({why}): {names}; "
                    f"apply never changes them, and the requirement and CUDA rules check them with the rest",
            hint="nothing to do if they belong there; otherwise install them into the venv, or drop the folder from "
                 "sys.path (the .pth line, or include-system-site-packages = false in pyvenv.cfg)",
            files=(folder,),
        ))
    return out
