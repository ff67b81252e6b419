"""CUDA build variants read from version local labels (pure core).

PyTorch's wheel index, and the projects that follow it (torchvision, triton kernels,
sgl-kernel, flashinfer-jit-cache), put the build variant in the PEP 440 local version
label: ``2.11.0+cu130`` is CUDA 13.0, ``+cu128`` CUDA 12.8, ``+cpu`` no CUDA, ``+rocm6.2``
ROCm (https://pytorch.org/get-started/locally/, "Compute Platform").
"""

from __future__ import annotations

import re

from packaging.version import Version

__all__ = ["cuda_variant", "variant_cuda_version", "describe_variant"]

_CU = re.compile(r"^cu(\d+)$")
_KNOWN = re.compile(r"^(cu\d+|cpu|rocm[\d.]+|xpu)$")


def cuda_variant(version: Version | None) -> str | None:
    """The build variant in a local label: ``cu130``, ``cpu``, ``rocm6.2``, ``xpu``, or None.

    Only the first dot-separated part of the label is read (``+cu130.post1`` -> ``cu130``);
    a label that names no known variant gives None.
    """
    if version is None or version.local is None:
        return None
    first = version.local.split(".")[0]
    if first.startswith("rocm"):
        return version.local if _KNOWN.match(version.local) else first
    return first if _KNOWN.match(first) else None


def variant_cuda_version(variant: str | None) -> tuple[int, int] | None:
    """(major, minor) of a ``cuNNN`` variant: ``cu130`` -> (13, 0), ``cu128`` -> (12, 8).

    The last digit is the minor version, the rest the major (PyTorch's naming).
    Returns None for ``cpu``, ROCm, None and anything else.
    """
    match = _CU.match(variant or "")
    if not match or len(match.group(1)) < 2:
        return None
    digits = match.group(1)
    return int(digits[:-1]), int(digits[-1])


def describe_variant(variant: str | None) -> str:
    """Human words for a variant: ``CUDA 13.0``, ``CPU-only``, ``ROCm 6.2``, or ``no build label``."""
    cuda = variant_cuda_version(variant)
    if cuda is not None:
        return f"CUDA {cuda[0]}.{cuda[1]}"
    if variant == "cpu":
        return "CPU-only"
    if variant and variant.startswith("rocm"):
        return "ROCm " + variant[4:]
    if variant:
        return variant
    return "no build label"
