"""``jit-compiler-too-old``: a JIT user present after apply will compile for the target's GPU
with a CUDA compiler too old for it (pure core).

triton compiles every kernel with ``ptxas`` (the one its wheel carries, or
``TRITON_PTXAS_PATH``); flashinfer's JIT compiles with the ``nvcc`` under ``CUDA_HOME`` /
``CUDA_PATH`` / ``PATH`` / ``/usr/local/cuda``. A compiler older than the first CUDA release
that targets the GPU's compute capability cannot build for it (``data/jit_compilers.json``,
``arch_first_cuda``, from NVIDIA's release text), and a JIT user may state its own minimum
(``stated_minimums``: flashinfer from 0.6.7 on refuses SM 12.x below CUDA 12.9, "SM 12.x
requires CUDA >= 12.9", and leaves the GPU out of its targets). The GPUs are the target's
(nvidia-smi's ``compute_cap``), the compilers the target's as its probe found them, except
triton's bundled ptxas, a file of the venv that arrives with triton (the donor's when the
overlay brings triton, unless the target sets ``TRITON_PTXAS_PATH``).

The verdict depends on the target's GPU, a host fact: a donor with an older GPU that ran the
same compiler fine does not excuse it (the donor principle does not apply). Silent when the
target's GPUs are unknown (no driver answered), when the compiler is unknown (not found, or its
``--version`` printed no release), and for a compute capability the table does not list.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from transplant.core.data import _load
from transplant.core.inventory import JitCompiler
from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, severity, target_gpus

__all__ = ["jit_compiler_findings", "arch_first_cuda", "JIT_USERS"]

#: The JIT users judged, by normalised distribution name, and the compiler each runs.
JIT_USERS = {"triton": "ptxas", "flashinfer-python": "nvcc"}


@dataclass(frozen=True)
class _Need:
    cuda: tuple[int, int]
    why: str


def _cuda(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def arch_first_cuda(arch: int) -> tuple[tuple[int, int], str] | None:
    """The first CUDA release whose compiler targets compute capability ``arch`` (121 ->
    ``((12, 9), source)``) and the NVIDIA page that says so, or None when
    ``data/jit_compilers.json`` does not list it."""
    row = _load("jit_compilers.json")["arch_first_cuda"].get(str(arch))
    return (_cuda(row["cuda"]), row["source"]) if row else None


def _stated(name: str, version: Version, arch: int) -> list[_Need]:
    """The minimums ``name`` at ``version`` states itself for ``arch`` (its own refusal text)."""
    out = []
    for row in _load("jit_compilers.json")["stated_minimums"]:
        if row["dist"] == name and version >= Version(row["from_version"]) and arch // 10 == row["major"]:
            out.append(_Need(_cuda(row["cuda"]), f"{row['dist']} {row['from_version']} and later refuse it: "
                                                 f"\"{row['refusal']}\""))
    return out


def _compiler(env: EnvironmentAfter, name: str, kind: str) -> tuple[JitCompiler | None, str]:
    """The compiler ``name`` will run on the target after apply, and where it comes from."""
    target = env.target.jit_compilers
    if kind == "nvcc":
        return (target.nvcc if target else None), "the target's"
    if target is not None and target.triton_ptxas is not None and target.triton_ptxas.source == "TRITON_PTXAS_PATH":
        return target.triton_ptxas, "the target's TRITON_PTXAS_PATH"
    side = env.side(name).jit_compilers
    if side is None or side.triton_ptxas is None or side.triton_ptxas.source != "triton":
        return None, ""
    return side.triton_ptxas, ("triton's bundled (arriving with it from the donor)" if name in env.overlaid
                               else "triton's bundled")


def jit_compiler_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per JIT user (:data:`JIT_USERS`) present after apply whose compiler is older
    than a target GPU needs. Severity: :func:`~transplant.core.rules.env.severity` without the
    donor principle (error when apply changes the JIT user, else warning: the target has this
    already)."""
    gpus = target_gpus(env) if env.target.nvidia.available else {}
    if not gpus:
        return []
    out = []
    for name, kind in JIT_USERS.items():
        dist = env.after.get(name)
        if dist is None:
            continue
        compiler, whose = _compiler(env, name, kind)
        if compiler is None or compiler.release is None:
            continue
        try:
            version = Version(dist.raw_version) if dist.raw_version else None
        except InvalidVersion:
            version = None
        short: list[tuple[int, str, _Need]] = []
        for arch, gpu in sorted(gpus.items()):
            needs = _stated(name, version, arch) if version is not None else []
            first = arch_first_cuda(arch)
            if first is not None:
                needs.append(_Need(first[0], f"CUDA {first[0][0]}.{first[0][1]} is the first release whose compiler "
                                             f"targets sm_{arch} ({first[1]})"))
            for need in needs:
                if need.cuda > compiler.release:
                    short.append((arch, gpu, need))
                    break
        if not short:
            continue
        arch, gpu, need = max(short, key=lambda s: s[2].cuda)
        have = f"{compiler.release[0]}.{compiler.release[1]}"
        fix = (f"set TRITON_PTXAS_PATH on the target to the ptxas of CUDA {need.cuda[0]}.{need.cuda[1]} or newer, or "
               f"overlay a triton whose bundled ptxas is that new" if kind == "ptxas" else
               f"install CUDA {need.cuda[0]}.{need.cuda[1]} or newer on the target (a toolkit, or the nvcc wheel) and "
               f"point CUDA_HOME at it where {dist.display_name} runs")
        out.append(Finding(
            code="jit-compiler-too-old", severity=severity(env, [name], donor=False), dists=(name,),
            message=f"{describe(dist)} JIT-compiles with {whose} {kind} {compiler.describe()}, and the target's "
                    f"{gpu} is sm_{arch}: {need.why}; CUDA {have} is older, so its kernels cannot be built for "
                    f"this GPU (the target's GPU decides this: a donor GPU the compiler knows does not excuse it)",
            hint=fix,
        ))
    return out
