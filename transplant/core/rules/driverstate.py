"""``driver-unusable``: the target has an NVIDIA driver that does not answer (pure core).

``nvidia-smi`` that is installed but fails, printing "Failed to initialize NVML:
Driver/library version mismatch" (the user-space driver upgraded while the old kernel module
is still loaded, until a reboot) or "NVIDIA-SMI has failed because it couldn't communicate with
the NVIDIA driver" (no kernel module loaded), is a broken driver, not a host without a GPU:
every CUDA call fails there. The probe reports its text (``NvidiaFacts.failure``) and the
loaded kernel module's version (``/proc/driver/nvidia/version``). The fault is the target
system's, so the donor principle does not apply.
"""

from __future__ import annotations

from transplant.core.plan import Finding
from transplant.core.rules.cudaenv import cuda_evidence
from transplant.core.rules.env import EnvironmentAfter, severity
from transplant.core.units import visible

__all__ = ["driver_state_findings"]


def driver_state_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding when the target's ``nvidia-smi`` is there and failed. Severity over the
    distributions with CUDA evidence after apply: error when apply changes one of them, else
    warning (:func:`~transplant.core.rules.env.severity`)."""
    nv = env.target.nvidia
    if nv.failure is None:
        return []
    users = sorted({e.name for e in cuda_evidence(env)})
    module = f"; the loaded kernel module is {visible(nv.kernel_module, 40)}" if nv.kernel_module else \
        "; no kernel module is loaded (/proc/driver/nvidia/version is absent)"
    return [Finding(
        code="driver-unusable", severity=severity(env, users, donor=False), dists=tuple(users),
        message=f"the target's NVIDIA driver is installed and does not answer: {visible(nv.failure)}{module}; every "
                f"CUDA call fails there (this is a broken driver, not a host without a GPU)",
        hint="on the target: a driver upgraded without a reboot shows \"Driver/library version mismatch\" (reboot, "
             "or reload the nvidia kernel modules); otherwise reinstall the driver for the running kernel; then "
             "check with nvidia-smi",
    )]
