"""A synthetic serving-shaped venv for the benchmarks: ~300 distributions, ~60,000 files.

A few large shared objects (libtorch, cuBLAS, cuDNN-like; hundreds of MB at scale 1) and
many small Python files, about 2 GB in all at scale 1. The shared objects are real ELF
(:mod:`bench.elfgen`: gcc-built bases with thousands of dynamic symbols, C++-mangled in
libtorch's namespaces for the torch-like ones, versioned for the nvidia-like ones, grown to
size by a ``.nv_fatbin`` section of SASS and PTX entries or a padding section), so the plan
pays the ELF reading that dominates on real stacks. The donor (+cu130) and the target
(+cu128) differ like the story's hosts: the torch family, the nvidia libraries and the
kernel packages have other versions and other bytes; every other distribution is
byte-identical. Distributions are written directly (dist-info with METADATA, WHEEL,
RECORD with sha256 hashes), not through pip, so building 2 GB takes seconds.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .elfgen import object_size, write_object

__all__ = ["Dist", "distributions", "build_venv", "differing_files"]

SITE = "lib/python3.11/site-packages"
MIB = 1 << 20


@dataclass(frozen=True)
class Dist:
    """One synthetic distribution: name, version per side, files (site-relative path -> size in bytes)."""

    name: str
    donor_version: str
    target_version: str
    files: tuple[tuple[str, int], ...]

    @property
    def differs(self) -> bool:
        return self.donor_version != self.target_version


def _small_files(package: str, count: int, rng: random.Random, scale: float = 1.0) -> list[tuple[str, int]]:
    count = max(2, int(count * min(1.0, scale)))  # below scale 1 the file count shrinks too (tests)
    out = [(f"{package}/__init__.py", 200)]
    for i in range(count - 1):
        folder = f"{package}/sub{i // 50}"
        out.append((f"{folder}/m{i}.py", rng.randint(500, 12000)))
    return out


def distributions(scale: float = 1.0) -> list[Dist]:
    """The workload's distributions at ``scale`` (1.0: ~2 GB, 300 distributions, ~60,000 files)."""
    rng = random.Random(1130)

    def big(mib: float) -> int:  # sizes of a CUDA serving venv's large objects, scaled
        return max(1, int(mib * 0.75 * scale * MIB))

    dists = [
        Dist("torch", "2.11.0+cu130", "2.11.0+cu128",
             tuple(_small_files("torch", 12000, rng, scale)) + (("torch/lib/libtorch_cuda.so", big(520)),
                                                         ("torch/lib/libtorch_cpu.so", big(330)),
                                                         ("torch/lib/libc10.so", big(2)))),
        Dist("torchvision", "0.26.0+cu130", "0.26.0+cu128",
             tuple(_small_files("torchvision", 400, rng, scale)) + (("torchvision/_C.so", big(12)),)),
        Dist("triton", "3.6.0", "3.5.1", tuple(_small_files("triton", 900, rng, scale)) + (("triton/_C/libtriton.so", big(90)),)),
        Dist("sgl-kernel", "0.3.21+cu130", "0.3.21+cu128",
             tuple(_small_files("sgl_kernel", 40, rng, scale)) + (("sgl_kernel/common_ops.so", big(180)),)),
    ]
    nvidia = [("cublas", 380), ("cudnn", 260), ("cusparse", 110), ("cufft", 95), ("nccl", 90), ("cusolver", 70),
              ("curand", 40), ("nvjitlink", 30), ("cuda-nvrtc", 40), ("cuda-runtime", 2), ("cuda-cupti", 6),
              ("nvtx", 1)]
    for lib, mib in nvidia:
        module = lib.replace("-", "_")
        dists.append(Dist(f"nvidia-{lib}", "13.0.0", "12.8.0",
                          ((f"nvidia/{module}/__init__.py", 0), (f"nvidia/{module}/lib/lib{module}.so", big(mib)))))
    for i in range(300 - len(dists)):
        dists.append(Dist(f"common-{i:03d}", "1.0.0", "1.0.0", tuple(_small_files(f"common_{i:03d}", 150, rng, scale))))
    return dists


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write(site: Path, dist: Dist, version: str, seed: bytes) -> None:
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for rel, size in dist.files:
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # shared objects: real ELF (bench.elfgen), random section bodies; small files: derived bytes
        if rel.endswith(".so"):
            digest, written = write_object(path, rel, size)
            writer.writerow([rel, "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode(),
                             written])
        elif size <= 64 * 1024:
            block = hashlib.sha512(seed + rel.encode()).digest()
            data = (block * (size // len(block) + 1))[:size]
            path.write_bytes(data)
            writer.writerow([rel, _digest(data), size])
        else:
            hasher = hashlib.sha256()
            with open(path, "wb") as handle:
                left = size
                while left:
                    chunk = os.urandom(min(left, 8 * MIB))
                    handle.write(chunk)
                    hasher.update(chunk)
                    left -= len(chunk)
            writer.writerow([rel, "sha256=" + base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode(), size])
    info = site / f"{dist.name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    meta = {"METADATA": f"Metadata-Version: 2.1\nName: {dist.name}\nVersion: {version}\n",
            "WHEEL": "Wheel-Version: 1.0\nGenerator: transplant-bench\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
            "INSTALLER": "pip\n"}
    for name, text in meta.items():
        (info / name).write_text(text)
        writer.writerow([f"{info.name}/{name}", _digest(text.encode()), len(text)])
    writer.writerow([f"{info.name}/RECORD", "", ""])
    (info / "RECORD").write_text(record.getvalue())


def build_venv(path: Path, side: str, scale: float = 1.0, common: Path | None = None) -> Path:
    """Create the ``side`` (``donor`` or ``target``) venv at ``path`` at ``scale``.

    :param common: an already built venv of the other side to hardlink the identical
        distributions from (saves writing them twice); None writes everything.
    :returns: ``path``.
    """
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(path)],
                   check=True)
    site = path / SITE
    for dist in distributions(scale):
        version = dist.donor_version if side == "donor" else dist.target_version
        if not dist.differs and common is not None:
            subprocess.run(["cp", "-al", *[str(common / SITE / p) for p in _tops(dist)], str(site)], check=True)
            continue
        _write(site, dist, version, b"common")  # small files equal on both sides; large ones random
    return path


def _tops(dist: Dist) -> list[str]:
    tops = {rel.split("/", 1)[0] for rel, _ in dist.files}
    tops.add(f"{dist.name.replace('-', '_')}-{dist.target_version}.dist-info")
    return sorted(tops)


def differing_files(scale: float = 1.0) -> tuple[list[str], int]:
    """Site-relative paths of the donor's files that differ from the target's (the shared
    objects of the differing distributions, their dist-info), and the shared objects' bytes."""
    paths, total = [], 0
    for dist in distributions(scale):
        if dist.differs:
            for rel, size in dist.files:
                if rel.endswith(".so"):
                    paths.append(rel)
                    total += object_size(rel, size)
            info = f"{dist.name.replace('-', '_')}-{dist.donor_version}.dist-info"
            paths += [f"{info}/{name}" for name in ("METADATA", "WHEEL", "INSTALLER", "RECORD")]
    return paths, total
