"""``libcuda-unversioned-missing``: triton after apply on a host with a driver but no
``libcuda.so`` where triton links its launchers (pure core).

triton compiles a small C launcher per kernel and links it with ``-lcuda`` against the
folders its ``libcuda_dirs()`` returns (triton/backends/nvidia/driver.py:
``TRITON_LIBCUDA_PATH``, else the folders of ``libcuda.so*`` in ``ldconfig -p``, else the
``LD_LIBRARY_PATH`` folders holding ``libcuda.so.1``). The linker wants the unversioned
``libcuda.so``; a driver install that ships only ``libcuda.so.1`` passes every import and
fails at the first kernel launch ("cannot find -lcuda", or triton's own "libcuda.so cannot
found!"). The facts come from the target's probe (``Inventory.libcuda``, its own
environment: a service that sets ``LD_LIBRARY_PATH`` or ``TRITON_LIBCUDA_PATH`` may differ,
which the hint says); a driver means nvidia-smi answered. An older probe document without
the facts makes the rule find nothing.
"""

from __future__ import annotations

import posixpath
import shlex

from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, severity

__all__ = ["libcuda_findings"]

#: Where distributions' packages put the driver library when nothing else says (Debian / Ubuntu multiarch).
_DEFAULT_DIR = "/usr/lib/x86_64-linux-gnu"


def libcuda_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding when triton is present after apply, the target has a driver, and none of
    the folders triton searches holds ``libcuda.so``. Severity by
    :func:`transplant.core.rules.env.severity` over triton, without the donor principle (the
    fault is the target host's): error when apply brings or changes triton, else warning."""
    triton = env.after.get("triton")
    facts = env.target.libcuda
    if triton is None or facts is None or not env.target.nvidia.available or facts.unversioned:
        return []
    folder = posixpath.dirname(facts.versioned[0]) if facts.versioned else (
        facts.searched[0] if facts.searched else _DEFAULT_DIR)
    where = (f"TRITON_LIBCUDA_PATH={facts.triton_libcuda_path} names {', '.join(facts.searched) or 'no folder'}"
             if facts.triton_libcuda_path else
             f"{'ldconfig -p lists' if facts.searched else 'neither ldconfig -p nor LD_LIBRARY_PATH shows'} "
             f"{', '.join(facts.versioned) or 'any libcuda.so.1'}"
             + ("" if facts.ldconfig else " (ldconfig did not run)"))
    link = shlex.join(["ln", "-s", "libcuda.so.1", posixpath.join(folder, "libcuda.so")])
    return [Finding(
        code="libcuda-unversioned-missing", severity=severity(env, ["triton"], donor=False), dists=("triton",),
        message=f"{describe(triton)} links its kernel launchers with -lcuda, and the target (driver "
                f"{env.target.nvidia.driver_version or '?'}) has no libcuda.so where triton looks: {where}; every "
                f"import passes and the first triton kernel fails (\"cannot find -lcuda\")",
        hint=f"on the target, as root: {link} && ldconfig (the symlink, then the loader cache); or point "
             f"TRITON_LIBCUDA_PATH at a folder holding a libcuda.so in the service's environment (and verify.env)",
        files=tuple(facts.versioned) or (posixpath.join(folder, "libcuda.so.1"),),
    )]
