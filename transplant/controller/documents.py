"""Reading and writing the controller's own files: manifests, patch files, saved plans (edge)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

import yaml

from transplant.remote._common import record_hash_of  # RECORD's hash form, one definition
from transplant.errors import ManifestError, PlanError, TransplantError
from transplant.core.manifest import Manifest, parse_manifest
from transplant.core.plan import Plan, plan_from_dict
from transplant.core.planner import PatchFile

__all__ = ["load_manifest", "read_patch_files", "save_plan", "load_plan", "file_digest", "check_plan_destination"]


#: the largest manifest read (bytes): a real one is a few KiB; YAML takes minutes over tens of MiB
MAX_MANIFEST_BYTES = 1 << 20
#: the largest saved plan read (bytes): about 200 bytes a file, so over a million files
MAX_PLAN_BYTES = 256 << 20


class _DuplicateKey(Exception):
    pass


class _NotRegular(Exception):
    pass


def _read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Opened without blocking (a FIFO given as the file never waits for a writer) and checked
    with fstat on the open file before anything is read.

    :raises FileNotFoundError: it does not exist.
    :raises OSError: it cannot be opened or read.
    :raises _NotRegular: it is not a regular file, or it is larger than ``limit`` (the message says which).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise _NotRegular(f"is {kind}, not a regular file")
        if info.st_size > limit:
            raise _NotRegular(f"is {info.st_size} bytes, over the limit of {limit} bytes")
        chunks, size = [], 0
        while size <= limit:
            block = os.read(fd, min(1 << 20, limit + 1 - size))
            if not block:
                break
            chunks.append(block)
            size += len(block)
        if size > limit:
            raise _NotRegular(f"grew past the limit of {limit} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML 1.2 says keys are unique)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                mark = key_node.start_mark
                raise _DuplicateKey(f"(yaml): a key that is a {type(key).__name__} (line {mark.line + 1}, "
                                    f"column {mark.column + 1}); fix: write plain names as keys (a '? [a, b]' "
                                    f"complex key is not part of a manifest)")
            if key in seen:
                mark = key_node.start_mark
                raise _DuplicateKey(f"(yaml): the key {key!r} is given twice (line {mark.line + 1}); "
                                    f"fix: keep one of them")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read, safe-load and validate a manifest; check that every patch source exists.

    :raises ManifestError: unreadable file, not a regular file (a FIFO is not waited on),
        over :data:`MAX_MANIFEST_BYTES`, YAML syntax error (with line and column), a key
        that is not a scalar, or any validation problem; nothing else has run when it is raised.
    """
    name = str(path)
    try:
        text = _read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ManifestError(name, ["(file): not found; fix: give the path of an existing manifest, "
                                   "e.g. manifests/seed-migration.yaml"]) from None
    except _NotRegular as exc:
        raise ManifestError(name, [f"(file): {exc}; fix: give the path of the manifest file itself "
                                   f"(a YAML file of at most {MAX_MANIFEST_BYTES // 1024} KiB)"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(name, [f"(file): cannot be read ({exc}); fix: check the path and permissions"]) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ManifestError(name, ["(yaml): nested too deeply; fix: a manifest needs at most a few levels"]) from None
    except _DuplicateKey as exc:
        raise ManifestError(name, [str(exc)]) from None
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


def check_plan_destination(path: str | os.PathLike, *, manifest: str) -> None:
    """Refuse a ``--out`` path that cannot or must not be replaced by a plan file.

    :raises TransplantError: its folder is missing, it is a folder or another non-regular
        file (a device, a FIFO), or it is the manifest itself.
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    fix = "give --out a new file name in an existing folder, e.g. --out plan.json"
    if not parent.is_dir():
        raise TransplantError(f"--out {path}: the folder {parent} does not exist", hint=fix)
    if target.exists() or target.is_symlink():
        if not target.is_file() or target.is_symlink():
            raise TransplantError(f"--out {path}: exists and is not a regular file; refusing to replace it", hint=fix)
        if target.resolve() == Path(manifest).resolve():
            raise TransplantError(f"--out {path}: that is the manifest itself", hint=fix)


def save_plan(plan: Plan, path: str | os.PathLike, *, manifest: str) -> None:
    """Write a plan as JSON atomically (temporary file in the same folder, fsync, rename), with
    the manifest's path made absolute (``apply plan.json`` works from any folder).

    :raises TransplantError: as :func:`check_plan_destination`, or the write failed (the
        temporary file is removed).
    """
    check_plan_destination(path, manifest=manifest)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            # the manifest's path absolute: the plan is applied from any folder
            json.dump({**plan.to_dict(), "manifest": os.path.abspath(plan.manifest)}, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise TransplantError(f"--out {path}: cannot write the plan ({exc.strerror})") from None


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan saved by :func:`save_plan`.

    :raises PlanError: unreadable, not a regular file (a FIFO is not waited on), over
        :data:`MAX_PLAN_BYTES`, not JSON, nested too deeply, or not a plan document.
    """
    hint = "make one with: transplant plan MANIFEST --out plan.json"
    try:
        data = json.loads(_read_regular(path, MAX_PLAN_BYTES).decode("utf-8"))
    except _NotRegular as exc:
        raise PlanError(f"{path}: refusing the plan: it {exc}", hint=hint) from None
    except RecursionError:
        raise PlanError(f"{path}: refusing the plan: it is nested too deeply to be a plan", hint=hint) from None
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc})", hint=hint) from None
    try:
        return plan_from_dict(data, source=str(path))
    except RecursionError:
        raise PlanError(f"{path}: refusing the plan: it is nested too deeply to be a plan", hint=hint) from None
