"""The manifest's patch files on the controller: expanded to files with RECORD-form hashes (edge)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from transplant.remote._common import record_hash_of  # RECORD's hash form, one definition
from transplant.errors import ManifestError
from transplant.core.manifest import Manifest
from transplant.core.planner import PatchFile

__all__ = ["file_digest", "read_patch_files"]


def file_digest(path: Path) -> tuple[str, int]:
    """(``sha256=<urlsafe b64, no padding>``, size in bytes) of a file, as RECORD writes hashes (PEP 376)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            size += len(block)
            digest.update(block)
    return record_hash_of(digest.digest()), size


def read_patch_files(manifest: Manifest) -> list[PatchFile]:
    """Expand the manifest's patches into files with hashes; destinations stay site-packages-relative.

    :raises ManifestError: a patch folder is empty, a file resolves outside the manifest's
        folder, or two patches write the same destination.
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
            if dest in out:
                problems.append(f"patches[{i}].dest: {dest!r} is also written by {out[dest].local!r}; "
                                f"fix: keep one patch per destination")
                continue
            out[dest] = PatchFile(local=local, dest=dest, hash=digest, size=size)
    if problems:
        raise ManifestError(manifest.path, problems)
    return [out[k] for k in sorted(out)]
