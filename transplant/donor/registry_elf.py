"""ELF facts of a registry snapshot, read once when it is pushed (edge), so a plan from the
registry needs no shared object on the controller.

At push time the ``elf_facts`` host script runs once on the snapshot's view (on the
controller, where the files are) over every shared object the snapshot holds, with device
code and libtorch symbols (the snapshot's own torch libraries skipped, as the plan skips
them), and the dynamic symbols the snapshot's torch libraries define in libtorch's
namespaces are listed (pyelftools, the same ``.dynsym`` rule as the script's ``defined``
query). The document (schema :data:`ELF_SCHEMA`) is pushed as one more layer;
:func:`answer` serves a plan's ELF requests from it and says None when a request asks for
more than it holds (the caller then reads the files themselves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from transplant.core.elf_facts import ElfReport, is_shared_object, is_torch_symbol, parse_elf_report
from transplant.hosts.elf_facts import elftools_sources
from transplant.hosts.probing import run_script
from transplant.core.rules.libtorch import torch_libraries
from transplant.donor.snapshot import Snapshot, SnapshotSource

__all__ = ["ELF_SCHEMA", "precompute", "answer"]

ELF_SCHEMA = "transplant.snapshot-elf/1"


def _objects(snap: Snapshot) -> list[str]:
    return sorted(p for p, f in snap.files.items() if "hash" in f and is_shared_object(p))


def precompute(snap: Snapshot) -> dict[str, Any]:
    """The ELF document of ``snap``: ``{"schema", "report": <elf_facts reply>, "skip": [...],
    "torch": {"libraries": [...asked], "searched": [...], "symbols": [...]}}``.

    :raises HostError: the script failed on the controller; :raises StoreError: a file is missing.
    """
    files = _objects(snap)
    torch = snap.inventory.latest().get("torch")
    own = sorted(p for p in (torch.files if torch is not None and "torch" in snap.dists else {}) if p in files)
    libraries = [p for p in torch_libraries(torch) if p in snap.files] if "torch" in snap.dists else []
    with SnapshotSource(snap) as source:
        host, root = source.files(files)
        report = run_script(host, root, "elf_facts", request={
            "modules": elftools_sources(), "files": files, "torch_symbols": True, "torch_symbols_skip": own,
            "device_code": True, "libstdcxx": False}, timeout=None)
        searched: list[str] = []
        symbols: set[str] = set()
        for rel in libraries:
            try:
                with open(Path(root) / rel, "rb") as stream:
                    elf = ELFFile(stream)
                    table = elf.get_section_by_name(".dynsym")
                    searched.append(rel)
                    if table is not None:
                        symbols.update(s.name for s in table.iter_symbols()
                                       if s["st_shndx"] != "SHN_UNDEF" and s.name and is_torch_symbol(s.name))
            except (OSError, ELFError):
                continue
    report["seconds"] = 0.0  # the same snapshot content gives the same blob
    return {"schema": ELF_SCHEMA, "report": report, "skip": own,
            "torch": {"libraries": libraries, "searched": searched, "symbols": sorted(symbols)}}


def answer(doc: Mapping[str, Any], files: Sequence[str], kwargs: Mapping[str, Any], *, label: str) -> ElfReport | None:
    """:func:`transplant.hosts.elf_facts.read_elf_facts`'s report for ``files`` and ``kwargs``, from ``doc``;
    None when ``doc`` cannot answer (a file it did not read, ``libstdcxx``, a symbol query on
    other libraries or outside libtorch's namespaces, torch symbols asked of a file it skipped).

    :raises ProbeError: ``doc``'s report is malformed."""
    if doc.get("schema") != ELF_SCHEMA or kwargs.get("libstdcxx"):
        return None
    full = parse_elf_report(doc["report"], label=label)
    if any(f not in full.files for f in files):
        return None
    want_torch = kwargs.get("torch_symbols", True)
    skip = set(kwargs.get("torch_symbols_skip") or ())
    if want_torch and any(f in set(doc.get("skip") or ()) and f not in skip for f in files):
        return None
    picked = {}
    for path in files:
        facts = full.files[path]
        if not want_torch or path in skip:
            facts = dataclasses.replace(facts, torch_undefined=())
        if not kwargs.get("device_code"):
            facts = dataclasses.replace(facts, device_code=(), notes=())
        picked[path] = facts
    defined: dict[str, bool] = {}
    searched: tuple[str, ...] = ()
    query = kwargs.get("defined")
    if query is not None:
        libraries, symbols = query
        torch = doc.get("torch") or {}
        if list(libraries) != list(torch.get("libraries") or []) or not all(is_torch_symbol(s) for s in symbols):
            return None
        known = set(torch.get("symbols") or ())
        defined = {s: s in known for s in symbols}
        searched = tuple(torch.get("searched") or ())
    return dataclasses.replace(full, files=picked, defined=defined, defined_in=searched, libstdcxx=None)
