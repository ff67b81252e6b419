"""Transactions on the target (edge): the lock, interrupted transactions, resume, rollback
and history, driving the ``applier`` host script (see :mod:`transplant.remote.applier`)."""

from __future__ import annotations

import json
import os
import posixpath
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from transplant.core.units import visible
from transplant.errors import HostError, TransactionError
from transplant.hosts.host import Host
from transplant.hosts.probing import ScriptSession, run_script
from transplant.reporting import QUIET, Reporter

__all__ = [
    "TransactionError",
    "Holder",
    "session",
    "call",
    "acquire",
    "release",
    "interrupted",
    "finish",
    "Completed",
    "has_state",
    "record_completed",
    "unrecorded",
    "OUTCOMES",
    "check_state",
    "history",
    "undo",
    "reply_problem",
]


#: The applier sessions open now, by (host, venv): every :func:`call` for that venv inside a
#: :func:`session` block goes through its one process.
_OPEN: dict[tuple[str, str], ScriptSession] = {}
_OPEN_LOCK = threading.Lock()


def _key(host: Host, venv: str) -> tuple[str, str]:
    """A venv as the sessions know it: its host's label (one place, whichever object names it) and path."""
    return host.label, posixpath.normpath(venv)


def _enter(host: Host, venv: str) -> bool:
    """Open a session for ``venv`` unless one is open; True when this call opened it."""
    with _OPEN_LOCK:
        if _key(host, venv) in _OPEN:
            return False
        _OPEN[_key(host, venv)] = ScriptSession(host, venv, "applier")
        return True


def _leave(host: Host, venv: str) -> None:
    with _OPEN_LOCK:
        opened = _OPEN.pop(_key(host, venv), None)
    if opened is not None:
        opened.close()


@contextmanager
def session(host: Host, venv: str) -> Iterator[ScriptSession]:
    """Send every applier operation on ``venv`` inside the block through one host script process
    (:class:`transplant.hosts.probing.ScriptSession`): the applier is sent and its interpreter
    started once, not once per step. A block inside another for the same host and venv (or
    inside :func:`acquire` ... :func:`release`, which hold one session with the lock) uses the
    outer one's process. On leaving, the process's input is closed and it exits; a controller
    killed inside the block closes it too (the host script finishes the step it is in, and the
    lock stays for the next command to judge, as with one process per step).
    """
    opened = _enter(host, venv)
    try:
        with _OPEN_LOCK:
            current = _OPEN[_key(host, venv)]
        yield current
    finally:
        if opened:
            _leave(host, venv)


#: The sessions :func:`acquire` opened, closed by :func:`release`.
_WITH_LOCK: set[tuple[str, str]] = set()


def call(host: Host, venv: str, op: str, request: Mapping[str, Any], *, check: bool = True,
         timeout: float | None = 3600.0) -> dict[str, Any]:
    """Run one applier operation on the target and return its reply: through the open
    :func:`session` for ``venv``, else in a process of its own.

    :param check: raise when the reply says ``ok: false``; False returns it for the caller.
    :raises TransactionError: the operation failed (with ``check``).
    :raises HostError: as :func:`transplant.hosts.probing.run_script`, or the reply is not of the
        shape the applier gives for ``op`` (:func:`reply_problem`; the session's process is ended
        and the session answers every later request with that error).
    """
    with _OPEN_LOCK:
        opened = _OPEN.get(_key(host, venv))
    if opened is not None:
        reply = opened.request(op, request, timeout=timeout)
    else:
        reply = run_script(host, venv, "applier", [op], request=dict(request), timeout=timeout)
    problem = reply_problem(op, reply)
    if problem is not None:
        error = HostError(f"{host.label}:{venv}: the applier's reply to {_DOING.get(op, op)} is not one the applier "
                          f"gives ({visible(problem, 200)}); nothing more is asked of that venv",
                          hint="check that the venv's bin/python is a real Python interpreter (transplant's applier "
                               "runs in it) and that nothing on the host prints to standard output")
        if opened is not None:
            opened.abandon(error)  # its process is not the applier: ended, and never asked again
        raise error
    if check and not reply.get("ok"):
        raise TransactionError(f"{host.label}:{venv}: {_DOING.get(op, op)} failed: {reply.get('error')}")
    return reply


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _objects(*keys: tuple[str, Any]) -> Any:
    """A check for a list of objects, each with ``keys`` (``(name, check)``)."""
    def check(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(v, dict) and all(test(v.get(name)) for name, test in keys) for v in value)
    return check


def _kind(*types: type) -> Any:
    return lambda value: isinstance(value, types) and not isinstance(value, bool)


_DICT, _LIST, _TEXT = _kind(dict), _kind(list), _kind(str)
_TXNS = _objects(("id", _TEXT), ("state", _TEXT))

#: What each applier operation's successful reply holds, beyond ``ok`` and ``error``: key ->
#: (check, what it must be); every key is required. The keys the controller reads, no more.
_OK_SHAPES: dict[str, dict[str, tuple[Any, str]]] = {
    "pending": {"interrupted": (_TXNS, "a list of transactions (objects with id and state)"),
                "lock": (lambda v: v is None or isinstance(v, dict), "an object or null"),
                "active": (lambda v: v is None or _count(v), "a process id or null"),
                "exists": (lambda v: isinstance(v, bool), "true or false")},
    "begin": {"staged": (_TEXT, "a path"), "free": (_count, "a byte count"), "needed": (_count, "a byte count")},
    "heads": {"rewritten": (_LIST, "a list")},
    "records": {"rows": (_count, "a row count")},
    "check": {"differ": (_texts, "a list of strings"), "verified": (_DICT, "an object")},
    "state": {"differ": (_texts, "a list of strings")},
    "commit": {"steps": (_count, "a step count"), "removed": (_count, "a file count")},
    "rollback": {"steps": (_count, "a step count")},
    "txn": {"plan": (lambda v: isinstance(v, dict) and _objects(("path", _TEXT), ("op", _TEXT))(v.get("steps")),
                     "an object whose steps are a list of objects with path and op"),
            "state": (_TEXT, "a string"), "before": (_DICT, "an object"), "after": (_DICT, "an object"),
            "committed_at": (lambda v: v is None or _number(v), "a time or null")},
    "history": {"events": (_objects(), "a list of objects"), "transactions": (_TXNS, "a list of transactions "
                                                                                       "(objects with id and state)")},
    "tidy": {"removed": (lambda v: isinstance(v, bool), "true or false")},
}
#: The keys a failed reply may hold that the controller reads: checked when present.
_FAILED_SHAPES: dict[str, dict[str, tuple[Any, str]]] = {
    "lock": {"held": (_DICT, "an object")},
    "begin": {"needed": (_count, "a byte count"), "free": (_count, "a byte count"),
              "unwritable": (_texts, "a list of strings")},
    "check": {"differ": (_texts, "a list of strings")},
}


def reply_problem(op: str, reply: Mapping[str, Any]) -> str | None:
    """What is wrong with the applier's ``reply`` to ``op`` (one line naming the key and what it
    must be), or None when it has the shape the applier gives: ``ok`` true or false, ``error`` a
    string when not ok, and the keys the controller reads of that operation's reply (a session
    that answers ``{"ok": true}`` to everything is caught here, not by a KeyError later)."""
    ok = reply.get("ok")
    if not isinstance(ok, bool):
        return f"ok is {_shown(ok)}, not true or false"
    if not ok and not isinstance(reply.get("error"), str):
        return f"a failed reply whose error is {_shown(reply.get('error'))}, not a string"
    for key, (test, what) in (_OK_SHAPES if ok else _FAILED_SHAPES).get(op, {}).items():
        if (ok or key in reply) and not test(reply.get(key)):
            return f"{key} is {_shown(reply.get(key)) if key in reply else 'missing'}, not {what}"
    return None


def _shown(value: Any) -> str:
    """A value of a reply, short, for a message."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: What each applier operation is, as the operator reads it in an error (``reading the
#: transactions failed: ...``, not the operation's name ``pending``).
_DOING = {
    "lock": "taking the venv's lock", "unlock": "releasing the venv's lock", "break-lock": "breaking the venv's lock",
    "pending": "looking for an interrupted transaction", "begin": "starting the transaction",
    "heads": "reading the console scripts' first lines", "records": "reading the RECORD files",
    "links": "reading the symlinks", "commit": "committing the transaction",
    "rollback": "rolling the transaction back", "discard": "discarding the staged files",
    "txn": "reading the transaction's record", "mark": "recording the transaction's state",
    "record": "writing the venv's history", "history": "reading the venv's history",
    "check": "checking the staged files", "state": "comparing the venv with the recorded state",
    "tidy": "removing the empty state folder",
}


@dataclass(frozen=True, kw_only=True)
class Holder:
    """Who holds a target's lock: transaction id, controller host name, its process id,
    since when (seconds since the epoch) and the command; ``alive`` is False when the
    holder ran on this controller and its process is gone, None when that cannot be told."""

    id: str | None
    controller: str | None
    pid: int | None
    since: float | None
    command: str | None
    alive: bool | None

    def describe(self) -> str:
        """One line for messages (control characters from the lock file shown escaped)."""
        try:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since)) if self.since else "an unknown time"
        except (OverflowError, OSError, ValueError):
            when = "an unknown time"
        who = _printable(f"transaction {self.id} ({self.command or 'transplant'}) from {self.controller} pid {self.pid}")
        state = {True: "still running", False: "its process is gone", None: "on another controller"}[self.alive]
        return f"{who}, since {when}; {state}"


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _holder(raw: Any) -> Holder | None:
    """The lock's holder from the lock file's JSON; None when it is unreadable."""
    if not isinstance(raw, Mapping) or raw.get("unreadable"):
        return None
    controller, pid, since = raw.get("controller"), raw.get("pid"), raw.get("since")
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**22 else None
    since = since if isinstance(since, (int, float)) and not isinstance(since, bool) and 0 < since < 2**40 else None
    alive = None
    if controller == socket.gethostname() and pid is not None:
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True

    def text(v: object) -> str | None:
        return str(v)[:200] if v is not None else None

    return Holder(id=text(raw.get("id")), controller=text(controller), pid=pid, since=since,
                  command=text(raw.get("command")), alive=alive)


def acquire(host: Host, venv: str, txid: str, command: str, *, reporter: Reporter = QUIET,
            break_lock: bool = False) -> None:
    """Take the target's lock for transaction ``txid``.

    A lock whose holder ran on this controller and is gone is broken, and said so; one from
    another controller (or unreadable) is refused unless ``break_lock``; one whose holder
    still runs on this controller is refused even with ``break_lock``.

    From here to :func:`release`, every operation on ``venv`` goes through one applier
    process (:func:`session`), unless a session was open already.

    :param reporter: told a note when a lock is broken.
    :raises TransactionError: the lock is held (the message names the holder and since when).
    """
    opened = _enter(host, venv)
    try:
        _acquire(host, venv, txid, command, reporter=reporter, break_lock=break_lock)
    except BaseException:
        if opened:
            _leave(host, venv)
        raise
    if opened:
        with _OPEN_LOCK:
            _WITH_LOCK.add(_key(host, venv))


def _acquire(host: Host, venv: str, txid: str, command: str, *, reporter: Reporter, break_lock: bool) -> None:
    request = {"id": txid, "controller": socket.gethostname(), "pid": os.getpid(), "command": command}
    label = f"{host.label}:{venv}"
    reply = call(host, venv, "lock", request, check=False)
    if reply.get("ok"):
        return
    if "held" not in reply:
        raise TransactionError(f"{label}: cannot take the lock: {reply.get('error')}",
                               hint="the venv's state folder must be writable (.transplant inside the venv)")
    holder = _holder(reply.get("held"))
    if break_lock and holder is not None and holder.alive is True:
        raise TransactionError(
            f"{label} is locked by an apply still running on this controller: {holder.describe()}; --break-lock "
            f"breaks only the lock of a holder that is gone",
            hint=f"wait for it to finish, or stop it first (kill {holder.pid}), then run the command again")
    if (holder is not None and holder.alive is False) or break_lock:
        why = "its holder is gone" if holder is not None and holder.alive is False else "--break-lock was given"
        reporter.note(f"breaking the lock of {label} ({why}): {holder.describe() if holder else 'an unreadable lock file'}")
        broke = call(host, venv, "break-lock", {"expect": holder.id if holder else None}, check=False)
        if broke.get("ok") and call(host, venv, "lock", request, check=False).get("ok"):
            return
        reply = call(host, venv, "lock", request, check=False)
        if reply.get("ok"):
            return
        holder = _holder(reply.get("held"))
    raise TransactionError(
        f"{label} is locked by another apply: {holder.describe() if holder else 'an unreadable lock file'}",
        hint="wait for it to finish; if its controller is gone for good, add --break-lock",
    )


def release(host: Host, venv: str, txid: str) -> None:
    """Give the lock back (only if ``txid`` holds it), and end the session :func:`acquire` opened."""
    try:
        call(host, venv, "unlock", {"id": txid}, check=False)
    finally:
        with _OPEN_LOCK:
            owned = _key(host, venv) in _WITH_LOCK
            _WITH_LOCK.discard(_key(host, venv))
        if owned:
            _leave(host, venv)


def interrupted(host: Host, venv: str, *, reporter: Reporter = QUIET, wait: float = 600.0) -> list[dict[str, Any]]:
    """Transactions on the target that started and did not end (``staging``, ``committing``,
    ``rolling-back``), oldest first.

    A commit or rollback still running there (its controller died, the host script lives
    on) is waited for first, up to ``wait`` seconds, so nothing races it.

    :param reporter: told a note, once, when it waits.
    :raises TransactionError: it still runs after ``wait`` seconds.
    """
    deadline = time.monotonic() + wait
    said = False
    while True:
        reply = call(host, venv, "pending", {})
        if reply.get("active") is None:
            return list(reply.get("interrupted", []))
        if time.monotonic() > deadline:
            raise TransactionError(f"{host.label}:{venv}: a commit or rollback (pid {reply['active']}) is still "
                                   f"running there after {wait:g} s", hint="wait for it, then run the command again")
        if not said:
            reporter.note(f"waiting for the commit or rollback still running on {host.label} (pid {reply['active']})")
            said = True
        time.sleep(0.5)


def has_state(host: Host, venv: str) -> bool:
    """Whether the venv has a transplant state folder (``<venv>/.transplant``); asking creates none.

    :raises TransactionError: the state folder is a symlink or not a folder.
    """
    return bool(call(host, venv, "pending", {}).get("exists", True))


#: History events that end a transaction; a committed one without any was completed by its host
#: script after its controller died (or its controller is recording it now).
OUTCOMES = ("applied", "differs", "rolled-back", "aborted")


@dataclass(frozen=True, kw_only=True)
class Completed:
    """A committed transaction whose outcome was missing from the history, now recorded:
    ``outcome`` ``applied`` (the target matches its ``after.json``) or ``differs``
    (``mismatches`` names the files), ``committed_at`` when its commit finished (seconds since
    the epoch; None when its journal does not say)."""

    id: str
    outcome: str
    mismatches: tuple[str, ...]
    committed_at: float | None

    def describe(self) -> str:
        """One line for messages: what happened and what was recorded."""
        when = ""
        if self.committed_at is not None:
            when = time.strftime(" at %Y-%m-%d %H:%M:%S UTC", time.gmtime(self.committed_at))
        said = ("the target matches its planned state hash for hash" if self.outcome == "applied" else
                f"{len(self.mismatches)} files differ from its planned state")
        return (f"transaction {self.id} was completed on the target by its host script after the controller died"
                f"{when}; recorded as {self.outcome}: {said}")


def unrecorded(record: Mapping[str, Any]) -> list[str]:
    """Ids of the committed transactions of a :func:`history` record that have no outcome event
    (:data:`OUTCOMES`), oldest first: commits a host script completed after its controller died."""
    ended = {e.get("id") for e in record["events"] if e.get("event") in OUTCOMES}
    return [t["id"] for t in record["transactions"] if t.get("state") == "committed" and t["id"] not in ended]


def record_completed(host: Host, venv: str) -> list[Completed]:
    """Record the outcome of every committed transaction whose history has none (its host script
    finished the commit after the controller that started it died), oldest first.

    The target is checked hash for hash against the transaction's ``after.json`` (paths a later
    committed transaction wrote again left out) and ``applied`` or ``differs`` is recorded, with
    ``completed_by: "host"``, ``time`` when the commit finished (from its journal; else now) and
    ``recorded`` (now). The transaction stays ``committed`` either way: ``transplant rollback``
    undoes it. Call it holding the target's lock, after :func:`interrupted` (which waits for a
    host script still running). A venv without a state folder is not touched.

    :returns: the transactions recorded now; empty when none was missing its outcome.
    :raises TransactionError: a transaction's records are damaged.
    """
    record = history(host, venv)
    missing = set(unrecorded(record))
    committed = [t["id"] for t in record["transactions"] if t.get("state") == "committed"]
    done = []
    for index, txid in enumerate(committed):
        if txid not in missing:
            continue
        info = call(host, venv, "txn", {"id": txid})
        later: set[str] = set()
        for newer in committed[index + 1:]:
            later.update(call(host, venv, "txn", {"id": newer})["after"])
        expected = {p: h for p, h in info["after"].items() if p not in later}
        mismatches = check_state(host, venv, expected, recorded=(txid, "after")) if expected else []
        at = info.get("committed_at")
        at = at if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        outcome = "differs" if mismatches else "applied"
        now = time.time()
        _record(host, venv, txid, outcome, completed_by="host", recorded=now, **({"time": at} if at else {}),
                note="completed by the host script after its controller died; recorded later",
                **({"mismatches": mismatches[:50]} if mismatches else {}))
        done.append(Completed(id=txid, outcome=outcome, mismatches=tuple(mismatches), committed_at=at))
    return done


def check_state(host: Host, venv: str, expected: Mapping[str, str | None], *,
                known: Mapping[str, list] | None = None, recorded: tuple[str, str] | None = None) -> list[str]:
    """Hash the paths of ``expected`` on the target (the applier's ``state``, in the open
    :func:`session`: no probe process of its own); lines naming each one that differs (content,
    script head and body, RECORD rows, symlink target; None: must be absent).

    :param known: path -> ``[identity, st_dev, st_ino, st_size, st_mtime_ns]`` as the applier's
        ``check`` verified the staged file (its ``verified``): a live file with that same stat
        identity is not hashed again (the commit's rename keeps it); None hashes every path.
    :param recorded: ``(transaction id, "before" | "after")``: the stat identities that
        transaction's folder on the target keeps of that state (``before-known.json``: the files
        as ``begin`` read them; ``after-known.json``: as ``check`` verified them staged) spare
        every file that still has one, as ``known`` does, without sending them; a transaction
        recorded before these files existed has every path hashed. None: not used.
    :raises TransactionError: a path leaves the venv, ``recorded`` names a bad id, or the target
        cannot be read.
    """
    request: dict[str, Any] = {"expect": dict(expected)}
    if known:
        request["known"] = dict(known)
    if recorded is not None:
        request["recorded"] = {"id": recorded[0], "of": recorded[1]}
    return list(call(host, venv, "state", request)["differ"])


def _plain(identity: object) -> bool:
    """Whether a recorded identity is a whole file's (``sha256=``, ``symlink:``, or None: absent),
    the form a transaction's ``before.json`` holds, so two records can be compared as strings."""
    return identity is None or (isinstance(identity, str) and identity.startswith(("sha256=", "symlink:")))


def _refuse_drift_up_front(host: Host, venv: str, chosen: Sequence[str], infos: Mapping[str, Mapping[str, Any]],
                           label: str) -> None:
    """Before a ``rollback --to`` changes anything: each chosen transaction's files must still be
    as it left them, once the newer chosen ones are rolled back. A path no newer chosen
    transaction touched is compared with the live target now; a path a newer one touched will be
    what the oldest such one recorded before it (its ``before``), compared with this one's
    ``after`` from the records (when both are whole-file identities; a console script's or a
    RECORD's planned form is checked just before its own rollback, as a single rollback does).

    :param chosen: transaction ids, oldest first; ``infos`` their applier ``txn`` replies.
    :raises TransactionError: naming every transaction and path that changed; nothing was rolled back.
    """
    problems: list[str] = []
    bad: list[str] = []
    for index, txid in enumerate(chosen):
        newer = chosen[index + 1:]
        live: dict[str, Any] = {}
        for path, want in infos[txid]["after"].items():
            restorer = next((n for n in newer if path in infos[n]["before"]), None)
            if restorer is None:
                live[path] = want
            elif _plain(want) and _plain(infos[restorer]["before"][path]) and infos[restorer]["before"][path] != want:
                problems.append(f"{path}: changed between {txid} and {restorer}")
                bad.append(txid)
        drifted = check_state(host, venv, live, recorded=(txid, "after")) if live else []
        problems.extend(drifted)
        bad.extend([txid] if drifted else [])
    if problems:
        which = ", ".join(dict.fromkeys(bad))
        raise TransactionError(
            f"{label}: the files of transaction {which} changed since it was applied; rolling back would lose that; "
            f"nothing was rolled back (all of {', '.join(reversed(chosen))} or none)",
            hint="look at the files listed; add --force to roll back anyway", mismatches=problems)


def finish(host: Host, venv: str, txid: str, how: str, *, lock: str, crash_after: int | None = None) -> str:
    """Resume (``how="resume"``) or roll back (``"rollback"``) an interrupted transaction,
    then check the target hash for hash against the state it must reach (a file whose stat
    identity is the one the transaction recorded of that state is not read again: a file renamed
    back from its backup, a committed one as ``check`` verified it; see :func:`check_state`).

    A transaction still ``staging`` never changed a live file: either way it is discarded
    (resuming means applying afresh). Returns the transaction's new state.

    :param lock: the id of the lock the caller holds (see :func:`acquire`).

    :raises TransactionError: the target differs afterwards (``mismatches`` names the files).
    """
    info = call(host, venv, "txn", {"id": txid})
    extra = {"lock": lock, **({"crash_after": crash_after} if crash_after is not None else {})}
    if info["state"] == "staging":
        call(host, venv, "discard", {"id": txid, "lock": lock})
        _record(host, venv, txid, "aborted", how=how)
        return "aborted"
    if how == "resume" and info["state"] in ("committing", "committed"):
        call(host, venv, "commit", {"id": txid, **extra})
        side, outcome, ok_state, open_state = "after", "applied", "committed", "committing"
    else:
        call(host, venv, "rollback", {"id": txid, **extra})
        side, outcome, ok_state, open_state = "before", "rolled-back", "rolled-back", "rolling-back"
    mismatches = check_state(host, venv, info[side], recorded=(txid, side))
    call(host, venv, "mark", {"id": txid, "state": open_state if mismatches else ok_state})
    _record(host, venv, txid, outcome if not mismatches else "differs", how=how)
    if mismatches:
        raise TransactionError(
            f"{host.label}:{venv}: after {how}, {len(mismatches)} files differ from the recorded state of transaction "
            f"{txid}; it stays open", mismatches=mismatches,
            hint="look at the files listed (their backups are in the venv's .transplant/txn/<id>/backup), then run "
                 "the same command again")
    return outcome


def _record(host: Host, venv: str, txid: str, event: str, **fields: Any) -> None:
    call(host, venv, "record", {"entry": {"id": txid, "event": event, "time": time.time(), **fields}})


def history(host: Host, venv: str) -> dict[str, Any]:
    """The target's transactions (id, state, source, created, steps) and its event log."""
    reply = call(host, venv, "history", {})
    return {"transactions": reply.get("transactions", []), "events": reply.get("events", [])}


def _chosen(host: Host, venv: str, to: str | None, listing: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The committed transactions a rollback undoes (the newest, or every one after ``to``; ids
    oldest first) and each one's applier ``txn`` reply.

    :raises TransactionError: ``to`` is unknown, or nothing is committed (after it)."""
    label = f"{host.label}:{venv}"
    every = history(host, venv)["transactions"]
    known = [t["id"] for t in every]
    if to is not None and to not in known:
        raise TransactionError(f"{label}: no transaction {to!r}", hint=f"list them: {listing}")
    ids = [t["id"] for t in every if t["state"] == "committed"]
    order = {t["id"]: n for n, t in enumerate(every)}  # the applier's order: oldest first (not the ids' text)
    chosen = ids[-1:] if to is None else [i for i in ids if order[i] > order[to]]
    if not chosen:
        raise TransactionError(f"{label}: no committed transaction to roll back"
                               + (f" after {to}" if to else ""))
    return chosen, {txid: call(host, venv, "txn", {"id": txid}) for txid in chosen}


def preview_undo(host: Host, venv: str, *, to: str | None, force: bool = False,
                 listing: str = "transplant history MANIFEST") -> list[tuple[str, int]]:
    """What :func:`undo` would roll back, read only, before anyone is asked: ``[(transaction id,
    paths it wrote or removed)]``, newest first. Unless ``force``, the files of each must still
    be as it left them (the check :func:`undo` makes first).

    :raises TransactionError: as :func:`undo` would before changing anything (an unknown ``to``,
        nothing to roll back, files changed since; nothing is changed)."""
    chosen, infos = _chosen(host, venv, to, listing)
    label = f"{host.label}:{venv}"
    if not force and len(chosen) > 1:
        _refuse_drift_up_front(host, venv, chosen, infos, label)
    elif not force:
        [txid] = chosen
        drifted = check_state(host, venv, infos[txid]["after"], recorded=(txid, "after"))
        if drifted:
            raise TransactionError(
                f"{label}: transaction {txid}'s files changed since it was applied; rolling it back would lose "
                f"that; nothing was rolled back", hint="look at the files listed; add --force to roll back anyway",
                mismatches=drifted)
    return [(txid, len(infos[txid]["after"])) for txid in reversed(chosen)]


def undo(host: Host, venv: str, *, to: str | None, reporter: Reporter = QUIET, lock: str, force: bool = False,
         listing: str = "transplant history MANIFEST") -> list[str]:
    """Roll back committed transactions, newest first: the newest one (``to`` None), or every
    one after ``to``, so the target returns to the state recorded before them, hash for hash.

    Before undoing one, its files must still be as it left them (else another change
    happened since: refused unless ``force``). With several chosen, all of them are checked
    before the first is undone (:func:`_refuse_drift_up_front`), so a drifted older one refuses
    the whole rollback with nothing changed. Neither that check nor the one after each rollback
    reads a file whose stat identity is still the one the transaction recorded of that state
    (``recorded`` of :func:`check_state`); an older transaction without these records has all
    its files read.

    :param reporter: told a step ``rolling back <id>`` as each starts, then the transactions
        rolled back of all chosen (items).
    :param listing: the command that lists the transactions, for the hint.
    :returns: the ids rolled back.
    :raises TransactionError: ``to`` is unknown, nothing to roll back, the target drifted,
        or a rolled-back state differs from its record.
    """
    label = f"{host.label}:{venv}"
    chosen, infos = _chosen(host, venv, to, listing)
    ahead = not force and len(chosen) > 1  # all or none: every check before the first rollback
    if ahead:
        _refuse_drift_up_front(host, venv, chosen, infos, label)
    done: list[str] = []
    for txid in reversed(chosen):
        info = infos[txid]
        # the newest was just checked whole; an older one again, for the forms the records cannot compare
        drifted = [] if ahead and not done else check_state(host, venv, info["after"], recorded=(txid, "after"))
        if drifted and not force:
            so_far = ("; nothing was rolled back" if not done else
                      f"; already rolled back: {', '.join(done)} (the target is now as it was before "
                      f"{done[-1]}, with {txid} still applied)")
            raise TransactionError(
                f"{label}: transaction {txid}'s files changed since it was applied; rolling it back would lose "
                f"that{so_far}",
                hint="look at the files listed; add --force to roll back anyway", mismatches=drifted)
        reporter.step(f"rolling back {txid}")
        finish(host, venv, txid, "rollback", lock=lock)
        done.append(txid)
        reporter.progress(len(done), len(chosen))
    return done
