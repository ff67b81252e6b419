"""CUDA facts of the environment after apply: which CUDA release each distribution is
built for, and on what evidence (pure core).

Evidence, strongest first: the local version label (``+cu130``: PyTorch's naming,
https://pytorch.org/get-started/locally/), the ``nvidia-*-cuNN`` distribution names
against the unsuffixed CUDA-13 ``nvidia-*`` components whose version is the CUDA
version, the DT_NEEDED sonames of their shared objects (``libcudart.so.12``), and
torch's ``torch/version.py`` (``cuda = '12.8'``). The soname and component tables are
in ``data/cuda.json``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from transplant.core.cuda import cuda_variant, variant_cuda_version
from transplant.core.data import cuda_table
from transplant.core.rules.env import EnvironmentAfter

__all__ = ["Evidence", "cuda_evidence", "torch_cuda", "runtime_cuda"]

_SUFFIX = re.compile(r"^nvidia-.+-cu(\d+)$")
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.(\d+)", re.M)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """One fact saying a distribution is built for CUDA ``major`` (``minor`` when known).

    :ivar how: ``label`` (``+cu130``), ``name`` (``-cu12``), ``version`` (an unsuffixed
        CUDA component's own version), ``soname`` (a DT_NEEDED entry) or ``torch/version.py``.
    :ivar detail: the fact itself (``+cu130``, ``libcudart.so.12``).
    """

    name: str
    major: int
    minor: int | None
    how: str
    detail: str


def _soname_major(needed: str) -> int | None:
    for stem in cuda_table()["soname_majors"]:
        if needed.startswith(stem + "."):
            tail = needed[len(stem) + 1:].split(".")[0]
            return int(tail) if tail.isdigit() else None
    return None


def torch_cuda(env: EnvironmentAfter) -> tuple[int, int] | None:
    """torch's CUDA version from ``torch/version.py`` on the side torch comes from, or None."""
    if "torch" not in env.after:
        return None
    side = env.side("torch")
    text = side.texts.get(f"{side.site_packages}/torch/version.py")
    match = _TORCH_CUDA.search(text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_evidence(env: EnvironmentAfter) -> list[Evidence]:
    """Every piece of CUDA evidence in the environment after apply, one distribution at a time."""
    versioned = set(cuda_table()["versioned_components"])
    out: list[Evidence] = []
    for name in sorted(env.after):
        dist = env.after[name]
        found: list[Evidence] = []
        variant = cuda_variant(dist.version)
        cuda = variant_cuda_version(variant)
        if cuda is not None:
            found.append(Evidence(name=name, major=cuda[0], minor=cuda[1], how="label", detail=f"+{variant}"))
        suffix = _SUFFIX.match(name)
        if suffix and not found:
            found.append(Evidence(name=name, major=int(suffix.group(1)), minor=None, how="name",
                                  detail=f"-cu{suffix.group(1)}"))
        elif name in versioned and dist.version is not None and dist.version.major >= 11 and not found:
            found.append(Evidence(name=name, major=dist.version.major, minor=dist.version.minor, how="version",
                                  detail=dist.raw_version or ""))
        if not found:
            for facts in env.objects(name):
                majors = {(m, n) for n in facts.needed if (m := _soname_major(n)) is not None}
                for major, needed in sorted(majors):
                    found.append(Evidence(name=name, major=major, minor=None, how="soname",
                                          detail=f"{facts.path} needs {needed}"))
                if found:
                    break
        if name == "torch" and not found and (tc := torch_cuda(env)) is not None:
            found.append(Evidence(name=name, major=tc[0], minor=tc[1], how="torch/version.py",
                                  detail=f"cuda = '{tc[0]}.{tc[1]}'"))
        out.extend(found)
    return out


def runtime_cuda(evidence: list[Evidence]) -> tuple[int, int] | None:
    """The newest CUDA ``(major, minor)`` the environment needs: the highest evidence with a
    known minor, or ``(major, 0)`` when only a major is known; None without CUDA evidence."""
    best: tuple[int, int] | None = None
    for e in evidence:
        version = (e.major, e.minor if e.minor is not None else 0)
        best = version if best is None or version > best else best
    return best
