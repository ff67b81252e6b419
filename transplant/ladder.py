"""What the verify ladder checks, derived from an inventory, and how its new stages are judged
(pure core: plain data in, ``(status, reason)`` out; no I/O).

The derivations read the target's inventory: the overlaid distributions (manifest
``overlay`` patterns), their import names (``top_level.txt``, else RECORD's top-level
entries) and their shared objects (RECORD rows ending in ``.so`` or ``.so.N``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from .inventory import Distribution, Inventory

__all__ = [
    "overlaid",
    "dists_for_imports",
    "import_names",
    "shared_objects",
    "library_key",
    "judge_interpreter",
    "judge_native",
    "provenance_conflicts",
    "judge_provenance",
    "cuda_torch_libraries",
    "DRIVER_SONAMES",
    "missing_driver_library",
]

#: Libraries the NVIDIA driver installs on the host (never a wheel): a venv library that needs
#: one loads only where a driver is installed.
DRIVER_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libcuda.so")
_SHARED = re.compile(r"\.so(\.\d+)*$")
_MISSING = re.compile(r"([^\s:]+): cannot open shared object file")
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")
#: Folders the loader searches after LD_LIBRARY_PATH, RUNPATH and ld.so.cache (ld.so(8)).
_DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def overlaid(inventory: Inventory, patterns: Sequence[str]) -> list[Distribution]:
    """The target's distributions (newest of each name) that match the overlay patterns, by name."""
    latest = inventory.latest()
    return [latest[name] for name in sorted(latest) if any(fnmatchcase(name, p) for p in patterns)]


def _record_tops(dist: Distribution) -> list[str]:
    """Top-level import names from RECORD: packages (folders holding ``.py`` files, PEP 420
    namespaces included), ``x.py`` modules and ``x.<suffix>.so`` extension modules."""
    tops: set[str] = set()
    for entry in dist.record or ():
        path = entry.record_path
        if path.startswith("../") or path.startswith("/"):
            continue
        head, sep, rest = path.partition("/")
        if sep:
            if head.endswith((".dist-info", ".data")) or head == "__pycache__":
                continue
            if rest.endswith(".py") and head.isidentifier():
                tops.add(head)
        elif path.endswith(".py") and path[:-3].isidentifier():
            tops.add(path[:-3])
        elif _SHARED.search(path):
            name = path.split(".", 1)[0]
            if name.isidentifier():
                tops.add(name)
    return sorted(tops)


def import_names(dists: Iterable[Distribution], extra: Sequence[str] = ()) -> list[str]:
    """Import names to check: ``extra`` (``verify.imports``) first, in order, then each
    distribution's ``top_level.txt`` names (else its RECORD's top-level packages and modules),
    without duplicates. Names that are not identifiers (``tests/data``) are left out.
    """
    out: list[str] = []
    for name in extra:
        if name not in out:
            out.append(name)
    for dist in dists:
        names = [t for t in dist.top_level if t.isidentifier()] or _record_tops(dist)
        for name in names:
            if name not in out:
                out.append(name)
    return out


def dists_for_imports(inventory: Inventory, names: Sequence[str]) -> list[Distribution]:
    """The distributions that provide the top-level packages of ``names`` (``sglang.srt`` -> sglang's)."""
    tops = {n.split(".")[0] for n in names}
    return [d for d in inventory.latest().values() if tops & set(d.top_level) or tops & set(_record_tops(d))]


def shared_objects(dists: Iterable[Distribution], venv: str) -> list[str]:
    """Absolute paths of the shared objects (``*.so``, ``*.so.N``) the distributions' RECORDs
    list and the disk holds, inside the venv, sorted."""
    out = set()
    for dist in dists:
        for entry in dist.record or ():
            if entry.path is None or not entry.exists or entry.symlink is not None:
                continue
            if _SHARED.search(posixpath.basename(entry.path)):
                out.add(posixpath.join(venv, entry.path))
    return sorted(out)


def library_key(name: str) -> str:
    """The name that identifies a library across its file names: the file name up to ``.so``
    and the first version number after it (``libcudart.so.13.0.96`` and ``libcudart.so.13`` ->
    ``libcudart.so.13``; ``libtorch_cuda.so`` -> itself), the part the soname keeps."""
    base = posixpath.basename(name)
    match = re.match(r"^(.*?\.so)((\.\d+)?)", base)
    return match.group(1) + match.group(2) if match else base


def judge_interpreter(target: Mapping[str, Any], expected: Mapping[str, Any] | None, *,
                      python: str | None = None) -> tuple[str, str]:
    """(status, reason) for the target's interpreter.

    :param target: ``{"version": "3.11.2", "implementation": "cpython", "home": str | None,
        "home_exists": bool | None, "executable": str}`` from the target's probe.
    :param expected: the same keys for the donor's interpreter, or None when there is no donor
        to compare with (then only ``home`` and ``python`` are checked, and the reason says so).
    :param python: the manifest's ``verify.python`` (``3.11`` or ``3.11.9``): the target's version
        must start with it; None: not checked.
    """
    home, version = target.get("home"), str(target.get("version"))
    if target.get("home_exists") is False:
        return "fail", f"pyvenv.cfg home {home} does not exist: the venv's python points to nothing"
    minor = ".".join(version.split(".")[:2])
    impl = target.get("implementation")
    where = f"{impl} {version} ({target.get('executable')}, home {home})"
    if python is not None and version.split(".")[:len(python.split("."))] != python.split("."):
        return "fail", f"{where}, but the manifest expects Python {python} (verify.python)"
    if python is not None:
        where += f"; Python {python} as the manifest expects"
    if expected is None:
        return "pass", f"{where}; no donor interpreter to compare with"
    want_minor = ".".join(str(expected.get("version")).split(".")[:2])
    if (impl, minor) != (expected.get("implementation"), want_minor):
        return "fail", (f"{where}, but the donor runs {expected.get('implementation')} {expected.get('version')}: "
                        f"extension modules built for {want_minor} do not load in {minor}")
    return "pass", f"{where}; matches the donor's {expected.get('version')}"


def missing_driver_library(error: str | None) -> str | None:
    """The driver library (:data:`DRIVER_SONAMES`) a loader or import error says is missing,
    or None when the error is anything else.

    :param error: the text of a failed ``dlopen`` / import, as the dynamic loader words it
        (``ImportError: libcuda.so.1: cannot open shared object file: No such file or directory``;
        glibc's ``_dl_map_object`` message, which Python's ImportError and ctypes' OSError quote).
    """
    missing = _MISSING.search(error or "")
    if missing and missing.group(1) in DRIVER_SONAMES:
        return missing.group(1)
    return None


def _load_error(error: str) -> str:
    missing = _MISSING.search(error or "")
    if missing:
        return f"missing {missing.group(1)}"
    undefined = _UNDEFINED.search(error or "")
    if undefined:
        return f"undefined symbol {undefined.group(1)}"
    return error or "unknown error"


def judge_native(report: Mapping[str, Any], *, driver: bool, venv: str = "") -> tuple[str, str]:
    """(status, reason) for the native-load script's report.

    A library fails when the loader refuses it: the reason names the missing soname or the
    undefined symbol. One that only lacks a driver library (:data:`DRIVER_SONAMES`) fails
    where the host has a driver (``driver`` True) and is counted as not checkable otherwise.

    :param venv: stripped from the paths shown.
    """
    libraries = report.get("libraries", [])
    if not libraries:
        return "skip", "the overlaid distributions ship no shared objects"
    failed, driverless = [], []
    for lib in libraries:
        if lib.get("ok"):
            continue
        what = _load_error(str(lib.get("error")))
        if not driver and what.startswith("missing ") and what[len("missing "):] in DRIVER_SONAMES:
            driverless.append(lib)
        else:
            failed.append((lib, what))
    prefix = venv.rstrip("/") + "/" if venv else ""

    def shown(path: str) -> str:
        return path[len(prefix):] if prefix and path.startswith(prefix) else path

    not_loaded = [p for p in report.get("preload", []) if not p.get("ok")]
    note = "".join(f"; note: preloading {p['name']} failed ({p['error']})" for p in not_loaded)
    if driverless:
        note += (f"; {len(driverless)} need the NVIDIA driver's libraries, absent on this host "
                 f"(e.g. {shown(driverless[0]['path'])}): not checkable here")
    if failed:
        head = "; ".join(f"{shown(lib['path'])}: {what}" for lib, what in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        return "fail", f"{len(failed)} of {len(libraries)} shared objects do not load: {head}{more}{note}"
    loaded = len(libraries) - len(driverless)
    return "pass", f"{loaded} of {len(libraries)} shared objects load (RTLD_NOW){note}"


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(r and (path == r or path.startswith(r.rstrip("/") + "/")) for r in roots)


def provenance_conflicts(report: Mapping[str, Any], shipped: Sequence[str]) -> list[dict[str, str]]:
    """Mapped libraries that came from outside the venv while the venv ships a library of the
    same name (:func:`library_key`), each with where it came from and why the loader took it.

    :param report: the library-provenance script's report.
    :param shipped: absolute paths of the venv's shared objects (from RECORD).
    :returns: ``[{"library", "mapped", "venv_copy", "why"}]`` sorted by library.
    """
    roots = [report.get("prefix", ""), report.get("prefix_real", "")]
    ours: dict[str, str] = {}
    for path in shipped:
        ours.setdefault(library_key(path), path)
    preload = report.get("ld_preload", [])
    lib_path = report.get("ld_library_path", [])
    conf = report.get("ld_so_conf", [])
    out = []
    for mapped in report.get("mapped", []):
        if _inside(mapped, roots):
            continue
        key = library_key(mapped)
        if key not in ours:
            continue
        folder = posixpath.dirname(mapped)
        if any(real == mapped or posixpath.basename(entry) == posixpath.basename(mapped)
               or library_key(entry) == key for entry, real in preload):
            why = "LD_PRELOAD names it"
        elif any(real == folder for _, real in lib_path):
            entry = next(e for e, real in lib_path if real == folder)
            why = (f"LD_LIBRARY_PATH lists {entry}, searched before the venv's RUNPATH" if entry
                   else "LD_LIBRARY_PATH has an empty entry (the current folder), searched before the venv's RUNPATH")
        elif any(real == folder for _, real in conf):
            entry = next(e for e, real in conf if real == folder)
            why = f"ld.so.conf lists {entry} (the loader's cache), and nothing loaded the venv's copy by path first"
        elif folder in _DEFAULT_DIRS:
            why = f"{folder} is one of the loader's default folders"
        else:
            why = "loaded by absolute path or through another library's RPATH/RUNPATH"
        out.append({"library": key, "mapped": mapped, "venv_copy": ours[key], "why": why})
    return sorted(out, key=lambda c: c["library"])


_CUDA_TORCH = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nvJitLink|cudnn\w*|nccl|cusparse\w*|cufft\w*|curand|"
                         r"cusolver\w*|nvshmem\w*|torch\w*|c10\w*|shm)\.so")


def cuda_torch_libraries(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """The CUDA and torch libraries the process mapped (libcudart, libcublas, libcublasLt, libnvrtc,
    libcudnn, libnccl, libtorch*, libc10*...), each ``{"library", "path", "from": "venv" | "outside"}``."""
    roots = [report.get("prefix", ""), report.get("prefix_real", "")]
    return [{"library": library_key(m), "path": m, "from": "venv" if _inside(m, roots) else "outside"}
            for m in report.get("mapped", []) if _CUDA_TORCH.match(posixpath.basename(m))]


def judge_provenance(report: Mapping[str, Any], shipped: Sequence[str]) -> tuple[str, str]:
    """(status, reason): fail on any :func:`provenance_conflicts`; else pass, counting the mapped
    libraries from the venv and from the system."""
    conflicts = provenance_conflicts(report, shipped)
    roots = [report.get("prefix", ""), report.get("prefix_real", "")]
    mapped = [m for m in report.get("mapped", []) if _SHARED.search(m)]
    inside = [m for m in mapped if _inside(m, roots)]
    failed_imports = [i["name"] for i in report.get("imported", []) if not i.get("ok")]
    note = f"; could not import {', '.join(failed_imports)} (see imports)" if failed_imports else ""
    if conflicts:
        head = "; ".join(f"{c['library']} mapped from {c['mapped']} instead of the venv's {c['venv_copy']}: {c['why']}"
                         for c in conflicts[:3])
        more = f"; and {len(conflicts) - 3} more" if len(conflicts) > 3 else ""
        return "fail", f"{len(conflicts)} librar{'y' if len(conflicts) == 1 else 'ies'} from outside the venv: {head}{more}{note}"
    imported = [i["name"] for i in report.get("imported", []) if i.get("ok")]
    if not imported:
        return "skip", "nothing could be imported, so no library was mapped to check" + note
    return "pass", (f"after importing {', '.join(imported[:6])}{' ...' if len(imported) > 6 else ''}: "
                    f"{len(inside)} libraries mapped from the venv, {len(mapped) - len(inside)} from the system, "
                    f"none shadowing a library the venv ships{note}")
