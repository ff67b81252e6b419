"""The transaction engine on the target: lock, stage, commit, roll back, history.

The controller runs ``<venv>/bin/python -I -S -c <this file's text> OP`` with a JSON
request on standard input; it prints one JSON reply ``{"ok": bool, "error": str|null, ...}``.
Stdlib only, Python 3.9+.

State lives in ``<venv>/.transplant/`` (mode 0700):

* ``lock``: who applies now (``{"id", "controller", "pid", "since", "command"}``), created
  with O_EXCL; ``history.jsonl``: one line per event of every transaction.
* ``txn/<id>/``: ``plan.json`` (the ordered steps), ``state`` (``staging``,
  ``committing``, ``committed``, ``rolled-back``, ``aborted``), ``before.json`` and
  ``after.json`` (path -> content identity before and after), ``journal.jsonl``
  (progress), ``staged/`` (the new files, copied here by rsync first, so a live path is
  only ever changed by a rename on the same filesystem) and ``backup/`` (each replaced
  or removed file, hardlinked, so a backup costs no copy and other hardlinks of a
  replaced file keep their bytes).

A step is ``{"op": "put"|"del", "path": venv-relative}``. ``commit`` runs the steps in
order and is idempotent: a put whose staged file is gone is done; otherwise the old file
is backed up (once) and the staged one renamed into place; a del backs up then unlinks.
So a commit killed at any point is finished by running it again (``--resume``), and
``rollback`` undoes any prefix of it: every backup is renamed back, every file that did
not exist before is removed. Operations:

* ``lock`` ``{"id", "controller", "pid", "command"}`` -> ``{"ok"}`` or ``{"ok": false, "held": {...}}``
* ``unlock`` ``{"id"}``; ``break-lock`` ``{}``
* ``pending`` ``{}`` -> ``{"lock", "interrupted": [{"id", "state", "source", ...}], "active"}``
  (``active``: the pid of a commit or rollback running now, which holds ``.transplant/active``)
* ``begin`` ``{"id", "steps", "after", "bytes", "source"}``: checks free space and that
  every folder it will write is writable, before anything is written; records the
  content of each touched path (``before.json``).
* ``heads`` ``{"id", "scripts": [{"path", "head", "body_hash"}]}``: rewrite staged scripts.
* ``links`` ``{"id", "links": [{"path", "target"}]}``: repoint staged symlinks (absolute ones
  into the donor's prefix get the same path under this venv; never outside it).
* ``commit`` ``{"id"}``, ``rollback`` ``{"id"}``, ``discard`` ``{"id"}`` (drop an unstarted one)
* ``record`` ``{"entry"}``; ``history`` ``{}`` -> ``{"events", "transactions"}``
* ``txn`` ``{"id"}`` -> the transaction's plan, state, before and after.

Testing hook: a request with ``"crash_after": N`` makes ``commit`` or ``rollback`` kill its own
process with SIGKILL before step N (a real crash at a chosen point, for the fault tests).
"""

import base64
import fcntl
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time

STATE = ".transplant"
_SH_EXEC = b"'" * 3 + b"exec'"
_PROTECTED = ("pyvenv.cfg", STATE)
_MARGIN = 16 << 20  # bytes kept free beyond what staging needs


def venv_prefix():
    """The venv this interpreter belongs to: the folder above ``bin/`` holding ``pyvenv.cfg``.

    The controller starts host scripts with ``-I -S`` (no ``site``: a venv's ``.pth`` files
    are code, and nothing of the venv may run), so ``sys.prefix`` is the base install
    there; the venv is found from the interpreter's own path instead (never resolved).
    """
    candidate = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
        return os.path.normpath(candidate)
    return os.path.normpath(sys.prefix)


class Refused(Exception):
    """A request this script will not carry out; the message says why."""


def _resolve(prefix, rel):
    """Full path of a venv-relative path; Refused when it leaves the venv (also through a
    symlinked folder) or is part of the venv itself (pyvenv.cfg, bin/python*, bin/activate*,
    .transplant/)."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        raise Refused("refused: {!r} is not a venv-relative path".format(rel))
    norm = os.path.normpath(rel)
    name = os.path.basename(norm)
    if norm.split(os.sep)[0] in _PROTECTED or (
            os.path.dirname(norm) == "bin" and name.startswith(("python", "activate", "Activate"))):
        raise Refused("refused: {!r} is part of the venv itself".format(rel))
    full = os.path.normpath(os.path.join(prefix, norm))
    real_prefix = os.path.realpath(prefix)
    parent = os.path.realpath(os.path.dirname(full))
    if not (parent == real_prefix or parent.startswith(real_prefix + os.sep)) or norm.startswith(".."):
        raise Refused("refused: {!r} leaves the venv {}".format(rel, prefix))
    return os.path.join(parent, os.path.basename(full))


def _real_folder(path):
    """Create ``path`` (mode 0700) if missing; Refused when it is a symlink or not a folder,
    so transplant's state can never be redirected outside the venv."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        raise Refused("refused: {} is a symlink or not a folder; transplant keeps its state only in a real "
                      "folder inside the venv".format(path))
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _state_dir(prefix):
    return _real_folder(os.path.join(prefix, STATE))


def _txn_dir(prefix, txid):
    if not isinstance(txid, str) or not txid or "/" in txid or txid.startswith(".") or "\0" in txid:
        raise Refused("refused: bad transaction id {!r}".format(txid))
    root = _real_folder(os.path.join(_state_dir(prefix), "txn"))
    folder = os.path.join(root, txid)
    if os.path.islink(folder):
        raise Refused("refused: {} is a symlink".format(folder))
    return folder


def _write_atomic(path, data):
    """Write bytes to a temporary name beside ``path``, fsync, rename (never in place)."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def _fsync_dir(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_json(path, value):
    _write_atomic(path, json.dumps(value, sort_keys=True).encode("utf-8"))


def _read_json(path, default=None):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _content(full):
    """Content identity of a path: ``sha256=...``, ``symlink:<target>``, or None when absent."""
    if os.path.islink(full):
        return "symlink:" + os.readlink(full)
    if not os.path.isfile(full):
        return None
    digest = hashlib.sha256()
    with open(full, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


# --- lock --------------------------------------------------------------------------------

def lock(prefix, request):
    path = os.path.join(_state_dir(prefix), "lock")
    entry = {"id": request.get("id"), "controller": request.get("controller"), "pid": request.get("pid"),
             "command": request.get("command"), "since": time.time()}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return {"ok": False, "error": "locked", "held": _read_json(path, {"unreadable": True})}
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(entry, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return {"ok": True, "error": None}


def unlock(prefix, request):
    path = os.path.join(_state_dir(prefix), "lock")
    held = _read_json(path)
    if held is not None and held.get("id") != request.get("id"):
        return {"ok": False, "error": "the lock belongs to {}".format(held.get("id")), "held": held}
    if os.path.exists(path):
        os.unlink(path)
    return {"ok": True, "error": None}


def break_lock(prefix, request):
    path = os.path.join(_state_dir(prefix), "lock")
    held = _read_json(path)
    if os.path.exists(path):
        os.unlink(path)
    return {"ok": True, "error": None, "held": held}


# --- transactions --------------------------------------------------------------------------

def _transactions(prefix):
    root = os.path.join(_state_dir(prefix), "txn")
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        folder = os.path.join(root, name)
        plan = _read_json(os.path.join(folder, "plan.json"), {})
        state = _read_state(folder)
        out.append({"id": name, "state": state, "source": plan.get("source"), "created": plan.get("created"),
                    "steps": len(plan.get("steps", []))})
    return out


def _read_state(folder):
    try:
        with open(os.path.join(folder, "state"), "r", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return "unknown"


def _set_state(folder, state):
    _write_atomic(os.path.join(folder, "state"), state.encode("utf-8"))


def pending(prefix, request):
    interrupted = [t for t in _transactions(prefix) if t["state"] in ("staging", "committing", "rolling-back")]
    return {"ok": True, "error": None, "lock": _read_json(os.path.join(_state_dir(prefix), "lock")),
            "interrupted": interrupted, "active": active(prefix)}


def _writable_problems(prefix, steps):
    """Folders the steps write in that cannot be written (read-only mount, permissions)."""
    problems, seen = [], set()
    for step in steps:
        full = _resolve(prefix, step["path"])
        folder = os.path.dirname(full)
        while not os.path.isdir(folder) and folder != prefix:
            folder = os.path.dirname(folder)
        if folder in seen:
            continue
        seen.add(folder)
        try:
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except OSError as exc:
            problems.append("{}: {}".format(os.path.relpath(folder, prefix), exc.strerror))
            continue
        if read_only:
            problems.append("{}: on a read-only filesystem".format(os.path.relpath(folder, prefix)))
        elif not os.access(folder, os.W_OK | os.X_OK):
            problems.append("{}: not writable by this user".format(os.path.relpath(folder, prefix)))
        elif step["op"] == "del" or os.path.lexists(full):
            if os.path.lexists(full) and os.path.isdir(full) and not os.path.islink(full):
                problems.append("{}: is a folder, not a file".format(step["path"]))
    return problems


def begin(prefix, request):
    txid = request.get("id")
    folder = _txn_dir(prefix, txid)
    steps = request.get("steps") or []
    for step in steps:
        if step.get("op") not in ("put", "del"):
            raise Refused("refused: bad step {!r}".format(step))
        _resolve(prefix, step.get("path"))
    problems = _writable_problems(prefix, steps)
    if problems:
        return {"ok": False, "error": "cannot write {} place(s) in the venv: {}".format(
            len(problems), "; ".join(problems[:5])), "unwritable": problems}
    needed = int(request.get("bytes") or 0) + _MARGIN
    stat = os.statvfs(prefix)
    free = stat.f_bavail * stat.f_frsize
    if free < needed:
        return {"ok": False, "error": "not enough space", "needed": needed, "free": free}
    os.makedirs(os.path.join(folder, "staged"), mode=0o700)
    os.makedirs(os.path.join(folder, "backup"), mode=0o700)
    before = {s["path"]: _content(_resolve(prefix, s["path"])) for s in steps}
    _write_json(os.path.join(folder, "before.json"), before)
    _write_json(os.path.join(folder, "after.json"), request.get("after") or {})
    _write_json(os.path.join(folder, "plan.json"), {"id": txid, "source": request.get("source"),
                                                    "created": time.time(), "steps": steps})
    _set_state(folder, "staging")
    return {"ok": True, "error": None, "free": free, "needed": needed,
            "staged": os.path.join(folder, "staged")}


def _split_head(data):
    if not data.startswith(b"#!"):
        return None, data
    first, sep, rest = data.partition(b"\n")
    head = first + sep
    if first.strip() == b"#!/bin/sh" and rest.startswith(_SH_EXEC):
        second, sep2, rest = rest.partition(b"\n")
        head += second + sep2
    return head, rest


def heads(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    staged = os.path.join(folder, "staged")
    done = []
    for item in request.get("scripts") or []:
        rel = item.get("path", "")
        _resolve(prefix, rel)
        full = os.path.join(staged, os.path.normpath(rel))
        with open(full, "rb") as handle:
            data = handle.read()
        head, body = _split_head(data)
        if head is None or _digest(body) != item.get("body_hash"):
            return {"ok": False, "error": "{}: not the script the plan copied (its body hashes to {})".format(
                rel, _digest(body))}
        mode = os.lstat(full).st_mode & 0o7777
        _write_atomic(full, item.get("head", "").encode("utf-8") + body)
        os.chmod(full, mode)
        done.append(rel)
    return {"ok": True, "error": None, "rewritten": done}


def links(prefix, request):
    """Point staged symlinks at their target-side paths (absolute links into the donor's prefix)."""
    staged = os.path.join(_txn_dir(prefix, request.get("id")), "staged")
    real_prefix = os.path.realpath(prefix)
    for item in request.get("links") or []:
        rel, where = item.get("path", ""), item.get("target", "")
        _resolve(prefix, rel)
        if not isinstance(where, str) or not where.startswith(real_prefix + os.sep) and not where.startswith(prefix + os.sep):
            raise Refused("refused: link {!r} -> {!r} leaves the venv".format(rel, where))
        full = os.path.join(staged, os.path.normpath(rel))
        if not os.path.islink(full):
            raise Refused("{}: not a staged symlink".format(rel))
        os.unlink(full)
        os.symlink(where, full)
    return {"ok": True, "error": None}


def _backup(full, backup):
    """Keep the current file (or symlink) at ``backup``: a hardlink, or a copy where links fail."""
    if os.path.lexists(backup):
        return
    os.makedirs(os.path.dirname(backup), exist_ok=True)
    try:
        os.link(full, backup, follow_symlinks=False)
    except OSError:
        if os.path.islink(full):
            os.symlink(os.readlink(full), backup)
        else:
            shutil.copy2(full, backup)


def _crash_point(request, index):
    if request.get("crash_after") == index:
        os.kill(os.getpid(), signal.SIGKILL)


def _prune_empty(prefix, folders):
    stop = os.path.realpath(prefix)
    for folder in sorted(folders, key=len, reverse=True):
        while folder != stop and folder.startswith(stop + os.sep) and os.path.basename(folder) != "site-packages":
            try:
                entries = os.listdir(folder)
                if entries == ["__pycache__"] and not os.listdir(os.path.join(folder, "__pycache__")):
                    os.rmdir(os.path.join(folder, "__pycache__"))
                    entries = []
                if entries:
                    break
                os.rmdir(folder)
            except OSError:
                break
            folder = os.path.dirname(folder)


class _Active:
    """An exclusive flock on ``.transplant/active`` held while a commit or rollback runs, with
    the pid written in it: a second one (a resume started while an orphaned commit still
    runs) is refused instead of racing it. The kernel drops the flock when the process dies."""

    def __init__(self, prefix):
        self.path = os.path.join(_state_dir(prefix), "active")

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise Refused("a commit or rollback is still running in this venv (pid {}); wait for it".format(
                _active_pid(self.path)))
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _active_pid(path):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read().strip() or "?"
    except OSError:
        return "?"


def active(prefix):
    """The pid of a running commit or rollback in this venv, or None."""
    path = os.path.join(_state_dir(prefix), "active")
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return _active_pid(path)
    finally:
        os.close(fd)
    return None


def commit(prefix, request):
    with _Active(prefix):
        return _commit(prefix, request)


def rollback(prefix, request):
    with _Active(prefix):
        return _rollback(prefix, request)


def _commit(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    plan = _read_json(os.path.join(folder, "plan.json"))
    if plan is None:
        raise Refused("no transaction {}".format(request.get("id")))
    state = _read_state(folder)
    if state not in ("staging", "committing", "committed"):
        raise Refused("transaction {} is {}; it cannot be committed".format(request.get("id"), state))
    _set_state(folder, "committing")
    staged, backups = os.path.join(folder, "staged"), os.path.join(folder, "backup")
    journal = open(os.path.join(folder, "journal.jsonl"), "a", encoding="utf-8")
    emptied = set()
    try:
        for index, step in enumerate(plan["steps"]):
            _crash_point(request, index)
            rel = os.path.normpath(step["path"])
            full = _resolve(prefix, rel)
            if step["op"] == "put":
                source = os.path.join(staged, rel)
                if not os.path.lexists(source):
                    continue  # done before a crash
                if os.path.lexists(full):
                    _backup(full, os.path.join(backups, rel))
                os.makedirs(os.path.dirname(full), exist_ok=True)
                os.rename(source, full)
            else:
                if os.path.lexists(full):
                    _backup(full, os.path.join(backups, rel))
                    os.unlink(full)
                    emptied.add(os.path.dirname(full))
            if index % 500 == 499:
                journal.write(json.dumps({"done": index + 1, "time": time.time()}) + "\n")
                journal.flush()
        journal.write(json.dumps({"done": len(plan["steps"]), "time": time.time()}) + "\n")
        journal.flush()
        os.fsync(journal.fileno())
    finally:
        journal.close()
    _prune_empty(prefix, emptied)
    os.sync()
    _set_state(folder, "committed")
    return {"ok": True, "error": None, "steps": len(plan["steps"]), "removed": len(
        [s for s in plan["steps"] if s["op"] == "del"])}


def _rollback(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    plan = _read_json(os.path.join(folder, "plan.json"))
    before = _read_json(os.path.join(folder, "before.json"), {})
    if plan is None:
        raise Refused("no transaction {}".format(request.get("id")))
    _set_state(folder, "rolling-back")
    backups = os.path.join(folder, "backup")
    created = set()
    for index, step in enumerate(reversed(plan["steps"])):
        _crash_point(request, index)
        rel = os.path.normpath(step["path"])
        full = _resolve(prefix, rel)
        saved = os.path.join(backups, rel)
        if os.path.lexists(saved):
            os.makedirs(os.path.dirname(full), exist_ok=True)
            os.rename(saved, full)
        elif before.get(step["path"]) is None and os.path.lexists(full):
            os.unlink(full)
            created.add(os.path.dirname(full))
    _prune_empty(prefix, created)
    shutil.rmtree(os.path.join(folder, "staged"), ignore_errors=True)
    os.sync()
    _set_state(folder, "rolled-back")
    return {"ok": True, "error": None, "steps": len(plan["steps"])}


def discard(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    state = _read_state(folder)
    if state != "staging":
        raise Refused("transaction {} is {}; only an unstarted one is discarded".format(request.get("id"), state))
    shutil.rmtree(os.path.join(folder, "staged"), ignore_errors=True)
    _set_state(folder, "aborted")
    return {"ok": True, "error": None}


def txn(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    plan = _read_json(os.path.join(folder, "plan.json"))
    if plan is None:
        raise Refused("no transaction {}".format(request.get("id")))
    return {"ok": True, "error": None, "plan": plan, "state": _read_state(folder),
            "before": _read_json(os.path.join(folder, "before.json"), {}),
            "after": _read_json(os.path.join(folder, "after.json"), {})}


def record(prefix, request):
    with open(os.path.join(_state_dir(prefix), "history.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(request.get("entry", {}), sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return {"ok": True, "error": None}


def history(prefix, request):
    events = []
    try:
        with open(os.path.join(_state_dir(prefix), "history.jsonl"), "r", encoding="utf-8") as handle:
            for line in handle:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return {"ok": True, "error": None, "events": events, "transactions": _transactions(prefix)}


OPERATIONS = {"lock": lock, "unlock": unlock, "break-lock": break_lock, "pending": pending, "begin": begin,
              "heads": heads, "links": links, "commit": commit, "rollback": rollback, "discard": discard, "txn": txn,
              "record": record, "history": history}


def main(argv):
    prefix = venv_prefix()
    request = json.load(sys.stdin)
    op = OPERATIONS.get(argv[0] if argv else "")
    try:
        if op is None:
            raise Refused("unknown operation {!r}".format(argv[0] if argv else ""))
        reply = op(prefix, request)
    except Refused as exc:
        reply = {"ok": False, "error": str(exc)}
    except OSError as exc:
        reply = {"ok": False, "error": "{}: {}".format(exc.filename or "", exc.strerror or exc), "errno": exc.errno}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
