"""Inventory: what a venv holds, as frozen data parsed from the probe's JSON (pure core).

The model follows pip's ``pip inspect`` v1 report and extends it with RECORD entries
checked against the disk, WHEEL tags, the interpreter's marker environment and the
host's NVIDIA facts. :func:`parse_inventory` is the only way in, through the one decoder
(:mod:`transplant.core.decode`); it reports the key path of any bad value
(``distributions[3].record[0].size``).
"""

from __future__ import annotations

import dataclasses
import functools

import hashlib
import json
import posixpath
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, parse_tag
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

from transplant.errors import ProbeError
from transplant.core.decode import DecodeError, Decoder, entry_path, item_path, member, strings

__all__ = [
    "SCHEMA",
    "TEXTS",
    "GENCODE_STAMP",
    "FileEntry",
    "Distribution",
    "Interpreter",
    "Gpu",
    "NvidiaFacts",
    "LibcudaFacts",
    "JitCompiler",
    "JitCompilers",
    "CompilerFacts",
    "OsRelease",
    "CToolchainFacts",
    "LoadedLibcuda",
    "HostFact",
    "HOST_FACTS",
    "Inventory",
    "parse_inventory",
    "expanded",
    "KeptDocument",
    "COLUMNS",
    "inside_path",
    "link_escapes",
    "newest",
    "protected_path",
]

SCHEMA = "transplant.inventory/1"

#: A generated module's stamp as the probe reports it (``_gencode`` in :mod:`transplant.remote.probe`):
#: protoc's ``protobuf <domain> <major>.<minor>.<patch><suffix>`` or grpcio-tools' ``grpc <version>``.
GENCODE_STAMP = re.compile(r"protobuf (PUBLIC|GOOGLE_INTERNAL) ([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})([0-9A-Za-z.+-]{0,32})"
                           r"|grpc ([0-9][0-9A-Za-z.+-]{0,63})")

#: The most generated modules' stamps one probe reports (``_GENCODE_MAX`` in :mod:`transplant.remote.probe`).
GENCODE_MAX = 20000

#: Site-packages files whose text every probe reads for the rules (torch's build facts): the
#: plan, the snapshot and the stale-plan check under apply's lock read the same set.
TEXTS = ("torch/version.py",)


@dataclass(frozen=True, kw_only=True, slots=True)
class FileEntry:
    """One file of a distribution: what RECORD says and what the disk holds.

    :ivar record_path: the path as RECORD writes it, relative to site-packages.
    :ivar path: POSIX path relative to the venv prefix; None when the RECORD path
        escapes the prefix (such an entry is never copied or removed).
    :ivar record_hash: RECORD's ``sha256=<urlsafe b64>``; None for RECORD itself and
        other unhashed entries.
    :ivar record_size: RECORD's size in bytes, or None.
    :ivar exists: whether the file is on disk (False also when ``path`` is None).
    :ivar hash: sha256 of the bytes on disk in RECORD's form; None when not hashed by
        the probe (metadata-only) or when the entry is a symlink or absent.
    :ivar size: size on disk in bytes; None when absent or a symlink.
    :ivar mode: permission bits on disk, or None when absent.
    :ivar symlink: the link target when the entry is a symlink, else None.
    :ivar error: why the entry could not be read (not a regular file, RECORD not CSV), else None.
    :ivar head: for a console script in the scripts folder, its shebang line (two lines
        in pip's ``#!/bin/sh`` form), else None.
    :ivar body_hash: the sha256 (RECORD's form) of the script's bytes after ``head``.
    :ivar record_identity: for a distribution's own RECORD (hashed), its normalised
        identity ``record:sha256=<urlsafe b64>``: the rows with the hash and size of those
        under the scripts folder blanked (the probe's ``record_identity``); None otherwise
        or when it does not parse.
    """

    record_path: str
    path: str | None
    record_hash: str | None = None
    record_size: int | None = None
    exists: bool = False
    hash: str | None = None
    size: int | None = None
    mode: int | None = None
    symlink: str | None = None
    error: str | None = None
    head: str | None = None
    body_hash: str | None = None
    record_identity: str | None = None

    @property
    def content(self) -> str | None:
        """The identity of the content on disk: hash, ``symlink:<target>``, or None if unknown."""
        if self.symlink is not None:
            return f"symlink:{self.symlink}"
        return self.hash

    @property
    def script_identity(self) -> str | None:
        """``script:<body hash>:<head>`` for a console script with a shebang, else None
        (compared with :attr:`transplant.core.plan.FileCopy.identity`)."""
        if self.head is None or self.body_hash is None:
            return None
        return f"script:{self.body_hash}:{self.head}"


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """One installed distribution (a ``*.dist-info`` folder) in site-packages.

    :ivar name: PEP 503 normalised name; ``display_name`` keeps METADATA's spelling.
    :ivar version: the version, local label included (``2.11.0+cu130``); None when
        METADATA is missing or its version is not PEP 440.
    :ivar dist_info: path of the dist-info folder relative to the venv prefix.
    :ivar record: the RECORD entries, or None when there is no RECORD (or the probe was asked
        for a summary).
    :ivar record_files: with a summary (the probe's ``record: "summary"``), how many RECORD rows
        lie inside the venv; :ivar record_bytes: the sum of their RECORD size column (rows
        without one, RECORD itself and most ``.pyc``, count 0); both None otherwise.
    :ivar hashed: whether the probe hashed the files on disk (``FileEntry.hash`` set).
    :ivar listing: names of the regular files in the dist-info folder as found on disk
        (RECORD may not list them all, or be missing).
    """

    name: NormalizedName
    display_name: str
    version: Version | None
    raw_version: str | None
    dist_info: str
    metadata_present: bool
    summary: str | None = None
    requires_python: str | None = None
    requires_dist: tuple[Requirement, ...] = ()
    bad_requirements: tuple[str, ...] = ()
    installer: str | None = None
    requested: bool = False
    direct_url: Mapping[str, Any] | None = None
    wheel_tags: tuple[Tag, ...] = ()
    root_is_purelib: bool | None = None
    top_level: tuple[str, ...] = ()
    entry_points: str | None = None
    hashed: bool = False
    record: tuple[FileEntry, ...] | None = None
    record_files: int | None = None
    record_bytes: int | None = None
    listing: tuple[str, ...] = ()

    @cached_property
    def files(self) -> dict[str, FileEntry]:
        """RECORD entries inside the venv, keyed by prefix-relative path (built once per
        distribution; callers must not mutate the mapping)."""
        return {e.path: e for e in self.record or () if e.path is not None}


@dataclass(frozen=True, kw_only=True)
class Interpreter:
    """The venv's interpreter: version ``3.11.7``, ``cp311`` ABI tag, ``EXT_SUFFIX`` and friends.

    ``glibc`` is the C library version (``2.36``) or None on a non-glibc system;
    ``home_exists`` is None when pyvenv.cfg has no ``home``; ``markers`` is the PEP 508
    marker environment used to evaluate Requires-Dist markers for this venv.
    """

    executable: str
    prefix: str
    version: Version
    implementation: str
    abi_tag: str | None
    soabi: str | None
    ext_suffix: str | None
    machine: str
    glibc: str | None
    pyvenv_cfg: Mapping[str, str] | None
    home_exists: bool | None
    markers: Mapping[str, str]

    @property
    def minor(self) -> str:
        """``major.minor`` (``3.11``)."""
        return f"{self.version.major}.{self.version.minor}"


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One GPU as nvidia-smi reports it; ``compute_capability`` like ``9.0``, memory in MiB."""

    name: str
    compute_capability: str | None
    memory_mib: int | None


@dataclass(frozen=True, kw_only=True)
class NvidiaFacts:
    """The host's NVIDIA driver facts; ``available`` False with ``reason`` when there are none.

    :ivar failure: what ``nvidia-smi`` printed when it is there but failed (a driver that is
        installed and broken: "Driver/library version mismatch"), else None.
    :ivar kernel_module: the loaded kernel module's version (``/proc/driver/nvidia/version``),
        None when there is none or it was not read.
    """

    available: bool
    reason: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[Gpu, ...] = ()
    failure: str | None = None
    kernel_module: str | None = None


@dataclass(frozen=True, kw_only=True)
class LibcudaFacts:
    """Where the host's JIT users find the driver library to link with ``-lcuda`` (as the probe's
    own environment sees it; see ``_libcuda`` in :mod:`transplant.remote.probe`).

    :ivar searched: the folders triton's ``libcuda_dirs`` would pass to the linker
        (``TRITON_LIBCUDA_PATH``, else ``ldconfig -p``'s, else ``LD_LIBRARY_PATH``'s).
    :ivar versioned: ``libcuda.so.1`` paths found there; :ivar unversioned: ``libcuda.so`` paths.
    :ivar ldconfig: whether ``ldconfig -p`` ran; :ivar triton_libcuda_path: the variable's value.
    """

    searched: tuple[str, ...] = ()
    versioned: tuple[str, ...] = ()
    unversioned: tuple[str, ...] = ()
    ldconfig: bool = False
    triton_libcuda_path: str | None = None


@dataclass(frozen=True, kw_only=True)
class JitCompiler:
    """One CUDA compiler a JIT user runs on the host, as the probe found and ran it.

    :ivar path: where it is (absolute). :ivar source: how it was found (``triton``: the ptxas
        its wheel carries; ``TRITON_PTXAS_PATH``, ``CUDA_HOME``, ``CUDA_PATH``, ``PATH``,
        ``default``: ``/usr/local/cuda``; ``wheel``: an NVIDIA nvcc wheel's).
    :ivar release: ``(major, minor)`` from its ``--version`` ("release 12.8"); None when it did
        not run or printed no release line (:ivar error: then says why).
    :ivar build: the full version (``12.8.93``), or None.
    """

    path: str
    source: str
    release: tuple[int, int] | None = None
    build: str | None = None
    error: str | None = None

    def describe(self) -> str:
        """``/usr/local/cuda/bin/nvcc (CUDA 12.8, V12.8.93)``."""
        if self.release is None:
            return self.path
        build = f", V{self.build}" if self.build else ""
        return f"{self.path} (CUDA {self.release[0]}.{self.release[1]}{build})"


@dataclass(frozen=True, kw_only=True)
class JitCompilers:
    """The compilers the host's JIT users run, as the probe's own environment finds them (an SSH
    session's, not a service's: a unit that sets ``CUDA_HOME`` elsewhere is not seen).

    :ivar triton_ptxas: triton's ``ptxas`` (``TRITON_PTXAS_PATH``, else the one its wheel
        carries in the venv), None when there is none.
    :ivar nvcc: the ``nvcc`` flashinfer's JIT runs (``CUDA_HOME``, ``CUDA_PATH``, the ``nvcc``
        on ``PATH``, ``/usr/local/cuda``), None when there is none.
    :ivar wheel_nvcc: the ``nvcc`` of NVIDIA's nvcc wheels in site-packages.
    """

    triton_ptxas: JitCompiler | None = None
    nvcc: JitCompiler | None = None
    wheel_nvcc: tuple[JitCompiler, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CompilerFacts:
    """The C compiler a run-time C build (triton's launcher) would use on the host, as the probe's
    own environment sees it (see ``_c_toolchain`` in :mod:`transplant.remote.probe`).

    :ivar source: where it came from: ``CC`` (the variable), else the name found on PATH
        (``gcc``, then ``clang``: triton's order).
    :ivar command: the variable's value or the name, as the build would run it.
    :ivar path: what PATH resolves ``command`` to; None: nothing runnable by that name (a
        ``CC`` naming a missing program).
    :ivar version: the first line of ``<path> --version``, or None.
    """

    source: str
    command: str
    path: str | None = None
    version: str | None = None

    def __post_init__(self) -> None:
        if self.source not in ("CC", "gcc", "clang"):
            raise ValueError(f"source {self.source!r} is none of CC, gcc, clang")
        if any(len(text) > 4096 for text in (self.command, self.path or "", self.version or "")):
            raise ValueError("a compiler's text is longer than 4096 characters")


@dataclass(frozen=True, kw_only=True)
class OsRelease:
    """``/etc/os-release``'s ``ID``, ``ID_LIKE`` and ``VERSION_ID`` (each None when absent)."""

    id: str | None = None
    id_like: str | None = None
    version_id: str | None = None

    def __post_init__(self) -> None:
        if any(len(text or "") > 256 for text in (self.id, self.id_like, self.version_id)):
            raise ValueError("an os-release value is longer than 256 characters")


@dataclass(frozen=True, kw_only=True)
class CToolchainFacts:
    """What a package building C at run time finds on the host: the compiler and the venv
    interpreter's headers.

    :ivar compiler: the compiler triton's launcher build would run; None when ``CC`` is unset
        and neither ``gcc`` nor ``clang`` is on PATH.
    :ivar include: the interpreter's include folder (``sysconfig`` ``include`` of its default
        scheme, as triton reads it); None when it could not be read.
    :ivar python_h: whether ``include`` holds ``Python.h``.
    :ivar os: the host's ``/etc/os-release`` facts, None where there is none (the hint's
        package names depend on them).
    """

    compiler: CompilerFacts | None = None
    include: str | None = None
    python_h: bool = False
    os: OsRelease | None = None

    def __post_init__(self) -> None:
        if self.include is not None and (not self.include.startswith("/") or len(self.include) > 4096):
            raise ValueError(f"include {self.include[:100]!r} is not an absolute path")

    @property
    def runnable(self) -> bool:
        """Whether a compiler was found that PATH resolves to a program."""
        return self.compiler is not None and self.compiler.path is not None

    @property
    def builds(self) -> bool:
        """Whether both halves of a launcher build are there: a runnable compiler and ``Python.h``."""
        return self.runnable and self.python_h


@dataclass(frozen=True, kw_only=True)
class LoadedLibcuda:
    """The ``libcuda.so.1`` the host's dynamic loader resolves for a process of the venv (as the
    probe's own environment sees it: ``LD_LIBRARY_PATH``, then the loader cache, then the default
    folders; see ``_libcuda_loaded`` in :mod:`transplant.remote.probe`).

    :ivar path: the absolute path found (``/usr/local/cuda-12.8/compat/libcuda.so.1``).
    :ivar real: the file it resolves to (``.../libcuda.so.570.124.06``).
    :ivar version: the version that file's name carries (``570.124.06``); None when it names none.
    :ivar how: where the loader found it: ``LD_LIBRARY_PATH``, ``ld.so.cache`` or ``default``.
    """

    path: str
    real: str
    version: str | None = None
    how: str


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """Everything the probe saw in one venv on one host. The host's facts (``hostname``, ``nvidia``,
    ``libcuda``, ``system_sonames``, ``cpu_flags``, ``c_toolchain``) are filled by their rows of :data:`HOST_FACTS`.

    :ivar label: where it came from, e.g. ``root@127.0.0.10:2222:/srv/venv`` (set by the
        caller; the probe does not know how it was reached).
    :ivar site_packages: purelib relative to the prefix (``lib/python3.11/site-packages``).
    :ivar distributions: sorted by (name, dist_info); a name may appear twice when the
        venv holds duplicate dist-info folders.
    :ivar files: extra files the probe was asked to hash, by prefix-relative path.
    :ivar texts: prefix-relative path -> text of the small files the probe read (asked
        for, plus site-packages' ``*.pth``, ``*.egg-link``, ``__editable__*.py``); None
        when a file was too large or unreadable.
    :ivar elsewhere: absolute path -> whether it exists on the host (asked for).
    :ivar fingerprint: sha256 hex of the canonical document, to detect drift (of the document
        as the probe sent it: a compact and a full probe of one venv differ).
    :ivar document: the probe's document: the decoded dict, or for a plan's probe (compact) a
        :class:`KeptDocument` that decodes its text when read.
    :ivar libcuda: where the host's JIT users find ``libcuda.so``; None when the probe did not
        report it (an older probe document).
    :ivar outside: distributions the venv's interpreter imports from folders outside the venv
        (``*.pth`` path lines, ``include-system-site-packages``), metadata only (``record``
        None), each ``dist_info`` an absolute path; sorted by name. Not part of
        :attr:`distributions`: apply never writes or removes them.
    :ivar outside_folders: absolute folder -> why it is on ``sys.path`` (``foo.pth in
        lib/python3.11/site-packages``, ``include-system-site-packages = true``), in path order.
    :ivar system_sonames: the library file names the host's dynamic loader finds outside the
        venv (``ldconfig -p`` and ``LD_LIBRARY_PATH``, see ``_system_sonames`` in
        :mod:`transplant.remote.probe`); None when the probe did not report them or
        ``ldconfig`` did not run (the host-library rule then finds nothing).
    :ivar jit_compilers: the CUDA compilers the host's JIT users run (triton's ptxas, nvcc);
        None when the probe did not report them.
    :ivar cpu_flags: the host CPU's feature flags (``/proc/cpuinfo``: ``avx2``, ``avx512f``...);
        None when the probe did not report them.
    :ivar c_toolchain: the C compiler and ``Python.h`` a run-time C build (triton's launchers)
        finds on the host; None when the probe did not report them (an older probe document).
    :ivar gencode: venv-relative path -> the version stamped into a generated protobuf or grpc
        module (``protobuf PUBLIC 5.27.0``, ``grpc 1.66.1``: :data:`GENCODE_STAMP`), for the
        ``*_pb2.py`` / ``*_pb2_grpc.py`` files RECORD lists that carry one; None when the probe did
        not read them (an older document, or a probe that did not look at the files).
    :ivar libcuda_loaded: the ``libcuda.so.1`` the host's loader resolves for the venv's processes
        (:class:`LoadedLibcuda`); None when no folder holds one or the probe did not report it.
    :ivar inputs: the probe's ``inputs`` report when it was asked for one (``{"digest", "count",
        "paths", "racy"}``: what the plan memo checks, see :mod:`transplant.pipeline.memo`);
        None otherwise. Not part of the fingerprint.
    """

    label: str
    hostname: str
    interpreter: Interpreter
    site_packages: str
    scripts: str
    distributions: tuple[Distribution, ...]
    files: Mapping[str, FileEntry]
    nvidia: NvidiaFacts
    fingerprint: str
    texts: Mapping[str, str | None] = field(default_factory=dict)
    elsewhere: Mapping[str, bool] = field(default_factory=dict)
    document: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    libcuda: LibcudaFacts | None = None
    outside: tuple[Distribution, ...] = ()
    outside_folders: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    system_sonames: frozenset[str] | None = field(default=None, repr=False)
    cpu_flags: frozenset[str] | None = field(default=None, repr=False)
    jit_compilers: JitCompilers | None = field(default=None, repr=False)
    c_toolchain: CToolchainFacts | None = field(default=None, repr=False)
    gencode: Mapping[str, str] | None = field(default=None, repr=False)
    libcuda_loaded: LoadedLibcuda | None = field(default=None, repr=False)

    def latest(self) -> dict[str, Distribution]:
        """One distribution per normalised name: the newest where dist-info folders are duplicated."""
        return {name: newest(dists) for name, dists in self.by_name().items()}

    def by_name(self) -> dict[str, list[Distribution]]:
        """Distributions grouped by normalised name (a list: duplicates are possible)."""
        out: dict[str, list[Distribution]] = {}
        for dist in self.distributions:
            out.setdefault(dist.name, []).append(dist)
        return out


def newest(dists: list[Distribution]) -> Distribution:
    """The distribution with the highest version; one without a PEP 440 version ranks lowest.

    :raises ValueError: ``dists`` is empty.
    """
    return max(dists, key=lambda d: (d.version is not None, d.version or Version("0")))


def _fingerprint(document: Mapping[str, Any]) -> str:
    """sha256 hex over the parts of a probe document that describe content (not timings)."""
    stable = {k: v for k, v in document.items() if k not in ("probe_seconds", "elsewhere", "hash_cache", "inputs")}

    text = json.dumps(stable, sort_keys=True, separators=(",", ":"))
    # Drop every ``"mtime":<number>`` member. In compact JSON ``,"`` and ``{"`` occur only
    # around keys (a quote inside a string is always escaped), so no string value is touched.
    text = _MTIME_FIRST.sub("{", _MTIME_LATER.sub("", text))
    return hashlib.sha256(text.encode()).hexdigest()


_NUMBER = r"(?:-?[0-9.eE+-]+|null|-?Infinity|NaN)"
_MTIME_LATER = re.compile(r',"mtime":' + _NUMBER + r'(?=[,}])')
_MTIME_FIRST = re.compile(r'\{"mtime":' + _NUMBER + r'(?:,(?=")|(?=\}))')


#: The keys of a file entry and their exact JSON types, for the fast path below.
_FILE_KEYS: dict[str, type] = {
    "venv_path": str, "error": str, "record_hash": str, "record_size": int, "hash": str, "size": int,
    "mode": int, "symlink": str, "head": str, "body_hash": str, "record_identity": str, "exists": bool}


def _file_entry(obj: Any, path: str, record_path: str) -> FileEntry:
    """One file entry of the probe (a RECORD row or an extra file) at key path ``path``.

    :raises DecodeError: a value of another type than :data:`_FILE_KEYS` gives it.
    """
    if type(obj) is dict:
        # Fast path (a real venv has about 110,000 entries): when every value has exactly the
        # JSON type :data:`_FILE_KEYS` names (or is null), the checked path below would accept
        # the entry as it is, so the same values are read without the per-key calls.
        get = obj.get
        if all(v is None or type(v) is _FILE_KEYS.get(k, type(v)) for k, v in obj.items()):
            venv_path = get("venv_path")
            return FileEntry(
                record_path=record_path,
                path=inside_path(venv_path) if venv_path is not None else None,
                record_hash=get("record_hash"), record_size=get("record_size"), exists=get("exists") is True,
                hash=get("hash"), size=get("size"), mode=get("mode"), symlink=get("symlink"),
                error="not a regular file" if get("not_a_file") else get("error"),
                head=get("head"), body_hash=get("body_hash"), record_identity=get("record_identity"),
            )
    venv_path = member(obj, "venv_path", path, str, optional=True)
    if venv_path is not None:
        venv_path = inside_path(venv_path)
    error = member(obj, "error", path, str, optional=True)
    if obj.get("not_a_file"):
        error = "not a regular file"
    return FileEntry(
        record_path=record_path,
        path=venv_path,
        record_hash=member(obj, "record_hash", path, str, optional=True),
        record_size=member(obj, "record_size", path, int, optional=True),
        exists=bool(member(obj, "exists", path, bool, optional=True)),
        hash=member(obj, "hash", path, str, optional=True),
        size=member(obj, "size", path, int, optional=True),
        mode=member(obj, "mode", path, int, optional=True),
        symlink=member(obj, "symlink", path, str, optional=True),
        error=error,
        head=member(obj, "head", path, str, optional=True),
        body_hash=member(obj, "body_hash", path, str, optional=True),
        record_identity=member(obj, "record_identity", path, str, optional=True),
    )


#: The columns of a RECORD row in the probe's compact form (``"compact": true``; the document's
#: ``record_columns``), in order; a row leaves out its trailing nulls.
COLUMNS = ("path", "venv_path", "record_hash", "record_size", "exists", "size", "mode", "symlink", "not_a_file",
           "error", "hash", "head", "body_hash", "record_identity")
_NONE = type(None)
#: Each column's allowed JSON types: ``venv_path`` and ``hash`` may also be the number 1 ("as
#: ``<site_packages>/<path>``", "as ``record_hash``").
_COLUMN_TYPES: tuple[tuple[type, ...], ...] = (
    (str,), (str, _NONE, int), (str, _NONE), (int, _NONE), (bool, _NONE), (int, _NONE), (int, _NONE), (str, _NONE),
    (bool, _NONE), (str, _NONE), (str, _NONE, int), (str, _NONE), (str, _NONE), (str, _NONE))
_COLUMN_NAMES = {str: "str", int: "int", bool: "bool", _NONE: "null"}
#: Row shapes (the tuple of the values' types) already checked against :data:`_COLUMN_TYPES`.
_GOOD_SHAPES: set[tuple[type, ...]] = set()


def _check_row(row: list, path: str) -> None:
    """Check a compact row's values against :data:`_COLUMN_TYPES`.

    :raises DecodeError: naming ``path.<column>`` (the key the dict form would have), or
        ``path`` when the row is empty or longer than :data:`COLUMNS`.
    """
    if not row or len(row) > len(COLUMNS):
        raise DecodeError(path, f"a list of 1 to {len(COLUMNS)} values ({', '.join(COLUMNS)})", row)
    for column, allowed, value in zip(COLUMNS, _COLUMN_TYPES, row, strict=False):
        if type(value) not in allowed:
            raise DecodeError(f"{path}.{column}", " or ".join(_COLUMN_NAMES[t] for t in allowed), value)
        if type(value) is int and column in ("venv_path", "hash") and value != 1:
            raise DecodeError(f"{path}.{column}", "a string, null or 1", value)


def _plain(rel: str) -> bool:
    """Whether a relative POSIX path is already normal (as the probe's ``_plain``): then
    :func:`inside_path` of it is itself."""
    return (rel[:1] not in ("/", ".", "") and rel[-1] != "/" and "/." not in rel and "//" not in rel
            and "\0" not in rel)


#: A compact row's missing trailing columns, by the row's length.
_PAD_LISTS = tuple([None] * (len(COLUMNS) - n) for n in range(len(COLUMNS) + 1))


def _row_entries(rows: list, path: str, site: str | None) -> tuple[FileEntry, ...]:
    """The RECORD rows of one distribution in the compact form (``rows[i]`` at key path
    ``path[i]``), read in one loop rather than a call per row (a real venv has 110,000 rows: the
    call per row and its lookups were half of the parse).

    :raises DecodeError: a row that is not a list, or a value of another type than
        :data:`_COLUMN_TYPES` allows.
    """
    out: list[FileEntry] = []
    append = out.append
    good, pads, new = _GOOD_SHAPES, _PAD_LISTS, _new_entry
    width = len(COLUMNS)
    for i, row in enumerate(rows):
        if type(row) is not list:
            raise DecodeError(f"{path}[{i}]", "a list", row)
        shape = tuple(map(type, row))
        n = len(row)
        if shape not in good or (n > 1 and shape[1] is int and row[1] != 1) or \
                (n > 10 and shape[10] is int and row[10] != 1):
            _check_row(row, f"{path}[{i}]")
            good.add(shape)
        (record_path, venv_path, record_hash, record_size, exists, size, mode, symlink, not_a_file, error, digest,
         head, body_hash, identity) = row + pads[n] if n < width else row
        if venv_path == 1 and type(venv_path) is int:
            if site is None:
                raise DecodeError(f"{path}[{i}].venv_path", "a string or null (the distribution's site_packages is "
                                                            "not a normal venv-relative path)", venv_path)
            # (_plain, written out)
            venv_path = f"{site}/{record_path}" if (
                record_path[:1] not in ("/", ".", "") and record_path[-1] != "/" and "/." not in record_path
                and "//" not in record_path and "\0" not in record_path) else inside_path(f"{site}/{record_path}")
        elif venv_path is not None:
            venv_path = inside_path(venv_path)
        if digest == 1 and type(digest) is int:
            digest = record_hash
        append(new(record_path, venv_path, record_hash, record_size, exists is True, digest, size, mode, symlink,
                   "not a regular file" if not_a_file else error, head, body_hash, identity))
    return tuple(out)


def _entry_maker(names: tuple[str, ...]) -> Any:
    """``_new_entry(*values)``: a :class:`FileEntry` of ``values`` (one per field, in the order
    ``names`` gives), equal to ``FileEntry(**dict(zip(names, values)))`` but built without the
    frozen dataclass's ``__init__`` (one slot descriptor ``__set__`` per field): a large venv's
    inventory makes 100,000 of them, and this takes a third of the time.

    :raises TypeError: ``names`` are not exactly FileEntry's fields (at import: a field added to
        FileEntry must be added here too, never left unset).
    """
    if sorted(names) != sorted(f.name for f in dataclasses.fields(FileEntry)) or len(set(names)) != len(names):
        raise TypeError(f"_entry_maker: {names} are not FileEntry's fields")
    setters = [FileEntry.__dict__[name].__set__ for name in names]  # the slots' descriptors
    # one call per field, written out (no loop, no zip: half the time of a loop over the setters);
    # the text is made of these numbered names alone, nothing taken from data
    values = ", ".join(f"v{i}" for i in range(len(names)))
    lines = "".join(f"    s{i}(entry, v{i})\n" for i in range(len(names)))
    scope: dict[str, Any] = {f"s{i}": setter for i, setter in enumerate(setters)}
    scope.update(create=object.__new__, FileEntry=FileEntry)
    exec(f"def new_entry({values}):\n    entry = create(FileEntry)\n{lines}    return entry\n", scope)  # noqa: S102 - text made of numbered names alone (above)
    return scope["new_entry"]


_new_entry = _entry_maker(("record_path", "path", "record_hash", "record_size", "exists", "hash", "size", "mode",
                           "symlink", "error", "head", "body_hash", "record_identity"))


class KeptDocument(Mapping[str, Any]):
    """A probe document kept as the JSON text it came in, decoded only when read (a snapshot,
    a fixture): the decoded tree of a large venv's document takes several times the memory of
    its text, and a plan needs none of it once the inventory is parsed.

    A read-only mapping (``dict(kept)`` for a dict); ``hash_cache.entries`` (the hashes a donor
    returned for the controller's cache, kept there) is left out of the decoded document. The
    text is kept compressed (zlib, level 1: a fifth of its size, in about 0.1 s for 15 MB).
    """

    __slots__ = ("_packed", "_value")

    def __init__(self, text: str) -> None:
        self._packed = zlib.compress(text.encode("utf-8"), 1)
        self._value: dict[str, Any] | None = None

    def _decoded(self) -> dict[str, Any]:
        if self._value is None:
            value = json.loads(zlib.decompress(self._packed))
            if isinstance(value, dict) and isinstance(value.get("hash_cache"), dict):
                value["hash_cache"].pop("entries", None)
            if isinstance(value, dict):
                value.pop("inputs", None)  # the plan memo's (Inventory.inputs), not a fact of the venv
            self._value = value if isinstance(value, dict) else {}
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._decoded()[key]

    def __iter__(self):
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())


def expanded(document: Mapping[str, Any]) -> dict[str, Any]:
    """A probe document with its compact RECORD rows (``record_columns``) written as the dict
    entries of the full form (``venv_path`` and ``hash`` given as 1 spelled out, null columns
    left out but ``venv_path``, ``record_hash`` and ``record_size``); a full-form document is
    returned as a shallow copy. Nothing is checked: :func:`parse_inventory` reads both forms.
    """
    doc = dict(document)
    if doc.pop("record_columns", None) is None:
        return doc
    purelib = (doc.get("paths") or {}).get("purelib")
    dists = []
    for d in doc.get("distributions") or []:
        d = dict(d)
        site = d.get("site_packages") or purelib
        if isinstance(d.get("record"), list):
            entries = []
            for row in d["record"]:
                entry: dict[str, Any] = {"venv_path": None, "record_hash": None, "record_size": None}
                entry.update((k, v) for k, v in zip(COLUMNS, row, strict=False) if v is not None)
                if entry["venv_path"] == 1:
                    entry["venv_path"] = f"{site}/{entry['path']}"
                if entry.get("hash") == 1:
                    entry["hash"] = entry["record_hash"]
                entries.append(entry)
            d["record"] = entries
        dists.append(d)
    doc["distributions"] = dists
    return doc


def inside_path(path: str) -> str | None:
    """Normalise a POSIX path relative to a root; None when it is absolute, empty or leaves the root.

    ``a/./b`` -> ``a/b``; ``a/../../x``, ``/etc/x``, ``..`` and ``.`` -> None.
    """
    if not path or path.startswith("/") or "\0" in path:
        return None
    norm = posixpath.normpath(path)
    if norm in (".", "..") or norm.startswith("../"):
        return None
    return norm


_INTERPRETERS = re.compile(r"^(python(\d+(\.\d+)?)?|pythonw|activate(\.\w+)?|Activate\.ps1)$")


def protected_path(path: str, scripts: str = "bin") -> bool:
    """Whether a venv-relative path is part of the venv itself, which no distribution may
    write or remove: ``pyvenv.cfg``, the interpreter links and activate scripts in the
    scripts folder (``bin/python3.11``, ``bin/activate.fish``), and transplant's own
    ``.transplant/`` state folder. A RECORD row naming one (``../../../pyvenv.cfg``) is
    refused (``unsafe-path``)."""
    if path == "pyvenv.cfg" or path == ".transplant" or path.startswith(".transplant/"):
        return True
    if not path.startswith(scripts):  # most paths (lib/...): the split below cannot match
        return False
    folder, _, name = path.rpartition("/")
    return folder == scripts and bool(_INTERPRETERS.match(name))


def link_escapes(path: str, target: str) -> bool:
    """Whether a symlink at ``path`` (root-relative) pointing to ``target`` leaves the root.

    Absolute targets always count as leaving (they name the donor's filesystem).
    """
    if target.startswith("/"):
        return True
    return inside_path(posixpath.join(posixpath.dirname(path), target)) is None


def _requirements(texts: list[Any], path: str) -> tuple[tuple[Requirement, ...], tuple[str, ...]]:
    good, bad = [], []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DecodeError(item_path(path, i), "a string", text)
        requirement = _requirement(text)
        if requirement is None:
            bad.append(text)
        else:
            good.append(requirement)
    return tuple(good), tuple(bad)


@functools.lru_cache(maxsize=16384)
def _requirement(text: str) -> Requirement | None:
    """``Requirement(text)``, or None when it is not PEP 508; remembered by text (a plan parses
    both venvs' 2,600 Requires-Dist lines, most of them the same text on both sides; nothing
    changes a parsed requirement, so one object serves every inventory)."""
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _distribution(obj: Any, path: str, site_default: str, compact: bool = False) -> Distribution:
    """One distribution of the probe (its wire shape is not :class:`Distribution`'s: explicit
    per-field decoding, each value through :func:`transplant.core.decode.member`); ``compact``:
    its RECORD rows are lists of :data:`COLUMNS` (the document has ``record_columns``)."""
    name = member(obj, "name", path, str)
    raw_version = member(obj, "version", path, str, optional=True)
    try:
        version = Version(raw_version) if raw_version is not None else None
    except InvalidVersion:
        version = None
    site = member(obj, "site_packages", path, str, optional=True) or site_default
    dist_info = f"{site}/{member(obj, 'dist_info', path, str)}"
    requires, bad = _requirements(member(obj, "requires_dist", path, list, optional=True) or [],
                                  f"{path}.requires_dist")
    wheel = member(obj, "wheel", path, dict, optional=True) or {}
    tags: list[Tag] = []
    for text in strings(member(wheel, "tags", f"{path}.wheel", list, optional=True), f"{path}.wheel.tags"):
        tags.extend(sorted(parse_tag(text), key=str))
    record_raw = member(obj, "record", path, list, optional=True)
    record = None
    if record_raw is not None and compact:
        own_site = site if inside_path(site) == site else None
        record = _row_entries(record_raw, f"{path}.record", own_site)
    elif record_raw is not None:
        record = tuple(
            _file_entry(e, f"{path}.record[{i}]", member(e, "path", f"{path}.record[{i}]", str))
            for i, e in enumerate(record_raw)
        )
    summary = member(obj, "record_summary", path, dict, optional=True)
    return Distribution(
        name=canonicalize_name(name),
        display_name=name,
        version=version,
        raw_version=raw_version,
        dist_info=dist_info,
        metadata_present=bool(member(obj, "metadata_present", path, bool, optional=True)),
        summary=member(obj, "summary", path, str, optional=True),
        requires_python=member(obj, "requires_python", path, str, optional=True),
        requires_dist=requires,
        bad_requirements=bad,
        installer=member(obj, "installer", path, str, optional=True),
        requested=bool(member(obj, "requested", path, bool, optional=True)),
        direct_url=member(obj, "direct_url", path, dict, optional=True),
        wheel_tags=tuple(tags),
        root_is_purelib=member(wheel, "root_is_purelib", f"{path}.wheel", bool, optional=True),
        top_level=tuple(member(obj, "top_level", path, list, optional=True) or ()),
        entry_points=member(obj, "entry_points", path, str, optional=True),
        hashed=bool(member(obj, "hashed", path, bool, optional=True)),
        record=record,
        record_files=member(summary, "files", f"{path}.record_summary", int) if summary is not None else None,
        record_bytes=member(summary, "bytes", f"{path}.record_summary", int) if summary is not None else None,
        listing=tuple(n for n in member(obj, "listing", path, list, optional=True) or ()
                      if isinstance(n, str) and "/" not in n and n not in (".", "..")),
    )


def _version(value: Any, path: str, obj: Mapping[str, Any]) -> Version:
    if not isinstance(value, str):
        raise DecodeError(path, "str", value)
    try:
        return Version(value)
    except InvalidVersion:
        raise DecodeError(path, "a Python version", value) from None


#: The typed parts of the document whose wire shape is the model's (keys it does not keep are ignored,
#: null is a field's default).
_INTERPRETER = Decoder(Interpreter, unknown="ignore", fields={"version": _version})
_NVIDIA = Decoder(NvidiaFacts, unknown="ignore", null_default=True)
_LIBCUDA = Decoder(LibcudaFacts, unknown="ignore", null_default=True)
_C_TOOLCHAIN = Decoder(CToolchainFacts, unknown="ignore", null_default=True)
_LOADED_LIBCUDA = Decoder(LoadedLibcuda, unknown="ignore", null_default=True)
#: What ``_libcuda_loaded`` reports: an absolute path without control characters, a dotted version.
_ABSOLUTE = re.compile(r"^/[^\x00-\x1f\x7f]{0,4095}$")
_DRIVER_VERSION = re.compile(r"^[0-9]{1,4}(\.[0-9]{1,4}){1,3}$")
_HOW = ("LD_LIBRARY_PATH", "ld.so.cache", "default")


def parse_inventory(document: Any, *, label: str) -> Inventory:
    """Build an :class:`Inventory` from the probe's JSON document (already decoded).

    The parts shaped like the model (interpreter, NVIDIA and libcuda facts) are decoded by
    :class:`transplant.core.decode.Decoder`; distributions and file entries, whose wire shape
    differs, field by field with :func:`transplant.core.decode.member` (file entries through a
    fast path that reads the same values once their exact JSON types are confirmed).

    :param document: the decoded JSON object the probe printed.
    :param label: where it came from, for messages (``host:venv``).
    :raises ProbeError: the schema is not ``transplant.inventory/1``, or a value has the
        wrong type; the message names the key path (``distributions[3].record[0].size``).
    """
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        got = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise ProbeError(
            f"{label}: the probe reported schema {got!r}, expected {SCHEMA!r}",
            hint="run the same transplant version on the controller and the hosts",
        )
    try:
        return _inventory(document, label)
    except DecodeError as exc:
        raise ProbeError(f"{label}: inventory key {exc.path!r}: {exc.describe()}",
                         hint="the probe and controller versions may differ; reinstall transplant on the controller",
                         ) from None


def _inventory(document: dict, label: str) -> Inventory:
    interpreter = _INTERPRETER(member(document, "interpreter", "", dict), "interpreter")
    paths = member(document, "paths", "", dict)
    site = member(paths, "purelib", "paths", str)
    _refuse_unseen(member(document, "unseen", "", dict, optional=True), site, label)
    columns = member(document, "record_columns", "", list, optional=True)
    if columns is not None and tuple(columns) != COLUMNS:
        raise DecodeError("record_columns", f"the list {list(COLUMNS)}", columns)
    dists = [
        _distribution(d, f"distributions[{i}]", site, compact=columns is not None)
        for i, d in enumerate(member(document, "distributions", "", list))
    ]
    dists.sort(key=lambda d: (d.name, d.dist_info))
    files = {
        rel: _file_entry(facts, entry_path("files", rel), rel)
        for rel, facts in (member(document, "files", "", dict, optional=True) or {}).items()
    }
    host = member(document, "host", "", dict)
    texts = member(document, "texts", "", dict, optional=True) or {}
    for rel, text in texts.items():
        if text is not None and not isinstance(text, str):
            raise DecodeError(entry_path("texts", rel), "a string or null", text)
    gencode = member(document, "gencode", "", dict, optional=True)
    if gencode is not None and len(gencode) > GENCODE_MAX:
        raise DecodeError("gencode", f"at most {GENCODE_MAX} generated modules (the probe's bound)", len(gencode))
    for rel, stamp in (gencode or {}).items():
        if inside_path(rel) != rel or not isinstance(stamp, str) or not GENCODE_STAMP.fullmatch(stamp):
            raise DecodeError(entry_path("gencode", rel), "a generated module's stamp (protobuf PUBLIC 5.27.0, "
                                                          "grpc 1.66.1) under a venv-relative path", stamp)
    elsewhere = member(document, "elsewhere", "", dict, optional=True) or {}
    for where, exists in elsewhere.items():
        if not isinstance(exists, bool):
            raise DecodeError(entry_path("elsewhere", where), "a boolean", exists)
    return Inventory(
        **{fact.name: fact.parse(member(host, fact.part, "host", fact.wire, optional=not fact.required), fact.cache_key)
           for fact in HOST_FACTS},
        label=label,
        interpreter=interpreter,
        site_packages=site,
        scripts=member(paths, "scripts", "paths", str, optional=True) or "bin",
        distributions=tuple(dists),
        files=files,
        fingerprint=_fingerprint(document),
        texts={k: v for k, v in texts.items() if inside_path(k) == k},
        elsewhere=dict(elsewhere),
        gencode=dict(gencode) if gencode is not None else None,
        document=document,
        **_outside(member(document, "outside", "", list, optional=True) or []),
    )


def _refuse_unseen(unseen: dict | None, site: str, label: str) -> None:
    """Refuse an inventory that found no distribution in ``site`` while other site folders of
    the venv hold some (the probe's ``unseen``): an empty table there would be a false report.

    :raises ProbeError: naming the folders and how many dist-info folders each holds.
    :raises DecodeError: a malformed ``unseen``."""
    if not unseen:
        return
    for folder, found in unseen.items():
        if not isinstance(found, int) or isinstance(found, bool) or inside_path(folder) != folder:
            raise DecodeError(entry_path("unseen", folder), "a count of dist-info folders", found)
    where = ", ".join(f"{folder} ({found} dist-info)" for folder, found in sorted(unseen.items())[:3])
    raise ProbeError(
        f"{label}: the probe found no distribution in {site}, the venv's site-packages for its interpreter, but "
        f"{where} {'holds' if len(unseen) == 1 else 'hold'} some: the venv's layout is not one this transplant reads",
        hint="check which folder the venv's python imports from (<venv>/bin/python -c 'import sys; print(sys.path)') "
             "and report the venv's layout; transplant refuses to plan from an inventory it cannot read whole",
    )


def _cpu_flags(reported: dict | None, path: str) -> frozenset[str] | None:
    """The CPU flags of the probe's ``host.cpu`` (``{"flags": [...]}``); None when absent.

    :raises DecodeError: a malformed report."""
    if reported is None:
        return None
    flags = strings(member(reported, "flags", path, list), f"{path}.flags")
    return frozenset(flags)


def _sonames(reported: dict | None, path: str) -> frozenset[str] | None:
    """The host's library names from the probe's ``host.sonames`` (``{"ldconfig", "names"}``);
    None when absent or when ``ldconfig`` did not run. A name must be a plain file name.

    :raises DecodeError: a malformed report."""
    if reported is None:
        return None
    ran = member(reported, "ldconfig", path, bool)
    names = member(reported, "names", path, list)
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name or "/" in name or len(name) > 255:
            raise DecodeError(f"{path}.names[{i}]", "a library file name", name)
    return frozenset(names) if ran else None


_RELEASE_TEXT = re.compile(r"(\d{1,3})\.(\d{1,3})")
#: How ``_jit_compilers`` in :mod:`transplant.remote.probe` says it found a compiler.
_JIT_SOURCES = ("triton", "TRITON_PTXAS_PATH", "CUDA_HOME", "CUDA_PATH", "PATH", "default", "wheel")


def _jit_compiler(reported: Any, path: str) -> JitCompiler | None:
    """One compiler of the probe's ``host.jit_compilers``; None for null.

    :raises DecodeError: a malformed entry (a path that is not absolute or holds a control
        character, a source the probe does not write, a release that is not
        ``MAJOR.MINOR``, text over its bound)."""
    if reported is None:
        return None
    if not isinstance(reported, dict):
        raise DecodeError(path, "an object or null", reported)
    where = member(reported, "path", path, str)
    source = member(reported, "source", path, str)
    release = member(reported, "release", path, str, optional=True)
    build = member(reported, "build", path, str, optional=True)
    error = member(reported, "error", path, str, optional=True)
    if not _ABSOLUTE.match(where):  # shown in jit-compiler-too-old's message: no control characters
        raise DecodeError(f"{path}.path", "an absolute path without control characters", where)
    if source not in _JIT_SOURCES:
        raise DecodeError(f"{path}.source", f"one of {', '.join(_JIT_SOURCES)}", source)
    match = _RELEASE_TEXT.fullmatch(release) if release is not None else None
    if release is not None and match is None:
        raise DecodeError(f"{path}.release", "MAJOR.MINOR", release)
    if build is not None and not re.fullmatch(r"[0-9.]{1,32}", build):
        raise DecodeError(f"{path}.build", "a version", build)
    return JitCompiler(path=where, source=source, build=build, error=error[:300] if error else None,
                       release=(int(match.group(1)), int(match.group(2))) if match else None)


def _jit_compilers(reported: dict | None, path: str) -> JitCompilers | None:
    """The probe's ``host.jit_compilers``; None when absent (an older probe).

    :raises DecodeError: a malformed report."""
    if reported is None:
        return None
    wheel = member(reported, "wheel_nvcc", path, list, optional=True) or []
    return JitCompilers(
        triton_ptxas=_jit_compiler(reported.get("triton_ptxas"), f"{path}.triton_ptxas"),
        nvcc=_jit_compiler(reported.get("nvcc"), f"{path}.nvcc"),
        wheel_nvcc=tuple(c for i, item in enumerate(wheel[:4])
                         if (c := _jit_compiler(item, f"{path}.wheel_nvcc[{i}]")) is not None),
    )
def _libcuda_loaded(reported: dict | None, path: str) -> LoadedLibcuda | None:
    """The probe's ``host.libcuda_loaded``; None when absent.

    :raises DecodeError: a malformed report (a path that is not absolute or holds control
        characters, a version that is not dotted numbers, an unknown ``how``)."""
    if reported is None:
        return None
    loaded = _LOADED_LIBCUDA(reported, path)
    for name in ("path", "real"):
        if not _ABSOLUTE.match(getattr(loaded, name)):
            raise DecodeError(f"{path}.{name}", "an absolute path", getattr(loaded, name))
    if loaded.version is not None and not _DRIVER_VERSION.match(loaded.version):
        raise DecodeError(f"{path}.version", "a driver version", loaded.version)
    if loaded.how not in _HOW:
        raise DecodeError(f"{path}.how", f"one of {', '.join(_HOW)}", loaded.how)
    return loaded


@dataclass(frozen=True)
class HostFact:
    """One fact of the host a venv is on, as the probe reports it and the inventory keeps it.

    :ivar name: the :class:`Inventory` field it fills (what the rules read).
    :ivar part: the probe's host-script part that reports it (``HOST_PARTS`` in
        :mod:`transplant.remote.probe`), and its key in the document's ``host`` section.
    :ivar wire: the JSON type the part reports (``dict``, ``str``); null counts as absent.
    :ivar parse: ``(reported value or None when absent, its key path) -> the field's value``.
    :ivar required: an absent value is an error (else ``parse`` gets None).
    """

    name: str
    part: str
    wire: type
    parse: Callable[[Any, str], Any]
    required: bool = False

    @property
    def cache_key(self) -> str:
        """``host.<part>``: where the document keeps it; the key path its errors name, and what the
        plan memo's fingerprint digests (with the whole ``host`` section: a fact that changes
        makes a kept plan stale)."""
        return f"host.{self.part}"


#: The host's facts the controller reads, one row each: adding one is its host-script part in
#: ``remote/probe.py`` (``HOST_PARTS``), its row here (with its parser and the :class:`Inventory`
#: field it fills) and the rule that reads that field.
HOST_FACTS: tuple[HostFact, ...] = (
    HostFact("hostname", "hostname", str, lambda value, path: value, required=True),
    HostFact("nvidia", "nvidia", dict, lambda value, path: _NVIDIA(value, path), required=True),
    HostFact("libcuda", "libcuda", dict, lambda value, path: _LIBCUDA(value, path) if value is not None else None),
    HostFact("system_sonames", "sonames", dict, _sonames),
    HostFact("cpu_flags", "cpu", dict, _cpu_flags),
    HostFact("jit_compilers", "jit_compilers", dict, _jit_compilers),
    HostFact("c_toolchain", "c_toolchain", dict,
             lambda value, path: _C_TOOLCHAIN(value, path) if value is not None else None),
    HostFact("libcuda_loaded", "libcuda_loaded", dict, _libcuda_loaded),
)


def _outside(folders: list) -> dict[str, Any]:
    """``outside`` and ``outside_folders`` from the probe's ``outside`` list."""
    dists: list[Distribution] = []
    where: dict[str, str] = {}
    for i, item in enumerate(folders):
        folder = member(item, "folder", f"outside[{i}]", str)
        where[folder] = member(item, "why", f"outside[{i}]", str)
        dists += [_distribution(d, f"outside[{i}].distributions[{j}]", folder)
                  for j, d in enumerate(member(item, "distributions", f"outside[{i}]", list))]
    return {"outside": tuple(sorted(dists, key=lambda d: (d.name, d.dist_info))), "outside_folders": where}
