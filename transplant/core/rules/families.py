"""Families of distributions that must match: ``cuda-variant-mismatch`` (the torch family)
and ``lockstep-mismatch`` (flashinfer, sglang and its kernel) (pure core).

Sources, in order: a torchvision / torchaudio wheel's own ``Requires-Dist: torch...`` decides
which torch it pairs with (torchvision 0.24.1 and torchaudio 2.9.1 declare ``torch==2.9.1``;
an unmet pin is ``requirement-unmet``'s to report, not this rule's); only a companion that
declares no torch requirement is checked against the release pairs of
``data/families.json``, every release of which exists on the registry
(``tests/data/registry-listing.json``). PyPI's default builds and the lockstep families are
in the same file, with their sources.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from transplant.core.cuda import cuda_variant, describe_variant
from transplant.core.inventory import Distribution
from transplant.core.plan import Finding
from transplant.core.data import family_table
from transplant.core.rules.env import EnvironmentAfter, describe, severity

__all__ = ["torch_family_findings", "lockstep_findings", "build_variant", "torch_requirement"]

_COMPANIONS = ("torchvision", "torchaudio")


def _release(version: Version | None) -> str | None:
    return f"{version.major}.{version.minor}" if version is not None else None


def torch_requirement(dist: Distribution, markers: Mapping[str, str] | None = None) -> Requirement | None:
    """The distribution's own ``Requires-Dist`` on torch with a version specifier
    (``torch==2.9.1``, ``torch>=2.14.0``), or None when it declares none (torchaudio 2.11.0
    declares no requirements at all) or only a bare ``torch``.

    A requirement whose marker is false in ``markers`` (the target's PEP 508 environment,
    ``extra`` empty) does not count; one whose marker cannot be evaluated (no ``markers``
    given, or a name they lack) counts as applying, as in ``requirement-unmet``.
    """
    for req in dist.requires_dist:
        if canonicalize_name(req.name) != "torch" or not req.specifier:
            continue
        if req.marker is not None:
            try:
                if not req.marker.evaluate({**(markers or {}), "extra": ""}):
                    continue
            except UndefinedEnvironmentName:
                pass
        return req
    return None


def _paired_torch_release(dist: Distribution) -> str | None:
    """The torch release (``2.9``) a torch-family distribution was built for: torch's own;
    a companion's ``torch==X`` pin; else the one release of ``data/families.json`` that names
    the companion's release; None when none of these says."""
    if dist.name == "torch":
        return _release(dist.version)
    pin = torch_requirement(dist)
    if pin is not None:
        exact = [s.version for s in pin.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if exact:
            try:
                return _release(Version(exact[0]))
            except InvalidVersion:
                return None
    mine = _release(dist.version)
    rows = [t for t, row in family_table()["torch"].items() if mine is not None and row.get(dist.name) == mine]
    return rows[0] if len(rows) == 1 else None


def build_variant(dist: Distribution) -> tuple[str | None, str]:
    """The build variant of a torch-family distribution and how it was found, as
    ``(variant, how)``: ``("cu130", "+cu130")`` from a local label; without one, PyPI's
    default build (``data/families.json``'s ``default_variant``) for the torch release the
    distribution was built for (see :func:`_paired_torch_release`), or ``(None, "no label")``
    when the table does not say.
    """
    variant = cuda_variant(dist.version)
    if variant is not None:
        return variant, f"+{variant}"
    row = family_table()["torch"].get(_paired_torch_release(dist) or "", {})
    default = row.get("default_variant")
    return default, (f"no label: PyPI's default {describe_variant(default)} build" if default else "no label")


def _install(venv: str, dist: str, spec: str, variant: str | None) -> str:
    cmd = [f"{venv}/bin/python", "-m", "pip", "install", f"{dist}=={spec}"]
    if variant:
        cmd += ["--index-url", f"https://download.pytorch.org/whl/{variant}"]
    return shlex.join(cmd)


def _wildcard(release: str) -> str:
    """``2.9`` -> ``2.9.*`` (any patch of a release); a full version stays as it is."""
    return f"{release}.*" if release.count(".") == 1 else release


def _requirement_of(torch: Distribution, name: str) -> Requirement | None:
    """torch's own Requires-Dist entry on ``name`` (triton), any specifier, or None."""
    return next((r for r in torch.requires_dist if canonicalize_name(r.name) == name), None)


def _problems(torch: Distribution, dist: Distribution, markers: Mapping[str, str]) -> tuple[list[str], str | None]:
    """What is wrong with ``dist`` next to ``torch``, and the table's release to install
    instead when the release is what is wrong (``0.29``, ``3.5``; None otherwise).

    The release check uses the table only where the pair's own metadata is silent: triton
    when torch pins none, a companion when it pins no torch.
    """
    pairs = family_table()["torch"].get(_release(torch.version) or "", {})
    want = pairs.get(dist.name)
    problems = []
    if dist.name == "triton":
        if want and _requirement_of(torch, "triton") is None and not _in_release(dist.version, want):
            problems.append(f"torch {torch.version.public if torch.version else torch.raw_version} was released with triton {want}, "
                            f"not {dist.raw_version} (and names no triton pin)")
        return problems, want if problems else None
    release = None
    if torch_requirement(dist, markers) is None and want and _release(dist.version) != want:
        problems.append(f"torch {_release(torch.version)} pairs with {dist.name} {want}.x, not {dist.raw_version} "
                        f"({dist.name} {dist.raw_version} declares no torch requirement to say otherwise)")
        release = want
    t_variant, t_how = build_variant(torch)
    v_variant, v_how = build_variant(dist)
    if t_variant and v_variant and t_variant != v_variant:
        problems.append(f"torch is a {describe_variant(t_variant)} build ({t_how}) and {dist.name} a "
                        f"{describe_variant(v_variant)} build ({v_how}); its operators will not register "
                        f"(\"operator {dist.name}::... does not exist\")")
    return problems, release


def _in_release(version: Version | None, release: str) -> bool:
    """Whether ``version`` is ``release`` or a patch of it (``3.5.1`` is in ``3.5``)."""
    want = Version(release).release
    return version is not None and version.release[:len(want)] == want


def _fits(torch: Distribution, dist: Distribution, markers: Mapping[str, str]) -> bool:
    """Whether ``dist`` pairs with ``torch``: its own torch pin (if any) is met and this rule finds nothing."""
    pin = torch_requirement(dist, markers)
    if pin is not None and (torch.version is None or not pin.specifier.contains(torch.version, prereleases=True)):
        return False
    return not _problems(torch, dist, markers)[0]


def _donor_runs(env: EnvironmentAfter, torch: Distribution, dist: Distribution) -> bool:
    """Whether the donor holds this very pair (same versions, build labels included) on the
    same Python (implementation, major.minor) and machine as the target."""
    donor = env.donor.latest()
    d_torch, d_dist = donor.get("torch"), donor.get(dist.name)
    same_pair = (d_torch is not None and d_dist is not None and d_torch.raw_version == torch.raw_version
                 and d_dist.raw_version == dist.raw_version)
    d, t = env.donor.interpreter, env.target.interpreter
    return same_pair and (d.implementation, d.minor, d.machine) == (t.implementation, t.minor, t.machine)


def torch_family_findings(env: EnvironmentAfter) -> list[Finding]:
    """``cuda-variant-mismatch``: torchvision / torchaudio from another build than torch
    (a CPU torch with a CUDA torchvision: "operator torchvision::nms does not exist"), or
    (when the companion declares no torch requirement) from a release the table does not
    pair with torch's; triton where torch names no pin.

    :returns: one finding per mismatched distribution, empty when torch is absent or has no
        PEP 440 version. Severity: ``info`` when the donor runs with the same pair on the same
        Python and machine (what the donor runs is not, by itself, an error); otherwise
        ``error`` when apply changes either member, ``warning`` when the target has it already.
        The hint overlays the donor's member when that one fits torch, removes the member
        when the donor runs without it, and otherwise names an install whose release the
        registry has (the table's, or the installed version with torch's build index).
    """
    torch = env.after.get("torch")
    if torch is None or torch.version is None:
        return []
    markers = env.target.interpreter.markers
    t_variant = build_variant(torch)[0]
    venv = env.target.interpreter.prefix
    donor = env.donor.latest()
    out = []
    for name in (*_COMPANIONS, "triton"):
        dist = env.after.get(name)
        if dist is None or dist.version is None:
            continue
        problems, release = _problems(torch, dist, markers)
        if not problems:
            continue
        if name == "triton":
            install = (f"install the matching release: {_install(venv, name, _wildcard(release), None)}"
                       if release else "")
        else:
            spec = _wildcard(release) if release else dist.version.public
            install = "install the matching build: " + _install(venv, name, spec, t_variant)
        donor_has = donor.get(name)
        if donor_has is not None and name not in env.overlaid and _fits(torch, donor_has, markers):
            fix = f"add {name!r} to overlay (the donor's {describe(donor_has)} pairs with {describe(torch)})"
        elif donor_has is None and name not in env.overlaid:
            fix = f"add {name!r} to remove: in {env.manifest} (the donor runs without it)"
            fix += f", or {install}" if install else ""
        else:
            fix = install or f"overlay torch and {name} from one release"
        message = f"{describe(torch)} with {describe(dist)}: " + "; ".join(problems)
        level = severity(env, ["torch", name])
        if _donor_runs(env, torch, dist):
            level = "info"
            message += "; the donor runs with this pair too, on the same Python and machine"
            fix = "nothing, if the service works on the donor; otherwise " + fix
        out.append(Finding(code="cuda-variant-mismatch", severity=level, dists=("torch", name),
                           message=message, hint=fix))
    return out


def lockstep_findings(env: EnvironmentAfter) -> list[Finding]:
    """``lockstep-mismatch``: a family of distributions that must move together is split by
    the overlay, or its members disagree on their public version or CUDA label."""
    donor = env.donor.latest()
    torch = env.after.get("torch")
    out = []
    for family in family_table()["lockstep"]:
        members = [m for m in family["members"] if m in env.after or m in donor]
        problems, fixes = [], []
        moved = [m for m in members if m in env.overlaid]
        if moved:
            left = [m for m in members if m not in env.overlaid and m in donor
                    and (m not in env.after or env.after[m].raw_version != donor[m].raw_version)]
            for m in left:
                here = env.after.get(m)
                problems.append(f"the overlay moves {', '.join(moved)} but not {m} (the donor has "
                                f"{donor[m].raw_version}, the target {here.raw_version if here else 'none'})")
            if left:
                fixes.append(f"add {', '.join(left)} to overlay in {env.manifest}")
        present = {m: env.after[m] for m in members if m in env.after and env.after[m].version is not None}
        if family["same_public_version"] and len({d.version.public for d in present.values() if d.version is not None}) > 1:
            problems.append("members are not one release: " + ", ".join(describe(d) for d in present.values()))
            stray = [m for m in present if m not in env.overlaid and m not in donor and m not in env.removed]
            if stray:  # the donor runs its release without them: overlaying is impossible, removing is the fix
                fixes.append(f"add {', '.join(stray)} to remove: in {env.manifest} (the donor runs without "
                             f"{'it' if len(stray) == 1 else 'them'})")
        for m in family["label_follows_torch"]:
            if m in present and torch is not None:
                mine, theirs = cuda_variant(present[m].version), build_variant(torch)[0]
                if mine and theirs and mine != theirs:
                    out.append(Finding(
                        code="lockstep-mismatch", severity=severity(env, [m, "torch"]), dists=(m, "torch"),
                        message=f"{family['name']} family: {describe(present[m])} is built for "
                                f"{describe_variant(mine)} and {describe(torch)} for {describe_variant(theirs)}; "
                                f"its prebuilt kernels are not used (or fail to load) with this torch",
                        hint=f"use the {m} build labelled +{theirs} (same version), or overlay a torch built for "
                             f"{describe_variant(mine)}",
                    ))
        if not problems:
            continue
        names = sorted(set(members) & (set(env.after) | set(donor)))
        out.append(Finding(
            code="lockstep-mismatch", severity=severity(env, names), dists=tuple(names),
            message=f"{family['name']} family: " + "; ".join(problems),
            hint="; ".join(fixes) or f"overlay every member together: {', '.join(members)}",
        ))
    return out
