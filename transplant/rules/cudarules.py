"""CUDA rules: ``cuda-major-mismatch``, ``driver-too-old``, ``gpu-arch-unsupported`` (pure core).

Sources: the minimum driver per CUDA release and the architectures per release are in
``data/cuda.json`` (NVIDIA's release notes and compatibility guide, cited there). SASS
for ``sm_XY`` runs on compute capability X.Z with Z >= Y; ``sm_XYa`` only on X.Y;
``sm_XYf`` on the family X.Z, Z >= Y; PTX for ``compute_XY`` is JIT-compiled for any
capability >= X.Y (CUDA C++ Programming Guide, "Binary Compatibility", "PTX
Compatibility", "Feature Availability").
"""

from __future__ import annotations

from collections import defaultdict

from ..binaries import DeviceCode
from ..tables import arch_minimum_cuda, cuda_table, driver_cuda, driver_minimum
from ..model import Finding
from .cudaenv import Evidence, cuda_evidence, runtime_cuda
from .env import EnvironmentAfter, describe, severity

__all__ = ["cuda_major_findings", "driver_findings", "gpu_arch_findings", "covers"]

_SHOWN = 6


def _anchor(env: EnvironmentAfter, by_major: dict[int, list[Evidence]]) -> int:
    """The CUDA major the environment should have: torch's, else the one the overlay brings most of."""
    for major, items in by_major.items():
        if any(e.name == "torch" for e in items):
            return major
    return max(by_major, key=lambda m: (sum(e.name in env.overlaid for e in by_major[m]), len(by_major[m]), m))


def _fix(env: EnvironmentAfter, name: str, anchor: int) -> str:
    donor = env.donor.latest().get(name)  # type: ignore[call-overload]
    if name not in env.overlaid and donor is not None and donor.raw_version != env.after[name].raw_version:
        return f"add {name!r} to overlay (the donor has {describe(donor)})"
    if name.startswith("nvidia-") and name not in env.overlaid:
        return f"add {name!r} to remove: in {env.manifest} (a CUDA {anchor} environment does not load it)"
    if name not in env.overlaid and donor is None:
        return (f"install a CUDA {anchor} build of {name}, or add {name!r} to remove: in {env.manifest} "
                f"(the donor runs without it)")
    return f"install a CUDA {anchor} build of {name}"


def cuda_major_findings(env: EnvironmentAfter) -> list[Finding]:
    """``cuda-major-mismatch``: the environment after apply holds builds for two CUDA majors."""
    evidence = cuda_evidence(env)
    by_major: dict[int, list[Evidence]] = defaultdict(list)
    for e in evidence:
        by_major[e.major].append(e)
    if len(by_major) < 2:
        return []
    anchor = _anchor(env, by_major)
    parts = []
    for major in sorted(by_major):
        items = by_major[major]
        shown = ", ".join(f"{describe(env.after[e.name])} ({e.how} {e.detail})" for e in items[:_SHOWN])
        more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
        parts.append(f"CUDA {major}: {shown}{more}")
    odd = sorted({e.name for m, items in by_major.items() if m != anchor for e in items})
    names = sorted({e.name for e in evidence})
    return [Finding(
        code="cuda-major-mismatch", severity=severity(env, names), dists=tuple(names),
        message="after apply the environment mixes CUDA majors: " + "; ".join(parts)
                + f"; one process loads one CUDA runtime, so the CUDA {anchor} side fails to load the others",
        hint="; ".join(_fix(env, n, anchor) for n in odd),
    )]


def _driver_cuda(env: EnvironmentAfter) -> tuple[int, int] | None:
    nv = env.target.nvidia
    if nv.cuda_version:
        parts = nv.cuda_version.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return driver_cuda(nv.driver_version) if nv.driver_version else None


def driver_findings(env: EnvironmentAfter) -> list[Finding]:
    """``driver-too-old``: the target driver's CUDA version is below the runtime major the
    environment after apply needs (error), or below its minor (warning: minor version
    compatibility runs it, without PTX JIT of newer code)."""
    if not env.target.nvidia.available:
        return []
    have = _driver_cuda(env)
    evidence = cuda_evidence(env)
    need = runtime_cuda(evidence)
    if have is None or need is None or have >= need:
        return []
    names = sorted({e.name for e in evidence if (e.major, e.minor or 0) > have})
    minimum = driver_minimum(need) or "a newer one"
    sev = "error" if have[0] < need[0] else "warning"
    why = ("a CUDA {0} runtime does not start on a CUDA {1} driver".format(need[0], have[0]) if sev == "error" else
           "minor version compatibility runs it, but PTX newer than the driver cannot be JIT-compiled")
    return [Finding(
        code="driver-too-old", severity=sev, dists=tuple(names),
        message=f"the target's NVIDIA driver {env.target.nvidia.driver_version or '?'} supports CUDA "
                f"{have[0]}.{have[1]}, and after apply the environment needs CUDA {need[0]}.{need[1]} "
                f"({', '.join(describe(env.after[n]) for n in names[:_SHOWN])}): {why}",
        hint=f"upgrade the target's NVIDIA driver to {minimum} or newer (CUDA {need[0]}.{need[1]}; table: "
             f"{cuda_table()['sources']['driver_minimum']}), or overlay builds for CUDA {have[0]}.{have[1]}",
    )]


def covers(code: tuple[DeviceCode, ...], arch: int) -> bool:
    """Whether device code ``code`` runs on compute capability ``arch`` (90 for 9.0)."""
    for d in code:
        if d.kind == "sass":
            if d.variant == "a" and d.arch == arch:
                return True
            if d.variant in ("", "f") and d.arch // 10 == arch // 10 and d.arch <= arch:
                return True
        elif (d.variant == "" and d.arch <= arch) or (d.variant != "" and d.arch == arch):
            return True
    return False


def _capabilities(env: EnvironmentAfter) -> dict[int, str]:
    out = {}
    for gpu in env.target.nvidia.gpus:
        cc = (gpu.compute_capability or "").split(".")
        if len(cc) == 2 and cc[0].isdigit() and cc[1].isdigit():
            out[int(cc[0]) * 10 + int(cc[1])] = gpu.name
    return out


def gpu_arch_findings(env: EnvironmentAfter) -> list[Finding]:
    """``gpu-arch-unsupported``: the target's GPUs are not covered by the SASS or PTX of the
    overlaid shared objects, or the environment's CUDA release is too old (or too new) for them."""
    caps = _capabilities(env)
    if not caps:
        return []
    out = []
    for name in env.overlaid:
        dist = env.after[name]
        for arch, gpu in sorted(caps.items()):
            bad = [f for f in env.objects(name) if f.device_code and not covers(f.device_code, arch)]
            if not bad:
                continue
            have = sorted({d.name for f in bad for d in f.device_code})
            out.append(Finding(
                code="gpu-arch-unsupported", severity="error", dists=(name,),
                message=f"{describe(dist)}: {len(bad)} shared object(s) carry device code only for "
                        f"{', '.join(have)}, which the target's {gpu} (sm_{arch}) cannot run "
                        f"(no kernel image is available for execution on the device)",
                hint=f"use a build of {dist.display_name} compiled for sm_{arch} or with PTX for compute_{arch} or "
                     f"older (e.g. TORCH_CUDA_ARCH_LIST=\"{arch // 10}.{arch % 10}\"), and overlay that instead",
                files=tuple(f.path for f in bad[:_SHOWN]),
            ))
    need = runtime_cuda(cuda_evidence(env))
    if need is None:
        return out
    for arch, gpu in sorted(caps.items()):
        first = arch_minimum_cuda(arch)
        dropped = [d for d in cuda_table()["arch_dropped"] if d["cuda_major"] <= need[0] and arch < d["below"]]
        if first is not None and need < first:
            out.append(Finding(
                code="gpu-arch-unsupported", severity=severity(env, list(env.after)), dists=(),
                message=f"the target's {gpu} (sm_{arch}) needs CUDA {first[0]}.{first[1]} or newer; the environment "
                        f"after apply is built for CUDA {need[0]}.{need[1]}",
                hint=f"overlay builds for CUDA {first[0]}.{first[1]} or newer (e.g. torch +cu{first[0]}{first[1]})",
            ))
        elif dropped:
            out.append(Finding(
                code="gpu-arch-unsupported", severity=severity(env, list(env.after)), dists=(),
                message=f"CUDA {need[0]} dropped support for the target's {gpu} (sm_{arch})",
                hint=f"overlay builds for CUDA {need[0] - 1}.x on this host",
            ))
    return out
