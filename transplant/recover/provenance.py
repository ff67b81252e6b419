"""What a target's history keeps of where its state came from (edge), for status and recover.

apply writes a *recipe* into the ``started`` event of each transaction
(``<venv>/.transplant/history.jsonl``): the manifest as data and its folder, the patch files
(local path, venv-relative destination, hash), the donor source's label and, when the
donor was a snapshot, the snapshot's index file. verify appends a ``verified`` event
(``ok`` true or false) naming the newest committed transaction. :func:`last_verified`
reads them back: the newest committed transaction that a passing verify followed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from transplant.apply import txn
from transplant.errors import TransplantError
from transplant.controller.patch_files import read_patch_files
from transplant.controller.state import refuse_loose, private_folder
from transplant.hosts.host import Host, SSHOptions
from transplant.core.manifest import Manifest
from transplant.core.plan import Plan

if TYPE_CHECKING:
    from transplant.donor.sources import Opened

__all__ = ["make_recipe", "record_verified", "last_verified", "known_states", "committed", "verified_log"]


def verified_log(state_dir: Path) -> Path:
    """The controller's log of verified states: ``<state>/verified.jsonl``."""
    return state_dir / "verified.jsonl"


def make_recipe(manifest: Manifest, plan: Plan, opened: Opened) -> dict[str, Any]:
    """The recipe apply records (see the module docstring).

    :param opened: the :class:`transplant.donor.sources.Opened` donor source in use.
    """
    venv_paths = {c.name for c in plan.changes if c.kind == "patch"}
    patches = []
    for p in read_patch_files(manifest):
        dest = next((v for v in sorted(venv_paths) if v.endswith("/" + p.dest)), None)
        patches.append({"local": p.local, "dest": p.dest, "venv_path": dest, "hash": p.hash})
    snap = opened.source.snapshot
    snapshot = snap.path if snap is not None else None
    return {
        "manifest": yaml.safe_load(Path(manifest.path).read_text(encoding="utf-8")),
        "manifest_dir": str(Path(manifest.path).resolve().parent),
        "manifest_path": str(Path(manifest.path).resolve()),
        "patches": patches,
        "donor": opened.source.label,
        "snapshot": str(Path(snapshot).resolve()) if snapshot is not None else None,
    }


def committed(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The committed transactions of a history record (``txn.history``), oldest first."""
    return [t for t in record["transactions"] if t.get("state") == "committed"]


def record_verified(host: Host, venv: str, ok: bool, when: float, *, log: Path | None = None,
                    ssh: SSHOptions | None = None) -> str | None:
    """Append a ``verified`` event for the newest committed transaction of the venv, and, when
    it passed, a line to the controller's log ``log`` (``<state>/verified.jsonl``: host, venv,
    transaction, the snapshot it came from, the SSH key and known_hosts that reached it), which
    ``transplant recover`` reads to find the last verified state anywhere.

    Nothing is written to a venv with no committed transaction (no state folder is made),
    nor to one whose python does not start (its verify failed already; there is no record
    to add to that matters more than that verdict).
    :returns: the transaction id recorded, or None.
    """
    try:
        record = txn.history(host, venv)
    except TransplantError:
        return None
    done = committed(record)
    if not done:
        return None
    txid = done[-1]["id"]
    txn.call(host, venv, "record", {"entry": {"id": txid, "event": "verified", "ok": ok, "time": when}})
    if ok and log is not None:
        started: dict[str, Any] = next((e for e in record["events"] if e.get("id") == txid and e.get("event") == "started"), {})
        recipe = found if isinstance(found := started.get("recipe"), dict) else {}
        keys = {k: str(Path(v).absolute()) for k, v in (("identity_file", getattr(ssh, "identity_file", None)),
                                                         ("known_hosts", getattr(ssh, "known_hosts", None))) if v}
        private_folder(log.parent)
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"time": when, "host": str(host.spec), "venv": venv, "transaction": txid,
                                     "snapshot": recipe.get("snapshot"), "ssh": keys}, sort_keys=True) + "\n")
    return txid


def known_states(log: Path) -> list[dict[str, Any]]:
    """The entries of the controller's verified log (see :func:`record_verified`), newest first,
    one per host and venv (its newest).

    :raises StateError: the log (or a folder from the state folder down to it) is owned by another
        user or writable by group or others: what it names would be rebuilt on a host.
    """
    refuse_loose(log, "the verified log", state_dir=log.parent)
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not (isinstance(entry, dict) and isinstance(entry.get("host"), str) and isinstance(entry.get("venv"), str)):
            continue
        if (entry["host"], entry["venv"]) not in seen:
            seen.add((entry["host"], entry["venv"]))
            out.append(entry)
    return out


def last_verified(record: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the newest committed transaction a passing verify followed, its ``started`` event), or
    (None, None). A transaction counts as verified when the newest ``verified`` event about it
    (after it committed) has ``ok`` true."""
    events = record["events"]
    for t in reversed(committed(record)):
        verdicts = [e for e in events if e.get("id") == t["id"] and e.get("event") == "verified"]
        if verdicts and verdicts[-1].get("ok") is True:
            started = next((e for e in events if e.get("id") == t["id"] and e.get("event") == "started"), None)
            return t, started
    return None, None
