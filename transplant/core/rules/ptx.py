"""``ptx-too-new``: kernels the target's GPU can run only by JIT-compiling their PTX, whose
PTX ISA version is newer than the target's driver knows (pure core).

When a shared object carries no SASS for a GPU (``sm_90`` SASS does not run on a 10.0 GPU),
the driver JIT-compiles the newest PTX entry it may use, and refuses PTX of an ISA version
newer than it knows: "the provided PTX was compiled with an unsupported toolchain"
(CUDA_ERROR_UNSUPPORTED_PTX_VERSION). The PTX ISA version of each entry is read from its
fatbin header (``ElfFacts.ptx_isa``); ``data/ptx.json`` maps it to the CUDA release that
introduced it, with its source, and ``data/cuda.json`` gives that release's minimum driver.
The target driver's CUDA version is nvidia-smi's (else derived from the driver version).
Only overlaid objects are judged (their device code is read); a PTX ISA version the table
does not list is not judged.
"""

from __future__ import annotations

from transplant.core.elf_facts import DeviceCode
from transplant.core.plan import Finding
from transplant.core.data import _load, driver_cuda, driver_minimum
from transplant.core.rules.cudarules import covers
from transplant.core.rules.env import EnvironmentAfter, describe, severity, target_gpus
from transplant.core.units import agree, count

__all__ = ["ptx_cuda", "ptx_findings"]

_SHOWN = 3


def ptx_cuda(isa: str) -> tuple[int, int] | None:
    """The CUDA release that introduced PTX ISA ``isa`` (``"8.7"`` -> ``(12, 8)``), or None when
    the table (``data/ptx.json``) does not list it."""
    text = _load("ptx.json")["ptx_isa_cuda"].get(isa)
    if text is None:
        return None
    major, minor = text.split(".")
    return int(major), int(minor)


def _driver(env: EnvironmentAfter) -> tuple[int, int] | None:
    nv = env.target.nvidia
    parts = (nv.cuda_version or "").split(".")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    return driver_cuda(nv.driver_version) if nv.driver_version else None


def _jit_entry(code: tuple[DeviceCode, ...], arch: int) -> DeviceCode | None:
    """The PTX entry the driver JIT-compiles for ``arch`` when no SASS runs there (the newest
    one that may run on it), or None when SASS covers ``arch`` or no PTX fits."""
    if covers(tuple(d for d in code if d.kind == "sass"), arch):
        return None
    usable = [d for d in code if d.kind == "ptx" and covers((d,), arch)]
    return max(usable, key=lambda d: (d.arch, d.variant != "")) if usable else None


def ptx_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per (overlaid distribution, target GPU) whose objects need PTX JIT with a
    PTX ISA newer than the target driver's CUDA version. Severity by
    :func:`transplant.core.rules.env.severity` without the donor principle (the driver is the
    target's): error, as the overlay brings these objects."""
    nv = env.target.nvidia
    have = _driver(env) if nv.available else None
    if have is None:
        return []
    gpus = target_gpus(env)
    out = []
    for name in env.overlaid:
        for arch, gpu in sorted(gpus.items()):
            bad: list[tuple[str, str, str, tuple[int, int]]] = []
            for facts in env.objects(name):
                entry = _jit_entry(facts.device_code, arch) if not facts.error else None
                isa = facts.ptx_isa.get(entry.name) if entry is not None else None
                need = ptx_cuda(isa) if isa else None
                if entry is not None and isa and need is not None and need > have:
                    bad.append((facts.path, entry.name, isa, need))
            if not bad:
                continue
            need = max(b[3] for b in bad)
            path, entry_name, isa, _ = max(bad, key=lambda b: b[3])
            minimum = driver_minimum(need) or "a newer one"
            out.append(Finding(
                code="ptx-too-new", severity=severity(env, [name], donor=False), dists=(name,),
                message=f"{describe(env.after[name])}: {count(len(bad), 'shared object')} {agree(len(bad), 'has', 'have')} no SASS for the target's "
                        f"{gpu} (sm_{arch}), so the driver must JIT-compile their PTX, and it is newer than the "
                        f"driver {nv.driver_version or '?'} (CUDA {have[0]}.{have[1]}) knows: e.g. {path} "
                        f"{entry_name} is PTX ISA {isa} (CUDA {need[0]}.{need[1]}): \"the provided PTX was compiled "
                        f"with an unsupported toolchain\"",
                hint=f"upgrade the target's NVIDIA driver to {minimum} or newer (CUDA {need[0]}.{need[1]}), or "
                     f"overlay a build of {env.after[name].display_name} with SASS for sm_{arch}",
                files=tuple(b[0] for b in bad[:_SHOWN]),
            ))
    return out
