"""ELF facts of shared objects, as frozen data parsed from the ``elf_facts`` host script (pure core).

The host script (:mod:`transplant.remote.elf_facts`) reads each file with pyelftools,
sent to the host with the request, and reports per file: the machine type, the soname,
DT_NEEDED, the symbol versions it needs (``.gnu.version_r``), its undefined
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
    :ivar ptx_isa: PTX entry name (``compute_90``) -> the newest PTX ISA version among its
        entries (``"9.0"``), from the fatbin entry headers; empty when not read.
    """

    path: str
    error: str | None = None
    machine: str | None = None
    elf_class: int | None = None
    soname: str | None = None
    needed: tuple[str, ...] = ()
    version_needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    torch_undefined: tuple[str, ...] = ()
    device_code: tuple[DeviceCode, ...] = ()
    notes: tuple[str, ...] = ()
    versioned_undefined: Mapping[str, tuple[str, ...]] | None = None
    numpy_abi: str | None = None
    ptx_isa: Mapping[str, str] = field(default_factory=dict)


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


def _fail(label: str, path: str, expected: str, value: Any) -> ProbeError:
    return ProbeError(f"{label}: ELF report key {path!r}: expected {expected}, got {value!r}",
                      hint="the host script and controller versions may differ; reinstall transplant")


def _strings(label: str, value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(label, path, "a list of strings", value)
    return tuple(value)


def _opt(label: str, obj: dict, key: str, path: str, kind: type) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(label, f"{path}.{key}", kind.__name__, value)
    return value


def _device_code(label: str, value: Any, path: str) -> tuple[DeviceCode, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(label, path, "a list", value)
    out = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise _fail(label, where, "an object", item)
        kind, arch, variant = item.get("kind"), item.get("arch"), item.get("variant", "")
        if kind not in ("sass", "ptx"):
            raise _fail(label, f"{where}.kind", "'sass' or 'ptx'", kind)
        if not isinstance(arch, int) or isinstance(arch, bool) or arch <= 0:
            raise _fail(label, f"{where}.arch", "a positive int", arch)
        if variant not in ("", "a", "f"):
            raise _fail(label, f"{where}.variant", "'', 'a' or 'f'", variant)
        out.append(DeviceCode(kind=kind, arch=arch, variant=variant))
    return tuple(sorted(set(out), key=lambda d: (d.kind, d.arch, d.variant)))


def _facts(label: str, rel: str, obj: Any) -> ElfFacts:
    path = f"files[{rel!r}]"
    if not isinstance(obj, dict):
        raise _fail(label, path, "an object", obj)
    needs_raw = obj.get("version_needs") or {}
    if not isinstance(needs_raw, dict):
        raise _fail(label, f"{path}.version_needs", "an object", needs_raw)
    needs = {lib: _strings(label, names, f"{path}.version_needs[{lib!r}]") for lib, names in needs_raw.items()}
    return ElfFacts(
        path=rel,
        error=_opt(label, obj, "error", path, str),
        machine=_opt(label, obj, "machine", path, str),
        elf_class=_opt(label, obj, "elf_class", path, int),
        soname=_opt(label, obj, "soname", path, str),
        needed=_strings(label, obj.get("needed"), f"{path}.needed"),
        version_needs=needs,
        torch_undefined=tuple(sorted(_strings(label, obj.get("torch_undefined"), f"{path}.torch_undefined"))),
        device_code=_device_code(label, obj.get("device_code"), f"{path}.device_code"),
        notes=_strings(label, obj.get("notes"), f"{path}.notes"),
        versioned_undefined=_versioned(label, obj.get("versioned_undefined"), f"{path}.versioned_undefined"),
        numpy_abi=_numpy(label, obj.get("numpy_abi"), f"{path}.numpy_abi"),
        ptx_isa=_ptx_isa(label, obj, path),
    )


_ISA = re.compile(r"^\d+\.\d+$")


def _ptx_isa(label: str, obj: dict, path: str) -> dict[str, str]:
    """PTX ISA versions from the device code entries' ``isa`` (the host script) or a ``ptx_isa``
    object (a recorded report), keyed by the entry name (``compute_90a``)."""
    out: dict[str, str] = {}
    raw = obj.get("ptx_isa") or {}
    if not isinstance(raw, dict):
        raise _fail(label, f"{path}.ptx_isa", "an object", raw)
    items = list(raw.items())
    for item in obj.get("device_code") or ():
        if isinstance(item, dict) and item.get("kind") == "ptx" and item.get("isa") is not None:
            items.append((f"compute_{item.get('arch')}{item.get('variant', '')}", item["isa"]))
    for name, isa in items:
        if not isinstance(isa, str) or not _ISA.match(isa):
            raise _fail(label, f"{path}.ptx_isa[{name!r}]", "a version like '9.0'", isa)
        out[name] = isa
    return out


def _numpy(label: str, value: Any, path: str) -> str | None:
    if value is not None and value not in ("", "1", "2"):
        raise _fail(label, path, "'1', '2', '' or null", value)
    return value


def _versioned(label: str, value: Any, path: str) -> dict[str, tuple[str, ...]] | None:
    """``{file: [names]}`` of a report (``versioned_undefined``, ``defined_by``); None stays None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(label, path, "an object", value)
    return {k: _strings(label, v, f"{path}[{k!r}]") for k, v in value.items()}


def parse_elf_report(document: Any, *, label: str) -> ElfReport:
    """Build an :class:`ElfReport` from the decoded JSON the ``elf_facts`` script printed.

    :param label: where it came from (``host:venv``), for messages.
    :raises ProbeError: another schema, or a value of the wrong type (the message names
        the key path, e.g. ``files['torch/lib/libc10.so'].needed``).
    """
    if not isinstance(document, dict) or document.get("schema") != ELF_SCHEMA:
        got = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise ProbeError(f"{label}: the ELF script reported schema {got!r}, expected {ELF_SCHEMA!r}",
                         hint="run the same transplant version on the controller and the hosts")
    files_raw = document.get("files") or {}
    if not isinstance(files_raw, dict):
        raise _fail(label, "files", "an object", files_raw)
    libstdcxx = None
    raw = document.get("libstdcxx")
    if raw is not None:
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise _fail(label, "libstdcxx", "an object with a path", raw)
        libstdcxx = LibraryVersions(path=raw["path"], versions=_strings(label, raw.get("versions"),
                                                                          "libstdcxx.versions"))
    defined = document.get("defined") or {}
    if not isinstance(defined, dict) or not all(isinstance(v, bool) for v in defined.values()):
        raise _fail(label, "defined", "an object of booleans", defined)
    seconds = document.get("seconds", 0.0)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise _fail(label, "seconds", "a number", seconds)
    return ElfReport(
        label=label,
        files={rel: _facts(label, rel, obj) for rel, obj in sorted(files_raw.items())},
        libstdcxx=libstdcxx,
        defined=dict(defined),
        defined_in=_strings(label, document.get("defined_in"), "defined_in"),
        seconds=float(seconds),
        defined_by={k: (None if v is None else _strings(label, v, f"defined_by[{k!r}]"))
                    for k, v in (_object(label, document.get("defined_by"), "defined_by")).items()},
        cache={k: v for k, v in _object(label, document.get("cache"), "cache").items() if k != "entries"},
    )


def _object(label: str, value: Any, path: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(label, path, "an object", value)
    return value
