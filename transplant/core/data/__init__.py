"""Compatibility tables shipped with transplant (``transplant/core/data/*.json``), each with its source.

Read-only package data, loaded once. Each table names where its facts come from in a
``sources`` key; :mod:`transplant.core.rules` cites them in findings.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from packaging.version import Version

__all__ = ["cuda_table", "cuda_compat_table", "family_table", "driver_minimum", "driver_cuda", "arch_minimum_cuda",
           "x86_levels", "runtime_c"]


@cache
def _load(name: str) -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"))


def cuda_table() -> dict[str, Any]:
    """``data/cuda.json``: minimum drivers, architecture minimums, CUDA sonames, versioned nvidia-* names."""
    return _load("cuda.json")


def cuda_compat_table() -> dict[str, Any]:
    """``data/cuda_compat.json``: what NVIDIA's CUDA Compatibility guide says of forward
    compatibility (the systems it applies to, the package, the error at ``cuInit`` where it does
    not apply), with sources."""
    return _load("cuda_compat.json")


def x86_levels() -> dict[str, Any]:
    """``data/x86_levels.json``: the CPU flags (as ``/proc/cpuinfo`` names them) each x86-64
    micro-architecture level adds, with sources."""
    return _load("x86_levels.json")


def runtime_c() -> dict[str, Any]:
    """``data/runtime_c.json``: the packages that build C with the host's compiler at run time
    (``builders``: name -> what, source, the failure they raise) and the package names that
    bring a compiler and Python's headers per distribution family (``packages``), with sources."""
    return _load("runtime_c.json")


def family_table() -> dict[str, Any]:
    """``data/families.json``: torch release pairs and default builds, lockstep families."""
    return _load("families.json")


def driver_minimum(cuda: tuple[int, int]) -> str | None:
    """The minimum Linux driver for CUDA ``(major, minor)`` (``(13, 0)`` -> ``580.65.06``), or
    the next listed release's when that minor is not listed; None above the table."""
    rows = sorted((tuple(int(p) for p in r["cuda"].split(".")), r["driver"]) for r in cuda_table()["driver_minimum"])
    for version, driver in rows:
        if version >= cuda:
            return driver
    return None


def driver_cuda(driver: str) -> tuple[int, int] | None:
    """The newest CUDA ``(major, minor)`` a driver version supports by the table, or None
    when it is older than every row or not a version."""
    try:
        have = Version(driver)
    except ValueError:
        return None
    best = None
    for row in cuda_table()["driver_minimum"]:
        if Version(row["driver"]) <= have:
            version = tuple(int(p) for p in row["cuda"].split("."))
            best = version if best is None or version > best else best
    return best  # type: ignore[return-value]  # the table's cuda column is MAJOR.MINOR: two parts


def arch_minimum_cuda(arch: int) -> tuple[int, int] | None:
    """The first CUDA release that supports compute capability ``arch`` (120 -> (12, 8)), or None if unknown."""
    text = cuda_table()["arch_minimum_cuda"].get(str(arch))
    if text is None:
        return None
    major, minor = text.split(".")
    return int(major), int(minor)
