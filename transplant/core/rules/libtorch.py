"""``libtorch-abi``: shared objects linked against libtorch that stay behind while torch
changes, or move without it (pure core).

Metadata is not enough (some kernel wheels declare no torch requirement), so the rule
reads the binaries: every shared object outside torch whose DT_NEEDED names a
``libtorch*`` or ``libc10*`` library must find each of its undefined libtorch symbols
(C++ names in the c10 / at / torch namespaces) defined by the torch that the target
holds after apply. The edge asks that torch's libraries (the ``defined`` query of the
ELF report on torch's side).
"""

from __future__ import annotations

from transplant.core.elf_facts import ElfFacts, is_shared_object
from transplant.core.inventory import Distribution
from transplant.core.plan import Finding
from transplant.core.rules.env import DONOR_RUNS, EnvironmentAfter, describe
from transplant.core.units import agree, count as counted

__all__ = ["links_libtorch", "torch_libraries", "libtorch_findings"]

_SHOWN = 3


def links_libtorch(facts: ElfFacts) -> bool:
    """Whether a shared object's DT_NEEDED names libtorch or libc10."""
    return any(n.startswith(("libtorch", "libc10")) for n in facts.needed)


def torch_libraries(torch: Distribution | None) -> list[str]:
    """venv-relative paths of a torch distribution's own libraries present on disk
    (``torch/lib/libtorch*.so``, ``libc10*.so``), sorted; [] for None."""
    if torch is None:
        return []
    return sorted(p for p, e in torch.files.items() if is_shared_object(p) and "/torch/lib/" in f"/{p}"
                  and p.rsplit("/", 1)[-1].startswith(("libtorch", "libc10"))
                  and e.exists and e.symlink is None and not e.error)


def libtorch_findings(env: EnvironmentAfter) -> list[Finding]:
    """Findings for linked objects whose libtorch symbols the torch after apply lacks."""
    torch = env.after.get("torch")
    report = env.elf("torch") if torch is not None else None
    out = []
    for name in sorted(env.after):
        if name == "torch":
            continue
        dist = env.after[name]
        linked = [f for f in env.objects(name) if not f.error and links_libtorch(f) and f.torch_undefined]
        if not linked:
            continue
        if torch is None:
            out.append(Finding(
                code="libtorch-abi", severity="error" if env.changes(name) or env.changes("torch") else "warning",
                dists=(name,),
                message=f"{describe(dist)} links libtorch ({linked[0].path}) but the target has no torch after apply",
                hint=f"add 'torch' to overlay in {env.manifest}",
                files=tuple(f.path for f in linked[:_SHOWN]),
            ))
            continue
        if report is None or not report.defined:
            continue
        missing = {f.path: [s for s in f.torch_undefined if not report.defined.get(s, False)] for f in linked}
        missing = {p: s for p, s in missing.items() if s}
        carried = sorted(p for p in missing if env.donor_runs([name, "torch"], [p]))
        if carried:  # the donor holds these bytes beside this very torch: whatever it loads of them, loads here
            out.append(Finding(
                code="libtorch-abi", severity="info", dists=(name, "torch"),
                message=f"{describe(dist)}: {counted(len(carried), 'shared object')} {agree(len(carried), 'names', 'name')} libtorch symbols that "
                        f"{describe(torch)} does not define (e.g. {carried[0]} needs {missing[carried[0]][0]}); "
                        f"{DONOR_RUNS} (a loader that picks the object built for the running torch, as "
                        f"torch_c_dlpack_ext's does, never opens the others)",
                hint="nothing to do", files=tuple(carried[:_SHOWN]),
            ))
            missing = {p: s for p, s in missing.items() if p not in carried}
        if not missing:
            continue
        moves, torch_moves = name in env.overlaid, env.changes("torch")
        donor_torch = env.donor.latest().get("torch")
        donor_dist = env.donor.latest().get(name)
        if moves and not torch_moves:
            why = f"it moves from the donor without the donor's torch; the target keeps {describe(torch)}"
            fix = (f"add 'torch' to overlay in {env.manifest} (the donor has {describe(donor_torch)})" if donor_torch
                   else f"use a build of {dist.display_name} for {describe(torch)}")
        else:
            why = (f"torch changes to {describe(torch)} and {dist.display_name} stays as built for the old one"
                   if torch_moves and not moves else f"it was built for another torch than {describe(torch)}")
            if donor_dist and not moves and donor_dist.raw_version != dist.raw_version:
                fix = (f"add {name!r} to overlay in {env.manifest} (the donor has {describe(donor_dist)}, built with "
                       f"the donor's torch)")
            elif donor_dist is None and not moves and torch_moves:
                fix = f"add {name!r} to remove: in {env.manifest} (the donor runs {describe(torch)} without it)"
            else:
                fix = f"install a build of {dist.display_name} made for {describe(torch)}"
        count = sum(len(s) for s in missing.values())
        first = next(iter(missing.items()))
        out.append(Finding(
            code="libtorch-abi", severity="error" if (env.changes(name) or torch_moves) else "warning",
            dists=(name, "torch"),
            message=f"{describe(dist)}: {counted(len(missing), 'shared object')} {agree(len(missing), 'needs', 'need')} {counted(count, 'libtorch symbol')} that "
                    f"{describe(torch)} does not define ({why}); e.g. {first[0]} needs {first[1][0]}",
            hint=fix,
            files=tuple(sorted(missing)[:_SHOWN]),
        ))
    return out
