"""Compatibility checks on the environment as it will be after apply (pure core).

:func:`compatibility_findings` runs every rule; the dependency rules live here, the
others in :mod:`transplant.core.rules`. Severity rules of the ones here:

* ``requirement-unmet``: *error* when the donor's environment satisfies the requirement
  (or the target's did before apply): the transplant would leave out or break what is
  needed, and the donor shows it can be had; *warning* when neither does (the donor runs
  without it too, so the transplant changes nothing there). PEP 440: ``==0.3.16.post4``
  is met by ``0.3.16.post4+cu130``; the CUDA label is then checked on its own
  (``cuda-major-mismatch``, ``lockstep-mismatch``).
* ``duplicate-dist-info``: *error* on the donor (which one to copy is ambiguous),
  *warning* on the target (apply replaces overlaid ones; others stay as they are).
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping


from transplant.core.inventory import Distribution, Inventory
from transplant.core.plan import Finding
from transplant.core.requirements import Unmet, unmet_requirements
from transplant.core.rules.cudarules import cuda_major_findings, driver_findings, gpu_arch_findings
from transplant.core.rules.env import EnvironmentAfter, pip
from transplant.core.rules.cpu import cpu_findings
from transplant.core.rules.ctoolchain import c_toolchain_findings
from transplant.core.rules.cudacompat import libcuda_compat_findings
from transplant.core.rules.driverstate import driver_state_findings
from transplant.core.rules.families import lockstep_findings, torch_family_findings
from transplant.core.rules.hostlibs import host_library_findings, runpath_findings
from transplant.core.rules.jitcc import jit_compiler_findings
from transplant.core.rules.gencode import gencode_findings
from transplant.core.rules.interpreter import interpreter_findings, platform_findings, python_abi_findings, unread_findings
from transplant.core.rules.libcuda import libcuda_findings
from transplant.core.rules.libtorch import libtorch_findings
from transplant.core.rules.numpyabi import numpy_findings
from transplant.core.rules.outside import outside_findings
from transplant.core.rules.ptx import ptx_findings
from transplant.core.rules.recordless import recordless_findings
from transplant.core.rules.symbols import symbol_findings
from transplant.core.rules.venvfiles import drift_findings, editable_findings, script_findings
from transplant.core.units import agree, count as counted

__all__ = ["EnvironmentAfter", "compatibility_findings", "requirement_findings"]

#: The rules run on every plan, in order.
RULES = (interpreter_findings, python_abi_findings, platform_findings, cuda_major_findings, torch_family_findings,
         lockstep_findings, libtorch_findings, driver_findings, gpu_arch_findings, editable_findings,
         script_findings, drift_findings, unread_findings, recordless_findings,
         symbol_findings, numpy_findings, gencode_findings, libcuda_findings, c_toolchain_findings, outside_findings,
         ptx_findings, jit_compiler_findings, host_library_findings, runpath_findings, cpu_findings,
         driver_state_findings, libcuda_compat_findings)

_SHOWN = 4  # unmet requirements named in a warning's message; --json has them all in ``dists``


def _versions(dists: Mapping[str, Distribution]) -> dict:
    return {n: d.version for n, d in dists.items()}


def _reqs(dists: Mapping[str, Distribution]) -> dict:
    return {n: d.requires_dist for n, d in dists.items()}


def requirement_findings(
    after: Mapping[str, Distribution],
    markers: Mapping[str, str],
    *,
    reference: list[Mapping[str, Distribution]],
    venv: str,
    donor: Mapping[str, Distribution] | None = None,
    changes: Callable[[str], bool] | None = None,
    overlaid: Collection[str] = (),
    manifest: str = "the manifest",
) -> list[Finding]:
    """``requirement-unmet`` findings for ``after``: one error per requiring distribution,
    and one warning for all the requirements no reference environment satisfies either.

    :param after: the environment to check.
    :param markers: the target interpreter's PEP 508 marker environment.
    :param reference: environments that show a requirement can be met (the donor's, and
        for a plan the target's before apply); an unmet requirement that one of them
        satisfies is an error, any other a warning; an empty list compares with nothing,
        so every unmet requirement is an error.
    :param venv: the target venv prefix, for the pip command in hints.
    :param donor: the donor's environment, to say in the hint which version it has.
    :param changes: for a plan, whether apply changes a distribution: an unmet requirement
        whose requirer and required distribution apply both leaves alone is a warning (the
        target has it already); None (verify) makes every meetable one an error.
    :param overlaid: names the overlay brings; a requirement on one of them is never fixed
        by reinstalling it at another version (that would undo the overlay), but by bringing
        the requirer's donor build, or removing a requirer the donor runs without.
    :param manifest: the manifest's path, for hints.
    """
    grouped: dict[tuple[str, str], list[Unmet]] = defaultdict(list)
    for u in unmet_requirements(_versions(after), _reqs(after), markers):
        known_unmeetable = bool(reference) and not any(_satisfies(env, u) for env in reference)
        severity = "inherited" if known_unmeetable else "error"
        if severity == "error" and changes is not None and not (changes(u.requirer) or changes(u.required)):
            severity = "warning"
        grouped[(u.requirer, severity)].append(u)
    findings = []
    inherited: list[tuple[str, list[Unmet]]] = []
    for (requirer, severity), items in sorted(grouped.items()):
        if severity == "inherited":
            inherited.append((requirer, items))
            continue
        dist = after[requirer]
        lines = "; ".join(u.detail for u in items)
        fixes: list[str] = []
        for u in items:
            fix = _requirement_fix(u, dist, donor or {}, overlaid, venv, manifest)
            if fix not in fixes:
                fixes.append(fix)
        kept = "" if severity == "error" else "; the target has this already and apply changes neither side"
        findings.append(Finding(code="requirement-unmet", severity=severity,
                                dists=(requirer, *sorted({u.required for u in items})),
                                message=f"{dist.display_name} {dist.raw_version} requires {lines}{kept}",
                                hint="; ".join(fixes)))
    if inherited:
        count = sum(len(items) for _, items in inherited)
        parts = ", ".join(f"{after[r].display_name} {after[r].raw_version} ({len(items)})" for r, items in inherited)
        first = [u for _, items in inherited for u in items][:_SHOWN]
        example = "; ".join(u.describe() for u in first)
        findings.append(Finding(
            code="requirement-unmet", severity="warning",
            dists=tuple(sorted({r for r, _ in inherited} | {u.required for _, items in inherited for u in items})),
            message=f"{counted(count, 'requirement')} of {counted(len(inherited), 'distribution')} {agree(count, 'is', 'are')} unmet here and on the donor (or "
                    f"before apply, or come from distributions the donor does not have), so the transplant does not "
                    f"change them: {parts}; e.g. {example}",
            hint=f"see them all with --json; if the service needs them: {pip(venv)} install ...",
        ))
    return findings


def _requirement_fix(u: Unmet, dist: Distribution, donor: Mapping[str, Distribution],
                     overlaid: Collection[str], venv: str, manifest: str) -> str:
    """The one fix for an unmet requirement: bring the donor's build of what is needed, or of
    the requirer when the overlay sets what it needs, or remove a requirer the donor runs
    without; a pip command only when the donor offers nothing that meets it."""
    have = donor.get(u.required)
    if u.required in overlaid and u.requirer not in overlaid:
        theirs = donor.get(u.requirer)
        if theirs is None:
            return (f"add {u.requirer!r} to remove: in {manifest} (the donor runs without it; its pin would undo "
                    f"the overlay's {u.required})")
        if theirs.raw_version != dist.raw_version:
            return f"add {u.requirer!r} to overlay (the donor has {theirs.raw_version}, which runs with its {u.required})"
    if have is not None and have.version is not None and u.requirement.specifier.contains(have.version,
                                                                                         prereleases=True):
        return f"add {u.required!r} to overlay (the donor has {have.raw_version})"
    return f"{pip(venv)} install {shlex.quote(str(u.requirement))}"


def _satisfies(env: Mapping[str, Distribution], unmet: Unmet) -> bool:
    """Whether ``env`` has a distribution that meets the unmet requirement (PEP 440, pre-releases allowed)."""
    have = env.get(unmet.required)
    if have is None:
        return False
    if not unmet.requirement.specifier:
        return True
    return have.version is not None and unmet.requirement.specifier.contains(have.version, prereleases=True)


def _duplicates(inv: Inventory, side: str, overlaid: tuple[str, ...]) -> list[Finding]:
    out = []
    for name, dists in sorted(inv.by_name().items()):
        broken = [d for d in dists if not d.metadata_present]
        if len(dists) < 2 and not broken:
            continue
        folders = tuple(d.dist_info for d in dists)
        if side == "donor":
            severity = "error" if name in overlaid else "warning"
            hint = (f"on the donor, remove the stale {agree(len(folders) - 1, 'folder', 'folders')} so one remains: "
                    f"{shlex.join(['rm', '-r', *(inv.interpreter.prefix + '/' + f for f in folders if f != max(folders))])}")
        else:
            severity = "warning"
            hint = ("apply replaces them with the donor's one" if name in overlaid else
                    f"add {name!r} to overlay, or reinstall it: {pip(inv.interpreter.prefix)} "
                    f"install --force-reinstall {name}")
        what = f"{len(dists)} dist-info folders" if len(dists) > 1 else "a dist-info folder without METADATA"
        out.append(Finding(
            code="duplicate-dist-info", severity=severity, dists=(name,),
            message=f"the {side} has {what} for {name}: {', '.join(folders)}; importlib may report the wrong "
                    f"version or none",
            hint=hint, files=folders,
        ))
    return out


def _metadata(env: EnvironmentAfter) -> list[Finding]:
    out = []
    for name in env.overlaid:
        dist = env.after[name]
        problems = [f"Requires-Dist {r!r} is not PEP 508" for r in dist.bad_requirements]
        if dist.version is None:
            problems.insert(0, f"version {dist.raw_version!r} is not PEP 440")
        if problems:
            out.append(Finding(
                code="metadata-invalid", severity="warning", dists=(name,),
                message=f"{dist.display_name} on the donor: " + "; ".join(problems[:5])
                        + "; those requirements are not checked",
                hint="reinstall it on the donor from a wheel with valid METADATA",
            ))
    return out


def compatibility_findings(env: EnvironmentAfter) -> list[Finding]:
    """All compatibility findings for the environment after apply (unsorted)."""
    donor_env = env.donor.latest()
    findings = _metadata(env)
    for rule in RULES:
        findings += rule(env)
    findings += _duplicates(env.donor, "donor", env.overlaid)
    findings += _duplicates(env.target, "target", env.overlaid)
    findings += requirement_findings(
        env.after, env.target.interpreter.markers,
        reference=[donor_env, env.target.latest()], venv=env.target.interpreter.prefix, donor=donor_env,
        changes=env.changes, overlaid=env.overlaid, manifest=env.manifest,
    )
    return findings
