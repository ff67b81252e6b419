"""``cpu-isa-unsupported``: an overlaid shared object marked as needing an x86-64
micro-architecture level that the target's CPU does not reach (pure core).

An object built with ``gcc -mneeded`` (or linked with ``ld -z x86-64-vN``) carries
``GNU_PROPERTY_X86_ISA_1_NEEDED`` in its GNU property note (``ElfFacts.x86_isa_needed``);
glibc's loader compares it with the processor before loading and refuses ("CPU ISA level is
lower than required"). The level's features come from ``data/x86_levels.json`` (the x86-64
psABI table, in ``/proc/cpuinfo``'s names); the target's CPU flags from its probe
(``Inventory.cpu_flags``). The verdict depends on the target's CPU alone: the donor's CPU
running the object says nothing about the target's (the donor principle does not apply). An
object without the note, or a target whose flags were not read, is not judged: most binaries
carry no such marker, so this rule sees only the objects that declare what they need.
"""

from __future__ import annotations

from transplant.core.data import x86_levels
from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, severity
from transplant.core.units import count

__all__ = ["cpu_findings", "missing_flags"]

_SHOWN = 3


def missing_flags(level: str, flags: frozenset[str]) -> list[str]:
    """The CPU flags of ``level`` and the levels below it that ``flags`` lacks, in the table's
    order ([] for a level the table does not name)."""
    levels = x86_levels()["levels"]
    names = list(levels)
    if level not in levels:
        return []
    need = [f for name in names[: names.index(level) + 1] for f in levels[name]]
    return [f for f in need if f not in flags]


def cpu_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per overlaid distribution with objects needing a level the target's CPU
    lacks. Severity: :func:`~transplant.core.rules.env.severity` without the donor principle."""
    flags = env.target.cpu_flags
    if flags is None or env.target.interpreter.machine not in ("x86_64", "amd64"):
        return []
    out = []
    for name in sorted(env.overlaid):
        short: dict[str, tuple[str, list[str]]] = {}
        for facts in env.objects(name):
            for level in reversed(facts.x86_isa_needed or ()):
                lacking = missing_flags(level, flags)
                if lacking:
                    short[facts.path] = (level, lacking)
                    break
        if not short:
            continue
        dist = env.after[name]
        paths = sorted(short)
        shown = "; ".join(f"{p} needs {short[p][0]} (the CPU lacks {', '.join(short[p][1][:5])})" for p in paths[:_SHOWN])
        more = f"; and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else ""
        out.append(Finding(
            code="cpu-isa-unsupported", severity=severity(env, [name], donor=False), dists=(name,),
            message=f"{describe(dist)}: {count(len(paths), 'shared object')} marked as needing an x86-64 level the "
                    f"target's CPU ({env.target.hostname}) does not reach: {shown}{more}; glibc's loader refuses "
                    f"them (\"CPU ISA level is lower than required\")",
            hint=f"leave {name!r} out of overlay in {env.manifest} and install a build for the target's CPU there, "
                 f"or run on a CPU with {', '.join(short[paths[0]][1][:5])}",
            files=tuple(paths[:_SHOWN]),
        ))
    return out
