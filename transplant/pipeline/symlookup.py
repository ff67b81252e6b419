"""Ask each host which versioned symbols its libraries define, for ``undefined-symbol`` (edge).

The pure rule (:mod:`transplant.core.rules.symbols`) says which libraries of each side to ask
about which names; this runs the ``elf_facts`` script's ``defined_by`` query on the donor
and the target side by side and returns the two reports with the answers in
``ElfReport.defined_by``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from packaging.utils import NormalizedName

from transplant.core.elf_facts import ElfReport
from transplant.core.inventory import Inventory
from transplant.core.rules.env import EnvironmentAfter
from transplant.core.rules.symbols import symbol_queries
from transplant.donor.sources import DonorSource
from transplant.reporting import QUIET, Reporter

__all__ = ["look_up_symbols"]


def look_up_symbols(donor: Inventory, target: Inventory, names: Sequence[NormalizedName],
                    removed: Sequence[NormalizedName], donor_elf: ElfReport, target_elf: ElfReport, *,
                    donor_source: DonorSource, target_source: DonorSource, timeout: float | None = 600.0,
                    reporter: Reporter = QUIET) -> tuple[ElfReport, ElfReport]:
    """(donor report, target report) with ``defined_by`` answered for every library a moving
    object needs from a staying one or the other way round (:func:`symbol_queries`); the
    reports unchanged when nothing is to be asked.

    :param names: the overlaid names; :param removed: the target's names ``remove:`` uninstalls.
    :raises HostError: a host could not be reached; :raises ProbeError: a malformed reply.
    """
    donor_latest = donor.latest()
    after = dict(target.latest())
    for name in names:
        after[name] = donor_latest[name]
    for name in removed:
        after.pop(name, None)
    env = EnvironmentAfter(donor=donor, target=target, overlaid=tuple(names), after=after,
                           removed=tuple(removed), donor_elf=donor_elf, target_elf=target_elf)
    queries = symbol_queries(env)
    if not queries["donor"] and not queries["target"]:
        return donor_elf, target_elf
    count = sum(len(q) for q in queries.values())
    reporter.step(f"looking up versioned symbols in {count} librar{'y' if count == 1 else 'ies'} on both hosts")

    def ask(source: DonorSource, query: dict[str, list[str]], report: ElfReport) -> ElfReport:
        if not query:
            return report
        answer = source.elf([], torch_symbols=False, defined_by=query, timeout=timeout)
        return replace(report, defined_by={**report.defined_by, **answer.defined_by})

    with ThreadPoolExecutor(max_workers=2) as pool:
        d = pool.submit(ask, donor_source, queries["donor"], donor_elf)
        t = pool.submit(ask, target_source, queries["target"], target_elf)
        return d.result(), t.result()
