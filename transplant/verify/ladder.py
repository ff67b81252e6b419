"""What the verify ladder checks, derived from an inventory (pure core: plain data in and out; no I/O).

How each stage's report is judged is in :mod:`transplant.verify.judges`.

The derivations read the target's inventory: the overlaid distributions (manifest
``overlay`` patterns), their import names (``top_level.txt``, else RECORD's top-level
entries) and their shared objects (RECORD rows ending in ``.so`` or ``.so.N``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from transplant.core.import_names import SHARED_OBJECT, import_names, record_tops
from transplant.core.inventory import Distribution, Inventory

__all__ = [
    "GPU_WORDS",
    "sort_donor_imports",
    "failure_class",
    "system_library_gap",
    "overlaid",
    "dists_for_imports",
    "import_names",
    "shared_objects",
    "record_library_keys",
    "pip_shipped_library",
    "library_key",
    "extension_module",
    "provenance_conflicts",
    "cuda_torch_libraries",
    "DRIVER_SONAMES",
    "missing_driver_library",
    "load_error",
    "MISSING_LIBRARY",
    "UNDEFINED_SYMBOL",
    "SHARED_OBJECT",
    "inside_roots",
]

#: Libraries the NVIDIA driver installs on the host (never a wheel): a venv library that needs
#: one loads only where a driver is installed.
DRIVER_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libcuda.so")
MISSING_LIBRARY = re.compile(r"([^\s:]+): cannot open shared object file")
UNDEFINED_SYMBOL = re.compile(r"undefined symbol: (\S+)")
#: Folders the loader searches after LD_LIBRARY_PATH, RUNPATH and ld.so.cache (ld.so(8)).
_DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def overlaid(inventory: Inventory, patterns: Sequence[str]) -> list[Distribution]:
    """The target's distributions (newest of each name) that match the overlay patterns, by name."""
    latest = inventory.latest()
    return [latest[name] for name in sorted(latest) if any(fnmatchcase(name, p) for p in patterns)]


def dists_for_imports(inventory: Inventory, names: Sequence[str]) -> list[Distribution]:
    """The distributions that provide the top-level packages of ``names`` (``sglang.srt`` -> sglang's)."""
    tops = {n.split(".")[0] for n in names}
    return [d for d in inventory.latest().values() if tops & set(d.top_level) or tops & set(record_tops(d))]


def shared_objects(dists: Iterable[Distribution], venv: str) -> list[str]:
    """Absolute paths of the shared objects (``*.so``, ``*.so.N``) the distributions' RECORDs
    list and the disk holds, inside the venv, sorted."""
    out = set()
    for dist in dists:
        for entry in dist.record or ():
            if entry.path is None or not entry.exists or entry.symlink is not None:
                continue
            if SHARED_OBJECT.search(posixpath.basename(entry.path)):
                out.add(posixpath.join(venv, entry.path))
    return sorted(out)


def record_library_keys(dists: Iterable[Distribution]) -> set[str]:
    """The :func:`library_key` of every shared object (``*.so``, ``*.so.N``) any of the
    distributions' RECORDs lists, whether or not the file is on disk (a listed file that is gone
    is still the venv's library, broken): what the venv ships, to tell its own libraries from the
    host's (:func:`transplant.verify.judges.judge_native`)."""
    out = set()
    for dist in dists:
        for entry in dist.record or ():
            base = posixpath.basename(entry.record_path)
            if SHARED_OBJECT.search(base):
                out.add(library_key(base))
    return out


#: The libraries pip distributions ship for CUDA and torch, by soname family. Source: the
#: shared objects of the ``nvidia-*-cu12`` wheels (``nvidia/<component>/lib``), the CUDA 13
#: ``nvidia-*`` wheels (``nvidia/cu13/lib``), ``nvidia-cudnn``, ``nvidia-nccl``,
#: ``nvidia-nvshmem`` (its ``nvshmem_*`` plugins too), ``nvidia-cusparselt`` and torch's wheel
#: (``torch/lib``): every library of sglang 0.5.9's and 0.5.23's stacks (torch 2.9.1+cu128,
#: 2.14.1+cu130) matches; plus cuTENSOR, cuDSS, NPP, nvJPEG and nvFatbin, shipped the same way.
#: A missing one of these is a distribution removed or broken, never a host library.
_PIP_GPU = re.compile(r"^(lib(cudart|cublas|cublasLt|cudnn\w*|cufft\w*|cufile\w*|cupti|curand|cusolver\w*|"
                      r"cusparse\w*|nccl|nvJitLink|nvrtc[\w.-]*|nvblas|nvperf_\w+|nvshmem\w*|nvToolsExt|nvtx\w*|"
                      r"nvvm|pcsamplingutil|checkpoint|torch\w*|c10\w*|caffe2\w*|shm|cutensor\w*|cudss\w*|"
                      r"npp\w*|nvjpeg\w*|nvfatbin)|nvshmem_\w+)\.so")
#: auditwheel repair grafts the libraries a wheel needs into it renamed ``<name>-<8 hex>.so...``
#: (the first 8 hex digits of the file's sha256) and rewrites DT_NEEDED to match: such a soname
#: exists only inside a wheel.
_GRAFTED = re.compile(r"-[0-9a-f]{8}\.so")


def pip_shipped_library(soname: str, shipped: Iterable[str] = ()) -> bool:
    """Whether a soname is one a pip distribution ships, so that its absence is a broken venv
    rather than a library the host may or may not have: its :func:`library_key` is among
    ``shipped`` (:func:`record_library_keys`), it is of a CUDA/torch family the ``nvidia-*``
    and torch wheels ship (:data:`_PIP_GPU`; ``libcudart.so.12`` after ``nvidia-cuda-runtime-cu12``
    was removed), or auditwheel grafted it into a wheel (``libgomp-a34b3233.so.1``)."""
    base = posixpath.basename(soname)
    return library_key(base) in set(shipped) or bool(_PIP_GPU.match(base)) or bool(_GRAFTED.search(base))


def library_key(name: str) -> str:
    """The name that identifies a library across its file names: the file name up to ``.so``
    and the first version number after it (``libcudart.so.13.0.96`` and ``libcudart.so.13`` ->
    ``libcudart.so.13``; ``libtorch_cuda.so`` -> itself), the part the soname keeps."""
    base = posixpath.basename(name)
    match = re.match(r"^(.*?\.so)((\.\d+)?)", base)
    return match.group(1) + match.group(2) if match else base


def missing_driver_library(error: str | None) -> str | None:
    """The driver library (:data:`DRIVER_SONAMES`) a loader or import error says is missing,
    or None when the error is anything else, or also names a missing library that is not the
    driver's (a package that wraps the loader's messages of several attempts, as sgl_kernel's
    "Could not load any common_ops library!" does, is judged on all of them).

    :param error: the text of a failed ``dlopen`` / import, as the dynamic loader words it
        (``ImportError: libcuda.so.1: cannot open shared object file: No such file or directory``;
        glibc's ``_dl_map_object`` message, which Python's ImportError and ctypes' OSError quote).
    """
    missing = MISSING_LIBRARY.findall(error or "")
    if missing and all(name in DRIVER_SONAMES for name in missing):
        return missing[0]
    return None


def load_error(error: str) -> str:
    missing = MISSING_LIBRARY.search(error or "")
    if missing:
        return f"missing {missing.group(1)}"
    undefined = UNDEFINED_SYMBOL.search(error or "")
    if undefined:
        return f"undefined symbol {undefined.group(1)}"
    return error or "unknown error"


def donor_shared_objects(report: Mapping[str, Any], donor: Mapping[str, Any] | None, venv: str) -> set[str]:
    """The target's failed shared objects (absolute paths under ``venv``) whose copy at the same
    venv-relative path fails on the donor with the same loader error (:func:`load_error`:
    the same missing soname or undefined symbol); empty without a donor report."""
    if not donor:
        return set()
    prefix = venv.rstrip("/") + "/"
    theirs: dict[str, str] = {}
    for lib in donor.get("libraries", []):
        rel = _relative(str(lib.get("path")), str(donor.get("prefix") or ""))
        if rel is not None and not lib.get("ok") and not lib.get("skipped"):
            theirs[rel] = load_error(str(lib.get("error")))
    out = set()
    for lib in report.get("libraries", []):
        path = str(lib.get("path"))
        if lib.get("ok") or lib.get("skipped") or not path.startswith(prefix):
            continue
        if theirs.get(path[len(prefix):]) == load_error(str(lib.get("error"))):
            out.add(path)
    return out


def _relative(path: str, prefix: str) -> str | None:
    """``path`` relative to ``prefix`` (the donor runner adds ``prefix`` to its report); None
    when it is not under it."""
    if prefix and path.startswith(prefix.rstrip("/") + "/"):
        return path[len(prefix.rstrip("/")) + 1:]
    return None


def donor_shared_imports(report: Mapping[str, Any], donor: Mapping[str, Any] | None) -> set[str]:
    """The import names that failed on the target and fail on the donor too, with the same
    exception class (``ImportError``...) and, where the error is the loader's, the same loader
    error (:func:`load_error`: the same missing soname or undefined symbol); a name that is
    itself missing from both venvs is not among them (:func:`_names_itself_missing`); empty
    without a donor report."""
    if not donor:
        return set()
    def kind(item: Mapping[str, Any]) -> str:
        error = str(item.get("error") or "")
        loader = MISSING_LIBRARY.search(error) or UNDEFINED_SYMBOL.search(error)
        return error.split(":", 1)[0] + (f" ({load_error(error)})" if loader else "")
    theirs = {i.get("name"): kind(i) for i in donor.get("imports", []) if not i.get("ok")}
    return {i["name"] for i in report.get("imports", []) if not i.get("ok") and theirs.get(i.get("name")) == kind(i)
            and not _names_itself_missing(i)}


def _names_itself_missing(item: Mapping[str, Any]) -> bool:
    """Whether an import failed because the module itself (or its package) exists in neither
    venv (``ModuleNotFoundError: No module named 'x'`` for ``x`` or ``x.y``): a wrong name,
    which no host can check, never "what the donor runs". A missing module it imports in turn
    is another matter (a dependency the donor lacks too)."""
    missing = re.search(r"^ModuleNotFoundError: No module named '([^']+)'", str(item.get("error") or ""))
    if missing is None:
        return False
    name = str(item.get("name"))
    return name == missing.group(1) or name.startswith(missing.group(1) + ".")


def inside_roots(path: str, roots: Sequence[str]) -> bool:
    return any(r and (path == r or path.startswith(r.rstrip("/") + "/")) for r in roots)


#: A Python extension module's file name: the module name, then an ABI-tagged suffix of
#: ``importlib.machinery.EXTENSION_SUFFIXES`` (PEP 3149: ``.cpython-311-x86_64-linux-gnu.so``;
#: PEP 384: ``.abi3.so``; PyPy's ``.pypy39-pp73-...so``). No library soname carries such a tag.
_EXTENSION_MODULE = re.compile(r"\.(cpython-[^./]+|pypy[^./]+|abi3)\.so$")


def extension_module(path: str) -> bool:
    """Whether a file name is a Python extension module's (:data:`_EXTENSION_MODULE`)."""
    return bool(_EXTENSION_MODULE.search(posixpath.basename(path)))


def provenance_conflicts(report: Mapping[str, Any], shipped: Sequence[str]) -> list[dict[str, str]]:
    """Mapped libraries that came from outside the venv while the venv ships a library of the
    same name (:func:`library_key`), each with where it came from and why the loader took it.

    Python extension modules are not libraries here, on either side: the interpreter imports
    them by path from ``sys.path`` (the import system's ExtensionFileLoader), the dynamic loader
    never looks them up by soname, so the standard library's ``_csv`` / ``_json`` do not shadow
    pyarrow's ``pyarrow/_csv.cpython-311-x86_64-linux-gnu.so`` of the same file name. A mapped
    file is one when the report's ``extension_modules`` (the files of the imported extension
    modules) holds it or its name is ABI-tagged (:func:`extension_module`); a shipped one when
    its name is.

    :param report: the library-provenance script's report.
    :param shipped: absolute paths of the venv's shared objects (from RECORD).
    :returns: ``[{"library", "mapped", "venv_copy", "why"}]`` sorted by library.
    """
    roots = [report.get("prefix", ""), report.get("prefix_real", "")]
    modules = set(report.get("extension_modules") or ())
    ours: dict[str, str] = {}
    for path in shipped:
        if not extension_module(path):
            ours.setdefault(library_key(path), path)
    preload = report.get("ld_preload", [])
    lib_path = report.get("ld_library_path", [])
    conf = report.get("ld_so_conf", [])
    out = []
    for mapped in report.get("mapped", []):
        if inside_roots(mapped, roots) or mapped in modules or extension_module(mapped):
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
    return [{"library": library_key(m), "path": m, "from": "venv" if inside_roots(m, roots) else "outside"}
            for m in report.get("mapped", []) if _CUDA_TORCH.match(posixpath.basename(m))]


def failure_class(stage: str, report: Mapping[str, Any] | None) -> str | None:
    """What kind of failure a ``smoke`` or ``server-args`` report shows, so that the target's and
    the donor's can be compared (same class: the donor fails the same way); None when the report
    shows none (or is absent).

    smoke: ``missing:torch``, ``unavailable:cuda``, ``import:<exception class>``, else the
    sorted names of the failed checks and sub-checks. server-args: ``rejected:<exception
    class>`` when the parser refused the arguments; a parsed value other than the manifest's
    ``expect`` is not classed (None): the expectation is the operator's, checked regardless.
    """
    if not report:
        return None
    if stage == "smoke":
        if report.get("ok"):
            failed = sorted(str(c.get("name")) for c in report.get("subchecks", []) if c.get("status") == "fail")
            return "checks:" + ",".join(failed) if failed else None
        if report.get("missing"):
            return f"missing:{report['missing']}"
        if report.get("unavailable"):
            return f"unavailable:{report['unavailable']}"
        reason = str(report.get("reason") or "")
        if reason.startswith("import torch failed: "):
            return "import:" + reason.removeprefix("import torch failed: ").split(":", 1)[0]
        failed = sorted({str(c.get("name")) for c in report.get("checks", []) if not c.get("ok")}
                        | {str(c.get("name")) for c in report.get("subchecks", []) if c.get("status") == "fail"})
        return "checks:" + ",".join(failed) if failed else "reason:" + reason[:200]
    if stage == "server-args":
        if report.get("ok"):
            return None
        return "rejected:" + str(report.get("error") or "").split(":", 1)[0]
    raise ValueError(f"no failure class for stage {stage!r}")


def system_library_gap(error: str | None, here: Collection[str] | None, donor: Collection[str] | None) -> str | None:
    """The fact that differs when a load ``error`` names a missing library (``libcbor.so.0.10:
    cannot open shared object file``) that the donor's host system provides and this host's
    does not (both as the inventories' ``system_sonames``); None otherwise, or when either is
    unknown."""
    missing = MISSING_LIBRARY.search(error or "")
    if missing is None or here is None or donor is None:
        return None
    name = missing.group(1)
    if name in donor and name not in here:
        return f"{name}: the donor's system has it, this host's has not"
    return None


#: Words whose presence in an error means "the platform has no GPU" in sglang's, torch's and
#: their kernels' own messages ("The NVIDIA driver does not expose a usable CUDA device", "no
#: accelerator", "Found no NVIDIA driver on your system").
GPU_WORDS = ("cuda", "gpu", "nvidia", "no accelerator", "device")


def sort_donor_imports(report: Mapping[str, Any], *, driver: bool) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The donor's imports report (``{"imports": [{"name", "ok", "error"}]}``) sorted for a
    starting manifest: (the names that import, in order; name -> error of those that fail only
    for want of a GPU, on a donor host without a driver (``driver`` False): a driver library
    they cannot open, or an error in :data:`GPU_WORDS`' terms; name -> error of the others,
    which fail in the donor itself)."""
    passed, gpu, failed = [], {}, {}
    for item in report.get("imports", []):
        name, error = str(item.get("name")), str(item.get("error") or "")
        if item.get("ok"):
            passed.append(name)
        elif not driver and (missing_driver_library(error) or any(w in error.lower() for w in GPU_WORDS)):
            gpu[name] = error
        else:
            failed[name] = error
    return passed, gpu, failed

