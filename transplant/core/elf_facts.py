"""ELF facts of shared objects, as frozen data parsed from the ``elf_facts`` host script (pure core).

The host script (:mod:`transplant.remote.elf_facts`) reads each file with pyelftools,
sent to the host with the request, and reports per file: the machine type, the soname,
DT_NEEDED, DT_RUNPATH and DT_RPATH, the symbol versions it needs (``.gnu.version_r``), its undefined
libtorch symbols, and the device code in its ``.nv_fatbin`` section. It can also answer
"which of these symbols do these libraries define" and report the version definitions
of the ``libstdc++.so.6`` the venv's interpreter loads. :func:`parse_elf_report` is the
only way in; it reports the key path of any bad value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transplant.errors import ProbeError
from transplant.core.decode import DecodeError, Decoder, entry_path, item_path, strings

__all__ = [
    "ELF_SCHEMA",
    "DeviceCode",
    "ElfFacts",
    "LibraryVersions",
    "ElfReport",
    "parse_elf_report",
    "is_shared_object",
    "is_torch_symbol",
]

ELF_SCHEMA = "transplant.elf/1"

_SO = re.compile(r"\.so(\.\d+)*$")
#: Itanium C++ ABI mangled names in the namespaces libtorch exports: ``c10``, ``at``,
#: ``torch``, ``caffe2`` (``_ZN3c10...``, ``_ZNK2at...``, vtables ``_ZTVN5torch...``).
_TORCH = re.compile(r"^_Z(?:T[VIS])?N[rVKRO]*(?:3c10|2at|5torch|6caffe2)")


def is_shared_object(path: str) -> bool:
    """Whether a path names a shared object by its suffix: ``x.so``, ``libcudart.so.13``."""
    return bool(_SO.search(path.rsplit("/", 1)[-1]))


def is_torch_symbol(name: str) -> bool:
    """Whether a (mangled) symbol name lies in one of libtorch's C++ namespaces (c10, at, torch, caffe2)."""
    return bool(_TORCH.match(name))


@dataclass(frozen=True, kw_only=True)
class DeviceCode:
    """One entry of a CUDA fatbin: SASS (a cubin for one architecture) or PTX.

    :ivar kind: ``sass`` or ``ptx``.
    :ivar arch: compute capability as major*10+minor (90 for 9.0, 120 for 12.0).
    :ivar variant: ``""``, ``a`` (arch-specific, runs only on exactly that
        architecture) or ``f`` (family-specific, runs on the same major with an equal or
        higher minor); CUDA C++ Programming Guide, "Feature Availability".
    """

    kind: str
    arch: int
    variant: str = ""

    @property
    def name(self) -> str:
        """``sm_90a`` for SASS, ``compute_90`` for PTX."""
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"


@dataclass(frozen=True, kw_only=True)
class ElfFacts:
    """What one shared object says about itself.

    :ivar path: POSIX path relative to the venv prefix.
    :ivar error: why it could not be read as ELF (then the other fields are empty).
    :ivar machine: pyelftools' e_machine name (``EM_X86_64``, ``EM_AARCH64``).
    :ivar elf_class: 32 or 64.
    :ivar soname: DT_SONAME, or None.
    :ivar needed: DT_NEEDED entries in order.
    :ivar runpath: DT_RUNPATH's folders in order, as written (``$ORIGIN`` not expanded); ``()``
        without the tag or from an older report (the host script keeps at most 64 per tag).
    :ivar rpath: DT_RPATH's folders, likewise.
    :ivar version_needs: needed file -> the version names it needs from it
        (``{"libc.so.6": ("GLIBC_2.2.5", "GLIBC_2.33")}``).
    :ivar torch_undefined: undefined, non-weak dynamic symbols in libtorch's namespaces
        (see :func:`is_torch_symbol`), sorted; only gathered when the request asked.
    :ivar device_code: the fatbin entries, sorted; empty without a ``.nv_fatbin`` section
        or when the request did not ask.
    :ivar notes: parts of the file that were not read, and why (a compressed fatbin too
        large to inflate); the rules say these checks were not done.
    :ivar versioned_undefined: needed file -> its undefined, non-weak dynamic symbols bound to
        a symbol version of that file (the C runtime's and libstdc++'s left out), sorted; None
        when not gathered (the request did not ask, or an older report).
    :ivar numpy_abi: the NumPy C-API the file was built against, from the module its
        ``_import_array()`` names: ``"1"`` (1.x headers), ``"2"`` (2.x headers), ``""`` (it
        uses neither); None when not read.
    :ivar x86_isa_needed: the x86-64 micro-architecture levels its GNU property note
        (``GNU_PROPERTY_X86_ISA_1_NEEDED``) says it needs (``("x86-64-baseline", "x86-64-v2",
        "x86-64-v3")``), which glibc 2.33 and later check against the CPU before loading it;
        ``()`` without the note; None when not read (an older report).
    :ivar ptx_isa: PTX entry name (``compute_90``) -> the newest PTX ISA version among its
        entries (``"9.0"``), from the fatbin entry headers; empty when not read.
    """

    path: str
    error: str | None = None
    machine: str | None = None
    elf_class: int | None = None
    soname: str | None = None
    needed: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    version_needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    torch_undefined: tuple[str, ...] = ()
    device_code: tuple[DeviceCode, ...] = ()
    notes: tuple[str, ...] = ()
    versioned_undefined: Mapping[str, tuple[str, ...]] | None = None
    numpy_abi: str | None = None
    ptx_isa: Mapping[str, str] = field(default_factory=dict)
    x86_isa_needed: tuple[str, ...] | None = None

    @property
    def search_folders(self) -> tuple[str, ...]:
        """The folders the loader searches for this object's DT_NEEDED names before the loader
        cache: DT_RUNPATH's, or DT_RPATH's when it has no DT_RUNPATH (ld.so(8): DT_RPATH is
        ignored when DT_RUNPATH is present)."""
        return self.runpath or self.rpath


@dataclass(frozen=True, kw_only=True)
class LibraryVersions:
    """A system library the venv's interpreter loads: its real path and the version names it defines."""

    path: str
    versions: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ElfReport:
    """One run of the ``elf_facts`` script on one host.

    :ivar files: venv-relative path -> facts, for every file asked.
    :ivar libstdcxx: the ``libstdc++.so.6`` the interpreter loads; None when not asked
        or not found.
    :ivar defined: symbol -> whether any of ``defined_in`` defines it (an answer to the
        request's ``defined`` query; empty when not asked).
    :ivar defined_in: the venv-relative libraries searched for ``defined``.
    :ivar defined_by: venv-relative library -> the asked names it does not define (None when
        it could not be read); empty when not asked.
    :ivar seconds: time the script took on the host.
    :ivar cache: the script's cache report (``{"enabled", "hits", "misses", "read": [venv-relative
        files whose content it opened], "written"}``); empty when the script sent none.
    """

    label: str
    files: Mapping[str, ElfFacts]
    libstdcxx: LibraryVersions | None = None
    defined: Mapping[str, bool] = field(default_factory=dict)
    defined_in: tuple[str, ...] = ()
    seconds: float = 0.0
    defined_by: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    cache: Mapping[str, Any] = field(default_factory=dict)


def _fail(label: str, exc: DecodeError) -> ProbeError:
    return ProbeError(f"{label}: ELF report key {exc.path!r}: {exc.describe()}",
                      hint="the host script and controller versions may differ; reinstall transplant")


def _device_code(value: Any, path: str, obj: Mapping[str, Any]) -> tuple[DeviceCode, ...]:
    """``device_code``: the fatbin entries, deduplicated and sorted (an entry's ``isa`` is read by
    :func:`_ptx_isa`)."""
    if not isinstance(value, list):
        raise DecodeError(path, "a list", value)
    out = []
    for i, item in enumerate(value):
        where = item_path(path, i)
        if not isinstance(item, dict):
            raise DecodeError(where, "an object", item)
        kind, arch, variant = item.get("kind"), item.get("arch"), item.get("variant", "")
        if kind not in ("sass", "ptx"):
            raise DecodeError(f"{where}.kind", "'sass' or 'ptx'", kind)
        if not isinstance(arch, int) or isinstance(arch, bool) or arch <= 0:
            raise DecodeError(f"{where}.arch", "a positive int", arch)
        if variant not in ("", "a", "f"):
            raise DecodeError(f"{where}.variant", "'', 'a' or 'f'", variant)
        out.append(DeviceCode(kind=kind, arch=arch, variant=variant))
    return tuple(sorted(set(out), key=lambda d: (d.kind, d.arch, d.variant)))


_ISA = re.compile(r"^\d+\.\d+$")


def _ptx_isa(value: Any, path: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """PTX ISA versions from the device code entries' ``isa`` (the host script) or a ``ptx_isa``
    object (a recorded report), keyed by the entry name (``compute_90a``)."""
    out: dict[str, str] = {}
    raw = value or {}
    if not isinstance(raw, dict):
        raise DecodeError(path, "an object", raw)
    items = list(raw.items())
    for item in obj.get("device_code") or ():
        if isinstance(item, dict) and item.get("kind") == "ptx" and item.get("isa") is not None:
            items.append((f"compute_{item.get('arch')}{item.get('variant', '')}", item["isa"]))
    for name, isa in items:
        if not isinstance(isa, str) or not _ISA.match(isa):
            raise DecodeError(entry_path(path, name), "a version like '9.0'", isa)
        out[name] = isa
    return out


def _numpy(value: Any, path: str, obj: Mapping[str, Any]) -> str | None:
    if value is not None and value not in ("", "1", "2"):
        raise DecodeError(path, "'1', '2', '' or null", value)
    return value


def _sorted_strings(value: Any, path: str, obj: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(strings(value, path)))


#: The level names ``x86_isa_needed`` may hold (the host script's ``ISA_LEVELS``).
X86_LEVELS = ("x86-64-baseline", "x86-64-v2", "x86-64-v3", "x86-64-v4")


def _isa_levels(value: Any, path: str, obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    if value is None:
        return None
    levels = strings(value, path)
    for i, level in enumerate(levels):
        if level not in X86_LEVELS:
            raise DecodeError(item_path(path, i), f"one of {', '.join(X86_LEVELS)}", level)
    return tuple(levels)


_FACTS = Decoder(ElfFacts, unknown="ignore", null_default=True, fields={
    "device_code": _device_code, "numpy_abi": _numpy, "torch_undefined": _sorted_strings,
    "ptx_isa": _ptx_isa, "x86_isa_needed": _isa_levels})


def _files(value: Any, path: str, obj: Mapping[str, Any]) -> dict[str, ElfFacts]:
    """``files``: venv-relative path -> facts, sorted by path; each entry's ``path`` is its key."""
    if not isinstance(value, dict):
        raise DecodeError(path, "an object", value)
    # ``ptx_isa`` is read even when absent: the device code entries carry the PTX ISA versions
    return {rel: _FACTS({**facts, "ptx_isa": facts.get("ptx_isa") or {}} if isinstance(facts, dict) else facts,
                        entry_path(path, rel), path=rel)
            for rel, facts in sorted(value.items())}


def _cache(value: Any, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """``cache``: the ELF script's cache counters (``read``: the files it opened), without the
    entries it carries back for the controller to keep."""
    if not isinstance(value, dict):
        raise DecodeError(path, "an object", value)
    return {k: v for k, v in value.items() if k != "entries"}


_REPORT = Decoder(ElfReport, unknown="ignore", null_default=True, fields={"files": _files, "cache": _cache})


def parse_elf_report(document: Any, *, label: str) -> ElfReport:
    """Build an :class:`ElfReport` from the decoded JSON the ``elf_facts`` script printed.

    Decoded by :class:`transplant.core.decode.Decoder`: keys the model does not keep are
    ignored, a null list or object is empty.

    :param label: where it came from (``host:venv``), for messages.
    :raises ProbeError: another schema, or a value of the wrong type (the message names
        the key path, e.g. ``files['torch/lib/libc10.so'].needed``).
    """
    if not isinstance(document, dict) or document.get("schema") != ELF_SCHEMA:
        got = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise ProbeError(f"{label}: the ELF script reported schema {got!r}, expected {ELF_SCHEMA!r}",
                         hint="run the same transplant version on the controller and the hosts")
    try:
        return _REPORT({**document, "files": document.get("files") or {}}, label=label)
    except DecodeError as exc:
        raise _fail(label, exc) from None
