"""ELF facts of a venv's shared objects: one file run by the venv's own interpreter on its host.

Usage on a host (the controller passes this file's text with ``-c``)::

    <venv>/bin/python -c "$(cat elf_facts.py)" <<< '{"modules": {...}, "files": [...], ...}'

The host has no pyelftools: the request carries its source, and :class:`SourceImporter`
imports it from memory (nothing is written to disk). All ELF reading goes through
pyelftools; only the payload of the ``.nv_fatbin`` section (NVIDIA's fatbin format) is
read with :mod:`struct`, header by header, seeking in the file (never reading it whole).

Request (one JSON object on standard input):

* ``modules``: ``{"elftools/__init__.py": "<source>", ...}``, POSIX paths relative to
  site-packages; a package is the key ending in ``/__init__.py``.
* ``files``: venv-relative POSIX paths of the shared objects to describe. An absolute
  path, one that leaves the venv prefix (see :func:`venv_prefix`) once normalised or once symlinks
  are resolved, a missing file or one that is not ELF gets an ``error``; the others are
  still described.
* ``torch_symbols`` (default true): list each file's undefined, non-weak dynamic symbols
  in libtorch's C++ namespaces (only for files whose DT_NEEDED names a ``libtorch*`` or
  ``libc10*`` library; others get an empty list). ``torch_symbols_skip``: paths among
  ``files`` not to scan for them (torch's own libraries: scanning their tables costs seconds).
* ``device_code`` (default false): list the entries of each file's ``.nv_fatbin``.
* ``defined`` (optional): ``{"files": [venv-relative libs], "symbols": [names]}``: for
  each symbol, whether any of those libraries defines it in its dynamic symbol table.
* ``libstdcxx`` (default false): report the ``libstdc++.so.6`` this interpreter loads.
* ``versioned_symbols`` (default false): list each file's undefined, non-weak dynamic symbols
  bound to a symbol version of a needed file other than the C runtime's
  (``versioned_undefined``: ``{"libnvJitLink.so.12": ["__nvJitLinkAddData_12_8", ...]}``).
* ``numpy_abi`` (default false): say which NumPy C-API each file was built against
  (``numpy_abi``: ``"1"``, ``"2"`` or ``""``; see :func:`numpy_abi`).
* ``defined_by`` (optional): ``{REL: [names]}``: for each venv-relative library, the names it
  does not define (``null`` when it cannot be read).
* ``cache`` (optional, default off): ``{"enabled": bool, "store": "venv"|"reply", "known": {...},
  "racy_ns": int}``: reuse the facts of files whose content has not changed (:class:`ElfCache`),
  kept in ``<venv>/.transplant/cache/elf.json`` (``store: venv``, for targets) or on the
  controller (``store: reply``: the request carries the ``known`` entries, the reply returns the
  entries of this run; nothing is written on the host, for donors). ``hashes``: ``{REL:
  "sha256=..."}``, the content hashes the controller's probe already has for some files (the
  cache's key for them).

Reply (one JSON line on standard output, schema ``transplant.elf/1``)::

    {"schema": "transplant.elf/1",
     "files": {REL: {"error": str|null, "machine": "EM_X86_64", "elf_class": 64,
                     "soname": str|null, "needed": [...],
                     "runpath": [DT_RUNPATH folders], "rpath": [DT_RPATH folders],
                     "version_needs": {"libc.so.6": ["GLIBC_2.2.5", ...]},
                     "torch_undefined": [...],
                     "device_code": [{"kind": "sass"|"ptx", "arch": 90, "variant": ""|"a"|"f",
                                      "isa": "9.0" (PTX entries: the PTX ISA version)}],
                     "versioned_undefined": {NEEDED: [names]}|null, "numpy_abi": "1"|"2"|""|null,
                     "x86_isa_needed": ["x86-64-baseline", "x86-64-v2", ...]}},
     "libstdcxx": {"path": "/usr/lib/.../libstdc++.so.6.0.30", "versions": ["GLIBCXX_3.4", ...]}|null,
     "defined": {SYMBOL: bool}, "defined_in": [REL...], "defined_by": {REL: [names]|null},
     "seconds": float,
     "cache": {"enabled", "hits", "misses", "read": [REL...], "written", "error"?, "entries"?}}

``cache.read`` lists every venv file whose content this run opened (the files the cache
could not answer for). With a cache, the pyelftools sent is imported only when a file must be
opened (a run the cache answers whole never compiles it); without one, at once.

Design rules: Python 3.9+, standard library plus the pyelftools source it is sent,
writes nothing but its own cache in the venv's state folder, and only when asked to (a target's). The controller parses the reply with
:func:`transplant.core.elf_facts.parse_elf_report`; it never imports this module.
"""

import ctypes
import importlib.abc
import importlib.util
import io
import json
import os
import re
import stat
import struct
import sys
import time

try:
    from _transplant_common import read_venv_cache, script_log, venv_cache_path, venv_prefix, write_venv_cache
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import read_venv_cache, script_log, venv_cache_path, venv_prefix, write_venv_cache

__all__ = ["SourceImporter", "load_elftools", "resolve", "describe", "fatbin_entries", "defined", "libstdcxx", "ElfCache",
           "main"]

SCHEMA = "transplant.elf/1"
ORIGIN = "<transplant>/"
#: Same pattern as ``transplant.core.elf_facts._TORCH`` (c10, at, torch, caffe2 namespaces).
TORCH_SYMBOL = re.compile(r"^_Z(?:T[VIS])?N[rVKRO]*(?:3c10|2at|5torch|6caffe2)")
TORCH_LIBS = ("libtorch", "libc10")

#: Fatbin container header: magic, version, header size, bytes of entries after the header.
FATBIN_CONTAINER = struct.Struct("<IHHQ")
FATBIN_MAGIC = 0xBA55ED50
#: Fatbin entry header: kind, ?, header size, payload size, compressed size, ?, minor,
#: major, arch, name offset, name length, flags, zero, decompressed size.
FATBIN_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
FATBIN_KINDS = {1: "ptx", 2: "sass"}
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000
SHF_COMPRESSED = 0x800
VER_FLG_BASE = 0x1

ELFFile = None  # set by load_elftools()


class SourceImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import modules from a mapping of site-packages-relative paths to source text."""

    def __init__(self, modules):
        self.modules = modules

    def _key(self, fullname):
        base = fullname.replace(".", "/")
        for key, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if key in self.modules:
                return key, package
        return None, False

    def find_spec(self, fullname, path=None, target=None):
        key, package = self._key(fullname)
        if key is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=ORIGIN + key, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        key, _ = self._key(module.__name__)
        code = compile(self.modules[key], ORIGIN + key, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - pyelftools' own source, sent with the request

    def get_source(self, fullname):
        """The module's text (lets tracebacks show source lines)."""
        key, _ = self._key(fullname)
        return None if key is None else self.modules[key]


def load_elftools(modules):
    """Put a :class:`SourceImporter` for ``modules`` first on ``sys.meta_path`` and import pyelftools.

    With no modules, the host's own pyelftools (if any) is used.
    """
    global ELFFile
    if modules:
        sys.meta_path.insert(0, SourceImporter(modules))
    from elftools.elf.elffile import ELFFile as elf_file

    ELFFile = elf_file


def resolve(prefix, rel):
    """(absolute path, None) for a venv-relative path, or (None, why it is refused).

    The path must be relative, stay inside ``prefix`` once normalised, and its real
    location (every symlink resolved, the file's own included) must too.
    """
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return None, f"refused: {rel!r} is not a venv-relative path"
    full = os.path.normpath(os.path.join(prefix, rel))
    real_prefix = os.path.realpath(prefix)
    inside = os.path.relpath(full, prefix)
    real = os.path.realpath(full)
    if inside == os.pardir or inside.startswith(os.pardir + os.sep) or not real.startswith(real_prefix + os.sep):
        return None, f"refused: {rel!r} leaves the venv {prefix}"
    return full, None


_PENDING = {"modules": None, "error": None}  # the request's pyelftools, imported on first use


class ElftoolsUnavailable(Exception):
    """The pyelftools sent with the request could not be imported (main reports it and exits 1)."""


def _elftools():
    """Import the request's pyelftools the first time a file must be opened: a run the cache
    answers whole never compiles it (about 0.3 s per run)."""
    if ELFFile is None and _PENDING["error"] is None and _PENDING["modules"] is not None:
        try:
            load_elftools(_PENDING["modules"])
        except Exception as exc:  # noqa: BLE001 - kept, and raised as ElftoolsUnavailable when a file needs it
            _PENDING["error"] = exc
    if _PENDING["error"] is not None:
        raise ElftoolsUnavailable(str(_PENDING["error"]))


def open_elf(full):
    """(open binary stream, ELFFile) of a regular ELF file.

    :raises ValueError: not a regular file, or not ELF (the message says which).
    :raises OSError: missing or unreadable.
    :raises ElftoolsUnavailable: the request's pyelftools does not import.
    """
    _elftools()
    if not stat.S_ISREG(os.stat(full).st_mode):
        raise ValueError("not a regular file")
    stream = open(full, "rb")
    try:
        magic = stream.read(4)
        if magic != b"\x7fELF":
            raise ValueError(f"not an ELF file (starts with {magic!r})")
        stream.seek(0)
        return stream, ELFFile(stream)
    except BaseException:
        stream.close()
        raise


def sections_by_type(elf):
    """First section of each ``sh_type`` (``SHT_DYNAMIC``...), plus ``.nv_fatbin`` and
    ``.note.gnu.property`` by name."""
    found = {}
    for section in elf.iter_sections():
        found.setdefault(section["sh_type"], section)
        if section.name in (".nv_fatbin", ".note.gnu.property"):
            found.setdefault(section.name, section)
    return found


#: GNU_PROPERTY_X86_ISA_1_NEEDED bits -> micro-architecture level (x86-64 psABI, "Micro-architecture
#: levels"; binutils' elf/common.h GNU_PROPERTY_X86_ISA_1_BASELINE .. _V4).
ISA_LEVELS = ((1, "x86-64-baseline"), (2, "x86-64-v2"), (4, "x86-64-v3"), (8, "x86-64-v4"))


def x86_isa_needed(sections):
    """The x86-64 micro-architecture levels the object's GNU property note says it needs
    (``GNU_PROPERTY_X86_ISA_1_NEEDED``, written by ``gcc -mneeded`` or ``ld -z x86-64-vN``), which
    glibc's loader (2.33 and later) checks against the CPU before it loads the object: ``[]``
    without such a note."""
    section = sections.get(".note.gnu.property")
    if section is None:
        return []
    levels = []
    try:
        for note in section.iter_notes():
            if note["n_type"] != "NT_GNU_PROPERTY_TYPE_0":
                continue
            for prop in note["n_desc"]:
                if getattr(prop, "pr_type", None) == "GNU_PROPERTY_X86_ISA_1_NEEDED" and isinstance(prop.pr_data, int):
                    levels += [name for bit, name in ISA_LEVELS if prop.pr_data & bit and name not in levels]
    except Exception:  # noqa: BLE001 - a note pyelftools cannot parse says nothing it can use
        return []
    return levels


def dynamic_names(sections):
    """(DT_SONAME or None, [DT_NEEDED...] in order)."""
    soname, needed = None, []
    dynamic = sections.get("SHT_DYNAMIC")
    if dynamic is not None:
        for tag in dynamic.iter_tags():
            if tag["d_tag"] == "DT_NEEDED":
                needed.append(tag.needed)
            elif tag["d_tag"] == "DT_SONAME" and soname is None:
                soname = tag.soname
    return soname, needed


SEARCH_PATH_MAX_ENTRIES = 64  # folders kept per tag; real objects list a handful
SEARCH_PATH_MAX_CHARS = 4096  # PATH_MAX: a longer entry names no folder the loader can open


def search_paths(sections):
    """(DT_RUNPATH entries, DT_RPATH entries): each tag's colon-separated folders in order, as
    written (``$ORIGIN`` not expanded), at most :data:`SEARCH_PATH_MAX_ENTRIES` per tag, entries
    longer than :data:`SEARCH_PATH_MAX_CHARS` or holding a NUL left out."""
    runpath, rpath = [], []
    dynamic = sections.get("SHT_DYNAMIC")
    if dynamic is not None:
        for tag in dynamic.iter_tags():
            if tag["d_tag"] == "DT_RUNPATH":
                into, value = runpath, tag.runpath
            elif tag["d_tag"] == "DT_RPATH":
                into, value = rpath, tag.rpath
            else:
                continue
            for entry in (value if isinstance(value, str) else "").split(":"):
                if entry and len(entry) <= SEARCH_PATH_MAX_CHARS and "\0" not in entry \
                        and len(into) < SEARCH_PATH_MAX_ENTRIES:
                    into.append(entry)
    return runpath, rpath


def version_needs(sections):
    """{needed file: [version names, in table order]} from ``.gnu.version_r``."""
    section = sections.get("SHT_GNU_verneed")
    if section is None:
        return {}
    needs = {}
    for verneed, auxiliaries in section.iter_versions():
        names = needs.setdefault(verneed.name, [])
        names.extend(aux.name for aux in auxiliaries if aux.name not in names)
    return needs


def torch_undefined(sections):
    """Sorted names of undefined, non-weak ``.dynsym`` symbols in libtorch's namespaces."""
    dynsym = sections.get("SHT_DYNSYM")
    if dynsym is None:
        return []
    names = set()
    for symbol in dynsym.iter_symbols():
        if (symbol["st_shndx"] == "SHN_UNDEF" and symbol["st_info"]["bind"] == "STB_GLOBAL"
                and TORCH_SYMBOL.match(symbol.name)):
            names.add(symbol.name)
    return sorted(names)


def fatbin_entries(stream, start, size):
    """Device code entries of a fatbin payload at ``start`` (bytes) in ``stream``.

    Reads only the headers, seeking from one to the next. Stops, keeping what it has
    read, at anything malformed (bad magic, a header too small, a size running past its
    container or the section). Entries other than PTX and SASS (LTO IR) are skipped;
    duplicates (one per translation unit) are reported once.
    """
    entries, end, position = {}, start + size, start
    while position + FATBIN_CONTAINER.size <= end and len(entries) < FATBIN_MAX_ENTRIES:
        stream.seek(position)
        head = stream.read(FATBIN_CONTAINER.size)
        if len(head) < FATBIN_CONTAINER.size:
            break
        magic, _version, header_size, fat_size = FATBIN_CONTAINER.unpack(head)
        if magic != FATBIN_MAGIC or header_size < FATBIN_CONTAINER.size:
            break
        body, stop = position + header_size, min(position + header_size + fat_size, end)
        if not _container_entries(stream, body, stop, entries):
            break
        position = stop
    return list(entries.values())


FATBIN_MAX_ENTRIES = 4096  # distinct (kind, arch, variant) triples; real fatbins hold a few dozen
FATBIN_MAX_INFLATED = 64 << 20  # bytes: a compressed .nv_fatbin section larger than this is not inflated


def _container_entries(stream, position, stop, entries):
    """Add one container's entries to ``entries`` (a dict keyed by (kind, arch, variant));
    False when it was malformed (stop reading)."""
    while position + FATBIN_ENTRY.size <= stop and len(entries) < FATBIN_MAX_ENTRIES:
        stream.seek(position)
        head = stream.read(FATBIN_ENTRY.size)
        if len(head) < FATBIN_ENTRY.size:
            return False
        fields = FATBIN_ENTRY.unpack(head)
        kind, header_size, payload, arch, flags = fields[0], fields[2], fields[3], fields[8], fields[11]
        following = position + header_size + payload
        if header_size < FATBIN_ENTRY.size or following > stop:
            return False
        if kind in FATBIN_KINDS and arch > 0:
            variant = "f" if flags & FLAG_FAMILY_SPECIFIC else "a" if flags & FLAG_ARCH_SPECIFIC else ""
            entry = entries.setdefault((kind, arch, variant),
                                       {"kind": FATBIN_KINDS[kind], "arch": arch, "variant": variant})
            if FATBIN_KINDS[kind] == "ptx" and fields[7] > 0:
                # a PTX entry's header (major, minor) is its PTX ISA version, what cuobjdump prints as its
                # "code version" and what its `.version` line says; read here, compressed or not
                isa = (fields[7], fields[6])
                entry["isa"] = "{}.{}".format(*max(isa, tuple(map(int, entry.get("isa", "0.0").split(".")))))
        position = following
    return position == stop


class FatbinTooLarge(Exception):
    """A compressed .nv_fatbin section too large to inflate (a decompression bomb or worse)."""


def device_code(elf, sections):
    """Entries of the ``.nv_fatbin`` section; [] without one."""
    section = sections.get(".nv_fatbin")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return []
    if section["sh_flags"] & SHF_COMPRESSED:
        inflated = getattr(section, "data_size", None)
        if not isinstance(inflated, int) or inflated > FATBIN_MAX_INFLATED:
            raise FatbinTooLarge("its compressed .nv_fatbin section would inflate to {} bytes; not read".format(inflated))
        data = section.data()
        return fatbin_entries(io.BytesIO(data), 0, len(data))
    return fatbin_entries(elf.stream, section["sh_offset"], section["sh_size"])


def facts(elf, torch_symbols, want_device_code, want_versioned=False, want_numpy=False):
    """The reply object of one readable ELF file."""
    sections = sections_by_type(elf)
    soname, needed = dynamic_names(sections)
    runpath, rpath = search_paths(sections)
    links_torch = any(name.startswith(TORCH_LIBS) for name in needed)
    machine = elf["e_machine"]
    code, notes = [], []
    if want_device_code:
        try:
            code = device_code(elf, sections)
        except FatbinTooLarge as exc:
            notes.append(str(exc))
    return {
        "error": None,
        "machine": machine if isinstance(machine, str) else f"EM_{machine}",
        "elf_class": elf.elfclass,
        "soname": soname,
        "needed": needed,
        "runpath": runpath,
        "rpath": rpath,
        "version_needs": version_needs(sections),
        "torch_undefined": torch_undefined(sections) if torch_symbols and links_torch else [],
        "device_code": code,
        "notes": notes,
        "versioned_undefined": versioned_undefined(elf, sections) if want_versioned else None,
        "numpy_abi": numpy_abi(elf, sections) if want_numpy else None,
        "x86_isa_needed": x86_isa_needed(sections),
    }


def describe(prefix, rel, torch_symbols=True, want_device_code=False, want_versioned=False, want_numpy=False,
             cache=None):
    """Reply object for one venv-relative file; any failure becomes its ``error``.

    With a :class:`ElfCache`, a file whose content key is known is not opened; the facts of a
    file read whole (no error) are kept under its key."""
    full, refused = resolve(prefix, rel)
    if refused:
        return {"error": refused}
    cache = cache or ElfCache(prefix, None)
    what = "facts:t{:d}d{:d}v{:d}n{:d}".format(bool(torch_symbols), bool(want_device_code), bool(want_versioned),
                                                bool(want_numpy))
    key = cache.key(rel, full, what)
    known = cache.get(key)
    if isinstance(known, dict):
        return known
    cache.opened(rel)
    reply = _describe(full, torch_symbols, want_device_code, want_versioned, want_numpy)
    if reply.get("error") is None:
        cache.put(key, reply, full)
    return reply


def _describe(full, torch_symbols, want_device_code, want_versioned, want_numpy):
    try:
        stream, elf = open_elf(full)
    except OSError as exc:
        return {"error": f"cannot open: {exc.strerror or exc}"}
    except ValueError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many kinds on a damaged header
        return {"error": f"cannot read as ELF: {type(exc).__name__}: {exc}"}
    try:
        return facts(elf, torch_symbols, want_device_code, want_versioned, want_numpy)
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many kinds on a damaged body
        return {"error": f"cannot read as ELF: {type(exc).__name__}: {exc}"}
    finally:
        stream.close()


def defined_names(elf, wanted):
    """The names in ``wanted`` (a set) that ``elf`` defines in its dynamic symbol table.

    Looks each name up in ``.gnu.hash`` (or ``.hash``) when present; otherwise reads
    ``.dynsym`` once.
    """
    sections = sections_by_type(elf)
    table = sections.get("SHT_GNU_HASH") or sections.get("SHT_HASH")
    if table is not None:
        found = set()
        for name in wanted:
            symbol = table.get_symbol(name)
            if symbol is not None and symbol["st_shndx"] != "SHN_UNDEF":
                found.add(name)
        return found
    dynsym = sections.get("SHT_DYNSYM")
    if dynsym is None:
        return set()
    return {s.name for s in dynsym.iter_symbols() if s["st_shndx"] != "SHN_UNDEF" and s.name in wanted}


def defined(prefix, files, symbols, cache=None):
    """({symbol: defined by any of files}, [files searched: existing ELF files])."""
    answer = {name: False for name in symbols}
    searched = []
    for rel in files:
        wanted = {name for name, found in answer.items() if not found}
        found = _defined_in(prefix, rel, wanted, cache or ElfCache(prefix, None))
        if found is None:
            continue
        searched.append(rel)
        answer.update(dict.fromkeys(found, True))
    return answer, searched


def _defined_in(prefix, rel, wanted, cache):
    """The names of ``wanted`` that the library ``rel`` defines, or None when it cannot be read.

    The answers are kept per name under the library's content key: a name asked before is not
    looked up again, and the library is opened only for names never asked."""
    full, refused = resolve(prefix, rel)
    if refused:
        return None
    key = cache.key(rel, full, "symbols")
    known = cache.get(key)
    known = dict(known) if isinstance(known, dict) else {}
    unknown = {name for name in wanted if name not in known}
    if unknown:
        cache.opened(rel)
        try:
            stream, elf = open_elf(full)
        except Exception:  # noqa: BLE001 - unreadable: the caller reads no answer as unknown
            return None
        try:
            found = defined_names(elf, unknown)
        except Exception:  # noqa: BLE001 - pyelftools raises many kinds on a damaged file
            return None
        finally:
            stream.close()
        known.update((name, name in found) for name in unknown)
        cache.put(key, known, full)
    return {name for name in wanted if known.get(name)}


#: Libraries of the C runtime and toolchain: their symbols are the platform rules' (glibc and
#: libstdc++ symbol versions), never a venv library's, so versioned_undefined leaves them out.
SYSTEM_LIBRARIES = re.compile(r"^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libgcc_s|libstdc\+\+|libatomic|"
                              r"libgomp|ld-linux[-\w.]*|ld64)\.so(\.\d+)*$")
VERSYM_HIDDEN = 0x8000


def versioned_undefined(elf, sections):
    """{needed file: [names]}: the undefined, non-weak dynamic symbols bound to a version that
    ``.gnu.version_r`` says a needed file (not a system library) provides, sorted.

    Reads ``.dynsym`` and ``.gnu.version`` as raw arrays (pyelftools' per-symbol objects
    take seconds on libtorch_cuda.so's 35,000 symbols); names come from the linked string table.
    """
    dynsym, versym, verneed = (sections.get(k) for k in ("SHT_DYNSYM", "SHT_GNU_versym", "SHT_GNU_verneed"))
    if dynsym is None or versym is None or verneed is None:
        return {}
    owner = {}
    for need, auxiliaries in verneed.iter_versions():
        if SYSTEM_LIBRARIES.match(need.name or ""):
            continue
        for aux in auxiliaries:
            owner[aux.entry["vna_other"]] = need.name
    if not owner:
        return {}
    order = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:
        entry, layout = struct.Struct(order + "IBBHQQ"), (0, 1, 3)
    else:
        entry, layout = struct.Struct(order + "IIIBBH"), (0, 3, 5)
    table = dynsym.data()
    count = len(table) // entry.size
    raw = versym.data()
    known = min(count, len(raw) // 2)
    indexes = struct.unpack(order + "{}H".format(known), raw[:2 * known])
    strings = elf.get_section(dynsym["sh_link"])
    out = {}
    for i, ndx in enumerate(indexes):
        file = owner.get(ndx & ~VERSYM_HIDDEN)
        if file is None:
            continue
        fields = entry.unpack_from(table, i * entry.size)
        name_at, info, shndx = (fields[k] for k in layout)
        if shndx != 0 or info >> 4 != 1:  # defined, or not STB_GLOBAL (weak, local)
            continue
        out.setdefault(file, set()).add(strings.get_string(name_at))
    return {file: sorted(names) for file, names in sorted(out.items())}


def defined_by(prefix, queries, cache=None):
    """{library: [names it does not define]} for ``{library: [names]}`` (venv-relative
    libraries); None for a library that cannot be read."""
    answer = {}
    for rel, names in sorted(queries.items()):
        found = _defined_in(prefix, rel, set(names), cache or ElfCache(prefix, None))
        answer[rel] = None if found is None else sorted(set(names) - found)
    return answer


CACHE_SCHEMA = "transplant.elfcache/3"  # /2: x86_isa_needed; /3: runpath and rpath
RACY_NS = 2 * 10 ** 9
CACHE_MAX_ENTRIES = 20000  # a venv has a few hundred to a few thousand shared objects


class ElfCache:
    """Facts of shared objects kept from one run to the next, keyed by the file's content.

    The key of a file is the content hash the controller sends for it (``hashes``: the probe's,
    itself cached by ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``), else that stat
    tuple itself (as git's index and the probe's hash cache do), followed by what was asked
    (``facts:`` with the request's flags, or ``symbols``: the names looked up and whether the
    file defines each). Changed bytes give another hash or another stat tuple: a miss, and the
    file is read again. A file whose mtime or ctime lies within ``racy_ns`` of this run's start,
    or that changed while it was read, is not stored ("racily clean", see the probe's hash
    cache). The venv store is written only when this run missed (every entry kept, up to
    :data:`CACHE_MAX_ENTRIES`, then only this run's), never through a symlinked or
    escaping state folder; any error reading or writing it only turns it off for this run.
    """

    def __init__(self, prefix, options, hashes=None):
        self.options = options if isinstance(options, dict) else {"enabled": bool(options)}
        self.enabled = bool(options) and bool(self.options.get("enabled", True)) and prefix is not None
        self.store = self.options.get("store", "venv")
        self.racy_ns = int(self.options.get("racy_ns", RACY_NS))
        self.started = time.time_ns()
        self.hashes = hashes if isinstance(hashes, dict) else {}
        self.entries, self.fresh = {}, {}
        self.hits = self.misses = 0
        self.read = []
        self.error = None
        self.path, self.prefix = None, prefix
        if not self.enabled:
            return
        if self.store == "reply":
            known = self.options.get("known")
            self.entries = dict(known) if isinstance(known, dict) else {}
            return
        self.path = venv_cache_path(prefix, "elf.json")
        if self.path is None:
            self.enabled, self.error = False, "the state folder is a symlink or leaves the venv"
            return
        try:
            self.entries = read_venv_cache(self.path, CACHE_SCHEMA)
        except (OSError, ValueError) as exc:
            self.error = "unreadable, rebuilt: {}".format(exc)[:200]

    @staticmethod
    def _stat(full):
        try:
            st = os.stat(full)
        except OSError:
            return None
        return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def key(self, rel, full, what):
        """``<content>|<what>``, or None when the file cannot be keyed (missing) or the cache is off."""
        if not self.enabled:
            return None
        digest = self.hashes.get(rel)
        if isinstance(digest, str) and digest.startswith("sha256="):
            return "{}|{}".format(digest, what)
        st = self._stat(full)
        if st is None:
            return None
        return "stat:{}|{}".format(":".join(map(str, st)), what)

    def get(self, key):
        """The value kept under ``key`` (counted as a hit), or None (a miss)."""
        if key is None:
            return None
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self.fresh[key] = value
        return value

    def opened(self, rel):
        """Count ``rel`` as read (its content opened) in this run."""
        if rel not in self.read:
            self.read.append(rel)

    def put(self, key, value, full):
        """Keep ``value`` under ``key`` unless the file is racily clean or changed since it was keyed."""
        if key is None:
            return
        st = self._stat(full)
        if st is None or max(st[3], st[4]) >= self.started - self.racy_ns:
            return
        if key.startswith("stat:") and key[len("stat:"):].split("|", 1)[0] != ":".join(map(str, st)):
            return
        self.entries[key] = value
        self.fresh[key] = value

    def save(self):
        """The reply's ``cache`` report; writes the venv store when this run read something."""
        report = {"enabled": self.enabled, "hits": self.hits, "misses": self.misses, "read": list(self.read),
                  "written": False}
        if self.error:
            report["error"] = self.error
        if not self.enabled:
            return report
        if self.store == "reply":
            report["entries"] = self.fresh
            return report
        if not self.misses:
            return report
        try:
            # every entry kept (one plan asks facts, then symbols, in separate runs); past
            # CACHE_MAX_ENTRIES only this run's, so that keys of bytes long gone do not pile up
            kept = self.entries if len(self.entries) <= CACHE_MAX_ENTRIES else self.fresh
            write_venv_cache(self.prefix, self.path, CACHE_SCHEMA, kept)
            report["written"] = True
        except OSError as exc:
            report["error"] = "not written: {}".format(exc)[:200]
        return report


#: The module NumPy's C-API headers import in ``_import_array()``: 2.x headers name
#: ``numpy._core._multiarray_umath`` first (and fall back to the 1.x name), 1.x headers only
#: ``numpy.core._multiarray_umath`` (numpy/_core/code_generators/generate_numpy_api.py).
NUMPY_2 = b"numpy._core._multiarray_umath"
NUMPY_1 = b"numpy.core._multiarray_umath"
NUMPY_SCAN_MAX = 256 << 20  # bytes of read-only data read per file, at most
NUMPY_CHUNK = 1 << 20


def numpy_abi(elf, sections):
    """``"2"`` when the file's read-only data names NumPy 2's C-API module, ``"1"`` when only
    NumPy 1.x's, ``""`` when neither (or the file imports no module: no ``PyImport_ImportModule``
    in ``.dynstr``). Reads ``.rodata*`` sections in chunks, at most :data:`NUMPY_SCAN_MAX` bytes."""
    dynsym = sections.get("SHT_DYNSYM")
    if dynsym is None:
        return ""
    strtab = elf.get_section(dynsym["sh_link"])
    if strtab is None or strtab["sh_size"] > NUMPY_SCAN_MAX or b"PyImport_ImportModule" not in strtab.data():
        return ""
    found, budget, keep = set(), NUMPY_SCAN_MAX, len(NUMPY_2)
    for section in elf.iter_sections():
        if not section.name.startswith(".rodata") or section["sh_type"] != "SHT_PROGBITS":
            continue
        start, end, tail = section["sh_offset"], section["sh_offset"] + section["sh_size"], b""
        while start < end and budget > 0:
            elf.stream.seek(start)
            chunk = elf.stream.read(min(NUMPY_CHUNK, end - start, budget))
            if not chunk:
                break
            data = tail + chunk
            found.update(n for n in (NUMPY_2, NUMPY_1) if n in data)
            tail, start, budget = data[-keep:], start + len(chunk), budget - len(chunk)
    return "2" if NUMPY_2 in found else "1" if NUMPY_1 in found else ""


def loaded_path(prefix_name):
    """Real path of the first mapped file whose name starts with ``prefix_name``, or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(prefix_name):
                    return os.path.realpath(parts[5].strip())
    except OSError:
        pass
    return None


SHT_GNU_VERDEF = 0x6FFFFFFD


def verdef_versions(path):
    """The first name of each version definition of the ELF file ``path`` (``SHT_GNU_verdef``),
    the base one (``VER_FLG_BASE``: the soname) left out, in file order: what :func:`libstdcxx`
    reads with pyelftools, read here with ``struct`` alone (System V gABI, "Versioning"), so that
    a plan whose objects are all cached (or a small apply, with none) does not import pyelftools
    for it. None when the file is not one this reads (not ELF, extended section numbering, an
    offset out of bounds): the caller reads it with pyelftools then.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
            return None
        wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
        if wide:
            shoff, = struct.unpack_from(end + "Q", data, 0x28)
            shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
            header, size = end + "IIQQQQIIQQ", 64
        else:
            shoff, = struct.unpack_from(end + "I", data, 0x20)
            shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
            header, size = end + "IIIIIIIIII", 40
        if shnum == 0 or shentsize != size or shoff + shnum * size > len(data):
            return None
        sections = [struct.unpack_from(header, data, shoff + i * size) for i in range(shnum)]
        # (name, type, flags, addr, offset, size, link, info, ...)
        verdef = [sh for sh in sections if sh[1] == SHT_GNU_VERDEF]
        if not verdef:
            return []
        _, _, _, _, offset, length, link, count = verdef[0][:8]
        if link >= shnum or offset + length > len(data):
            return None
        strings = sections[link]
        if strings[4] + strings[5] > len(data):
            return None
        table = data[strings[4]:strings[4] + strings[5]]

        def name(at):
            stop = table.index(b"\0", at)
            return table[at:stop].decode("utf-8", "replace")

        versions, entry = [], offset
        for _ in range(count):
            if entry + 20 > offset + length:
                return None
            _, flags, _, auxiliaries, _, aux, following = struct.unpack_from(end + "HHHHIII", data, entry)
            if auxiliaries and not flags & VER_FLG_BASE:
                if entry + aux + 8 > offset + length:
                    return None
                versions.append(name(struct.unpack_from(end + "I", data, entry + aux)[0]))
            if not following:
                break
            entry += following
        return versions
    except (OSError, struct.error, ValueError, IndexError):
        return None


def libstdcxx():
    """``{"path", "versions"}`` of the ``libstdc++.so.6`` this interpreter loads, or None;
    its versions read by :func:`verdef_versions`, else (a file that one does not read) pyelftools."""
    try:
        ctypes.CDLL("libstdc++.so.6")
    except OSError:
        return None
    path = loaded_path("libstdc++.so.6")
    if path is None:
        return None
    quick = verdef_versions(path)
    if quick is not None:
        return {"path": path, "versions": quick}
    versions = []
    try:
        stream, elf = open_elf(path)
    except Exception:  # noqa: BLE001 - unreadable: no versions
        return {"path": path, "versions": versions}
    try:
        verdef = sections_by_type(elf).get("SHT_GNU_verdef")
        for version, auxiliaries in verdef.iter_versions() if verdef is not None else ():
            names = [aux.name for aux in auxiliaries]
            if names and not version["vd_flags"] & VER_FLG_BASE:
                versions.append(names[0])
    finally:
        stream.close()
    return {"path": path, "versions": versions}


def _unavailable():
    exc = _PENDING["error"]
    sys.stderr.write("elf_facts: cannot import the pyelftools sent with the request in Python {}: {}: {}\n"
                     .format(".".join(map(str, sys.version_info[:3])), type(exc).__name__, exc))
    return 1



def main(argv):
    started = time.monotonic()
    request = json.load(sys.stdin)
    script_log("elf_facts")
    _PENDING["modules"] = request.get("modules") or {}
    if not request.get("cache"):
        # without a cache every file is read: import at once, so that a bad pyelftools fails early
        try:
            _elftools()
        except ElftoolsUnavailable:
            pass  # reported below, before any reply
    if _PENDING["error"] is not None:
        return _unavailable()
    prefix = venv_prefix()
    torch_symbols = request.get("torch_symbols", True)
    want_device_code = request.get("device_code", False)
    skip = set(request.get("torch_symbols_skip") or [])
    want_versioned = request.get("versioned_symbols", False)
    want_numpy = request.get("numpy_abi", False)
    cache = ElfCache(prefix, request.get("cache"), request.get("hashes"))
    files = {rel: describe(prefix, rel, torch_symbols and rel not in skip, want_device_code, want_versioned,
                           want_numpy, cache)
             for rel in request.get("files") or []}
    query = request.get("defined") or {}
    answer, searched = defined(prefix, query.get("files") or [], query.get("symbols") or [], cache)
    reply = {
        "schema": SCHEMA,
        "files": files,
        "libstdcxx": libstdcxx() if request.get("libstdcxx") else None,
        "defined": answer,
        "defined_in": searched,
        "defined_by": defined_by(prefix, request.get("defined_by") or {}, cache),
        "seconds": round(time.monotonic() - started, 6),
    }
    reply["cache"] = cache.save()
    if _PENDING["error"] is not None:
        return _unavailable()
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
