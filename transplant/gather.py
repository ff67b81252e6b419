"""Gather what a plan needs from both hosts (edge): inventories, then ELF facts.

1. The donor and the target are probed side by side (the overlaid distributions
   hashed; the target's patch destinations; ``torch/version.py`` on both).
2. When an overlaid distribution is an editable install on the donor, the target is
   asked whether its source folders exist there.
3. The shared objects are read with pyelftools on each host, side by side: on the
   donor those of the overlaid distributions (with their device code when the target
   has GPUs), on the target those of the distributions that stay (and its libstdc++).
4. The undefined libtorch symbols of every shared object linked to libtorch are
   looked up in the libraries of the torch the target holds after apply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from .binaries import ElfReport, is_shared_object
from .elfscan import read_elf_facts
from .hosts import Host
from .inventory import Distribution, Inventory
from .manifest import Manifest
from .planner import PatchFile, selected_names
from .probing import take_inventory
from .rules.libtorch import links_libtorch, torch_libraries
from .rules.venvfiles import editable_sources
from .snapshot import TEXTS
from .sources import DonorSource, as_source

__all__ = ["Facts", "gather"]



@dataclass(frozen=True, kw_only=True)
class Facts:
    """Both inventories and both ELF reports, ready for :func:`transplant.planner.plan`."""

    donor: Inventory
    target: Inventory
    donor_elf: ElfReport
    target_elf: ElfReport


def _objects(dists: Sequence[Distribution]) -> list[str]:
    return sorted({p for d in dists for p, e in d.files.items()
                   if is_shared_object(p) and e.exists and e.symlink is None and not e.error})


def gather(
    manifest: Manifest,
    donor_host: Host | DonorSource,
    target_host: Host,
    patches: Sequence[PatchFile] = (),
    *,
    step: Callable[[str], None] | None = None,
    timeout: float | None = 600.0,
) -> Facts:
    """Probe both venvs and read their shared objects, as the module docstring says.

    :param donor_host: the connected donor host, or a donor source (a snapshot: see
        :mod:`transplant.sources`).
    :param step: called with a line describing each step (for a spinner), or None.
    :param timeout: seconds for each host script.
    :raises HostError: a host could not be reached or a script failed there.
    :raises ProbeError: a host script reported something malformed.
    """
    say = step or (lambda _line: None)
    m = manifest
    source = as_source(donor_host, m.donor.venv)
    say(f"probing the donor {m.donor} and the target {m.target} (hashing the overlaid distributions)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        d = pool.submit(source.inventory, hash_patterns=m.overlay, texts=TEXTS, timeout=timeout)
        t = pool.submit(take_inventory, target_host, m.target.venv, hash_patterns=m.overlay,
                        site_files=[p.dest for p in patches], texts=TEXTS, timeout=timeout)
        donor, target = d.result(), t.result()
    names = selected_names(m.overlay, donor)
    removed = set(selected_names(m.remove, target)) - set(names)
    donor_latest = donor.latest()
    sources = sorted({p for n in names for p in editable_sources(donor_latest[n], donor)})
    if sources:
        say(f"checking {len(sources)} editable source folder(s) on the target")
        seen = take_inventory(target_host, m.target.venv, record=False, paths_exist=sources, timeout=timeout)
        target = replace(target, elsewhere=seen.elsewhere)
    moving = [donor_latest[n] for n in names]
    staying = [d for d in target.distributions if d.name not in names and d.name not in removed]
    say("reading the shared objects on both hosts (pyelftools)")
    own_torch = [p for inv in (donor, target) for d in inv.distributions if d.name == "torch" for p in d.files
                 if is_shared_object(p)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        de = pool.submit(source.elf, _objects(moving), torch_symbols_skip=own_torch,
                         device_code=bool(target.nvidia.gpus), timeout=timeout)
        te = pool.submit(read_elf_facts, target_host, m.target.venv, _objects(staying), torch_symbols_skip=own_torch,
                         libstdcxx=True, timeout=timeout)
        donor_elf, target_elf = de.result(), te.result()
    torch_side = "donor" if "torch" in names else "target"
    torch = (donor_latest if torch_side == "donor" else target.latest()).get("torch")  # type: ignore[call-overload]
    own = set(torch.files) if torch is not None else set()
    wanted = sorted({s for report in (donor_elf, target_elf) for f in report.files.values()
                     if f.path not in own and links_libtorch(f)
                     for s in f.torch_undefined})
    libraries = torch_libraries(torch)
    if wanted and libraries:
        say(f"looking up {len(wanted)} libtorch symbol(s) in the {torch_side}'s torch")
        lookup = source if torch_side == "donor" else as_source(target_host, m.target.venv)
        answer = lookup.elf([], torch_symbols=False, defined=(libraries, wanted), timeout=timeout)
        found = {"defined": answer.defined, "defined_in": answer.defined_in}
        if torch_side == "donor":
            donor_elf = replace(donor_elf, **found)
        else:
            target_elf = replace(target_elf, **found)
    return Facts(donor=donor, target=target, donor_elf=donor_elf, target_elf=target_elf)
