"""The plan document: changes, findings and fingerprints (pure core).

A :class:`Plan` is what ``transplant plan`` shows and ``--out`` saves as JSON
(schema ``transplant.plan/1``) and what ``apply`` executes. It is data: building it is
:func:`transplant.core.planner.plan`; reading a saved one is :func:`plan_from_dict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from transplant.errors import PlanError
from transplant.core.decode import DecodeError, Decoder
from transplant.core.json_text import dump_indented

__all__ = [
    "PLAN_SCHEMA",
    "SEVERITIES",
    "DIST_ACTIONS",
    "PATCH_ACTIONS",
    "FINDING_CODES",
    "UNFORCEABLE",
    "Finding",
    "FileCopy",
    "Change",
    "Side",
    "Plan",
    "plan_from_dict",
    "write_plan",
    "moved_roots",
]

PLAN_SCHEMA = "transplant.plan/1"
SEVERITIES = ("error", "warning", "info")
#: add: absent on the target; upgrade / downgrade: other public version; rebuild: same
#: public version, other local label (``+cu128`` -> ``+cu130``); refresh: same version,
#: files differ; keep: nothing to do; remove: the manifest's ``remove`` list uninstalls it.
DIST_ACTIONS = ("add", "upgrade", "downgrade", "rebuild", "refresh", "keep", "remove")
PATCH_ACTIONS = ("add", "replace", "keep")
#: Every finding code plan and verify can report (manifests/REFERENCE.md describes each).
FINDING_CODES = (
    "requirement-unmet", "duplicate-dist-info", "python-abi-mismatch", "platform-mismatch",
    "cuda-major-mismatch", "cuda-variant-mismatch", "lockstep-mismatch", "libtorch-abi",
    "driver-too-old", "gpu-arch-unsupported", "editable-install", "record-drift", "script-prefix",
    "interpreter-missing", "record-missing", "unsafe-path", "overlay-no-match", "overlay-target-only",
    "metadata-invalid", "remove-no-match", "accept-unused", "binary-unreadable", "file-owner-conflict",
    "closure-unmet", "closure-excluded", "target-record-missing",
    "undefined-symbol", "numpy-abi-mismatch", "libcuda-unversioned-missing",
    "outside-venv", "ptx-too-new", "host-library-missing", "python-version-mismatch", "cpu-isa-unsupported", "driver-unusable",
    "target-not-a-venv",
)
#: Codes that neither ``accept:`` nor ``--force`` lets through: applying past them would leave
#: the target in a state no installer can describe (a RECORD claiming another distribution's
#: files), or write into a Python installation other programs share (a target that is no venv).
UNFORCEABLE = ("file-owner-conflict", "target-not-a-venv")


@dataclass(frozen=True, kw_only=True)
class Finding:
    """Something plan or verify found: a stable kebab-case ``code``, a severity, the
    distributions and files involved, what was found (``message``) and the fix (``hint``).

    ``error`` blocks apply unless forced or ``accepted``; ``warning`` and ``info`` do not.

    :ivar accepted: the reason the manifest's ``accept`` list gives for this finding, or
        None when it is not accepted.
    """

    code: str
    severity: str
    dists: tuple[str, ...]
    message: str
    hint: str
    files: tuple[str, ...] = ()
    accepted: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")


@dataclass(frozen=True, kw_only=True)
class FileCopy:
    """One file to write on the target.

    :ivar path: POSIX path relative to the venv prefix where the target gets the file (for a
        donor file: where the donor has it too, unless ``donor_path`` says otherwise).
    :ivar size: bytes (None for a symlink).
    :ivar hash: ``sha256=<urlsafe b64>`` of the content, or ``symlink:<target>``.
    :ivar source: ``donor``, or ``patch`` for a file from the controller.
    :ivar local: for a patch, the source path relative to the manifest's folder; else None.
    :ivar head: for a console script whose shebang names the donor's prefix, the head
        apply writes instead (naming the target's interpreter); None copies verbatim.
    :ivar body_hash: with ``head``, the hash of the script's bytes after its head (the
        part that must arrive unchanged).
    :ivar link: for an absolute symlink into the donor's prefix, the target it gets on
        the target host (the same path under the target's prefix); ``hash`` is then
        ``symlink:<link>``. None copies a symlink as it is.
    :ivar record_identity: for a distribution's RECORD that lists console scripts apply
        rewrites, the normalised identity it must keep (``record:sha256=...``: its rows with
        the hash and size of rows under the scripts folder blanked; see
        ``record_identity`` in :mod:`transplant.remote.probe`); None copies it verbatim.
    :ivar record_scripts: with ``record_identity``, the venv-relative scripts whose RECORD
        rows apply sets to the sha256 and size of the file as written on the target (as
        pip writes rows for the scripts it generates); every other row stays the donor's.
    :ivar donor_path: for a donor file that lands elsewhere than the donor has it (a pure-Python
        distribution moved between the site-packages of two Python minors: its file
        ``lib/python3.13/site-packages/x.py`` lands at ``lib/python3.11/site-packages/x.py``), the
        venv-relative path the donor side reads; the same file name, ``path``'s folder is the
        target's. None: the donor reads ``path``. Staging, hashing and the target's state are
        keyed by ``path``; a snapshot holds the file under ``donor_path``.
    """

    path: str
    size: int | None
    hash: str
    source: str = "donor"
    local: str | None = None
    head: str | None = None
    body_hash: str | None = None
    link: str | None = None
    record_identity: str | None = None
    record_scripts: tuple[str, ...] = ()
    donor_path: str | None = None

    @property
    def read_path(self) -> str:
        """The venv-relative path the donor side reads: ``donor_path``, else ``path``."""
        return self.donor_path if self.donor_path is not None else self.path

    @staticmethod
    def plain(path: str, size: int | None, hash: str) -> FileCopy:
        """``FileCopy(path=path, size=size, hash=hash)`` (a donor file copied verbatim, every other
        field its default), built without the frozen dataclass's ``__init__`` (one ``__setattr__``
        per field): the real pair's forward plan makes 66,700 of them."""
        copy = _NEW(FileCopy)
        _SET(copy, "path", path)  # in __init__'s order: the instances share their attribute table's keys
        _SET(copy, "size", size)
        _SET(copy, "hash", hash)
        return copy  # the other fields read their defaults from the class, as dataclasses keep them there

    @property
    def identity(self) -> str:
        """What the target file must be after apply: its hash, for a rewritten script
        ``script:<body hash>:<head>``, for a RECORD whose script rows apply sets
        ``record:sha256=<...>`` (its normalised identity)."""
        if self.record_identity is not None:
            return self.record_identity
        if self.head is not None:
            return f"script:{self.body_hash}:{self.head}"
        return self.hash


def moved_roots(donor_path: str, path: str) -> tuple[str, str, str] | None:
    """Split a moved file's two venv-relative paths into (the donor's folder, the target's folder,
    the path below both): the longest trailing run of path components they share is the
    path below, what precedes it on each side the folder (``lib/python3.13``, ``lib/python3.11``,
    ``site-packages/x.py``). A transfer copies ``<donor root>/<donor folder>/<below>`` to
    ``<staged>/<target folder>/<below>``.

    :returns: None when the two paths do not even end in the same file name (no transfer can
        place such a file), or are the same.
    """
    donor_parts, parts = donor_path.split("/"), path.split("/")
    shared = 0
    while shared < min(len(donor_parts), len(parts)) - 1 and donor_parts[-1 - shared] == parts[-1 - shared]:
        shared += 1
    if shared == 0 or donor_path == path:
        return None
    return ("/".join(donor_parts[:-shared]), "/".join(parts[:-shared]), "/".join(parts[-shared:]))


_NEW, _SET = object.__new__, object.__setattr__
if any(f.default is MISSING or getattr(FileCopy, f.name, MISSING) is not f.default
       for f in fields(FileCopy) if f.name not in ("path", "size", "hash")):  # a new field must be set by plain()
    raise TypeError("FileCopy.plain: a field other than path, size and hash has no plain default on the class")


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
        """The error findings the manifest does not accept (they block apply unless forced)."""
        return tuple(f for f in self.findings if f.severity == "error" and f.accepted is None)

    @property
    def refused(self) -> tuple[Finding, ...]:
        """The error findings of :data:`UNFORCEABLE` codes: apply refuses them even with
        ``--force`` or an ``accept:`` entry."""
        return tuple(f for f in self.findings if f.severity == "error" and f.code in UNFORCEABLE)

    @property
    def has_changes(self) -> bool:
        """True when any change copies or removes a file."""
        return any(not c.is_noop for c in self.changes)

    @property
    def copy_bytes(self) -> int:
        """Bytes to copy over all changes."""
        return sum(c.bytes for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (schema ``transplant.plan/1``), stable key order: each dataclass's
        fields in declaration order; the same as :func:`dataclasses.asdict`
        gives, without its deep copy of every value (seconds on a 60,000-file plan)."""
        return _encode(self)


def _encode(value: Any) -> Any:
    """A plan dataclass, tuple or scalar as JSON-ready data (what :func:`dataclasses.asdict` gives)."""
    names = _FIELD_NAMES.get(type(value))
    if names is not None:
        return {name: _encode(getattr(value, name)) for name in names}
    if type(value) is tuple:
        return tuple(_encode(v) for v in value)
    if type(value) is list:
        return [_encode(v) for v in value]
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in (Plan, Finding, FileCopy, Change, Side)}


def write_plan(plan: Plan, write: Callable[[str], object], extra: Mapping[str, Any] | None = None) -> None:
    """Write ``json.dumps({**plan.to_dict(), **extra}, indent=2, sort_keys=True)``'s text (no
    trailing newline) through ``write``, in pieces, in one walk of the plan
    (:func:`transplant.core.json_text.dump_indented` with the plan's classes as ``fields``): no
    :meth:`Plan.to_dict` tree is built first (the real pair's forward plan: 66,800 files to copy).

    :param extra: top-level keys added, or replacing the plan's (``donor_source``, an absolute
        ``manifest``); JSON's own types only. None adds nothing.
    :raises TypeError: a value ``json`` cannot write (as :func:`dump_indented`).
    """
    top: dict[str, Any] = {name: getattr(plan, name) for name in _FIELD_NAMES[Plan]}
    top.update(extra or {})
    dump_indented(top, write, fields=_FIELD_NAMES)


_REMAKE = "make a new one with: transplant plan MANIFEST --out plan.json"
#: The plan's one decoder: every field typed by its annotation, unknown keys refused.
_DECODE = Decoder(Plan, unknown="error")


def plan_from_dict(data: Mapping[str, Any], *, source: str) -> Plan:
    """Rebuild a :class:`Plan` from its JSON form, checking the type of every value.

    Paths inside the plan are checked again by apply before anything is written.

    :param source: the file it came from, for messages.
    :raises PlanError: another schema, or a missing, unknown or mistyped key (named by its
        path, ``plan.changes[0].copy[1].hash``), decoded by :class:`transplant.core.decode.Decoder`;
        a change whose ``kind`` or ``action`` is none of :data:`DIST_ACTIONS` / :data:`PATCH_ACTIONS`.
    """
    if not isinstance(data, Mapping):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false",
                type(None): "null"}.get(type(data), type(data).__name__)
        raise PlanError(f"{source}: not a transplant plan (the JSON document is {kind}, not an object with "
                        f"schema {PLAN_SCHEMA!r})", hint=_REMAKE)
    if data.get("schema") != PLAN_SCHEMA:
        raise PlanError(f"{source}: not a transplant plan (schema {data.get('schema')!r}, expected {PLAN_SCHEMA!r})",
                        hint=_REMAKE)
    try:
        plan = _DECODE(data, "plan")
    except DecodeError as exc:
        raise PlanError(f"{source}: plan key {exc.path!r}: {exc.in_words()}",
                        hint=_REMAKE) from None
    for index, change in enumerate(plan.changes):
        actions = {"distribution": DIST_ACTIONS, "patch": PATCH_ACTIONS}.get(change.kind)
        if actions is None:
            raise PlanError(f"{source}: plan key 'plan.changes[{index}].kind': expected distribution or patch, "
                            f"got {change.kind!r}", hint=_REMAKE)
        if change.action not in actions:
            raise PlanError(f"{source}: plan key 'plan.changes[{index}].action': expected one of "
                            f"{', '.join(actions)} for a {change.kind}, got {change.action!r}", hint=_REMAKE)
    return plan
