"""The plan document: changes, findings and fingerprints (pure core).

A :class:`Plan` is what ``transplant plan`` shows and ``--out`` saves as JSON
(schema ``transplant.plan/1``) and what ``apply`` executes. It is data: building it is
:func:`transplant.planner.plan`; reading a saved one is :func:`plan_from_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import PlanError

__all__ = [
    "PLAN_SCHEMA",
    "SEVERITIES",
    "DIST_ACTIONS",
    "PATCH_ACTIONS",
    "Finding",
    "FileCopy",
    "Change",
    "Side",
    "Plan",
    "plan_from_dict",
]

PLAN_SCHEMA = "transplant.plan/1"
SEVERITIES = ("error", "warning", "info")
#: add: absent on the target; upgrade / downgrade: other public version; rebuild: same
#: public version, other local label (``+cu128`` -> ``+cu130``); refresh: same version,
#: files differ; keep: nothing to do.
DIST_ACTIONS = ("add", "upgrade", "downgrade", "rebuild", "refresh", "keep")
PATCH_ACTIONS = ("add", "replace", "keep")


@dataclass(frozen=True, kw_only=True)
class Finding:
    """Something plan or verify found: a stable kebab-case ``code``, a severity, the
    distributions and files involved, what was found (``message``) and the fix (``hint``).

    ``error`` blocks apply unless forced; ``warning`` and ``info`` do not.
    """

    code: str
    severity: str
    dists: tuple[str, ...]
    message: str
    hint: str
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")


@dataclass(frozen=True, kw_only=True)
class FileCopy:
    """One file to write on the target.

    :ivar path: POSIX path relative to the venv prefix, the same on donor and target.
    :ivar size: bytes (None for a symlink).
    :ivar hash: ``sha256=<urlsafe b64>`` of the content, or ``symlink:<target>``.
    :ivar source: ``donor``, or ``patch`` for a file from the controller.
    :ivar local: for a patch, the source path relative to the manifest's folder; else None.
    """

    path: str
    size: int | None
    hash: str
    source: str = "donor"
    local: str | None = None


@dataclass(frozen=True, kw_only=True)
class Change:
    """What happens to one distribution or one patch file.

    :ivar kind: ``distribution`` or ``patch``.
    :ivar name: normalised distribution name, or the patch's venv-relative path.
    :ivar action: one of :data:`DIST_ACTIONS` or :data:`PATCH_ACTIONS`.
    :ivar from_version / to_version: versions with local labels (None for absent / patches).
    :ivar reason: one line saying why (``same version, all 1,204 files identical``).
    :ivar copy: files to write; :ivar remove: venv-relative paths to delete.
    :ivar dist_info: the donor's dist-info folder (venv-relative) for a distribution.
    :ivar unchanged: files already identical on the target (counted, not listed).
    """

    kind: str
    name: str
    action: str
    reason: str
    from_version: str | None = None
    to_version: str | None = None
    copy: tuple[FileCopy, ...] = ()
    remove: tuple[str, ...] = ()
    dist_info: str | None = None
    unchanged: int = 0

    @property
    def bytes(self) -> int:
        """Total bytes of the files to copy."""
        return sum(c.size or 0 for c in self.copy)

    @property
    def is_noop(self) -> bool:
        """True when nothing is copied or removed."""
        return not self.copy and not self.remove


@dataclass(frozen=True, kw_only=True)
class Side:
    """One end of the plan: where (``host:venv``), the venv prefix and the inventory fingerprint."""

    label: str
    host: str
    venv: str
    fingerprint: str
    hostname: str


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A plan: sorted changes plus findings, with fingerprints of both inventories.

    :ivar manifest: the manifest's path as given.
    :ivar hash_patterns: the overlay patterns the probes hashed, so apply can re-probe alike.
    :ivar patch_files: venv-relative patch destinations the target probe was asked about.
    """

    manifest: str
    donor: Side
    target: Side
    changes: tuple[Change, ...]
    findings: tuple[Finding, ...]
    hash_patterns: tuple[str, ...] = ()
    patch_files: tuple[str, ...] = ()
    schema: str = field(default=PLAN_SCHEMA)

    @property
    def blocking(self) -> tuple[Finding, ...]:
        """The error findings (they block apply unless forced)."""
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def has_changes(self) -> bool:
        """True when any change copies or removes a file."""
        return any(not c.is_noop for c in self.changes)

    @property
    def copy_bytes(self) -> int:
        """Bytes to copy over all changes."""
        return sum(c.bytes for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (schema ``transplant.plan/1``), stable key order."""
        return asdict(self)


def _tuple(items: Any, cls: type, path: str) -> tuple:
    if not isinstance(items, list):
        raise PlanError(f"plan key {path!r}: expected a list, got {type(items).__name__}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise PlanError(f"plan key '{path}[{i}]': expected an object")
        try:
            out.append(cls(**item))
        except (TypeError, ValueError) as exc:
            raise PlanError(f"plan key '{path}[{i}]': {exc}") from exc
    return tuple(out)


def plan_from_dict(data: Mapping[str, Any], *, source: str) -> Plan:
    """Rebuild a :class:`Plan` from its JSON form.

    :param source: the file it came from, for messages.
    :raises PlanError: another schema, or a missing or mistyped key (named by path).
    """
    if not isinstance(data, Mapping) or data.get("schema") != PLAN_SCHEMA:
        got = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
        raise PlanError(f"{source}: not a transplant plan (schema {got!r}, expected {PLAN_SCHEMA!r})",
                        hint="make one with: transplant plan MANIFEST --out plan.json")
    try:
        changes = []
        for i, c in enumerate(data["changes"]):
            c = dict(c)
            c["copy"] = _tuple(c.get("copy", []), FileCopy, f"changes[{i}].copy")
            c["remove"] = tuple(c.get("remove", []))
            changes.append(Change(**c))
        findings = []
        for f in data["findings"]:
            f = dict(f)
            f["dists"] = tuple(f.get("dists", []))
            f["files"] = tuple(f.get("files", []))
            findings.append(Finding(**f))
        return Plan(
            manifest=data["manifest"],
            donor=Side(**data["donor"]),
            target=Side(**data["target"]),
            changes=tuple(changes),
            findings=tuple(findings),
            hash_patterns=tuple(data.get("hash_patterns", ())),
            patch_files=tuple(data.get("patch_files", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{source}: the plan is damaged ({type(exc).__name__}: {exc})",
                        hint="make a new one with: transplant plan MANIFEST --out plan.json") from exc
