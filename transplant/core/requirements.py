"""Dependency consistency of an environment, like ``pip check`` (pure core).

The environment is a mapping of normalised name to installed version; each
distribution's Requires-Dist is evaluated with the target interpreter's PEP 508 marker
environment (``extra`` empty: optional extras are not checked) and matched by PEP 440
rules, pre-releases allowed, where a specifier without a local label ignores the
candidate's label (``==0.3.16.post4`` accepts ``0.3.16.post4+cu130``: PEP 440,
"Version matching"). :func:`parse_root` reads a closure's root (a name with extras, as the
manifest's ``{closure: NAME}`` writes it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

__all__ = ["Unmet", "unmet_requirements", "parse_root"]


@dataclass(frozen=True, kw_only=True)
class Unmet:
    """One requirement an environment does not satisfy.

    :ivar requirer: normalised name of the distribution that declares it.
    :ivar requirer_version: that distribution's version (None if unparseable).
    :ivar requirement: the Requires-Dist entry.
    :ivar found: the installed version of the required distribution, None when absent.
    """

    requirer: NormalizedName
    requirer_version: Version | None
    requirement: Requirement
    found: Version | None

    @property
    def required(self) -> NormalizedName:
        """Normalised name of the required distribution."""
        return canonicalize_name(self.requirement.name)

    @property
    def detail(self) -> str:
        """``flashinfer-python==0.7.2, found 0.6.3`` (or ``, not installed``)."""
        have = f"found {self.found}" if self.found is not None else "not installed"
        return f"{self.requirement}, {have}"

    def describe(self) -> str:
        """``sglang 0.5.23 requires flashinfer-python==0.7.2, found 0.6.3`` style text."""
        return f"{self.requirer} {self.requirer_version} requires {self.detail}"


def unmet_requirements(
    installed: Mapping[NormalizedName, Version | None],
    requirements: Mapping[NormalizedName, Iterable[Requirement]],
    markers: Mapping[str, str],
) -> list[Unmet]:
    """Every Requires-Dist in ``requirements`` that ``installed`` does not satisfy.

    :param installed: normalised name -> version (None when the version is unknown; such
        a distribution satisfies only requirements without a specifier).
    :param requirements: normalised name of each requirer -> its Requires-Dist entries.
    :param markers: the PEP 508 marker environment of the target interpreter.
    :returns: sorted by (requirer, required name); a marker that cannot be evaluated
        counts as applying.
    """
    out: list[Unmet] = []
    for requirer, reqs in requirements.items():
        for req in reqs:
            if req.marker is not None:
                try:
                    if not req.marker.evaluate({**markers, "extra": ""}):
                        continue
                except UndefinedEnvironmentName:
                    pass
            name = canonicalize_name(req.name)
            if name not in installed:
                out.append(Unmet(requirer=requirer, requirer_version=installed.get(requirer),
                                 requirement=req, found=None))
                continue
            version = installed[name]
            if not req.specifier:
                continue
            if version is None or not req.specifier.contains(version, prereleases=True):
                out.append(Unmet(requirer=requirer, requirer_version=installed.get(requirer),
                                 requirement=req, found=version))
    out.sort(key=lambda u: (u.requirer, u.required, str(u.requirement)))
    return out


def parse_root(text: str) -> tuple[NormalizedName, frozenset[str]]:
    """``sglang`` or ``sglang[http2,tracing]`` -> (normalised name, normalised extras).

    :raises ValueError: ``text`` is not a PEP 508 name with optional extras (no version,
        no marker, no URL).
    """
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"{text!r} is not a distribution name: {exc}") from None
    if req.specifier or req.marker is not None or req.url:
        raise ValueError(f"{text!r} has a version, marker or URL; a closure names a distribution (and extras) only")
    return canonicalize_name(req.name), frozenset(canonicalize_name(e) for e in req.extras)
