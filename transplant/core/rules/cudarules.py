"""CUDA rules: ``cuda-major-mismatch``, ``driver-too-old``, ``gpu-arch-unsupported`` (pure core).

Sources: the minimum driver per CUDA release and the architectures per release are in
``data/cuda.json`` (NVIDIA's release notes and compatibility guide, cited there). SASS
for ``sm_XY`` runs on compute capability X.Z with Z >= Y; ``sm_XYa`` only on X.Y;
``sm_XYf`` on the family X.Z, Z >= Y; PTX for ``compute_XY`` is JIT-compiled for any
capability >= X.Y (CUDA C++ Programming Guide, "Binary Compatibility", "PTX
Compatibility", "Feature Availability").
"""

from __future__ import annotations

import re
from collections import defaultdict
from fnmatch import fnmatchcase

from transplant.core.elf_facts import DeviceCode
from transplant.core.data import arch_minimum_cuda, cuda_table, driver_cuda, driver_minimum
from transplant.core.plan import Finding
from transplant.core.rules.cudaenv import Evidence, cuda_evidence, runtime_cuda
from transplant.core.rules.env import DONOR_RUNS, EnvironmentAfter, describe, severity, target_gpus
from transplant.core.units import agree, count

__all__ = ["cuda_major_findings", "driver_findings", "gpu_arch_findings", "covers"]

_SHOWN = 6


def _anchor(env: EnvironmentAfter, by_major: dict[int, list[Evidence]]) -> int:
    """The CUDA major the environment should have: torch's, else the one the overlay brings most of."""
    for major, items in by_major.items():
        if any(e.name == "torch" for e in items):
            return major
    return max(by_major, key=lambda m: (sum(e.name in env.overlaid for e in by_major[m]), len(by_major[m]), m))


_SUFFIXED = re.compile(r"^(nvidia-.+)-cu(\d+)$")


def _donor_anchor(env: EnvironmentAfter) -> int | None:
    """The CUDA major the donor's own environment is built around (:func:`_anchor` on it), or
    None without CUDA evidence there or when the donor's context is not the target's."""
    if not env.same_interpreter:
        return None
    latest = env.donor.latest()
    own = EnvironmentAfter(donor=env.donor, target=env.donor, overlaid=tuple(latest), after=latest,
                           donor_elf=env.donor_elf, target_elf=env.donor_elf)
    by_major: dict[int, list[Evidence]] = defaultdict(list)
    for e in cuda_evidence(own):
        by_major[e.major].append(e)
    return _anchor(own, by_major) if by_major else None


def _compact(names: list[str], present: set[str]) -> list[str]:
    """Names for a manifest list, with every ``nvidia-*-cuNN`` group written as that glob when
    the glob matches exactly those of ``present`` (``nvidia-*-cu12``)."""
    out: list[str] = []
    groups: defaultdict[str, list[str]] = defaultdict(list)
    for n in names:
        m = _SUFFIXED.match(n)
        (groups[m.group(2)] if m else out).append(n)
    for major, members in sorted(groups.items()):
        glob = f"nvidia-*-cu{major}"
        if len(members) > 1 and set(members) == {p for p in present if fnmatchcase(p, glob)}:
            out.append(glob)
        else:
            out.extend(members)
    return sorted(out)


def _fixes(env: EnvironmentAfter, names: list[str], anchor: int) -> str:
    """The manifest changes that leave one CUDA major, grouped into one line per key:
    overlay the donor's build where the donor has another version, remove what the donor
    runs without (and every ``nvidia-*`` leftover), and for an overlaid name say to leave
    it out or rebuild it (never "a CUDA 13 build of ...-cu12", which cannot exist)."""
    donor = env.donor.latest()
    overlay, remove, other = [], [], []
    for n in names:
        theirs = donor.get(n)
        if n in env.overlaid:
            other.append(f"the donor's {describe(env.after[n])} is itself for another CUDA major: leave {n!r} out of "
                         f"overlay" + ("" if n.startswith("nvidia-") else f", or build it for CUDA {anchor}"))
        elif theirs is not None and theirs.raw_version != env.after[n].raw_version and not _SUFFIXED.match(n):
            overlay.append(f"{n} (the donor has {theirs.raw_version})")
        else:
            remove.append(n)
    parts = []
    if remove:
        listed = ", ".join(_compact(remove, set(env.after)))
        it = "it" if len(remove) == 1 else "them"
        without = "" if any(n in donor for n in remove) else f", and the donor runs without {it}"
        parts.append(f"add to remove: in {env.manifest}: [{listed}] (a CUDA {anchor} environment does not load "
                     f"{it}{without})")
    if overlay:
        parts.append(f"add to overlay in {env.manifest}: {', '.join(overlay)}")
    return "; ".join(parts + other)


def cuda_major_findings(env: EnvironmentAfter) -> list[Finding]:
    """``cuda-major-mismatch``: the environment after apply holds builds for two CUDA majors.

    A distribution that the donor runs beside the same anchor major (identical to the donor's,
    in the same context, the donor's own anchor being this one: :func:`_donor_anchor`) is not
    counted as the fault; when it is all there is, the finding is ``info``."""
    evidence = cuda_evidence(env)
    by_major: dict[int, list[Evidence]] = defaultdict(list)
    for e in evidence:
        by_major[e.major].append(e)
    if len(by_major) < 2:
        return []
    anchor = _anchor(env, by_major)
    odd_items = [e for m, items in by_major.items() if m != anchor for e in items]
    # a distribution identical to the donor's, in a donor built around the same major: the donor runs it
    # beside that major (the donor's own evidence for it may be unread: its bytes are these)
    same_anchor = _donor_anchor(env) == anchor
    donor_run = sorted({e.name for e in odd_items if same_anchor and env.donor_identical(e.name)})
    odd = sorted({e.name for e in odd_items} - set(donor_run))
    parts = []
    for major in sorted(by_major):
        items = [e for e in by_major[major] if e.name not in donor_run]
        if not items:
            continue
        shown = ", ".join(f"{describe(env.after[e.name])} ({e.how} {e.detail})" for e in items[:_SHOWN])
        more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
        parts.append(f"CUDA {major}: {shown}{more}")
    ran = (f"; the donor runs with {', '.join(describe(env.after[n]) for n in donor_run)} beside CUDA {anchor} "
           f"too (same files, same context), so {'those are' if len(donor_run) > 1 else 'that is'} not counted"
           if donor_run else "")
    names = sorted({e.name for e in evidence})
    if not odd:
        return [Finding(
            code="cuda-major-mismatch", severity="info", dists=tuple(donor_run),
            message=f"after apply the environment is CUDA {anchor} but holds "
                    f"{', '.join(describe(env.after[n]) for n in donor_run)} for another major; {DONOR_RUNS}",
            hint="nothing to do",
        )]
    return [Finding(
        code="cuda-major-mismatch", severity=severity(env, names, donor=False), dists=tuple(sorted({*odd, *(
            e.name for e in by_major[anchor])})),
        message="after apply the environment mixes CUDA majors: " + "; ".join(parts)
                + f"; one process loads one CUDA runtime, so the CUDA {anchor} side fails to load the others" + ran,
        hint=_fixes(env, odd, anchor),
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
    why = (f"a CUDA {need[0]} runtime does not start on a CUDA {have[0]} driver" if sev == "error" else
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


def gpu_arch_findings(env: EnvironmentAfter) -> list[Finding]:
    """``gpu-arch-unsupported``: the target's GPUs are not covered by the SASS or PTX of the
    overlaid shared objects, or the environment's CUDA release is too old (or too new) for them."""
    caps = target_gpus(env)
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
                message=f"{describe(dist)}: {count(len(bad), 'shared object')} {agree(len(bad), 'carries', 'carry')} device code only for "
                        f"{', '.join(have)}, which the target's {gpu} (sm_{arch}) cannot run "
                        f"(no kernel image is available for execution on the device)",
                hint=f"use a build of {dist.display_name} compiled for sm_{arch} or with PTX for compute_{arch} or "
                     f"older (e.g. TORCH_CUDA_ARCH_LIST=\"{arch // 10}.{arch % 10}\"), and overlay that instead",
                files=tuple(f.path for f in bad[:_SHOWN]),
            ))
    evidence = cuda_evidence(env)
    need = runtime_cuda(evidence)
    if need is None:
        return out
    # the distributions the finding is about: those whose CUDA build sets the runtime needed
    builders = tuple(sorted({e.name for e in evidence if (e.major, e.minor if e.minor is not None else 0) == need}))
    for arch, gpu in sorted(caps.items()):
        first = arch_minimum_cuda(arch)
        dropped = [d for d in cuda_table()["arch_dropped"] if d["cuda_major"] <= need[0] and arch < d["below"]]
        if first is not None and need < first:
            out.append(Finding(
                code="gpu-arch-unsupported", severity=severity(env, list(env.after), donor=False), dists=builders,
                message=f"the target's {gpu} (sm_{arch}) needs CUDA {first[0]}.{first[1]} or newer; the environment "
                        f"after apply is built for CUDA {need[0]}.{need[1]}",
                hint=f"overlay builds for CUDA {first[0]}.{first[1]} or newer (e.g. torch +cu{first[0]}{first[1]})",
            ))
        elif dropped:
            out.append(Finding(
                code="gpu-arch-unsupported", severity=severity(env, list(env.after), donor=False), dists=builders,
                message=f"CUDA {need[0]} dropped support for the target's {gpu} (sm_{arch})",
                hint=f"overlay builds for CUDA {need[0] - 1}.x on this host",
            ))
    return out
