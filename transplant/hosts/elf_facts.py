"""Read ELF facts of a venv's shared objects on its host (edge): the ``elf_facts`` script.

The host needs no pyelftools: the controller sends the source of its own installed
``elftools`` package with the request, and the script imports it from memory.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import elftools

from transplant.core.elf_facts import ElfReport, parse_elf_report
from transplant.hosts.host import Host
from transplant.hosts.controller_cache import ControllerCache
from transplant.hosts.probing import run_script

__all__ = ["read_elf_facts", "elftools_sources"]


@functools.cache
def _sources() -> tuple[tuple[str, str], ...]:
    root = Path(elftools.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] not in ("tests", "test"):
            found.append((f"elftools/{rel.as_posix()}", path.read_text(encoding="utf-8")))
    return tuple(found)


def elftools_sources() -> dict[str, str]:
    """The controller's pyelftools as ``{"elftools/elf/elffile.py": source, ...}``.

    Keys are POSIX paths relative to site-packages (every ``*.py`` of the package, tests
    left out); the files are read once per process.
    """
    return dict(_sources())


def read_elf_facts(
    host: Host,
    venv: str,
    files: Sequence[str],
    *,
    torch_symbols: bool = True,
    torch_symbols_skip: Sequence[str] = (),
    device_code: bool = False,
    defined: tuple[Sequence[str], Sequence[str]] | None = None,
    libstdcxx: bool = False,
    timeout: float | None = 600.0,
    versioned_symbols: bool = False,
    defined_by: Mapping[str, Sequence[str]] | None = None,
    numpy_abi: bool = False,
    elf_cache: str | Mapping[str, Any] | None = None,
    hashes: Mapping[str, str] | None = None,
) -> ElfReport:
    """Describe shared objects of a venv, reading them on its host with the venv's python.

    :param files: venv-relative POSIX paths; each gets an :class:`~transplant.core.elf_facts.ElfFacts`,
        with ``error`` set for a missing, non-ELF or out-of-venv file.
    :param torch_symbols: gather undefined libtorch symbols of files that link libtorch/libc10.
    :param torch_symbols_skip: files among ``files`` not to scan for them (torch's own
        libraries, whose symbol tables take seconds to read and are not needed).
    :param device_code: list the ``.nv_fatbin`` entries (SASS and PTX) of each file.
    :param defined: ``(libraries, symbols)``: venv-relative libraries and symbol names to
        answer "does any of these define it" (``ElfReport.defined``); None asks nothing.
    :param libstdcxx: report the ``libstdc++.so.6`` the venv's interpreter loads
        (``ElfReport.libstdcxx``, None when it cannot be loaded).
    :param timeout: seconds for the whole script; None waits without limit.
    :param versioned_symbols: list each file's undefined symbols bound to a needed file's
        symbol version (``ElfFacts.versioned_undefined``).
    :param defined_by: ``{library: [names]}`` (venv-relative): answer which names each one
        does not define (``ElfReport.defined_by``); None asks nothing.
    :param numpy_abi: say which NumPy C-API each file was built against (``ElfFacts.numpy_abi``).
    :param elf_cache: the script's cache of ELF facts and symbol answers, keyed by each file's
        content (``ElfCache`` in :mod:`transplant.remote.elf_facts`), so that a file whose bytes
        did not change is not read again: ``"venv"`` keeps it in the venv's state folder
        (``.transplant/cache/elf.json``; for a target), ``"controller"`` in the controller's
        state folder (``elf-cache/``; for a donor, never written to), None not at all; a mapping
        is sent as the script's option (tests). ``TRANSPLANT_HASH_CACHE=0`` turns it off too.
    :param hashes: ``{file: "sha256=..."}``, content hashes the probe gave (the cache's key for
        those files; the others are keyed by their stat tuple); None: none known.
    :raises HostError: as :func:`transplant.hosts.probing.run_script` (host unreachable, python
        missing, script failed).
    :raises ProbeError: the reply is of another schema or malformed.
    """
    request: dict[str, object] = {
        "modules": elftools_sources(),
        "files": list(files),
        "torch_symbols": torch_symbols,
        "torch_symbols_skip": list(torch_symbols_skip),
        "device_code": device_code,
        "libstdcxx": libstdcxx,
        "versioned_symbols": versioned_symbols,
        "numpy_abi": numpy_abi,
        "defined_by": {k: list(v) for k, v in (defined_by or {}).items()},
    }
    if defined is not None:
        libraries, symbols = defined
        request["defined"] = {"files": list(libraries), "symbols": list(symbols)}
    request["cache"] = _cache_options(host, venv, elf_cache)
    if request["cache"] and hashes:
        request["hashes"] = dict(hashes)
    document = run_script(host, venv, "elf_facts", request=request, timeout=timeout)
    if elf_cache == "controller":
        _keep_controller_cache(host, venv, request["cache"], document.get("cache"))
    return parse_elf_report(document, label=f"{host.label}:{venv}")


_CACHE_SCHEMA = "transplant.elfcache/3"  # the hosts' cache schema (remote/elf_facts.py)
_CACHE_MAX_ENTRIES = 20000  # as the script's CACHE_MAX_ENTRIES


#: The ELF facts a donor's script returns, kept on the controller (nothing is written in a donor).
_CONTROLLER_CACHE = ControllerCache("elf-cache", _CACHE_SCHEMA, "elf_cache")


def _controller_cache_path(host: Host, venv: str) -> Path:
    """``<controller state>/elf-cache/<sha256 of "host label:venv">.json``."""
    return _CONTROLLER_CACHE.path(host, venv)


def _cache_options(host: Host, venv: str, elf_cache: str | Mapping[str, Any] | None) -> Any:
    """The script's ``cache`` request option for :func:`read_elf_facts`'s ``elf_cache``."""
    return _CONTROLLER_CACHE.options(host, venv, elf_cache)


def _keep_controller_cache(host: Host, venv: str, sent: Any, report: Any) -> None:
    """Merge the entries a ``store: reply`` run returned into the controller's file (atomically;
    a failure only costs speed). Written only when the run read something."""
    if not isinstance(report, dict) or not isinstance(report.get("entries"), dict):
        return
    fresh = report.pop("entries")
    if not report.get("misses") and not report.get("read"):
        return  # nothing new
    known = found if isinstance(sent, dict) and isinstance(found := sent.get("known"), dict) else {}
    merged = {**known, **fresh} if len(known) + len(fresh) <= _CACHE_MAX_ENTRIES else fresh
    _CONTROLLER_CACHE.write(host, venv, merged)
