"""Apply a plan to the target (edge): move the differing files, remove stale ones, check.

Order, so that a half-copied distribution does not look installed: package files
first, then the donor's dist-info folders, then patch files, then the shebangs of
console scripts from the donor are rewritten for the target's prefix, then the removals (old
files and old dist-info folders); last, every path the plan touched is hashed again on
the target and must equal the planned state hash for hash (the files it left alone were
found identical when the plan was made). rsync writes each file under a temporary name in its
folder and renames it into place, so other hardlinks to a replaced file keep their
bytes. A history line is appended to ``<venv>/.transplant/history.jsonl`` before and
after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import TransplantError
from .hosts import Host, LocalHost
from .inventory import inside_path, protected_path
from .model import Plan
from .probing import run_script, take_inventory
from .state import expected_state, state_mismatches
from .transfer import copy_files

__all__ = ["ApplyResult", "ApplyError", "execute", "check_plan_paths", "default_state_dir"]

Progress = Callable[[str, int, int], None]


class ApplyError(TransplantError):
    """Apply failed; ``mismatches`` lists the files that differ from the plan, if any."""

    def __init__(self, message: str, *, hint: str | None = None, mismatches: list[str] | None = None) -> None:
        super().__init__(message, hint=hint)
        self.mismatches = mismatches or []


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    """What apply did: files and bytes copied (bytes as rsync moved them), files removed, seconds,
    and ``steps``: (step name, seconds) for the transfer, the removals and the final check."""

    transaction: str
    files_copied: int
    bytes_moved: int
    files_removed: int
    seconds: float
    steps: tuple[tuple[str, float], ...] = ()


def check_plan_paths(plan: Plan, manifest_dir: Path) -> None:
    """Refuse a plan with any path that leaves its root, before anything is written.

    Every copied and removed path must be relative to the venv and stay inside it once
    normalised; every patch source must be a regular file inside the manifest's folder
    (symlinks resolved).

    :raises ApplyError: naming the first bad path and the change it belongs to.
    """
    base = manifest_dir.resolve()
    for change in plan.changes:
        paths = [c.path for c in change.copy] + list(change.remove)
        if change.dist_info is not None:
            paths.append(change.dist_info)
        for path in paths:
            if inside_path(path) != path:
                raise ApplyError(f"refusing the plan: {change.name}: path {path!r} is not a normalised path "
                                 f"inside the venv", hint=_REPLAN)
            if protected_path(path):
                raise ApplyError(f"refusing the plan: {change.name}: path {path!r} is part of the venv itself",
                                 hint=_REPLAN)
        for copy in change.copy:
            if copy.source == "donor":
                continue
            if copy.source != "patch" or copy.local is None or inside_path(copy.local) != copy.local:
                raise ApplyError(f"refusing the plan: {change.name}: bad patch source {copy.local!r}", hint=_REPLAN)
            source = (base / copy.local).resolve()
            if base not in source.parents or not source.is_file():
                raise ApplyError(f"refusing the plan: patch source {copy.local!r} is not a file inside {base}",
                                 hint=_REPLAN)


_REPLAN = "make a fresh plan from the manifest: transplant plan MANIFEST --out plan.json"


def _stage_patches(plan: Plan, manifest_dir: Path, staging: Path) -> list[str]:
    paths = []
    for change in plan.changes:
        for copy in change.copy:
            if copy.source != "patch" or copy.local is None:
                continue
            source = (manifest_dir / copy.local).resolve()
            dest = staging / copy.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
            paths.append(copy.path)
    return paths


def execute(
    plan: Plan,
    *,
    donor: Host,
    target: Host,
    manifest_dir: Path,
    state_dir: Path,
    progress: Progress | None = None,
    timeout: float | None = None,
) -> ApplyResult:
    """Carry out ``plan``: copy, remove, then check the target against the planned state.

    :param donor: connected donor host; :param target: connected target host.
    :param manifest_dir: folder the patch sources are relative to.
    :param state_dir: the controller's state folder (staging for relayed copies).
    :param progress: called with (step name, bytes done, bytes in all).
    :param timeout: seconds for each transfer; None waits without limit.
    :raises ApplyError: a path in the plan leaves its root (checked before any write), a
        host script refused a path, or the target differs from the plan afterwards
        (``mismatches`` names the files).
    :raises HostError: a host could not be reached or rsync failed.
    """
    check_plan_paths(plan, manifest_dir)
    started = time.monotonic()
    transaction = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
    venv = plan.target.venv
    run_script(target, venv, "applier", ["record"], request={"entry": {
        "id": transaction, "event": "started", "time": time.time(), "donor": plan.donor.label,
        "plan_donor": plan.donor.fingerprint, "plan_target": plan.target.fingerprint}})
    staging = state_dir / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    dist_infos = [c.dist_info + "/" for c in plan.changes if c.dist_info]
    donor_files = [cp.path for c in plan.changes for cp in c.copy if cp.source == "donor"]
    package_files = [p for p in donor_files if not any(p.startswith(d) for d in dist_infos)]
    metadata_files = [p for p in donor_files if any(p.startswith(d) for d in dist_infos)]
    moved = copied = 0

    def report(step: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(step, done, total))

    steps: list[tuple[str, float]] = []
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps.append((name, now - mark))
        mark = now

    for step, paths in (("package files", package_files), ("dist-info", metadata_files)):
        if paths:
            result = copy_files(donor, plan.donor.venv, target, venv, paths, staging=staging,
                                progress=report(step), timeout=timeout)
            moved += result.bytes
            copied += len(paths)
    patch_dir = Path(tempfile.mkdtemp(prefix="patches-", dir=staging))
    try:
        patch_paths = _stage_patches(plan, manifest_dir, patch_dir)
        if patch_paths:
            result = copy_files(LocalHost(), str(patch_dir), target, venv, patch_paths, staging=staging,
                                progress=report("patches"), timeout=timeout)
            moved += result.bytes
            copied += len(patch_paths)
    finally:
        shutil.rmtree(patch_dir, ignore_errors=True)
    scripts = [{"path": cp.path, "head": cp.head, "body_hash": cp.body_hash}
               for c in plan.changes for cp in c.copy if cp.head is not None]
    if scripts:
        reply = run_script(target, venv, "applier", ["heads"], request={"scripts": scripts})
        if not reply.get("ok"):
            raise ApplyError(f"{plan.target.label}: rewriting console scripts: {reply.get('error')}")
    lap("transfer")
    expected = expected_state(plan)
    removals = sorted(p for p, want in expected.items() if want is None)
    removed = 0
    if removals:
        reply = run_script(target, venv, "applier", ["remove"], request={"paths": removals})
        if not reply.get("ok"):
            raise ApplyError(f"{plan.target.label}: {reply.get('error')}")
        removed = int(reply.get("removed", 0))
    lap("removals")
    after = take_inventory(target, venv, files=sorted(expected), record=False)
    mismatches = state_mismatches(expected, after)
    lap("check")
    outcome = "applied" if not mismatches else "differs"
    run_script(target, venv, "applier", ["record"], request={"entry": {
        "id": transaction, "event": outcome, "time": time.time(), "files_copied": copied,
        "files_removed": removed, "target_after": after.fingerprint}})
    if mismatches:
        raise ApplyError(
            f"{plan.target.label}: after apply, {len(mismatches)} files differ from the plan",
            hint="run transplant plan again to see the target's state, then apply again",
            mismatches=mismatches,
        )
    return ApplyResult(transaction=transaction, files_copied=copied, bytes_moved=moved,
                       files_removed=removed, seconds=time.monotonic() - started, steps=tuple(steps))


def default_state_dir() -> Path:
    """The controller's state folder: ``$TRANSPLANT_STATE_DIR``, else ``$XDG_STATE_HOME/transplant``
    (``~/.local/state/transplant``)."""
    explicit = os.environ.get("TRANSPLANT_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "transplant"
