"""What a target holds and whether it still does (edge): ``transplant status HOST:VENV``.

The target's own records are the source (``<venv>/.transplant/``): each committed
transaction's ``after.json`` (the state it left, path -> hash, None for a removal) and the
history events (``started`` with its source and recipe, ``applied``, ``verified``). The
state the venv should be in is every committed transaction's ``after`` in order, a later
one winning for a path; each path is hashed on the target now and compared, and every
one that no longer matches is drift. So is a file of an applied distribution that apply did
not write (the same in both versions) and that no longer matches its RECORD row. A committed transaction whose history has no outcome (its
host script completed the commit after the controller died) gets it recorded first, under the
target's lock (see :func:`transplant.apply.txn.record_completed`); while another apply holds the lock it
is listed as ``unrecorded`` instead. Bytecode (``__pycache__/*.pyc``) is left out: the
interpreter rewrites it whenever it finds it stale (PEP 3147), so a changed ``.pyc`` is a
cache refreshed, not an edit; its source file is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transplant.apply import txn
from transplant.hosts.host import Host
from transplant.hosts.probing import take_inventory
from transplant.core.planner import pyc_source
from transplant.recover.provenance import committed
from transplant.reporting import QUIET, Reporter

__all__ = ["Applied", "Status", "read_status"]


@dataclass(frozen=True, kw_only=True)
class Applied:
    """One committed transaction: ``id``, ``source`` (the donor or snapshot label), ``applied``
    (seconds since the epoch, None when unrecorded), ``verified`` (True / False for the newest
    verify after it, None when none ran), ``manifest`` (the path apply was given, or None)."""

    id: str
    source: str
    applied: float | None
    verified: bool | None
    manifest: str | None
    snapshot: str | None
    files: int


@dataclass(frozen=True, kw_only=True)
class Status:
    """A target's status: ``transactions`` oldest first, ``interrupted`` ids, ``drift`` lines
    (one per path that no longer matches its recorded state) out of ``checked`` paths (the
    applied paths, bytecode left out); ``completed``: commits a host script completed after its
    controller died, whose outcome was recorded now; ``unrecorded``: ids of such commits that
    could not be recorded now (another apply holds the lock)."""

    where: str
    transactions: tuple[Applied, ...]
    interrupted: tuple[str, ...]
    drift: tuple[str, ...]
    checked: int
    unrecorded: tuple[str, ...] = ()
    completed: tuple[txn.Completed, ...] = ()
    #: every applied path, bytecode included (the unit history's and the table's ``paths`` count)
    applied_paths: int = 0
    #: the applied distributions' other files, checked against their RECORD rows
    record_checked: int = 0
    #: ids of transactions applied and then rolled back, oldest first
    rolled_back: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (schema ``transplant.status/1``)."""
        return {"schema": "transplant.status/1", "where": self.where,
                "transactions": [t.__dict__ for t in self.transactions], "interrupted": list(self.interrupted),
                "drift": list(self.drift), "checked": self.checked, "record_checked": self.record_checked,
                "rolled_back": list(self.rolled_back),
                "unrecorded": list(self.unrecorded),
                "completed": [{"id": c.id, "outcome": c.outcome, "committed_at": c.committed_at}
                              for c in self.completed]}


def _event(events: list[dict[str, Any]], txid: str, name: str) -> dict[str, Any] | None:
    found = [e for e in events if e.get("id") == txid and e.get("event") == name]
    return found[-1] if found else None


def _text(value: Any) -> str | None:
    """A recorded text field, or None when the history holds something else there (it is the host's input)."""
    return value if isinstance(value, str) else None


def _record_completed(host: Host, venv: str, reporter: Reporter) -> list[txn.Completed]:
    """Under the target's lock, record the outcome of commits completed by the host; nothing
    (and no lock taken) when none lacks one, or when another apply holds the lock or runs."""
    from transplant.apply.execute import new_transaction_id

    if not txn.unrecorded(txn.history(host, venv)):
        return []
    txid = new_transaction_id()
    try:
        txn.acquire(host, venv, txid, "transplant status", reporter=reporter)
    except txn.TransactionError:
        return []  # a live apply (or another controller's) holds it: that one records it
    try:
        txn.interrupted(host, venv, wait=0)
        return txn.record_completed(host, venv)
    except txn.TransactionError:
        return []  # a commit or rollback still runs there
    finally:
        txn.release(host, venv, txid)


def read_status(host: Host, venv: str, *, reporter: Reporter = QUIET, record: bool = True) -> Status:
    """Read the target's records and hash the paths its transactions left; first record the
    outcome of commits a host script completed after its controller died.

    :param reporter: told a note for each notice (a dead holder's lock broken).
    :param record: False reads only: such commits are then listed in ``unrecorded``.
    :raises HostError: the host cannot be reached or the venv's python does not start.
    :raises TransactionError: a committed transaction's records are damaged.
    """
    completed = _record_completed(host, venv, reporter) if record else []
    history = txn.history(host, venv)
    events = history["events"]
    done = []
    expected: dict[str, str | None] = {}
    for t in committed(history):
        info = txn.call(host, venv, "txn", {"id": t["id"]})
        expected.update(info["after"])
        started = _event(events, t["id"], "started") or {}
        applied = _event(events, t["id"], "applied") or {}
        verified = _event(events, t["id"], "verified")
        recipe = found if isinstance(found := started.get("recipe"), dict) else {}
        done.append(Applied(
            id=t["id"], source=str(started.get("source") or t.get("source") or "?"),
            applied=applied.get("time") if isinstance(applied.get("time"), (int, float)) else None,
            verified=None if verified is None else verified.get("ok") is True,
            manifest=_text(recipe.get("manifest_path")), snapshot=_text(recipe.get("snapshot")),
            files=len(info["after"])))
    interrupted = tuple(t["id"] for t in history["transactions"] if t.get("state") not in
                        ("committed", "rolled-back", "aborted"))
    rolled_back = tuple(t["id"] for t in history["transactions"] if t.get("state") == "rolled-back")
    checked = {p: h for p, h in expected.items() if pyc_source(p) is None}
    drift = txn.check_state(host, venv, checked) if checked else []
    rows = _record_rows(host, venv, expected) if expected else {}
    drift += [f"{line} (not written by apply: its RECORD row)" for line in txn.check_state(host, venv, rows)] \
        if rows else []
    return Status(where=f"{host.label}:{venv}", transactions=tuple(done), interrupted=interrupted,
                  drift=tuple(drift), checked=len(checked), unrecorded=tuple(txn.unrecorded(history)),
                  completed=tuple(completed), applied_paths=len(expected), record_checked=len(rows),
                  rolled_back=rolled_back)


def _record_rows(host: Host, venv: str, expected: dict[str, str | None]) -> dict[str, str]:
    """The files apply did not write (identical in both versions, so not copied) of the
    distributions the transactions applied (those whose ``RECORD`` a transaction wrote), each with
    its RECORD row's hash: a hand edit of such a file is drift as much as one of a copied file.
    Bytecode, symlinks, unhashed rows and rows outside the venv are left out."""
    records = {p.rsplit("/", 1)[0] for p, h in expected.items() if h is not None and p.endswith(".dist-info/RECORD")}
    if not records:
        return {}
    inventory = take_inventory(host, venv, record=True)
    rows: dict[str, str] = {}
    for dist in inventory.distributions:
        if dist.dist_info not in records:
            continue
        for path, entry in dist.files.items():
            if path in expected or pyc_source(path) is not None or entry.record_hash is None \
                    or entry.symlink is not None or entry.error:
                continue
            rows[path] = entry.record_hash
    return rows
