"""``libcuda-compat-mismatch``: the ``libcuda.so.1`` the target's loader resolves for the venv's
processes is a forward-compatibility library, of another version than the kernel module (pure core).

The cuda-compat package (``/usr/local/cuda-X.Y/compat/libcuda.so.1``, on ``LD_LIBRARY_PATH`` or
in an ld.so.conf.d entry; or a copy a venv carries) is the user-space driver of a newer driver
release, run on an older kernel module. NVIDIA's CUDA Compatibility guide applies it only to data
center GPUs, select NGC Server Ready SKUs of RTX cards and Jetson boards (and, within one driver
branch, only to LTS branches for select GPUs); elsewhere ``cuInit`` fails with
``CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE`` (804). Facts and sources: ``data/cuda_compat.json``.

When ``nvidia-smi`` answered, the driver's own user-space libraries match the kernel module, so a
``libcuda.so.1`` of another version is a separate, forward-compatibility copy. The finding is an
error where the guide says it cannot run (a GeForce GPU), else a warning naming what to verify
(the guide's GPU and branch tables are not in the data). It is the target host's fact: a compat
library inside the venv that the donor ran on its own GPU does not excuse it here (no donor
principle). An older probe document without the fact finds nothing.
"""

from __future__ import annotations

import posixpath
import re
import shlex

from transplant.core.data import cuda_compat_table
from transplant.core.plan import Finding
from transplant.core.rules.cudaenv import cuda_evidence
from transplant.core.rules.env import EnvironmentAfter, severity
from transplant.core.units import visible

__all__ = ["libcuda_compat_findings", "excluded_gpus"]


def excluded_gpus(names: list[str]) -> list[str]:
    """The GPU names (as nvidia-smi prints them) that name a product line the guide's forward
    compatibility does not apply to (``data/cuda_compat.json``, ``consumer_name_words``: GeForce),
    matched as a whole word, any case; ``[]`` when none."""
    words = cuda_compat_table()["consumer_name_words"]
    return [n for n in names if any(re.search(rf"\b{re.escape(w)}\b", n, re.IGNORECASE) for w in words)]


def _undo(env: EnvironmentAfter) -> str:
    """How to stop the venv's processes from loading the compat library, by where it was found."""
    loaded = env.target.libcuda_loaded
    assert loaded is not None
    folder = posixpath.dirname(loaded.path)
    if loaded.how == "LD_LIBRARY_PATH":
        return f"take {folder} out of LD_LIBRARY_PATH in the service's environment (and verify.env)"
    if loaded.how == "ld.so.cache":
        return (f"remove the ld.so.conf.d entry naming {folder} ({shlex.join(['grep', '-l', folder, '-r', '/etc/ld.so.conf', '/etc/ld.so.conf.d'])}), "
                f"then run ldconfig")
    return f"remove {loaded.path} (a default folder of the loader)"


def libcuda_compat_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding when the target's ``nvidia-smi`` answered, the loaded kernel module's version
    is known, the environment after apply has CUDA evidence, and the ``libcuda.so.1`` its
    processes load carries another version than the kernel module. Severity: error where a target
    GPU is one the guide excludes (:func:`excluded_gpus`) and apply changes a CUDA distribution,
    else warning (:func:`~transplant.core.rules.env.severity`, without the donor principle)."""
    nv, loaded = env.target.nvidia, env.target.libcuda_loaded
    if not nv.available or not nv.kernel_module or loaded is None or loaded.version is None:
        return []
    if loaded.version == nv.kernel_module:
        return []
    users = sorted({e.name for e in cuda_evidence(env)})
    if not users:
        return []
    table = cuda_compat_table()
    gpus = [g.name for g in nv.gpus]
    excluded = excluded_gpus(gpus)
    inside = loaded.path.startswith(env.target.interpreter.prefix.rstrip("/") + "/")
    where = (f"{visible(loaded.path, 200)}" + (f" (-> {visible(posixpath.basename(loaded.real), 80)})"
                                                 if loaded.real != loaded.path else "")
             + f", found through {loaded.how}" + (", inside the venv" if inside else ""))
    fact = (f"the libcuda this venv's processes load on the target is a forward-compatibility library "
            f"{loaded.version} from {where}, and the kernel module is {visible(nv.kernel_module, 40)}")
    fails = (f"cuInit fails with {table['error_name']} ({table['error_code']}, \"{table['error_string']}\") "
             f"and every CUDA call with it")
    listed = ", ".join(table["supported_systems"])
    undo = _undo(env)
    upgrade = f"or upgrade the target's NVIDIA driver (kernel module) to {loaded.version} or newer"
    if excluded:
        return [Finding(
            code="libcuda-compat-mismatch", severity=severity(env, users, donor=False), dists=tuple(users),
            message=f"{fact}; NVIDIA applies forward compatibility only to {listed}, and the target's "
                    f"{', '.join(visible(n, 80) for n in excluded)} is none of them: {fails}",
            hint=f"on the target: {undo}, so the driver's own libcuda is loaded; {upgrade} (source: "
                 f"{table['sources']['supported_systems']})",
            files=(loaded.path,),
        )]
    shown = ", ".join(visible(n, 80) for n in gpus[:4]) or "no GPU listed"
    return [Finding(
        code="libcuda-compat-mismatch", severity="warning", dists=tuple(users),
        message=f"{fact}; verify that the target's GPUs ({shown}) are among those NVIDIA's forward compatibility "
                f"supports ({listed}) and that kernel driver branch {nv.kernel_module.split('.')[0]} is one the "
                f"compat package {loaded.version} supports: where not, {fails}",
        hint=f"check on the target with the venv's python that cuInit succeeds; if it fails with "
             f"{table['error_code']}: {undo}, {upgrade} (source: {table['sources']['supported_systems']})",
        files=(loaded.path,),
    )]
