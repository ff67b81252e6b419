"""The transaction engine on the target: lock, stage, commit, roll back, history.

The controller runs ``<venv>/bin/python -I -S -c <this file's text> OP`` with a JSON
request on standard input; it prints one JSON reply ``{"ok": bool, "error": str|null, ...}``.
With ``--session`` instead of OP it serves many: one line ``{"op": OP, "request": {...}}`` in,
one reply line out (the same replies, plus ``served``: how many this process answered), until
its input ends; an apply, a rollback or a resume talks to one such process from start to end.
Stdlib only, Python 3.9+.

State lives in ``<venv>/.transplant/`` (mode 0700):

* ``lock``: who applies now (``{"id", "controller", "pid", "since", "command"}``), created
  with O_EXCL; ``history.jsonl``: one line per event of every transaction.
* ``txn/<id>/``: ``plan.json`` (the ordered steps), ``state`` (``staging``,
  ``committing``, ``committed``, ``rolled-back``, ``aborted``), ``before.json`` and
  ``after.json`` (path -> content identity before and after), ``before-known.json`` and
  ``after-known.json`` (path -> ``[identity, st_dev, st_ino, st_size, st_mtime_ns]`` of the regular
  files as ``begin`` read them and as ``check`` verified them staged: the stat identities that let
  ``state`` check a rollback without reading an unchanged file again; see :func:`_write_known`; a
  transaction recorded before they existed has neither, and is checked by reading every file),
  ``journal.jsonl`` (progress), ``staged/`` (the new files, streamed or copied here by rsync first, so a live path is
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
* ``pending`` ``{}`` -> ``{"lock", "interrupted": [{"id", "state", "source", ...}], "active", "exists"}``
  (``active``: the pid of a commit or rollback running now, which holds ``.transplant/active``;
  ``exists``: False when the venv has no state folder, which this operation does not create)
* ``begin`` ``{"id", "steps", "after", "bytes", "source"}``: checks free space and that
  every folder it will write is writable, before anything is written; records the
  content of each touched path (``before.json``) and the stat identity of each regular file
  among them (``before-known.json``).
* ``heads`` ``{"id", "scripts": [{"path", "head", "body_hash"}]}``: rewrite staged scripts.
* ``records`` ``{"id", "records": [{"path", "scripts": [...]}]}``: after ``heads``, set the rows
  of those scripts in the staged RECORDs to the files as written (sha256 and size); ``check``
  compares such a RECORD by its normalised identity (``record:...``, see :func:`record_identity`).
* ``links`` ``{"id", "links": [{"path", "target"}]}``: repoint staged symlinks (absolute ones
  into the donor's prefix get the same path under this venv; never outside it).
* ``check`` ``{"id", "expect", "written"}`` -> ``{"differ", "verified", ...}``: the staged files against
  the plan; a file the stream's receiver hashed as it wrote it, unchanged since (stat identity), is
  not read again (see :func:`check`); the files it verified are kept in ``after-known.json``.
* ``state`` ``{"expect": {path: identity or null}, "known", "recorded"}`` -> ``{"differ": [line, ...],
  "trusted", "hashed"}``: the live venv against a recorded state (after a commit, rollback or resume;
  before a rollback), hash for hash; ``known`` spares the files ``check`` verified and the commit
  renamed unchanged, ``recorded`` (``{"id", "of": "before"|"after"}``) those a transaction's own
  ``before-known.json`` or ``after-known.json`` names, still with that stat identity (see :func:`state`).
* ``commit`` ``{"id"}`` -> ``{"steps", "removed", "warmed"}`` (``warmed``: the entries it gave the
  probe's hash cache for the files it renamed into place, see :class:`_Warm`), ``rollback``
  ``{"id"}``, ``discard`` ``{"id"}`` (drop an unstarted one)
* ``record`` ``{"entry"}``; ``history`` ``{}`` -> ``{"events", "transactions"}``
* ``txn`` ``{"id"}`` -> the transaction's plan, state, before and after, and ``committed_at``
  (when its commit finished, from the journal; None when it has not).
* ``tidy`` ``{}`` -> ``{"removed"}``: the state folder goes again when it holds nothing (an apply
  stopped before its transaction began, in a venv that had none); empty folders only, never a
  symlink (see :func:`tidy`).

Testing hooks: a request with ``"crash_after": N`` makes ``commit`` or ``rollback`` kill its own
process with SIGKILL before step N (a real crash at a chosen point, for the fault tests); with
``"orphan_at": N`` it waits before step N until the process that started it is gone (the test
kills the controller there), then goes on alone, as a host script orphaned mid-commit does.
``TRANSPLANT_TEST_APPLIER_LOG`` in the environment names a file where each process logs its start.
"""

import concurrent.futures
import csv
import fcntl
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import signal
import stat
import sys
import tempfile
import time

try:
    from _transplant_common import (HASH_CACHE_NAME, HASH_SCHEMA, read_venv_cache, record_hash as _digest,
                                    record_hash_of, record_identity, script_head as _split_head, venv_cache_path,
                                    venv_prefix, write_venv_cache, APPLIER_LOG, hook_log)
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import (HASH_CACHE_NAME, HASH_SCHEMA, read_venv_cache, record_hash as _digest, record_hash_of,
                          record_identity, script_head as _split_head, venv_cache_path, venv_prefix,
                          write_venv_cache, APPLIER_LOG, hook_log)

STATE = ".transplant"
_PROTECTED = ("pyvenv.cfg", STATE)
_MARGIN = 16 << 20  # bytes kept free beyond what staging needs


class Refused(Exception):
    """A request this script will not carry out; the message says why."""


#: Folder -> its real path, for the operation under way (:func:`answer` empties it before each,
#: and a step that puts a symlink empties it too). A transaction's steps lie in a few thousand
#: folders; ``os.path.realpath`` of each step's folder (an lstat per path component, in Python,
#: for each step in begin, check and commit) dominated the applier's time on large applies.
_REAL_FOLDERS: "dict[str, str]" = {}


#: Folders made (or found) by :func:`_make_folder` during the operation under way (emptied with
#: :data:`_REAL_FOLDERS`; a commit's folders are removed only after its last step).
_MADE_FOLDERS: "set[str]" = set()


def _make_folder(path):
    """``os.makedirs(path, exist_ok=True)``, once per folder and operation."""
    if path not in _MADE_FOLDERS:
        os.makedirs(path, exist_ok=True)
        _MADE_FOLDERS.add(path)


def _real_dir(folder):
    """``os.path.realpath(folder)``, asked once per folder and operation (:data:`_REAL_FOLDERS`).

    An absolute, normal folder (no ``.``, ``..`` or empty part) is resolved from its parent's
    answer (cached too) and one ``lstat`` of its last part: not a symlink (a folder, a file or
    nothing there), it is the parent's real path joined with that name, as ``realpath`` says; a
    symlink is left to ``realpath``. So a folder costs one ``lstat``, not one per part of its path
    (``realpath`` looks at every part every time, which adds up over tens of thousands of steps).
    Anything else is ``realpath``'s alone.
    """
    real = _REAL_FOLDERS.get(folder)
    if real is not None:
        return real
    parent, name = os.path.split(folder)
    if not folder.startswith("/") or not name or parent == folder or name in (".", "..") or \
            "/./" in folder or "/../" in folder or "//" in folder:
        real = os.path.realpath(folder)
    else:
        candidate = os.path.join(_real_dir(parent), name)
        try:
            linked = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            linked = False
        real = os.path.realpath(candidate) if linked else candidate
    _REAL_FOLDERS[folder] = real
    return real


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
    real_prefix = _real_dir(prefix)
    parent = _real_dir(os.path.dirname(full))
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


def _refuse_loose(path, what):
    """Refuse a state file or folder another user could have written (as OpenSSH refuses a loose
    key): owned by another uid than this process's (root's are accepted) or writable by its group
    or others. A symlink or an absent path passes here (the reads refuse symlinks themselves)."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        return
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        raise Refused("refused: {} ({}) is owned by uid {}, not by uid {} (the user transplant runs as) or root: "
                      "another user could have written it; if its content is yours: chown {} {}, otherwise "
                      "remove it".format(path, what, info.st_uid, me, me, _quote(path)))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused("refused: {} ({}) is writable by its group or others (mode {:04o}): another user could have "
                      "written it; fix: chmod go-w {}".format(path, what, stat.S_IMODE(info.st_mode), _quote(path)))


def _quote(path):
    return path if re.match(r"[A-Za-z0-9_@%+=:,./-]+\Z", path) else "'" + path.replace("'", "'\"'\"'") + "'"


#: The state folder's own entries checked by :func:`_refuse_loose_state` before every operation,
#: and a transaction folder's by :func:`_txn_dir`.
_STATE_ENTRIES = (("lock", "the lock"), ("history.jsonl", "the history"), ("txn", "the transactions' folder"),
                  ("cache", "the caches' folder"))
_TXN_ENTRIES = ("plan.json", "state", "journal.jsonl", "before.json", "after.json", "before-known.json",
                "after-known.json")


def _refuse_loose_state(prefix):
    """:func:`_refuse_loose` for the venv's state folder and its lock, history and folders."""
    folder = os.path.join(prefix, STATE)
    if not os.path.isdir(folder):
        return
    _refuse_loose(folder, "transplant's state folder in the venv")
    for name, what in _STATE_ENTRIES:
        _refuse_loose(os.path.join(folder, name), what)


def _txn_dir(prefix, txid):
    if not isinstance(txid, str) or not txid or "/" in txid or txid.startswith(".") or "\0" in txid:
        raise Refused("refused: bad transaction id {!r}".format(txid))
    root = _real_folder(os.path.join(_state_dir(prefix), "txn"))
    folder = os.path.join(root, txid)
    if os.path.islink(folder):
        raise Refused("refused: {} is a symlink".format(folder))
    _refuse_loose(folder, "a transaction's folder")
    for name in _TXN_ENTRIES:
        _refuse_loose(os.path.join(folder, name), "a transaction's record" if name != "journal.jsonl" else "its journal")
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
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError):
        return default


def _required(folder, name, kind):
    """A state file a commit or rollback relies on, of type ``kind``; Refused when missing or
    damaged (acting on a damaged record could delete what it never touched)."""
    value = _read_json(os.path.join(folder, name))
    if not isinstance(value, kind):
        raise Refused("{} of transaction {} is missing or damaged; transplant will not act on it. Look at the "
                      "venv by hand (the backups are in {})".format(name, os.path.basename(folder),
                                                                   os.path.join(folder, "backup")))
    return value


def _plan(folder):
    plan = _required(folder, "plan.json", dict)
    steps = plan.get("steps")
    if not isinstance(steps, list) or not all(
            isinstance(st, dict) and st.get("op") in ("put", "del") and isinstance(st.get("path"), str) for st in steps):
        raise Refused("plan.json of transaction {} has damaged steps; transplant will not act on it".format(
            os.path.basename(folder)))
    return plan


def _append(path, line):
    """Append a line to a state file, never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def _under(root, rel):
    """``root/rel`` for a staging or backup path, refusing a symlinked folder on the way
    (the state folder must not lead outside the venv)."""
    full = os.path.join(root, os.path.normpath(rel))
    real_root = _real_dir(root)
    parent = _real_dir(os.path.dirname(full))
    linked = _LINKED_ROOTS.get(root)
    if linked is None:  # once per root and operation, as its real path is (:data:`_REAL_FOLDERS`)
        linked = _LINKED_ROOTS[root] = os.path.islink(root)
    if linked or not (parent == real_root or parent.startswith(real_root + os.sep)):
        raise Refused("refused: {} leads outside the transaction's folder".format(full))
    return full


#: Whether each root :func:`_under` was given is a symlink, asked once per operation (emptied with
#: :data:`_REAL_FOLDERS`).
_LINKED_ROOTS: "dict[str, bool]" = {}


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
    return record_hash_of(digest.digest())


#: ``begin`` looks hashes up in the probe's hash cache only when the files it would read add up to
#: at least this many bytes (below that, reading them costs less than loading the cache).
_CACHE_MIN_BYTES = 32 << 20


def _contents_before(prefix, paths, keys=None, resolved=None):
    """``{path: content identity}`` (:func:`_content`'s form) of venv-relative ``paths`` as they are
    now: the transaction's ``before.json``, which ``rollback`` restores and checks hash for hash.

    A regular file whose ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` equals its entry
    in the probe's hash cache (``<venv>/.transplant/cache/hashes.json``, written by the plan's
    probe on this host under git's racy-clean rule) takes the entry's hash unread, when the files
    to read add up to at least :data:`_CACHE_MIN_BYTES`; every other path is read and hashed
    (a replaced file was read once by the plan's probe already: hashing it again here doubled
    what ``prepare`` read, 1.7 GB on the benchmark's pair). An unreadable or malformed cache is
    not used.

    :param keys: None, or a dict this fills with ``path -> [identity, st_dev, st_ino, st_size,
        st_mtime_ns]`` for each regular file whose identity was taken from the cache, or read with
        the same :func:`_stat_key` before and after the read, and whose mtime is older than this
        call's start less :data:`_RACY_NS` (:func:`_stable`): ``before-known.json``, by which
        ``state`` knows a file a rollback renamed back from its backup (a hardlink: all four
        fields survive).
    :param resolved: None, or ``{path: full path}`` as :func:`_resolve` gave them already.
    :raises Refused: a path leaves the venv (:func:`_resolve`).
    """
    started = time.time_ns()
    fulls = [(rel, resolved[rel] if resolved is not None else _resolve(prefix, rel)) for rel in paths]
    stats = {}
    for rel, full in fulls:
        try:
            stats[rel] = os.lstat(full)
        except OSError:
            stats[rel] = None
    unread = sum(st.st_size for st in stats.values() if st is not None and stat.S_ISREG(st.st_mode))
    known = {}
    where = venv_cache_path(prefix, HASH_CACHE_NAME) if unread >= _CACHE_MIN_BYTES else None
    if where is not None:
        try:
            known = read_venv_cache(where, HASH_SCHEMA)
        except (OSError, ValueError):
            known = {}
    before, unread = {}, []
    for rel, full in fulls:
        st, entry = stats[rel], known.get(posixpath.normpath(rel))
        key = None if st is None else _stat_key_of(st)
        if key is not None and isinstance(entry, list) and len(entry) == 8 and \
                entry[:5] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] and \
                isinstance(entry[5], str) and entry[5].startswith("sha256="):
            before[rel] = entry[5]
            _keep_known(keys, rel, before[rel], key, started)
        else:
            before[rel] = None  # its place in the order; read below
            unread.append((rel, full, key))

    def read(job):
        rel, full, key = job
        content = _content(full)
        if key is not None and _stat_key(full) != key:  # replaced or written while it was read
            key = None
        return rel, content, key

    # files not yet in the page cache (those the plan needed no hash of: another size, a version
    # whose RECORD differs) read faster side by side: 1.7x with eight readers on this project's disk
    with concurrent.futures.ThreadPoolExecutor(max_workers=_READERS) as pool:
        for rel, content, key in pool.map(read, unread):
            before[rel] = content
            _keep_known(keys, rel, content, key, started)
    return before


#: How many files :func:`_contents_before` reads at once.
_READERS = 8


def _keep_known(keys, rel, content, key, started):
    """Note ``rel``'s stat identity in ``keys`` (``before-known.json``'s entries) when it is a
    regular file whose content was taken and whose mtime is older than the racy window."""
    if keys is not None and key is not None and isinstance(content, str) and _stable(key[3], started):
        keys[rel] = [content] + key


#: A file whose mtime lies within this many nanoseconds of the moment its identity was read, or
#: after it, gets no entry in a transaction's ``*-known.json`` ("racily clean", as git's index and
#: the probe's hash cache have it: a write in the same clock tick as the read would leave its stat
#: identity as it was). Such a file (a console script ``heads`` rewrote, a file written just before
#: the apply) is read again by the checks of a rollback; a few, in practice.
_RACY_NS = 2 * 10 ** 9


def _stable(mtime_ns, started_ns):
    """Whether a file last modified at ``mtime_ns`` (ns since the epoch) is safely older than a
    read that started at ``started_ns`` (this host's clock): see :data:`_RACY_NS`."""
    return mtime_ns < started_ns - _RACY_NS


#: The stat identities a transaction keeps of its two states (see the module docstring).
_KNOWN_FILES = {"before": "before-known.json", "after": "after-known.json"}


def _write_known(folder, of, entries):
    """Write ``entries`` (path -> ``[identity, st_dev, st_ino, st_size, st_mtime_ns]``) as the
    transaction folder ``folder``'s record of its ``of`` state (``"before"`` or ``"after"``):
    ``before-known.json`` or ``after-known.json``, replaced whole (:func:`_write_atomic`)."""
    _write_json(os.path.join(folder, _KNOWN_FILES[of]), entries)


def _read_known(prefix, recorded):
    """The stat identities a transaction recorded of one of its states, for :func:`state`.

    :param recorded: ``{"id": transaction id, "of": "before"|"after"}``, or None.
    :returns: path -> entry as :func:`_write_known` wrote it; empty when ``recorded`` is None, and
        when the record is missing (a transaction from before these records existed, or whose
        check never passed), damaged, not a regular file (never read through a symlink) or not a
        JSON object: then every file is read, as for any file whose entry does not hold.
    :raises Refused: ``recorded`` is not such an object, or its id is not a transaction id.
    """
    if recorded is None:
        return {}
    if not isinstance(recorded, dict) or recorded.get("of") not in _KNOWN_FILES:
        raise Refused("refused: recorded {!r} is not {{\"id\", \"of\": \"before\"|\"after\"}}".format(recorded))
    path = os.path.join(_txn_dir(prefix, recorded.get("id")), _KNOWN_FILES[recorded["of"]])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "r", encoding="utf-8") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return {}
            value = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


# --- lock --------------------------------------------------------------------------------

#: The lock's entry is written whole under this name (``lock.<pid>.tmp``), then linked as the lock.
_LOCK_TEMP = re.compile(r"lock\.([0-9]+)\.tmp\Z")


def lock(prefix, request):
    """Take the lock: its entry appears whole or not at all. It is written and synced under a
    temporary name first, then hard-linked as ``lock`` (``link`` fails when ``lock`` exists, as
    ``O_EXCL`` does). Created in place, the lock was empty until its entry was written: an applier
    killed in between (Ctrl-C as the lock is taken, seen under load) left an empty lock nobody could
    read, so the interrupted command could not release it (the next apply needed ``--break-lock``)
    and the state folder stayed. Where hard links are refused, it is created in place as before."""
    state = _state_dir(prefix)
    path = os.path.join(state, "lock")
    entry = {"id": request.get("id"), "controller": request.get("controller"), "pid": request.get("pid"),
             "command": request.get("command"), "since": time.time()}
    temporary = os.path.join(state, "lock.{}.tmp".format(os.getpid()))
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(entry, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.link(temporary, path)
        finally:
            try:
                os.unlink(temporary)
            except OSError:
                pass
    except FileExistsError:
        return _locked(path)
    except OSError:  # no hard links here (or no temporary file): created in place
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return _locked(path)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(entry, handle)
            handle.flush()
            os.fsync(handle.fileno())
    _fsync_dir(state)
    return {"ok": True, "error": None}


def _running(pid):
    """Whether process ``pid`` runs on this host (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):
        return True
    return pid > 0


def _locked(path):
    """The reply to a ``lock`` that found ``path`` held: its holder's entry, or ``unreadable``."""
    held = _read_json(path, None) if os.path.isfile(path) and not os.path.islink(path) else None
    return {"ok": False, "error": "locked", "held": held if isinstance(held, dict) else {"unreadable": True}}


def unlock(prefix, request):
    path = os.path.join(_state_dir(prefix), "lock")
    held = _read_json(path)
    if held is not None and held.get("id") != request.get("id"):
        return {"ok": False, "error": "the lock belongs to {}".format(held.get("id")), "held": held}
    if os.path.exists(path):
        os.unlink(path)
    return {"ok": True, "error": None}


def break_lock(prefix, request):
    """Remove the lock, but only the one the caller saw (``expect``: its id, or None for an
    unreadable one): it is renamed aside first, so two breakers never both win."""
    path = os.path.join(_state_dir(prefix), "lock")
    held = _read_json(path)
    seen = held.get("id") if isinstance(held, dict) else None
    if seen != request.get("expect"):
        return {"ok": False, "error": "the lock changed hands meanwhile (now {})".format(seen), "held": held}
    aside = "{}.broken-{}".format(path, os.getpid())
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return {"ok": False, "error": "the lock was broken by someone else meanwhile"}
    again = _read_json(aside)
    if (again.get("id") if isinstance(again, dict) else None) != seen:
        os.rename(aside, path)  # taken by another in between: put it back
        return {"ok": False, "error": "the lock changed hands meanwhile"}
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside)
    else:
        os.unlink(aside)
    return {"ok": True, "error": None, "held": held}


# --- transactions --------------------------------------------------------------------------

def _transactions(prefix, unfinished=False):
    """The venv's transactions, oldest first (``unfinished``: only those not in a :data:`FINAL`
    state, whose plan and after files alone are read: a real transaction's are megabytes, and
    every apply asks for the unfinished ones)."""
    root = os.path.join(_state_dir(prefix), "txn")
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        folder = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(folder) or os.path.islink(folder):
            continue  # a '.begin-' folder is a begin that never finished: no transaction
        state = _read_state(folder)
        if unfinished and state in FINAL:
            continue
        plan = _read_json(os.path.join(folder, "plan.json"), {})
        plan = plan if isinstance(plan, dict) else {}
        steps = plan.get("steps") if isinstance(plan.get("steps"), list) else []
        after = _read_json(os.path.join(folder, "after.json"), None)
        after = after if isinstance(after, dict) else None
        # paths: what the transaction leaves (the unit ``status`` counts); steps: its put/del operations
        paths = len(after) if after is not None else len({st.get("path") for st in steps if isinstance(st, dict)})
        out.append({"id": name, "state": state, "source": str(plan.get("source") or ""),
                    "created": plan.get("created") if isinstance(plan.get("created"), (int, float)) else None,
                    "steps": len(steps), "paths": paths})
    # oldest first: an id holds its second and a random suffix, so two transactions begun in the
    # same second are ordered by when begin wrote them (``created``, this host's clock), not by suffix
    out.sort(key=lambda t: (t["id"][:16], t["created"] or 0.0, t["id"]))
    return out


_STATES = ("staging", "committing", "committed", "rolling-back", "rolled-back", "aborted")
FINAL = ("committed", "rolled-back", "aborted")


def _read_state(folder):
    """The transaction's state; ``damaged`` for anything unreadable or unknown (then it counts
    as interrupted, so a damaged record never lets another apply run over it)."""
    try:
        with open(os.path.join(folder, "state"), encoding="utf-8", errors="replace") as handle:
            text = handle.read(64).strip()
    except OSError:
        return "damaged"
    return text if text in _STATES else "damaged"


def _set_state(folder, state):
    _write_atomic(os.path.join(folder, "state"), state.encode("utf-8"))


def pending(prefix, request):
    if not os.path.lexists(os.path.join(prefix, STATE)):  # never applied to: nothing to create here
        return {"ok": True, "error": None, "lock": None, "interrupted": [], "active": None, "exists": False}
    interrupted = _transactions(prefix, unfinished=True)
    held = _read_json(os.path.join(_state_dir(prefix), "lock"))
    return {"ok": True, "error": None, "lock": held if isinstance(held, dict) else None,
            "interrupted": interrupted, "active": active(prefix), "exists": True}


_BEGIN = ".begin-"


def _remove_unfinished_begins(root):
    """Remove the ``.begin-<id>`` folders under the transactions' folder ``root``: each is a
    begin that stopped before its rename (nothing in the live venv was touched by it). Only
    real folders of that name are removed (``lstat``: a symlink is never followed nor removed)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        path = os.path.join(root, name)
        try:
            if name.startswith(_BEGIN) and stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def _writable_problems(prefix, steps, resolved=None):
    """Folders the steps write in that cannot be written (read-only mount, permissions), steps
    whose path is a folder (a file cannot replace it), and files where a step needs a folder
    (``sub`` a file, the step ``sub/x.py``). Each folder is looked at once. ``resolved``:
    None or ``{path: full path}`` of every step as :func:`_resolve` gave them."""
    problems, verdicts, nearest = [], {}, {}
    for step in steps:
        full = resolved[step["path"]] if resolved is not None else _resolve(prefix, step["path"])
        where = os.path.dirname(full)
        folder = nearest.get(where)
        if folder is None:  # the nearest folder that exists (begin creates none)
            folder = where
            while not os.path.isdir(folder) and folder != prefix:
                if os.path.lexists(folder):  # a file (or a link to one) where the step needs a folder
                    clash = "{}: is a file, not a folder".format(os.path.relpath(folder, prefix))
                    if clash not in problems:
                        problems.append(clash)
                folder = os.path.dirname(folder)
            nearest[where] = folder
        if folder not in verdicts:
            verdicts[folder] = _folder_problem(prefix, folder)
            if verdicts[folder]:
                problems.append(verdicts[folder])
        if verdicts[folder]:
            continue
        try:
            is_folder = stat.S_ISDIR(os.lstat(full).st_mode)
        except OSError:
            is_folder = False
        if is_folder:
            problems.append("{}: is a folder, not a file".format(step["path"]))
    return problems


def _folder_problem(prefix, folder):
    """Why nothing can be written in ``folder`` (an existing folder), or None."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError as exc:
        return "{}: {}".format(os.path.relpath(folder, prefix), exc.strerror)
    if read_only:
        return "{}: on a read-only filesystem".format(os.path.relpath(folder, prefix))
    if not os.access(folder, os.W_OK | os.X_OK):
        return "{}: not writable by this user".format(os.path.relpath(folder, prefix))
    return None


def begin(prefix, request):
    txid = request.get("id")
    folder = _txn_dir(prefix, txid)
    steps = request.get("steps") or []
    resolved = {}
    for step in steps:
        if step.get("op") not in ("put", "del"):
            raise Refused("refused: bad step {!r}".format(step))
        resolved[step.get("path")] = _resolve(prefix, step.get("path"))
    problems = _writable_problems(prefix, steps, resolved)
    if problems:
        return {"ok": False, "error": "cannot write {} in the venv: {}".format(
            "1 place" if len(problems) == 1 else "{} places".format(len(problems)), "; ".join(problems[:5])), "unwritable": problems}
    needed = int(request.get("bytes") or 0) + _MARGIN
    fs = os.statvfs(prefix)
    free = fs.f_bavail * fs.f_frsize
    if free < needed:
        return {"ok": False, "error": "not enough space", "needed": needed, "free": free}
    if os.path.lexists(folder):
        raise Refused("refused: transaction {} already exists".format(txid))
    # built whole under a name no transaction has (ids never start with a dot), then renamed into
    # place: a begin stopped part-way (Ctrl-C, a kill) leaves no transaction without its plan.json
    # (one that no command could finish or undo), only a '.begin-' folder the next begin removes
    _remove_unfinished_begins(os.path.dirname(folder))
    building = os.path.join(os.path.dirname(folder), _BEGIN + txid)
    os.makedirs(os.path.join(building, "staged"), mode=0o700)
    os.makedirs(os.path.join(building, "backup"), mode=0o700)
    keys = {}
    before = _contents_before(prefix, [s["path"] for s in steps], keys, resolved)
    _write_json(os.path.join(building, "before.json"), before)
    _write_known(building, "before", keys)
    _write_json(os.path.join(building, "after.json"), request.get("after") or {})
    _write_json(os.path.join(building, "plan.json"), {"id": txid, "source": request.get("source"),
                                                      "created": time.time(), "steps": steps})
    _set_state(building, "staging")
    os.rename(building, folder)
    return {"ok": True, "error": None, "free": free, "needed": needed,
            "staged": os.path.join(folder, "staged")}


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


def _row_path(line):
    """The path field of one RECORD line, or None when the line is not one whole CSV row."""
    try:
        rows = list(csv.reader(io.StringIO(line.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error):
        return None
    return rows[0][0] if len(rows) == 1 and rows[0] else None


def _file_row(full):
    """(``sha256=<urlsafe b64>``, size in bytes) of a regular file; Refused otherwise."""
    if os.path.islink(full) or not os.path.isfile(full):
        raise Refused("{}: not a regular file; its RECORD row cannot be set".format(full))
    return _content(full), os.path.getsize(full)


def records(prefix, request):
    """Set the RECORD rows of the console scripts ``heads`` rewrote to the files as written.

    ``{"id", "records": [{"path": <venv-relative RECORD>, "scripts": [<venv-relative script>...]}]}``:
    in each staged RECORD, every line whose row names one of ``scripts`` (its path joined to
    the site-packages folder holding the dist-info folder, PEP 376) gets that script's
    sha256 (RECORD's ``sha256=<urlsafe b64, no padding>`` form) and size in bytes, as pip
    writes rows for the scripts it generates; the file measured is the staged script, or
    the live one where this transaction does not replace it. Every other line stays byte for
    byte as the donor wrote it (line endings too). Returns ``{"ok", "error", "rows": N}``
    (rows set); Refused for a path outside the venv, a RECORD that is not staged, or a
    script that is not a regular file.
    """
    folder = _txn_dir(prefix, request.get("id"))
    staged = _real_folder(os.path.join(folder, "staged"))
    done = 0
    for item in request.get("records") or []:
        rel = item.get("path", "")
        _resolve(prefix, rel)
        full = _under(staged, rel)
        if os.path.islink(full) or not os.path.isfile(full):
            raise Refused("{}: not a staged RECORD".format(rel))
        facts = {}
        for script in item.get("scripts") or []:
            _resolve(prefix, script)
            source = _under(staged, script)
            facts[posixpath.normpath(script)] = _file_row(
                source if os.path.lexists(source) else _resolve(prefix, script))
        site = posixpath.dirname(posixpath.dirname(posixpath.normpath(rel)))
        with open(full, "rb") as handle:
            lines = handle.read().splitlines(keepends=True)
        out = []
        for line in lines:
            path = _row_path(line)
            where = posixpath.normpath(posixpath.join(site, path)) if path else None
            if where in facts:
                body = line.rstrip(b"\r\n")
                text = io.StringIO(newline="")
                csv.writer(text, lineterminator="").writerow([path, facts[where][0], facts[where][1]])
                line = text.getvalue().encode("utf-8") + line[len(body):]
                done += 1
            out.append(line)
        mode = os.lstat(full).st_mode & 0o7777
        _write_atomic(full, b"".join(out))
        os.chmod(full, mode)
    return {"ok": True, "error": None, "rows": done}


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


def _identity(full, want, rel):
    """The content identity of a staged file in the form ``want`` uses (hash, symlink, script,
    or for a RECORD (``rel``: its venv-relative path) the normalised ``record:`` form of
    :func:`record_identity`, with ``bin`` as the scripts folder, as :func:`_resolve` has it)."""
    if isinstance(want, str) and want.startswith("record:") and not os.path.islink(full) and os.path.isfile(full):
        with open(full, "rb") as handle:
            data = handle.read()
        site = posixpath.dirname(posixpath.dirname(posixpath.normpath(rel)))
        return record_identity(data, site, "bin") or _content(full)
    if not isinstance(want, str) or not want.startswith("script:"):
        return _content(full)
    with open(full, "rb") as handle:
        data = handle.read()
    head, body = _split_head(data)
    if head is None:
        return _content(full)
    try:
        return "script:{}:{}".format(_digest(body), head.decode("utf-8"))
    except UnicodeDecodeError:
        return _content(full)


def _stat_key(full):
    """``[st_dev, st_ino, st_size, st_mtime_ns]`` of a regular file (``lstat``: never followed);
    None for anything else or nothing.

    ctime is left out on purpose: a rename sets the inode's ctime on Linux filesystems (ext4,
    xfs, btrfs), so a committed file's ctime never equals the one it had staged, while its
    device, inode, size and mtime stay. Any write changes the mtime (the receiver set it to the
    donor's, in the past), and a file rewritten by rename (``heads``, ``records``) gets a new inode.
    What this cannot see is a same-size rewrite whose mtime is then set back (``touch -d``):
    the trade git's index makes with the same fields.
    """
    try:
        info = os.lstat(full)
    except OSError:
        return None
    return _stat_key_of(info)


def _stat_key_of(info):
    """:func:`_stat_key` of an ``os.stat_result`` already taken (by ``lstat``)."""
    if not stat.S_ISREG(info.st_mode):
        return None
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]


def _known(entry, key):
    """Whether ``entry`` (``[identity, st_dev, st_ino, st_size, st_mtime_ns]``) names the file whose
    :func:`_stat_key` is ``key``."""
    return (key is not None and isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str)
            and entry[1:] == key)


def check(prefix, request):
    """Compare every staged file with the plan before the commit (``expect``: path ->
    identity); a donor file that changed between plan and copy is caught here, while the
    live venv is still untouched.

    ``written`` (optional): path -> ``[sha256, size, st_dev, st_ino, st_mtime_ns]`` as the stream's
    receiver wrote the file, hashing its bytes as they came (``stream_receive.py``). A staged
    regular file planned as a plain ``sha256=`` whose stat identity (:func:`_stat_key`) still
    equals the receiver's is taken at the receiver's hash, not read again; any other (a file
    ``heads`` or ``records`` rewrote, one whose stat differs, a symlink, a RECORD) is hashed.

    Reply: ``differ`` (lines, at most 50), ``trusted`` and ``hashed`` (files taken at the
    receiver's hash and files read), and ``verified``: path -> ``[identity, st_dev, st_ino,
    st_size, st_mtime_ns]`` of each staged regular file that matched, for ``state``'s ``known``
    after the commit (a rename keeps all four).

    A transaction still ``staging`` also keeps those entries in ``after-known.json`` (replaced by
    each check), but for files modified within :data:`_RACY_NS` of this check's start or later
    (:func:`_stable`): ``state`` takes them for the checks of a later rollback or resume
    (``recorded``), long after the commit, when a write in the tick the check read a file in
    would no longer be told from the file as verified.
    """
    started = time.time_ns()
    folder = _txn_dir(prefix, request.get("id"))
    staged = _real_folder(os.path.join(folder, "staged"))
    written = request.get("written") or {}
    differ, verified, trusted, hashed = [], {}, 0, 0
    for rel, want in sorted((request.get("expect") or {}).items()):
        _resolve(prefix, rel)
        full = _under(staged, rel)
        key = _stat_key(full)
        entry = written.get(rel)
        if (isinstance(want, str) and want.startswith("sha256=") and isinstance(entry, list) and len(entry) == 5
                and _known([entry[0], entry[2], entry[3], entry[1], entry[4]], key)):
            have = entry[0]
            trusted += 1
        else:
            have = _identity(full, want, rel) if os.path.lexists(full) else None
            hashed += key is not None
        if have != want:
            differ.append("{}: staged {} , planned {}".format(rel, have, want))
        elif key is not None:
            verified[rel] = [have] + key
    if _read_state(folder) == "staging":
        _write_known(folder, "after", {rel: entry for rel, entry in verified.items() if _stable(entry[4], started)})
    return {"ok": not differ, "error": ("1 staged file differs" if len(differ) == 1 else "{} staged files differ".format(len(differ))) + " from the plan" if differ else None,
            "differ": differ[:50], "trusted": trusted, "hashed": hashed, "verified": verified}


def state(prefix, request):
    """Compare the live venv with ``expect`` (path -> identity in the form :func:`_identity`
    reads; None: the path must be absent): after a commit, a rollback or a resume, and before
    a rollback (has anything changed since?). One line names each path that differs.

    ``known`` (optional): path -> ``[identity, st_dev, st_ino, st_size, st_mtime_ns]``, ``check``'s
    ``verified``: a live regular file whose stat identity (:func:`_stat_key`) equals the one it
    had staged, with the planned identity, is not hashed again (the commit renamed it, which
    keeps all four).

    ``recorded`` (optional): ``{"id": transaction id, "of": "before"|"after"}``: the entries of that
    transaction's ``before-known.json`` or ``after-known.json`` (:func:`_read_known`) count as
    ``known`` too (``known``'s own win): before a rollback, a committed file whose stat identity is
    the one ``check`` verified; after it, a file renamed back from its backup (a hardlink of the
    original: dev, inode, size and mtime survive) with the identity ``begin`` read. A transaction
    without these records has every file read. Either way an entry is taken only when its identity
    is the one expected of the path, and every path is resolved inside the venv first.

    Reply: ``differ``, ``trusted`` (files taken at their known identity) and ``hashed`` (files
    read: every path that is there but a symlink and a trusted file).

    :raises Refused: a path leaves the venv (:func:`_resolve`), or ``recorded`` is malformed."""
    differ, trusted, hashed = [], 0, 0
    known = dict(_read_known(prefix, request.get("recorded")))
    known.update(request.get("known") or {})
    for rel, want in sorted((request.get("expect") or {}).items()):
        full = _resolve(prefix, rel)
        there = os.path.islink(full) or os.path.isfile(full)
        if want is None:
            if there:
                differ.append("{}: should have been removed, still there".format(rel))
        elif not there:
            differ.append("{}: missing".format(rel))
        elif isinstance(known.get(rel), list) and known[rel][:1] == [want] and _known(known[rel], _stat_key(full)):
            trusted += 1
        else:
            hashed += not os.path.islink(full)
            have = _identity(full, want, rel)
            if have != want:
                kind = "script" if want.startswith("script:") else "RECORD" if want.startswith("record:") else "content"
                differ.append("{}: {} {} differs from the planned {}".format(rel, kind, have, want))
    return {"ok": True, "error": None, "differ": differ, "trusted": trusted, "hashed": hashed}


def _backup(full, backup):
    """Keep the current file (or symlink) at ``full`` at ``backup``: a hardlink, or a copy where
    links fail. A backup already there (a commit resumed after a crash) is kept as it is.

    The link is simply tried (one system call where a replaced file is concerned, not a look at
    each path first: 82,022 steps in the real pair's apply); its folder is made when the link
    says it is missing.

    :returns: whether a backup is there now (False: nothing at ``full`` to keep).
    """
    for attempt in (0, 1):
        try:
            os.link(full, backup, follow_symlinks=False)
            return True
        except FileExistsError:
            return True
        except FileNotFoundError:
            if attempt or not os.path.lexists(full):
                return False
            _make_folder(os.path.dirname(backup))  # the first backup in a folder of its own
        except OSError:
            break
    if os.path.lexists(backup):
        return True
    _make_folder(os.path.dirname(backup))  # where links fail before they say the folder is missing
    if os.path.islink(full):
        os.symlink(os.readlink(full), backup)
    else:
        shutil.copy2(full, backup)
    return True


def _crash_point(request, index):
    if request.get("crash_after") == index:
        os.kill(os.getpid(), signal.SIGKILL)
    if request.get("orphan_at") == index:
        _wait_orphaned()


def _wait_orphaned(limit=120.0):
    """Testing hook: wait (at most ``limit`` seconds) until the process that started this one
    is gone, so the rest of the commit runs as an orphan's."""
    parent = os.getppid()
    deadline = time.monotonic() + limit
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.02)


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
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise Refused("a commit or rollback is still running in this venv (pid {}); wait for it".format(
                _active_pid(self.path))) from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _active_pid(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or "?"
    except OSError:
        return "?"


def active(prefix):
    """The pid (a number: the controller takes a number or null) of a running commit or rollback
    in this venv, or None; 0 for one whose pid is not written yet."""
    path = os.path.join(_state_dir(prefix), "active")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = _active_pid(path)
        return int(pid) if pid.isdigit() else 0
    finally:
        os.close(fd)
    return None


def _holding(prefix, request):
    """Refused unless the caller holds the venv's lock (``request["lock"]`` is its id): a host
    script orphaned by a dead controller must not act after another apply took over."""
    held = _read_json(os.path.join(_state_dir(prefix), "lock"))
    if not isinstance(held, dict) or held.get("id") != request.get("lock"):
        raise Refused("refused: this request's lock {!r} is not the venv's lock (held by {!r}); another apply "
                      "took over".format(request.get("lock"), held.get("id") if isinstance(held, dict) else None))


def _exclusive(operation):
    """Run ``operation`` holding ``.transplant/active``, and only for the lock's holder."""
    def run(prefix, request):
        with _Active(prefix):
            _holding(prefix, request)
            return operation(prefix, request)
    return run


def _commit(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    plan = _plan(folder)
    _required(folder, "after.json", dict)
    state = _read_state(folder)
    if state not in ("staging", "committing", "committed"):
        raise Refused("transaction {} is {}; it cannot be committed".format(request.get("id"), state))
    _set_state(folder, "committing")
    staged = _real_folder(os.path.join(folder, "staged"))
    backups = _real_folder(os.path.join(folder, "backup"))
    journal = os.path.join(folder, "journal.jsonl")
    warm = _Warm(prefix, request.get("id"), plan["steps"])
    for index, step in enumerate(plan["steps"]):
        _crash_point(request, index)
        rel = os.path.normpath(step["path"])
        full = _resolve(prefix, rel)
        if step["op"] == "put":
            source = _under(staged, rel)
            try:
                placed = os.lstat(source).st_mode
            except OSError:
                continue  # done before a crash
            _backup(full, _under(backups, rel))
            _make_folder(os.path.dirname(full))
            os.rename(source, full)
            warm.placed(rel, full)
            if stat.S_ISLNK(placed):  # a later step's folder may lie through it: resolved afresh
                _REAL_FOLDERS.clear()
        elif _backup(full, _under(backups, rel)):
            try:
                os.unlink(full)
            except FileNotFoundError:
                pass  # removed before a crash, its backup kept then
        if index % 500 == 499:
            _append(journal, json.dumps({"done": index + 1, "time": time.time()}) + "\n")
    _append(journal, json.dumps({"done": len(plan["steps"]), "time": time.time()}) + "\n")
    # every folder a removal may have emptied, also those of steps done before a crash
    _prune_empty(prefix, {os.path.dirname(_resolve(prefix, st["path"])) for st in plan["steps"] if st["op"] == "del"})
    warmed = warm.save()
    os.sync()
    _set_state(folder, "committed")
    return {"ok": True, "error": None, "steps": len(plan["steps"]), "removed": len(
        [s for s in plan["steps"] if s["op"] == "del"]), "warmed": warmed}


class _Warm:
    """The probe's hash cache (``<venv>/.transplant/cache/hashes.json``, see ``_HashCache`` in
    ``probe.py``) given, at commit, an entry for each file the commit renamed into place whose
    content ``check`` verified: the operator's next plan then reads none of the bytes the apply
    just wrote (it hashed every one of them again before: new inodes, and a ctime the rename set
    just now, which the probe's own racy rule does not store).

    Trust rule. An entry ``[st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, hash, None, None]``
    is added for a put step's path only when all of these hold:

    * the transaction's ``after-known.json`` names the path (``check`` verified the staged file's
      content, by reading it or by the stream receiver's hash of the bytes as it wrote them, at
      the stat identity ``[st_dev, st_ino, st_size, st_mtime_ns]``), with a plain ``sha256=``
      identity (not a RECORD's ``record:`` form, not a script's ``script:`` form) and an mtime
      older than that check's start less two seconds (``_stable``: the rule ``after-known.json``
      already keeps, so a write in the clock tick of check's read cannot hide behind an unchanged
      mtime: any later write sets the mtime to the time of writing, not to that older value);
    * the path is not under ``bin/`` (the probe gives a script's shebang head and body hash too,
      which this entry does not know);
    * ``lstat`` taken right after this commit's rename gives exactly that dev, inode, size and
      mtime (a rename keeps all four); the entry's ctime is the one that lstat saw.

    That is ``after-known.json``'s own rule, with which ``state`` already spares re-reading these
    files, plus the ctime: the probe compares all five fields, so any change to the inode after
    this lstat (a write, a ``touch -d`` setting the mtime back, a chmod) sets another ctime and
    the file is hashed again. Residual risk, beyond ``after-known.json``'s: none new; what both
    cannot see is a same-size rewrite of the staged file whose mtime is then set back
    (``os.utime``) between check's read and the rename, or of the live file between the rename
    and the lstat microseconds later, or one after the lstat but within the same coarse clock
    tick (a few milliseconds) as it, so that the ctime reads the same.

    Cost: nothing when the files so trusted add up to fewer than :data:`_CACHE_MIN_BYTES` (below
    that the next probe re-hashes them for less than reading and writing the cache costs); else
    one lstat per such file and one read and write of the cache. Entries of paths the commit
    removed are dropped. Any error reading or writing the cache leaves it as it was (it is only
    a cache: a missing entry is a re-hash).
    """

    def __init__(self, prefix, txid, steps):
        self.prefix, self.entries, self.removed = prefix, {}, set()
        self.known = {}
        known = _read_known(prefix, {"id": txid, "of": "after"})
        puts = {os.path.normpath(step["path"]) for step in steps if step.get("op") == "put"}
        total = 0
        for rel, entry in known.items():
            rel = os.path.normpath(rel)
            if (rel in puts and isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str)
                    and entry[0].startswith("sha256=") and not rel.startswith("bin/")
                    and all(type(v) is int for v in entry[1:])):
                self.known[rel] = entry
                total += entry[3]
        self.on = total >= _CACHE_MIN_BYTES
        if self.on:
            self.removed = {os.path.normpath(step["path"]) for step in steps if step.get("op") == "del"}

    def placed(self, rel, full):
        """Note the file a put step just renamed to ``full`` (``rel``: its venv-relative path)."""
        if not self.on:
            return
        entry = self.known.get(rel)
        if entry is None:
            return
        try:
            info = os.lstat(full)
        except OSError:
            return
        if _known(entry, _stat_key_of(info)):
            self.entries[rel] = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
                                 entry[0], None, None]

    def save(self):
        """Merge the entries into the cache; returns how many were written (0: none, or it failed)."""
        if not self.entries:
            return 0
        where = venv_cache_path(self.prefix, HASH_CACHE_NAME)
        if where is None:
            return 0
        try:
            cache = read_venv_cache(where, HASH_SCHEMA)
            cache = {k: v for k, v in cache.items() if posixpath.normpath(k) not in self.removed} \
                if self.removed else dict(cache)
            cache.update(self.entries)
            write_venv_cache(self.prefix, where, HASH_SCHEMA, cache)
        except (OSError, ValueError, RecursionError):
            return 0
        return len(self.entries)


def _rollback(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    plan = _plan(folder)
    before = _required(folder, "before.json", dict)
    _set_state(folder, "rolling-back")
    backups = _real_folder(os.path.join(folder, "backup"))
    for index, step in enumerate(reversed(plan["steps"])):
        _crash_point(request, index)
        rel = os.path.normpath(step["path"])
        full = _resolve(prefix, rel)
        saved = _under(backups, rel)
        if os.path.lexists(saved):
            _make_folder(os.path.dirname(full))
            os.rename(saved, full)
            if os.path.islink(full):  # a later step's folder may lie through it: resolved afresh
                _REAL_FOLDERS.clear()
        elif step["path"] in before and before[step["path"]] is None and os.path.lexists(full):
            os.unlink(full)
    # every folder a put may have created, also those of steps undone before a crash
    _prune_empty(prefix, {os.path.dirname(_resolve(prefix, st["path"])) for st in plan["steps"]
                          if st["op"] == "put" and before.get(st["path"]) is None})
    staged = os.path.join(folder, "staged")
    if os.path.isdir(staged) and not os.path.islink(staged):
        shutil.rmtree(staged, ignore_errors=True)
    os.sync()
    return {"ok": True, "error": None, "steps": len(plan["steps"])}


def _discard(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    state = _read_state(folder)
    if state != "staging":
        raise Refused("transaction {} is {}; only an unstarted one is discarded".format(request.get("id"), state))
    staged = os.path.join(folder, "staged")
    if os.path.isdir(staged) and not os.path.islink(staged):
        shutil.rmtree(staged, ignore_errors=True)
    _set_state(folder, "aborted")
    return {"ok": True, "error": None}


def txn(prefix, request):
    folder = _txn_dir(prefix, request.get("id"))
    state = _read_state(folder)
    if not os.path.isdir(folder):
        raise Refused("no transaction {}".format(request.get("id")))
    plan = _plan(folder)
    return {"ok": True, "error": None, "plan": plan, "state": state,
            "before": _required(folder, "before.json", dict), "after": _required(folder, "after.json", dict),
            "committed_at": _committed_at(folder, len(plan["steps"]))}


def _committed_at(folder, steps):
    """When the commit's last step was journaled (seconds since the epoch), or None."""
    when = None
    try:
        fd = os.open(os.path.join(folder, "journal.jsonl"), os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(entry, dict) and entry.get("done") == steps and isinstance(entry.get("time"), (int, float)):
                    when = entry["time"]
    except OSError:
        return None
    return when


def mark(prefix, request):
    """Set a transaction's state after the controller checked the target (``rolled-back``
    only when the check passed; ``rolling-back`` keeps it interrupted when it did not)."""
    folder = _txn_dir(prefix, request.get("id"))
    if request.get("state") not in ("rolled-back", "rolling-back", "committed", "committing"):
        raise Refused("refused: state {!r}".format(request.get("state")))
    _plan(folder)
    _set_state(folder, request["state"])
    return {"ok": True, "error": None}


def record(prefix, request):
    _append(os.path.join(_state_dir(prefix), "history.jsonl"), json.dumps(request.get("entry", {}), sort_keys=True) + "\n")
    return {"ok": True, "error": None}


def history(prefix, request):
    events = []
    if not os.path.isdir(os.path.join(prefix, STATE)):
        return {"ok": True, "error": None, "events": [], "transactions": []}
    try:
        with open(os.path.join(_state_dir(prefix), "history.jsonl"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(event, dict):
                    events.append(event)
    except OSError:
        pass
    return {"ok": True, "error": None, "events": events, "transactions": _transactions(prefix)}


def tidy(prefix, request):
    """Remove ``<venv>/.transplant`` when nothing is in it but empty ``txn`` / ``cache`` folders:
    what an apply stopped before its transaction began leaves in a venv that had no state. Only
    ``os.rmdir`` (which removes nothing but an empty folder), only real folders (a symlink is left
    alone); but first the lock's temporary files (``lock.<pid>.tmp``, :func:`lock`) of appliers no
    longer running on this host (killed while taking the lock), regular files only, and, when
    nobody holds the lock (so no begin runs), the ``.begin-`` folders of begins killed part-way
    (an apply stopped inside its ``begin``: nothing in the live venv was touched; the next begin
    would remove them too). Reply ``removed``: whether the state folder is gone."""
    state = os.path.join(prefix, STATE)
    if os.path.islink(state) or not os.path.isdir(state):
        return {"ok": True, "error": None, "removed": False}
    transactions = os.path.join(state, "txn")
    if not os.path.lexists(os.path.join(state, "lock")) and os.path.isdir(transactions) \
            and not os.path.islink(transactions):
        _remove_unfinished_begins(transactions)
    try:
        names = os.listdir(state)
    except OSError:
        names = []
    for name in names:
        match = _LOCK_TEMP.match(name)
        if match is None or _running(int(match.group(1))):
            continue
        try:
            if stat.S_ISREG(os.lstat(os.path.join(state, name)).st_mode):
                os.unlink(os.path.join(state, name))
        except OSError:
            pass
    for sub in ("txn", "cache"):
        folder = os.path.join(state, sub)
        if os.path.isdir(folder) and not os.path.islink(folder):
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty: it stays, and so does the state folder
    try:
        os.rmdir(state)
    except OSError:
        return {"ok": True, "error": None, "removed": False}
    return {"ok": True, "error": None, "removed": True}


commit, rollback, discard = _exclusive(_commit), _exclusive(_rollback), _exclusive(_discard)

OPERATIONS = {"lock": lock, "unlock": unlock, "break-lock": break_lock, "pending": pending, "begin": begin,
              "heads": heads, "records": records, "links": links, "commit": commit, "rollback": rollback, "discard": discard, "txn": txn,
              "mark": mark, "record": record, "history": history, "check": check, "state": state, "tidy": tidy}


def answer(prefix, name, request):
    """The reply to one operation: its own, or ``{"ok": false, "error"}`` (never a traceback)."""
    op = OPERATIONS.get(name)
    try:
        if op is None:
            raise Refused("unknown operation {!r}".format(name))
        if not isinstance(request, dict):
            raise Refused("refused: the request of {} is not a JSON object".format(name))
        _REAL_FOLDERS.clear()
        _LINKED_ROOTS.clear()
        _MADE_FOLDERS.clear()
        _refuse_loose_state(prefix)
        return op(prefix, request)
    except Refused as exc:
        return {"ok": False, "error": str(exc)}
    except OSError as exc:
        return {"ok": False, "error": "{}: {}".format(exc.filename or "", exc.strerror or exc), "errno": exc.errno}
    except Exception as exc:  # noqa: BLE001 - a damaged state file must give an error, never a traceback
        return {"ok": False, "error": "{}: {}".format(type(exc).__name__, exc)[:500]}


def _say(reply):
    """Write one reply line; False when the controller is gone (its end of the pipe closed)."""
    try:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        return False
    return True


def session(prefix):
    """Answer one request per line of standard input (``{"op", "request"}``), one reply line
    each, until the input ends (the controller closed it, or died: then a step under way has
    finished first, and the lock stays for the next command to judge). A commit or rollback
    runs to its end whatever happens to the input, as in the one-operation mode."""
    served = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict):
            reply = {"ok": False, "error": "refused: a session line is not a JSON object"}
        else:
            reply = answer(prefix, message.get("op"), message.get("request", {}))
        served += 1
        reply["served"] = served
        if not _say(reply):
            break
    return 0


def _log_start(argv):
    """Testing hook: with ``TRANSPLANT_TEST_APPLIER_LOG`` set to a file, each process of this script
    appends a line there (its pid and operation), so a test counts the processes an apply starts."""
    hook_log(APPLIER_LOG, "{} {}".format(os.getpid(), argv[0] if argv else ""))


def main(argv):
    prefix = venv_prefix()
    _log_start(argv)
    if argv[:1] == ["--session"]:
        code = session(prefix)
        try:
            sys.stdout.close()
        except OSError:
            pass
        return code
    request = json.load(sys.stdin)
    _say(answer(prefix, argv[0] if argv else "", request))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
