"""Gather what a plan needs from both hosts (edge): inventories, then ELF facts.

1. The donor and the target are probed side by side (the overlaid distributions
   hashed; the target's patch destinations; ``torch/version.py`` on both).
2. When an overlaid distribution is an editable install on the donor, the target is
   asked whether its source folders exist there.
3. The shared objects are read with pyelftools on each host, side by side: on the
   donor those of the overlaid distributions (with their device code when the target
   has GPUs; no script at all when none of them holds a shared object), on the target
   those of the distributions that stay (and its libstdc++).
4. The versioned symbols a moving object needs from a staying library, or the other way
   round, are looked up in those libraries (:mod:`transplant.pipeline.symlookup`).
5. The undefined libtorch symbols of every shared object linked to libtorch are
   looked up in the libraries of the torch the target holds after apply.
6. When a moving object's run path (DT_RUNPATH or DT_RPATH) names absolute folders, both
   hosts (the donor only when it is live) are asked whether those folders and the libraries
   it needs in them exist (``Inventory.elsewhere``, for ``runpath-outside-venv``).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from transplant.core.elf_facts import ElfReport, is_shared_object
from transplant.core.closure import Closure, expand
from transplant.hosts.elf_facts import read_elf_facts
from transplant.hosts.identity import venv_identity
from transplant.hosts.host import Host
from transplant.core.inventory import Distribution, Inventory
from transplant.core.manifest import Endpoint, Manifest
from transplant.core.planner import PatchFile, selected_names
from transplant.hosts.probing import paths_exist, take_inventory
from transplant.core.rules.hostlibs import runpath_queries
from transplant.core.rules.libtorch import links_libtorch, torch_libraries
from transplant.reporting import QUIET, Reporter
from transplant.core.rules.venvfiles import editable_sources
from transplant.core.inventory import TEXTS
from transplant.donor.sources import DonorSource, as_source
from transplant.pipeline.symlookup import look_up_symbols
from transplant.core.units import agree, count

__all__ = ["Facts", "gather"]



@dataclass(frozen=True, kw_only=True)
class Facts:
    """Both inventories and both ELF reports, ready for :func:`transplant.core.planner.plan`,
    and the manifest's closures as computed for them (None: the manifest has none), for the
    planner's ``closure``."""

    donor: Inventory
    target: Inventory
    donor_elf: ElfReport
    target_elf: ElfReport
    closure: Closure | None = None


def _objects(dists: Sequence[Distribution]) -> list[str]:
    return sorted({p for d in dists for p, e in d.files.items()
                   if is_shared_object(p) and e.exists and e.symlink is None and not e.error})


def _hashes(dists: Sequence[Distribution], files: Sequence[str]) -> dict[str, str]:
    """``{file: "sha256=..."}`` for those of ``files`` the probe hashed (the ELF cache's keys)."""
    wanted = set(files)
    return {p: e.hash for d in dists for p, e in d.files.items() if p in wanted and e.hash}


def _label(source: DonorSource, manifest: Manifest) -> str:
    """How the donor's ELF report is named in messages (as its script's report would be)."""
    return str(source.label or manifest.donor)


def refuse_self_target(manifest: Manifest, donor_host: Host, target_host: Host) -> None:
    """Refuse a target venv that is the donor's venv under another name, compared by device and
    inode on the same machine (not by path strings).

    :raises TransplantError: it is (nothing was written).
    """
    from transplant.errors import TransplantError

    donor = manifest.donor
    assert isinstance(donor, Endpoint)  # a live donor: a snapshot has no venv of its own to compare
    with ThreadPoolExecutor(max_workers=2) as pool:  # two hosts, two interpreter starts: side by side
        asked = pool.submit(venv_identity, donor_host, donor.venv)
        theirs = venv_identity(target_host, manifest.target.venv)
        mine = asked.result()
    if mine is not None and mine == theirs:
        raise TransplantError(
            f"{manifest.path}: the target {manifest.target} is the donor {manifest.donor} under another name (the "
            f"same folder: a symlink, a bind mount or another host name); applying would remove files from the "
            f"donor; nothing was changed",
            hint="name another venv as the target in the manifest's target: (a copy: transplant clone)")


def expand_closures(manifest: Manifest, source: DonorSource, target_host: Host, *, timeout: float | None = 600.0,
                    reporter: Reporter = QUIET) -> tuple[Manifest, Closure | None]:
    """The manifest with its closures computed from a metadata-only probe of both venvs
    (versions and Requires-Dist, no RECORD read, nothing hashed: a few seconds even on a
    200-distribution venv), so the hashing probe that follows hashes exactly the closure's
    distributions. The closure is handed on to the planner (``Facts.closure``), not computed
    again: the hashing probe reads the same METADATA, so they agree unless a venv changed in
    between (then the plan's fingerprint check on apply refuses the plan as stale).

    :returns: (``manifest`` itself, None) when it has no closure, else
        :func:`transplant.core.closure.expand`'s (manifest with overlay = exact names and no
        closures, the closure).
    :raises HostError: a host could not be reached; :raises ProbeError: as :func:`take_inventory`.
    """
    if not manifest.closures:
        return manifest, None
    reporter.step(f"reading both venvs' metadata for the overlay {agree(len(manifest.closures), 'closure', 'closures')} {', '.join(manifest.closures)}")
    with ThreadPoolExecutor(max_workers=2) as pool:
        d = pool.submit(source.inventory, hash_patterns=(), timeout=timeout, record=False)
        t = pool.submit(take_inventory, target_host, manifest.target.venv, record=False, timeout=timeout)
        donor, target = d.result(), t.result()
    return expand(manifest, donor, target)


def gather(
    manifest: Manifest,
    donor_host: Host | DonorSource,
    target_host: Host,
    patches: Sequence[PatchFile] = (),
    *,
    reporter: Reporter = QUIET,
    timeout: float | None = 600.0,
    inputs: bool = False,
) -> Facts:
    """Probe both venvs and read their shared objects, as the module docstring says.

    :param donor_host: the connected donor host, or a donor source (a snapshot: see
        :mod:`transplant.donor.sources`).
    :param reporter: told each step as it starts (a line, for a spinner).
    :param timeout: seconds for each host script.
    :param inputs: ask both probes for their inputs' digest (``Inventory.inputs``, for the plan
        memo: :mod:`transplant.pipeline.memo`; a snapshot donor has none).
    :raises TransplantError: the target is the donor's venv under another name (device and inode).
    :raises HostError: a host could not be reached or a script failed there.
    :raises ProbeError: a host script reported something malformed.
    """
    m = manifest
    source = as_source(donor_host, m.donor.venv)  # type: ignore[union-attr]  # open_donor made the donor an Endpoint (a snapshot's own)
    live = source.live  # a host donor (a snapshot has none): it must not be the target
    if live is not None:
        refuse_self_target(replace(m, donor=Endpoint(host=live.spec, venv=source.venv)), live, target_host)
    m, closures = expand_closures(m, source, target_host, timeout=timeout, reporter=reporter)
    # a snapshot donor is read, not probed: say which it is (its label names the snapshot and its donor)
    what = f"probing the donor {m.donor}" if live is not None else f"reading {source.label}"
    reporter.step(f"{what} and probing the target {m.target} (hashing the overlaid distributions)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        d = pool.submit(source.inventory, hash_patterns=m.overlay, texts=TEXTS, timeout=timeout, inputs=inputs)
        t = pool.submit(take_inventory, target_host, m.target.venv, hash_patterns=m.overlay,
                        site_files=[p.dest for p in patches], texts=TEXTS, timeout=timeout, hash_cache="venv",
                        inputs=inputs)
        donor, target = d.result(), t.result()
    names = selected_names(m.overlay, donor)
    removed = set(selected_names(m.remove, target)) - set(names)
    donor_latest = donor.latest()
    sources = sorted({p for n in names for p in editable_sources(donor_latest[n], donor)})
    if sources:
        reporter.step(f"checking {count(len(sources), 'editable source folder')} on the target")
        target = replace(target, elsewhere=paths_exist(target_host, m.target.venv, sources, timeout=timeout))
    moving = [donor_latest[n] for n in names]
    staying = [d for d in target.distributions if d.name not in names and d.name not in removed]
    reporter.step("reading the shared objects on both hosts (pyelftools)")
    own_torch = [p for inv in (donor, target) for d in inv.distributions if d.name == "torch" for p in d.files
                 if is_shared_object(p)]
    moving_objects, staying_objects = _objects(moving), _objects(staying)
    # the ELF caches: a live donor's on the controller, the target's in its state folder
    extra = {"hashes": _hashes(moving, moving_objects)} if live is not None else {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        # no shared object moves: the donor's script would be asked about no file and nothing
        # else (its report: no files), so it is not started: one host interpreter less
        de = pool.submit(source.elf, moving_objects, torch_symbols_skip=own_torch,
                         device_code=bool(target.nvidia.gpus), versioned_symbols=True, numpy_abi=True,
                         timeout=timeout, **extra) if moving_objects else None
        te = pool.submit(read_elf_facts, target_host, m.target.venv, staying_objects, torch_symbols_skip=own_torch,
                         libstdcxx=True, versioned_symbols=True, numpy_abi=True, timeout=timeout,
                         elf_cache="venv", hashes=_hashes(staying, staying_objects))
        donor_elf = de.result() if de is not None else ElfReport(label=_label(source, m), files={})
        target_elf = te.result()
    donor_elf, target_elf = look_up_symbols(donor, target, names, sorted(removed), donor_elf, target_elf,
                                            donor_source=source, target_source=as_source(target_host, m.target.venv),
                                            timeout=timeout, reporter=reporter)
    torch_side = "donor" if "torch" in names else "target"
    torch = (donor_latest if torch_side == "donor" else target.latest()).get("torch")
    own = set(torch.files) if torch is not None else set()
    wanted = sorted({s for report in (donor_elf, target_elf) for f in report.files.values()
                     if f.path not in own and links_libtorch(f)
                     for s in f.torch_undefined})
    libraries = torch_libraries(torch)
    if wanted and libraries:
        reporter.step(f"looking up {count(len(wanted), 'libtorch symbol')} in the {torch_side}'s torch")
        lookup = source if torch_side == "donor" else as_source(target_host, m.target.venv)
        answer = lookup.elf([], torch_symbols=False, defined=(libraries, wanted), timeout=timeout)
        if torch_side == "donor":
            donor_elf = replace(donor_elf, defined=answer.defined, defined_in=answer.defined_in)
        else:
            target_elf = replace(target_elf, defined=answer.defined, defined_in=answer.defined_in)
    donor, target = _ask_run_paths(donor_elf, donor, target, live, source.venv, target_host, m.target.venv,
                                   timeout=timeout, reporter=reporter)
    return Facts(donor=donor, target=target, donor_elf=donor_elf, target_elf=target_elf, closure=closures)


def _ask_run_paths(donor_elf: ElfReport, donor: Inventory, target: Inventory, live: Host | None, donor_venv: str,
                   target_host: Host, target_venv: str, *, timeout: float | None,
                   reporter: Reporter) -> tuple[Inventory, Inventory]:
    """(donor, target) with ``elsewhere`` answering :func:`runpath_queries` for the moving objects
    (``donor_elf``): the probe's ``exists`` mode on the target and on a live donor, side by side; a
    snapshot donor's host is not there to ask (its paths stay unasked, and are not judged)."""
    paths = runpath_queries(donor_elf.files.values())
    if not paths:
        return donor, target
    reporter.step(f"checking {count(len(paths), 'run path folder and library', 'run path folders and libraries')} "
                  f"outside the venv on both hosts")
    with ThreadPoolExecutor(max_workers=2) as pool:
        t = pool.submit(paths_exist, target_host, target_venv, paths, timeout=timeout)
        d = pool.submit(paths_exist, live, donor_venv, paths, timeout=timeout) if live is not None else None
        target = replace(target, elsewhere={**target.elsewhere, **t.result()})
        if d is not None:
            donor = replace(donor, elsewhere={**donor.elsewhere, **d.result()})
    return donor, target
