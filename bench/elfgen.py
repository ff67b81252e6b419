"""Real ELF shared objects for the synthetic workload: gcc-built, then grown to size.

A handful of base objects is compiled once per process with gcc (a few seconds): C sources
whose functions carry C++-mangled names through asm labels, so gcc compiles C at C's speed
and the dynamic symbol tables still hold thousands of names in libtorch's namespaces (c10,
at, torch, caffe2). The shapes follow a CUDA serving venv:

* ``libc10.so``, ``libtorch_cpu.so``, ``libtorch_cuda.so``: sonames, thousands of defined
  torch-namespace symbols, DT_NEEDED on each other (RUNPATH ``$ORIGIN``), and undefined
  references to each other's symbols;
* ``ext`` (torchvision's ``_C.so``, sgl-kernel's ``common_ops.so``): an extension that
  links libtorch (DT_NEEDED ``libtorch_cpu.so`` and ``libc10.so``, RUNPATH
  ``$ORIGIN/../torch/lib``) and leaves hundreds of torch symbols undefined, all of them
  defined by the torch bases (so the plan's symbol lookup finds them);
* ``triton``: thousands of mlir/llvm-namespace symbols, no torch;
* ``nv`` (the nvidia libraries): thousands of C symbols under a version node
  (``libnvbench.so.13``), as cuBLAS' ``libcublas.so.13`` node.

Each file of the workload is one base with one section appended (see :func:`write_object`):
``.nv_fatbin`` for the libraries that carry device code (NVIDIA's fatbin format, as
``transplant/remote/elf_facts.py`` ``fatbin_entries`` reads it: containers of SASS and PTX
entries, one container per translation unit), ``.bench_pad`` for the others, holding random
bytes, so that every file has its declared size and the donor's bytes differ from the target's.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["base_objects", "object_size", "write_object", "base_for", "has_fatbin", "mangle"]

#: Fatbin container header (magic, version, header size, bytes after it) and entry header,
#: as ``transplant/remote/elf_facts.py`` reads them (the committed fixtures of tests/data/fatbin).
CONTAINER = struct.Struct("<IHHQ")
ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
MAGIC = 0xBA55ED50
ARCH_SPECIFIC = 0x100000
#: One translation unit's entries: SASS for five architectures (one arch-specific) and PTX.
TU_ENTRIES = ((2, 80, 0), (2, 86, 0), (2, 90, 0), (2, 90, ARCH_SPECIFIC), (2, 100, 0), (2, 120, 0), (1, 120, 0))
TU_BYTES = 256 << 10  # one container per 256 KiB of fatbin
MIN_FATBIN = CONTAINER.size + len(TU_ENTRIES) * ENTRY.size

SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
SHT_PROGBITS, SHT_STRTAB = 1, 3


def mangle(*parts: str) -> str:
    """Itanium-mangled name of ``ns1::ns2::name()`` (``_ZN3c104impl3fooEv`` for c10, impl, foo)."""
    return "_ZN" + "".join(f"{len(p)}{p}" for p in parts) + "Ev"


def _names(namespaces: tuple[tuple[str, ...], ...], stem: str, count: int) -> list[str]:
    return [mangle(*namespaces[i % len(namespaces)], f"{stem}{i:05d}") for i in range(count)]


C10 = _names((("c10",), ("c10", "impl"), ("c10", "detail")), "op", 2500)
CPU = _names((("at",), ("at", "native"), ("torch", "autograd"), ("torch", "jit"), ("caffe2",)), "fn", 9000)
CUDA = _names((("at", "cuda"), ("at", "native"), ("c10", "cuda")), "kernel", 4000)
EXT = _names((("vision", "ops"),), "op", 400)
TRITON = _names((("mlir",), ("mlir", "triton"), ("llvm",)), "pass", 5000)
NV = [f"nvbench{'Gemm' if i % 2 else 'Conv'}{i:05d}" for i in range(3000)]


def _source(defined: Sequence[str], undefined: Sequence[str] = ()) -> str:
    lines = [f'int d{i}(void) __asm__("{name}");\nint d{i}(void) {{ return {i}; }}' for i, name in enumerate(defined)]
    lines += [f'extern int u{i}(void) __asm__("{name}");' for i, name in enumerate(undefined)]
    if undefined:
        lines.append("int bench_use(void) { return " + " + ".join(f"u{i}()" for i in range(len(undefined))) + "; }")
    return "\n".join(lines) + "\n"


def _cc(folder: Path, out: str, source: str, *extra: str) -> None:
    (folder / f"{out}.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(folder / out), str(folder / f"{out}.c"), *extra],
                   check=True)


@functools.lru_cache(maxsize=1)
def base_objects() -> dict[str, bytes]:
    """The compiled bases, name -> bytes (a few hundred KB each), built once per process with gcc.

    :raises subprocess.CalledProcessError: gcc failed; FileNotFoundError: no gcc.
    """
    with tempfile.TemporaryDirectory(prefix="transplant-bench-elf-") as tmp:
        d = Path(tmp)
        link = ["-L", str(d), "-Wl,--no-as-needed"]
        _cc(d, "libc10.so", _source(C10), "-Wl,-soname,libc10.so")
        _cc(d, "libtorch_cpu.so", _source(CPU, C10[::10]), "-Wl,-soname,libtorch_cpu.so", "-Wl,-rpath,$ORIGIN",
            *link, "-l:libc10.so")
        _cc(d, "libtorch_cuda.so", _source(CUDA, CPU[::30] + C10[::25]), "-Wl,-soname,libtorch_cuda.so",
            "-Wl,-rpath,$ORIGIN", *link, "-l:libtorch_cpu.so", "-l:libc10.so")
        _cc(d, "ext", _source(EXT, CPU[::20] + C10[::20]), "-Wl,-rpath,$ORIGIN/../torch/lib", *link,
            "-l:libtorch_cpu.so", "-l:libc10.so")
        _cc(d, "triton", _source(TRITON))
        (d / "nv.map").write_text("libnvbench.so.13 { global: nvbench*; local: *; };\n")
        _cc(d, "nv", _source(NV), f"-Wl,--version-script={d / 'nv.map'}")
        return {name: (d / name).read_bytes() for name in
                ("libc10.so", "libtorch_cpu.so", "libtorch_cuda.so", "ext", "triton", "nv")}


def base_for(rel: str) -> str:
    """The base object of a workload file (site-relative path)."""
    name = rel.rsplit("/", 1)[-1]
    if rel.startswith("torch/lib/"):
        return name
    if rel.startswith("nvidia/"):
        return "nv"
    return "triton" if rel.startswith("triton/") else "ext"


#: Libraries whose real counterparts carry device code (a .nv_fatbin); the others get padding.
FATBIN_LIBS = ("libtorch_cuda.so", "torchvision/_C.so", "common_ops.so", "libcublas", "libcudnn", "libcusparse",
               "libcufft", "libnccl", "libcusolver", "libcurand")


def has_fatbin(rel: str) -> bool:
    """Whether the workload's file ``rel`` gets a ``.nv_fatbin`` section."""
    return any(part in rel for part in FATBIN_LIBS)


def _layout(base: bytes) -> tuple[int, int, int, bytes, bytes]:
    """(e_shoff, e_shnum, e_shstrndx, section headers, section names) of an ELF64 little-endian base."""
    if base[:4] != b"\x7fELF" or base[4] != 2 or base[5] != 1:
        raise ValueError("the bench's ELF writer handles 64-bit little-endian objects only")
    shoff, = struct.unpack_from("<Q", base, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", base, 0x3A)
    headers = base[shoff:shoff + shnum * shentsize]
    strtab = SECTION_HEADER.unpack_from(headers, shstrndx * SECTION_HEADER.size)
    return shoff, shnum, shstrndx, headers, base[strtab[4]:strtab[4] + strtab[5]]


def _fixed(base: bytes, name: str) -> int:
    """Bytes of a written object other than its appended section's payload."""
    _, shnum, _, _, names = _layout(base)
    return _up8(len(base)) + (shnum + 1) * SECTION_HEADER.size + _up8(len(names) + len(name) + 1)


def _up8(n: int) -> int:
    return (n + 7) & ~7


def object_size(rel: str, size: int) -> int:
    """The bytes :func:`write_object` writes for ``rel`` asked for ``size``: ``size``, or the
    smallest object its base and section allow, with some random bytes, when ``size`` is smaller
    (tiny test scales)."""
    base = base_objects()[base_for(rel)]
    fat = has_fatbin(rel)
    # at least 16 random bytes per fatbin entry (64 of padding): two writes never give the same bytes
    least = _fixed(base, ".nv_fatbin" if fat else ".bench_pad") + (MIN_FATBIN + 16 * len(TU_ENTRIES) if fat else 64)
    return max(size, least)


def _fatbin(payload: int):
    """Chunks of a fatbin of exactly ``payload`` bytes (>= MIN_FATBIN): headers and random entry bodies."""
    count = max(1, payload // TU_BYTES)
    each = payload // count
    for index in range(count):
        container = each if index < count - 1 else payload - each * (count - 1)
        body = container - CONTAINER.size
        yield CONTAINER.pack(MAGIC, 1, CONTAINER.size, body)
        data = body - len(TU_ENTRIES) * ENTRY.size
        share = data // len(TU_ENTRIES)
        for n, (kind, arch, flags) in enumerate(TU_ENTRIES):
            size = share if n < len(TU_ENTRIES) - 1 else data - share * (len(TU_ENTRIES) - 1)
            yield ENTRY.pack(kind, 0x101, ENTRY.size, size, 0, 0, 8 if kind == 2 else 0, 1 if kind == 2 else 9,
                             arch, 0, 0, 0x11 | flags, 0, 0)
            yield from _random(size)


def _random(size: int):
    while size > 0:
        chunk = os.urandom(min(size, 8 << 20))
        size -= len(chunk)
        yield chunk


def write_object(path: Path, rel: str, size: int) -> tuple[str, int]:
    """Write the workload's shared object ``rel`` at ``path``: its base with ``.nv_fatbin``
    (see :func:`has_fatbin`) or ``.bench_pad`` appended, random bodies (each call other bytes).

    Layout: the base (padded to 8), the section header table with the new section last, the
    new section-name table, then the new section's payload to the end of the file.

    :returns: (sha256 hex digest, bytes written: :func:`object_size`).
    """
    base = base_objects()[base_for(rel)]
    fat = has_fatbin(rel)
    name = ".nv_fatbin" if fat else ".bench_pad"
    total = object_size(rel, size)
    _, shnum, shstrndx, headers, names = _layout(base)
    shoff = _up8(len(base))
    strtab_at = shoff + (shnum + 1) * SECTION_HEADER.size
    new_names = names + name.encode() + b"\0"
    payload_at = strtab_at + _up8(len(new_names))
    payload = total - payload_at
    rows = [list(SECTION_HEADER.unpack_from(headers, i * SECTION_HEADER.size)) for i in range(shnum)]
    rows[shstrndx][4], rows[shstrndx][5] = strtab_at, len(new_names)
    rows.append([len(names), SHT_PROGBITS, 0, 0, payload_at, payload, 0, 0, 8, 0])
    head = bytearray(base) + bytes(shoff - len(base))
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<H", head, 0x3C, shnum + 1)
    head += b"".join(SECTION_HEADER.pack(*row) for row in rows)
    head += new_names + bytes(_up8(len(new_names)) - len(new_names))
    digest = hashlib.sha256()
    with open(path, "wb") as handle:
        for chunk in itertools.chain((bytes(head),), _fatbin(payload) if fat else _random(payload)):
            handle.write(chunk)
            digest.update(chunk)
    return digest.hexdigest(), total
