"""Families of distributions that must match: ``cuda-variant-mismatch`` (the torch family)
and ``lockstep-mismatch`` (flashinfer, sglang and its kernel) (pure core).

The release pairs, PyPI's default builds and the families are in ``data/families.json``
with their sources.
"""

from __future__ import annotations

import shlex

from packaging.version import Version

from ..cuda import cuda_variant, describe_variant
from ..inventory import Distribution
from ..model import Finding
from ..tables import family_table
from .env import EnvironmentAfter, describe, severity

__all__ = ["torch_family_findings", "lockstep_findings", "build_variant"]

_COMPANIONS = ("torchvision", "torchaudio")


def _release(version: Version | None) -> str | None:
    return f"{version.major}.{version.minor}" if version is not None else None


def build_variant(dist: Distribution, torch: Distribution | None) -> tuple[str | None, str]:
    """The build variant of a torch-family distribution and how it was found.

    A local label gives it (``cu130``, ``cpu``); without one, PyPI's default build for the
    paired torch release (``data/families.json``), or None when the table does not say.
    """
    variant = cuda_variant(dist.version)
    if variant is not None:
        return variant, f"+{variant}"
    anchor = torch if torch is not None and dist.name != "torch" else dist
    row = family_table()["torch"].get(_release(anchor.version) or "", {})
    default = row.get("default_variant")
    return default, (f"no label: PyPI's default {describe_variant(default)} build" if default else "no label")


def _index(venv: str, dist: str, version: str, variant: str | None) -> str:
    cmd = [f"{venv}/bin/python", "-m", "pip", "install", f"{dist}=={version}"]
    if variant:
        cmd += ["--index-url", f"https://download.pytorch.org/whl/{variant}"]
    return shlex.join(cmd)


def torch_family_findings(env: EnvironmentAfter) -> list[Finding]:
    """``cuda-variant-mismatch``: torchvision / torchaudio from another build than torch
    (a CPU torch with a CUDA torchvision: "operator torchvision::nms does not exist"), or
    from a release that was not paired with torch's; triton where torch names no pin."""
    torch = env.after.get("torch")  # type: ignore[call-overload]
    if torch is None or torch.version is None:
        return []
    pairs = family_table()["torch"].get(_release(torch.version) or "", {})
    t_variant, t_how = build_variant(torch, torch)
    venv = env.target.interpreter.prefix
    out = []
    for name in (*_COMPANIONS, "triton"):
        dist = env.after.get(name)  # type: ignore[call-overload]
        if dist is None or dist.version is None:
            continue
        problems = []
        want = pairs.get(name)
        if name == "triton":
            pinned = any(r.name == "triton" for r in torch.requires_dist)
            if want and not pinned and not str(dist.version.public).startswith(want):
                problems.append(f"torch {torch.version.public} was released with triton {want}, not {dist.raw_version}")
        else:
            if want and _release(dist.version) != want:
                problems.append(f"torch {_release(torch.version)} pairs with {name} {want}.x, not {dist.raw_version}")
            v_variant, v_how = build_variant(dist, torch)
            if t_variant and v_variant and t_variant != v_variant:
                problems.append(f"torch is a {describe_variant(t_variant)} build ({t_how}) and {name} a "
                                f"{describe_variant(v_variant)} build ({v_how}); its operators will not register "
                                f"(\"operator {name}::... does not exist\")")
        if not problems:
            continue
        fix_version = f"{want}.*" if want and name != "triton" else (dist.version.public if name != "triton" else want)
        donor_has = env.donor.latest().get(name)  # type: ignore[call-overload]
        first = (f"add {name!r} to overlay if the donor's {describe(donor_has)} matches torch, or install the "
                 f"matching build: " if donor_has is not None and name not in env.overlaid else "install the matching build: ")
        out.append(Finding(
            code="cuda-variant-mismatch", severity=severity(env, ["torch", name]), dists=("torch", name),
            message=f"{describe(torch)} with {describe(dist)}: " + "; ".join(problems),
            hint=first + _index(venv, name, str(fix_version), t_variant if name != "triton" else None),
        ))
    return out


def lockstep_findings(env: EnvironmentAfter) -> list[Finding]:
    """``lockstep-mismatch``: a family of distributions that must move together is split by
    the overlay, or its members disagree on their public version or CUDA label."""
    donor = env.donor.latest()
    torch = env.after.get("torch")  # type: ignore[call-overload]
    out = []
    for family in family_table()["lockstep"]:
        members = [m for m in family["members"] if m in env.after or m in donor]
        problems, fixes = [], []
        moved = [m for m in members if m in env.overlaid]
        if moved:
            left = [m for m in members if m not in env.overlaid and m in donor
                    and (m not in env.after or env.after[m].raw_version != donor[m].raw_version)]
            for m in left:
                here = env.after.get(m)  # type: ignore[call-overload]
                problems.append(f"the overlay moves {', '.join(moved)} but not {m} (the donor has "
                                f"{donor[m].raw_version}, the target {here.raw_version if here else 'none'})")
            if left:
                fixes.append(f"add {', '.join(left)} to overlay in {env.manifest}")
        present = {m: env.after[m] for m in members if m in env.after and env.after[m].version is not None}
        if family["same_public_version"] and len({d.version.public for d in present.values()}) > 1:
            problems.append("members are not one release: " + ", ".join(describe(d) for d in present.values()))
            stray = [m for m in present if m not in env.overlaid and m not in donor and m not in env.removed]
            if stray:  # the donor runs its release without them: overlaying is impossible, removing is the fix
                fixes.append(f"add {', '.join(stray)} to remove: in {env.manifest} (the donor runs without "
                             f"{'it' if len(stray) == 1 else 'them'})")
        for m in family["label_follows_torch"]:
            if m in present and torch is not None:
                mine, theirs = cuda_variant(present[m].version), build_variant(torch, torch)[0]
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
