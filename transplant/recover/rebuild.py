"""Rebuild a known-good state on a new host without the original donor (edge): ``transplant recover``.

A recovery writes an ordinary manifest into a work folder under the state folder
(``recover/<id>/manifest.yaml``, with the patch files beside it) and then runs the usual
plan, apply and verify on it, so every step is the one the user knows and can re-run:

* **from a host's history** (``--from HOST:VENV``): the newest transaction there that a
  passing verify followed (:func:`transplant.recover.provenance.last_verified`) gives the manifest it
  was applied with (its recipe); that venv, which holds exactly that state, becomes the
  donor (the snapshot it came from, if any, its fallback), and the patch files are read
  back from it and checked against the hashes the recipe recorded. A host whose applied
  files drifted since is refused (``force`` overrides).
* **from a snapshot** (``--snapshot``): the manifest the snapshot was taken with, the
  snapshot as the donor, the patch files from the store (hash-checked).
"""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from transplant.donor import store as cas
from transplant.apply import txn
from transplant.errors import RecoverError
from transplant.controller.patch_files import file_digest
from transplant.hosts.host import Host, LocalHost
from transplant.core.inventory import inside_path, protected_path
from transplant.core.manifest import Endpoint
from transplant.recover.provenance import last_verified
from transplant.donor.snapshot import Snapshot
from transplant.recover.status import read_status
from transplant.hosts.transfer import copy_files
from transplant.core.units import count

__all__ = ["RecoverError", "Recovery", "recorded_patches", "from_history", "from_snapshot"]


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """A written recovery manifest: ``manifest`` its path, ``origin`` one line saying what
    state it rebuilds and from where."""

    manifest: Path
    origin: str


def _work(state_dir: Path) -> Path:
    folder = state_dir / "recover" / (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8])
    folder.mkdir(parents=True)
    return folder


def _controller_ssh(data: dict[str, Any], base: str, ssh: dict[str, str]) -> dict[str, Any]:
    """SSH settings for a recovery manifest from a snapshot in the controller's own store: its
    manifest's key and known_hosts files (made absolute from its folder) and connect timeout,
    then ``ssh`` over them. ``verify_host_keys`` is never carried over: host keys are checked."""
    raw = found if isinstance(found := data.get("ssh"), dict) else {}
    out: dict[str, Any] = {}
    for key in ("identity_file", "known_hosts"):
        if isinstance(raw.get(key), str):
            path = Path(raw[key]).expanduser()
            out[key] = str(path if path.is_absolute() else Path(base) / path)
    if isinstance(raw.get("connect_timeout"), (int, float)) and not isinstance(raw.get("connect_timeout"), bool):
        out["connect_timeout"] = raw["connect_timeout"]
    out.update(ssh)
    return out


def _write(folder: Path, data: dict[str, Any], donor: dict[str, Any], target: Endpoint, ssh: dict[str, Any]) -> Path:
    manifest = {k: v for k, v in data.items() if k not in ("target", "targets", "donor", "ssh")}
    manifest.update({"donor": donor, "target": {"host": str(target.host), "venv": target.venv}})
    if ssh:
        manifest["ssh"] = ssh
    path = folder / "manifest.yaml"
    path.write_text("# written by transplant recover\n" + yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    return path


def _place(folder: Path, local: str) -> Path:
    dest = (folder / local).resolve()
    if folder.resolve() not in dest.parents:
        raise RecoverError(f"refusing the recorded patch path {local!r}: it leaves the work folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def recorded_patches(recipe: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The recipe's patch entries, each checked before any is read back: ``venv_path`` a
    venv-relative path (not absolute, no ``..``, not the venv's own files), ``local`` a path
    inside the manifest's folder, ``hash`` RECORD's sha256 form. The history lives on the host,
    so it is input like any other, and an edited one must not make recover read or move files
    outside the venv or write outside its work folder.

    :raises RecoverError: the first bad entry, named, with the fix.
    """
    raw = recipe.get("patches") or []
    out = []
    for i, p in enumerate(raw if isinstance(raw, list) else [raw]):
        fields = {k: p.get(k) for k in ("venv_path", "local", "hash")} if isinstance(p, dict) else {}
        venv_path, local, digest = fields.get("venv_path"), fields.get("local"), fields.get("hash")
        problem = None
        if venv_path is None and isinstance(p, dict):
            problem = f"it does not say where in the venv the patch {local!r} went"
        elif not (isinstance(venv_path, str) and inside_path(venv_path) == venv_path and not protected_path(venv_path)):
            problem = f"its venv path {venv_path!r} is not a file inside the venv"
        elif not (isinstance(local, str) and inside_path(local) == local):
            problem = f"its local path {local!r} leaves the manifest's folder"
        else:
            try:
                cas.object_key(digest if isinstance(digest, str) else "")
            except ValueError:
                problem = f"its hash {digest!r} is not a RECORD sha256 hash"
        if problem:
            raise RecoverError(f"{where}: the recorded recipe's patches[{i}] is refused: {problem} (the history "
                               f"was edited or damaged); nothing was read", hint="recover from a snapshot instead")
        out.append({"venv_path": venv_path, "local": local, "hash": digest})
    return out


def from_history(host: Host, venv: str, target: Endpoint, state_dir: Path, *, ssh: dict[str, str],
                 force: bool = False) -> Recovery:
    """Write the recovery manifest for the newest verified state of ``host:venv`` (see the module docstring).

    :param target: the host and venv to rebuild it on.
    :param ssh: the controller's ``identity_file`` / ``known_hosts`` (absolute path strings: the
        command line's, else those that reached ``host``); the manifest's only SSH settings.
        Nothing of the recipe's ``ssh`` block is used: it was read from the host.
    :raises RecoverError: no transaction there was applied and then verified, it has no
        recipe (applied by an older transplant), its files drifted (unless ``force``), or a
        patch file read back differs from what was applied.
    """
    where = f"{host.label}:{venv}"
    record = txn.history(host, venv)
    applied, started = last_verified(record)
    if applied is None:
        raise RecoverError(f"{where}: no transaction there was applied and then verified; nothing to rebuild from",
                           hint="verify it first (transplant verify MANIFEST), or recover from a snapshot "
                                "(transplant recover --snapshot ID --target HOST)")
    recipe = (started or {}).get("recipe")
    if not isinstance(recipe, dict) or not isinstance(recipe.get("manifest"), dict):
        raise RecoverError(f"{where}: transaction {applied['id']} has no recorded recipe (applied by an older "
                           f"transplant); recover from a snapshot instead")
    # the applier lists transactions in the order they began (ids of one second do not sort by text)
    done = [t["id"] for t in record["transactions"] if t.get("state") == "committed"]
    later = done[done.index(applied["id"]) + 1:]
    if later:
        raise RecoverError(f"{where}: transaction {applied['id']} is the newest verified one, but {', '.join(later)} "
                           f"was applied after it and not verified", hint=f"verify {where} first")
    status = read_status(host, venv, record=False)  # the source is only read
    if status.drift and not force:
        raise RecoverError(f"{where}: {count(len(status.drift), 'applied file')} changed since; it no longer holds the "
                           f"verified state: " + "; ".join(status.drift[:5]),
                           hint="recover from a snapshot instead, or add --force to take the files as they are")
    recipe = _summed(record, applied, recipe, where)
    patches = recorded_patches(recipe, where)
    folder = _work(state_dir)
    if patches:
        fetched = folder / ".fetched"
        copy_files(host, venv, LocalHost(), str(fetched), [p["venv_path"] for p in patches], staging=state_dir)
        for p in patches:
            got, _ = file_digest(fetched / p["venv_path"])
            if got != p["hash"] and not force:
                raise RecoverError(f"{where}: the patch file {p['venv_path']} differs from what was applied "
                                   f"({p['local']})", hint="recover from a snapshot instead")
            shutil.move(str(fetched / p["venv_path"]), _place(folder, p["local"]))
        shutil.rmtree(fetched, ignore_errors=True)
    donor: dict[str, Any] = {"host": str(host.spec), "venv": venv}
    if recipe.get("snapshot"):
        donor["fallback"] = [{"snapshot": recipe["snapshot"]}]
    # the recipe is data read from the host: its ssh block never reaches the new manifest (a recorded
    # verify_host_keys: false or another known_hosts would lower the controller's own checks)
    path = _write(folder, recipe["manifest"], donor, target, dict(ssh))
    summed = recipe.get("summed") or [applied["id"]]
    held = f", with what the {count(len(summed) - 1, 'earlier transaction')} {', '.join(summed[:-1])} left" \
        if len(summed) > 1 else ""
    return Recovery(manifest=path, origin=f"transaction {applied['id']} of {where} (applied from "
                                          f"{(started or {}).get('source', '?')}, verified){held}")


def _summed(record: dict[str, Any], applied: dict[str, Any], newest: dict[str, Any], where: str) -> dict[str, Any]:
    """The recipe of the state ``applied`` left: every committed transaction's recipe up to it,
    summed (:func:`transplant.recover.recipesum.sum_recipes`).

    :raises RecoverError: an earlier committed transaction has no recipe (applied by an older
        transplant), so the state it left cannot be rebuilt.
    """
    from transplant.recover.provenance import committed
    from transplant.recover.recipesum import sum_recipes

    recipes = []
    for t in committed(record):  # oldest first, in the order they began (the applier's listing)
        if t["id"] == applied["id"]:
            recipes.append((t["id"], newest))
            break
        started = next((e for e in record["events"] if e.get("id") == t["id"] and e.get("event") == "started"), None)
        recipe = (started or {}).get("recipe")
        if not isinstance(recipe, dict) or not isinstance(recipe.get("manifest"), dict):
            raise RecoverError(f"{where}: the earlier transaction {t['id']} has no recorded recipe (applied by an "
                               f"older transplant), so the state it left cannot be rebuilt; recover from a snapshot")
        recipes.append((t["id"], recipe))
    return sum_recipes(recipes)


def from_snapshot(snap: Snapshot, target: Endpoint, state_dir: Path, *, ssh: dict[str, str],
                  donor: dict[str, Any] | None = None) -> Recovery:
    """Write the recovery manifest that rebuilds ``snap`` (its manifest, its patches) on ``target``.

    :param donor: the manifest's ``donor`` (a registry snapshot: ``{snapshot: oci://..., ca}``);
        None: ``{snapshot: <snap's index file>}``.

    :raises StoreError: a patch file is missing from the store or fails its hash check.
    :raises RecoverError: the snapshot holds no manifest (an older or damaged index).
    """
    data = snap.manifest.get("data")
    if not isinstance(data, dict):
        raise RecoverError(f"snapshot {snap.path}: it holds no manifest to rebuild from",
                           hint="take the snapshot again with transplant snapshot MANIFEST")
    folder = _work(state_dir)
    for p in snap.patches:
        cas.read_into(snap.store, p["hash"], _place(folder, p["local"]))
    path = _write(folder, data, donor or {"snapshot": str(snap.path.resolve())}, target,
                  _controller_ssh(data, str(snap.manifest.get("dir") or "."), ssh))
    return Recovery(manifest=path, origin=f"snapshot {snap.id} of {snap.donor_host}:{snap.donor_venv}")
