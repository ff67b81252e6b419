"""``c-toolchain-missing``: a package that builds C at run time (triton's kernel launchers)
present after apply on a target without the C compiler or the ``Python.h`` that build needs
(pure core).

triton builds a small C launcher at the first launch of each kernel signature with the host's
compiler (``CC``, else ``gcc``, else ``clang`` on PATH) and ``-I`` the interpreter's include
folder (``data/runtime_c.json`` names the source). Without either, every import passes and the
first kernel fails. The facts come from the probe (``Inventory.c_toolchain``, its own
environment: a service that sets ``CC`` or ``PATH`` may differ, which the hint says).

Severity: the fault is the target's system, so the donor's files running says nothing about it;
but a donor whose own host cannot build the launcher either never launched a kernel of that venv,
so what the transplant carries breaks nothing that worked: info then (the principle "what the
donor runs is not by itself an error", with the donor's facts of the very fault). Otherwise
:func:`transplant.core.rules.env.severity` without the donor principle: error when apply brings
or changes the package, else warning. An older probe document without the facts, on the target,
makes the rule find nothing; on the donor, it counts as a donor that builds.
"""

from __future__ import annotations

import shlex

from transplant.core.data import runtime_c
from transplant.core.inventory import CToolchainFacts, Inventory
from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, severity
from transplant.core.units import visible

__all__ = ["c_toolchain_findings", "lacks"]


def lacks(facts: CToolchainFacts) -> list[str]:
    """What ``facts`` lacks for a launcher build, in words: ``[]`` when it builds, else one or
    both of ``no C compiler (...)`` and ``no Python.h in FOLDER``."""
    out = []
    if facts.compiler is None:
        out.append("no C compiler (CC is unset and neither gcc nor clang is on PATH)")
    elif facts.compiler.path is None:
        out.append(f"no C compiler (CC={visible(repr(facts.compiler.command))} names nothing on PATH)")
    if not facts.python_h:
        out.append(f"no Python.h in {visible(facts.include) if facts.include else 'the interpreter include folder (unread)'}")
    return out


def _debian_like(facts: CToolchainFacts) -> bool:
    os_release = facts.os
    if os_release is None:
        return False
    return os_release.id == "debian" or "debian" in (os_release.id_like or "").split()


def _hint(target: Inventory, facts: CToolchainFacts) -> str:
    """The install command for what ``facts`` lacks on the target's distribution."""
    minor = target.interpreter.minor
    system_python = facts.include == f"/usr/include/python{minor}"
    names = runtime_c()["packages"]["debian"]
    packages = []
    if not facts.runnable:
        packages.append(names["compiler"])
    if not facts.python_h and system_python:
        packages.append(names["headers"].format(minor=minor))
    parts = []
    if packages and _debian_like(facts):
        parts.append(f"on the target, as root: {shlex.join(['apt-get', 'install', '-y', *packages])}")
    elif not facts.runnable or (not facts.python_h and system_python):
        parts.append("on the target, install a C compiler (gcc or clang)"
                     + (f" and the headers of its Python {minor}" if not facts.python_h else "")
                     + " with the distribution's package manager")
    if not facts.python_h and not system_python:
        home = visible((target.interpreter.pyvenv_cfg or {}).get("home") or "its home")
        parts.append(f"Python.h comes with the Python build the venv runs ({home}): install that build with its "
                     f"headers ({visible(facts.include) if facts.include else 'its include folder'})")
    if facts.compiler is not None and facts.compiler.path is None:
        parts.append(f"or set CC to a compiler that exists (now CC={visible(repr(facts.compiler.command))})")
    return "; ".join(parts) + (" (the probe ran in an SSH session's environment: a service that sets CC or PATH "
                               "may find another compiler; verify.env can give verify the service's)")


def c_toolchain_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per package of ``data/runtime_c.json``'s ``builders`` present after apply,
    when the target's facts say its launcher build cannot run (:func:`lacks`). Severity: info
    when the donor's host cannot build it either (the donor never launched one), else error when
    apply brings or changes the package, else warning."""
    facts = env.target.c_toolchain
    if facts is None or facts.builds:
        return []
    missing = lacks(facts)
    donor = env.donor.c_toolchain
    donor_missing = lacks(donor) if donor is not None else []
    out = []
    for name, builder in sorted(runtime_c()["builders"].items()):
        dist = env.after.get(name)
        if dist is None:
            continue
        donor_says = (f"; the donor's host ({env.donor.hostname}) has {' and '.join(donor_missing)} either, so it "
                      f"never launched one of its kernels and the transplant breaks nothing that ran there"
                      if donor_missing else
                      f"; the donor's host ({env.donor.hostname}) builds it"
                      + (f" with {visible(donor.compiler.path)}" if donor is not None and donor.compiler is not None
                         and donor.compiler.path else ""))
        out.append(Finding(
            code="c-toolchain-missing",
            severity="info" if donor_missing else severity(env, [name], donor=False), dists=(name,),
            message=f"{describe(dist)} builds {builder['what']} with the host's C compiler and the interpreter's "
                    f"Python.h, and the target ({env.target.hostname}) has {' and '.join(missing)}: every import "
                    f"passes and the first kernel fails (\"{builder['failure']}\" or \"Python.h: No such file or "
                    f"directory\"){donor_says}",
            hint=_hint(env.target, facts),
            files=tuple(p for p in (facts.include,) if p and not facts.python_h),
        ))
    return out
