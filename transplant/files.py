"""Reading and writing the controller's own files: manifests, patch files, saved plans (edge)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path

import yaml

from .errors import ManifestError, PlanError
from .manifest import Manifest, parse_manifest
from .model import Plan, plan_from_dict
from .planner import PatchFile

__all__ = ["load_manifest", "read_patch_files", "save_plan", "load_plan", "file_digest"]


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read, safe-load and validate a manifest; check that every patch source exists.

    :raises ManifestError: unreadable file, YAML syntax error (with line and column), or
        any validation problem; nothing else has run when it is raised.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(name, ["(file): not found; fix: give the path of an existing manifest, "
                                   "e.g. manifests/seed-migration.yaml"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(name, [f"(file): cannot be read ({exc}); fix: check the path and permissions"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(name, [f"(yaml): {problem} at {where}; fix: correct the YAML syntax there"]) from None
    manifest = parse_manifest(data, path=name)
    base = Path(path).resolve().parent
    problems = []
    for i, patch in enumerate(manifest.patches):
        source = base / patch.source
        if not source.exists():
            problems.append(f"patches[{i}].source: {patch.source!r} does not exist (looked in {base}); "
                            f"fix: create it or correct the path")
        elif patch.source.endswith("/") and not source.is_dir():
            problems.append(f"patches[{i}].source: {patch.source!r} is not a folder; fix: drop the trailing '/'")
        elif not (base in source.resolve().parents):
            problems.append(f"patches[{i}].source: {patch.source!r} resolves outside {base} (a symlink); "
                            f"fix: copy the file beside the manifest")
    if problems:
        raise ManifestError(name, problems)
    return manifest


def file_digest(path: Path) -> tuple[str, int]:
    """(``sha256=<urlsafe b64, no padding>``, size in bytes) of a file, as RECORD writes hashes (PEP 376)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            size += len(block)
            digest.update(block)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(), size


def read_patch_files(manifest: Manifest, site_packages: str) -> list[PatchFile]:
    """Expand the manifest's patches into files with hashes.

    :param site_packages: the target's site-packages relative to its venv prefix
        (``lib/python3.11/site-packages``); destinations become venv-relative.
    :raises ManifestError: a patch folder is empty, or holds a symlink pointing outside it.
    """
    base = Path(manifest.path).resolve().parent
    out: dict[str, PatchFile] = {}
    problems = []
    for i, patch in enumerate(manifest.patches):
        source = base / patch.source
        if source.is_dir():
            files = sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if not files:
                problems.append(f"patches[{i}].source: folder {patch.source!r} holds no files; fix: add files or drop it")
            pairs = [(f, patch.dest.rstrip("/") + "/" + f.relative_to(source).as_posix()) for f in files]
        else:
            dest = patch.dest + source.name if patch.dest.endswith("/") else patch.dest
            pairs = [(source, dest)]
        for file, dest in pairs:
            if base not in file.resolve().parents:
                problems.append(f"patches[{i}].source: {file} resolves outside {base}; fix: copy it beside the manifest")
                continue
            digest, size = file_digest(file)
            local = file.relative_to(base).as_posix()
            out[dest] = PatchFile(local=local, dest=f"{site_packages}/{dest}", hash=digest, size=size)
    if problems:
        raise ManifestError(manifest.path, problems)
    return [out[k] for k in sorted(out)]


def save_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Write a plan as JSON atomically (temporary file in the same folder, then rename)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(plan.to_dict(), handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, target)


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan saved by :func:`save_plan`.

    :raises PlanError: unreadable, not JSON, or not a plan document.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc})",
                        hint="make one with: transplant plan MANIFEST --out plan.json") from None
    return plan_from_dict(data, source=str(path))
