"""Clone support on a host: check a destination, scan a venv for a prefix, relocate a clone.

One stdlib-only file, run on the host by a Python 3.9+ with ``-I -S`` (no ``site``: none of
a venv's ``.pth`` code runs). The controller passes this file with ``-c``, the operation as
the only argument, and a JSON request on standard input; it prints one JSON object.

Operations:

* ``check`` (run by the base interpreter named by the source's ``pyvenv.cfg`` ``home``,
  before anything is copied): ``{"dest", "paths": [...]}`` -> this interpreter's
  ``implementation``, ``version``, ``executable``; ``dest_state`` (``absent``, ``empty``,
  ``venv`` (a folder whose regular file ``pyvenv.cfg`` has a ``home`` key, and which is
  neither the user's home folder nor a mount point), ``interrupted`` (a folder holding the
  marker a clone writes before copying and removes when done, ``.transplant-cloning``: what a
  killed clone left; neither the home folder, ``/`` nor a mount point), ``nonempty``, ``not-a-folder``);
  ``real``: the destination's real path (symlinks resolved); ``overlap``: given the
  source's ``identity`` as ``source``, ``same`` (the destination is the source), ``inside``
  (it lies inside the source), ``contains`` (it holds the source), or null (none of these,
  or another machine);
  ``parent`` (the nearest existing folder above ``dest``, ``parent_writable``, ``free``:
  bytes available there to this user, or null); and
  ``exists``: ``{path: bool}`` for each of ``paths``.
* ``scan`` (run by the venv's own interpreter): ``{"root", "old"}`` -> ``hits``: every
  regular file under ``root`` (symlinks not followed, ``.transplant/`` skipped) whose bytes
  name ``old`` as a whole path (``old`` followed by ``/``, a quote, a blank, end... but not
  by another name character, so ``/srv/venv2`` is not ``/srv/venv``), each
  ``{"path", "binary", "nul", "head"}`` (``binary``: the file has a NUL byte or is not UTF-8;
  ``nul``: it has a NUL byte;
  ``head``: the shebang line(s) as text, or null); ``links``: symlinks whose target is
  absolute and names ``old`` (``{"path", "target"}``); ``external``: other absolute
  symlinks (``bin/python -> /usr/bin/python3.11``); ``files``, ``bytes`` scanned;
  ``read``: how many files were read (a file shorter than ``old`` cannot name it and is not);
  ``vouched``: a token (:func:`vouch_token`) for each file read whole and found not naming
  ``old`` whose ``mtime`` lies more than two seconds before the scan began;
  ``top``: the names at the top of ``root`` but ``.transplant``; ``lock``: whether
  ``root/.transplant/lock`` exists; ``identity``: this machine's boot id and the
  ``[device, inode]`` of ``root``'s real path and of each folder above it (``check``
  compares a destination with it, so a symlink cannot lead a clone into its source).
* ``relocate`` (run by the clone's own interpreter): ``{"root", "old", "new", "edits",
  "links", "vouched"}``; each edit ``{"path", "head_old", "head_new"}`` (both null: no head change)
  replaces the file's head (a plain shebang turned into pip's ``#!/bin/sh`` form also gets
  that form's third line, ``' '''``), then every whole-path ``old`` in the rest of the file by
  ``new``; each link ``{"path", "target"}`` is re-made pointing at ``target``. Then every
  RECORD row naming an edited file gets its new ``sha256=`` hash and size, the cached
  bytecode of an edited ``.py`` file is removed, and the tree is scanned again, not reading a
  file whose token is in ``vouched`` (the source scan's, when the clone was copied with times
  kept: the same path, size and ``mtime``): the answer is ``{"edited", "relinked", "records",
  "bytecode_removed", "scan": <scan answer>}``.

Edited files are written to a temporary name and renamed (mode kept), except files with
other hardlinks inside the clone, which are rewritten in place so the links stay links.
Nothing outside ``root`` is written; a path that leaves ``root`` is refused.
"""

import codecs
import csv
import hashlib
import io
import json
import os
import platform
import re
import stat
import sys
import tempfile
import time

try:
    from _transplant_common import record_hash as _digest, script_head
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import record_hash as _digest, script_head

_CHUNK = 8 << 20
_HEAD_MAX = 4096
_SKIP = ".transplant"


def _pattern(old):
    """Whole-path matches of ``old``: not inside a longer name on either side; ``file://``
    may precede it."""
    return re.compile(rb"(?:(?<![A-Za-z0-9_.\-/])|(?<=file://))" + re.escape(old) + rb"(?![A-Za-z0-9_.\-])")


def _inside(root, rel):
    full = os.path.normpath(os.path.join(root, rel))
    if not full.startswith(root.rstrip("/") + "/"):
        raise ValueError("path leaves the venv: " + rel)
    parent = os.path.realpath(os.path.dirname(full))
    real_root = os.path.realpath(root)
    if parent != real_root and not parent.startswith(real_root + "/"):
        raise ValueError("path leaves the venv through a symlink: " + rel)
    return full


def _named(full, old, pattern, buf):
    """(names ``old``, holds a NUL byte) for one regular file (names: None when it could not be read), read in blocks into ``buf`` (a
    bytearray of ``len(old) + 16 + _CHUNK`` bytes, reused: a large file is never held whole and
    no block is allocated per file). Each block is searched with the end of the one before kept
    in front of it, so a name across two blocks is found; the search of a later block starts one
    byte in, so the first kept byte is only the look-behind's context (a match starting there
    was already judged, with its own context, in the block before). Reading stops once both are
    known. An unreadable file names nothing."""
    keep = len(old) + 16
    named = nul = False
    view = memoryview(buf)
    kept = 0
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None, False
    try:
        while True:
            n = os.readv(fd, [view[kept:]])
            if not n:
                break
            end = kept + n
            if not nul and buf.find(b"\0", kept, end) != -1:
                nul = True
            if not named and buf.find(old, 0, end) != -1 and pattern.search(buf, 1 if kept else 0, end):
                named = True
            if named and nul:
                break
            kept = min(keep, end)
            buf[:kept] = bytes(view[end - kept:end])  # a copy: the two ranges may overlap
    except OSError:
        return None, False
    finally:
        os.close(fd)
    return named, nul


def _text_facts(full):
    """(decodes as UTF-8, head text or None) of a file that names the prefix and holds no NUL
    byte: read again in blocks (such files are few and small: scripts, RECORDs, ``.pth``)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    head = None
    try:
        with open(full, "rb") as handle:
            block = handle.read(_CHUNK)
            found, _ = script_head(block[:_HEAD_MAX])
            if found is not None:
                try:
                    head = found.decode("utf-8")
                except UnicodeDecodeError:
                    head = None
            while block:
                decoder.decode(block)
                block = handle.read(_CHUNK)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False, head
    except OSError:
        return False, None
    return True, head


def _head_only(full):
    """The head text (or None) of a file with a NUL byte that names the prefix."""
    try:
        with open(full, "rb") as handle:
            found, _ = script_head(handle.read(_HEAD_MAX))
    except OSError:
        return None
    try:
        return found.decode("utf-8") if found is not None else None
    except UnicodeDecodeError:
        return None


#: How long before a scan began a file's ``mtime`` must lie for the scan to vouch for it (ns): a
#: file written while the scan ran (or within the file system's coarse clock tick of its start)
#: may have been read before its last write, so it is not vouched for; the probe's "racy" rule.
_RACY_NS = 2 * 10 ** 9


def vouch_token(rel, info):
    """The token a scan gives a regular file it read and found not naming its prefix: 16 hex digits
    of a hash of the venv-relative path, size and ``mtime`` (ns). A later scan of a copy made with
    the times kept (``cp -a``, ``rsync -a``) finds the same token exactly when the copy's file has
    that path, size and ``mtime``."""
    raw = "{}\0{}\0{}".format(rel, info.st_size, info.st_mtime_ns).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def _walk(root):
    """(venv-relative path, full path, ``lstat`` result) of every entry under ``root`` but folders
    (symlinks not followed; a symlink to a folder is an entry, not descended into), and not the
    top ``.transplant`` folder; folder by folder, each folder's entries in name order before its
    subfolders. An unreadable folder or entry is left out."""
    stack = [("", root)]
    while stack:
        rel_dir, folder = stack.pop()
        try:
            with os.scandir(folder) as found:
                entries = sorted(found, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append((rel_dir + entry.name + "/", entry.path))
                    continue
                if not rel_dir and entry.name == _SKIP and entry.is_dir():
                    continue  # a symlink named .transplant to a folder: skipped, as the folder is
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield rel_dir + entry.name, entry.path, info
        for pair in reversed(subdirs):
            if not (pair[0] == _SKIP + "/" and folder == root):
                stack.append(pair)


def scan(root, old, vouched=None):
    """The ``scan`` answer (see the module docstring).

    :param vouched: tokens (:func:`vouch_token`) of files a scan of this tree's source read and
        found not naming ``old``; a file here with one of them is counted but not read again.
    """
    root = os.path.normpath(root)
    raw = old.encode("utf-8", "surrogateescape")
    pattern = _pattern(raw)
    buf = bytearray(len(raw) + 16 + _CHUNK)
    vouched = vouched or frozenset()
    hits, links, external, clean = [], [], [], []
    files = size = read = 0
    racy = time.time_ns() - _RACY_NS
    for rel, full, info in _walk(root):
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.readlink(full)
            except OSError:
                continue
            if target.startswith("/") and pattern.search(target.encode("utf-8", "surrogateescape")):
                links.append({"path": rel, "target": target})
            elif target.startswith("/"):
                external.append({"path": rel, "target": target})
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        files += 1
        size += info.st_size
        if info.st_size < len(raw):  # too short to hold the name: nothing to read, nothing to vouch for
            continue
        if vouched and vouch_token(rel, info) in vouched:
            continue
        named, nul = _named(full, raw, pattern, buf)
        read += 1
        if named:
            if nul:
                utf8, head = False, _head_only(full)
            else:
                utf8, head = _text_facts(full)
            hits.append({"path": rel, "binary": nul or not utf8, "nul": nul, "head": head})
        elif named is False and info.st_mtime_ns < racy:  # read whole and older than the scan: vouched for
            clean.append(vouch_token(rel, info))
    return {"hits": hits, "links": links, "external": external, "files": files, "bytes": size, "read": read,
            "vouched": clean, "top": sorted(n for n in os.listdir(root) if n != _SKIP),
            "lock": os.path.lexists(os.path.join(root, _SKIP, "lock")), "identity": identity(root)}


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def identity(root):
    """``{"boot", "real", "chain"}``: this machine's boot id (null when unknown), ``root``'s real
    path, and ``[device, inode]`` of it and of each folder above it (empty when ``root`` is missing)."""
    real = os.path.realpath(root)
    chain, path = [], real
    if os.path.isdir(real):
        while True:
            info = os.stat(path)
            chain.append([info.st_dev, info.st_ino])
            if path == "/":
                break
            path = os.path.dirname(path)
    return {"boot": _boot_id(), "real": real, "chain": chain}


def _overlap(dest, source):
    """``same``, ``inside``, ``contains`` or None: ``dest`` against the source's :func:`identity`,
    by device and inode, so symlinks and bind mounts on either side do not hide an overlap."""
    if not source or not source.get("boot") or source["boot"] != _boot_id() or not source.get("chain"):
        return None
    chain = [tuple(item) for item in source["chain"]]
    real = os.path.realpath(dest)
    path = real
    while True:
        try:
            info = os.stat(path)
        except OSError:
            info = None
        if info is not None:
            found = (info.st_dev, info.st_ino)
            if found == chain[0]:
                return "same" if path == real else "inside"
            if path == real and found in chain[1:]:
                return "contains"
        if path == "/":
            return None
        path = os.path.dirname(path)


def _write(full, data):
    info = os.lstat(full)
    if info.st_nlink > 1:  # keep the clone's own hardlinks linked: rewrite the shared inode
        with open(full, "r+b") as handle:
            handle.write(data)
            handle.truncate()
        return
    fd, temp = tempfile.mkstemp(prefix=".relocate-", dir=os.path.dirname(full))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temp, stat.S_IMODE(info.st_mode))
        os.replace(temp, full)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _drop_bytecode(full):
    """Remove the cached bytecode of an edited ``.py`` file (it holds the old text); Python
    compiles it again on the next import. Returns how many files went."""
    folder, name = os.path.split(full)
    stem, ext = os.path.splitext(name)
    cache = os.path.join(folder, "__pycache__")
    if ext != ".py" or os.path.islink(cache) or not os.path.isdir(cache):
        return 0
    gone = 0
    for entry in os.listdir(cache):
        if entry.startswith(stem + ".") and entry.endswith(".pyc") and entry.count(".") == stem.count(".") + 2:
            os.unlink(os.path.join(cache, entry))
            gone += 1
    return gone


def _update_records(root, edited):
    """Give every RECORD row naming an edited file its new hash and size; returns the RECORDs changed."""
    changed = []
    for folder, dirs, names in os.walk(root):
        if folder == root and _SKIP in dirs:
            dirs.remove(_SKIP)
        if not folder.endswith(".dist-info") or "RECORD" not in names:
            continue
        record = os.path.join(folder, "RECORD")
        if os.path.islink(record):
            continue
        site = os.path.dirname(folder)
        with open(record, encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
        touched = False
        for row in rows:
            if len(row) < 3 or not row[0]:
                continue
            full = os.path.normpath(row[0] if row[0].startswith("/") else os.path.join(site, row[0]))
            if full in edited and full != record:
                data = edited[full]
                row[1], row[2] = _digest(data), str(len(data))
                touched = True
        if touched:
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(rows)
            _write(record, out.getvalue().encode("utf-8"))
            changed.append(os.path.relpath(record, root))
    return sorted(changed)


def relocate(request):
    """The ``relocate`` answer (see the module docstring)."""
    root = os.path.normpath(request["root"])
    old, new = request["old"], request["new"]
    raw_old, raw_new = old.encode("utf-8"), new.encode("utf-8")
    pattern = _pattern(raw_old)
    edited = {}
    inodes = set()  # (device, inode) of every file edited, so a hardlink's other name is known
    bytecode = 0
    for edit in request.get("edits", []):
        full = _inside(root, edit["path"])
        if os.path.islink(full) or not os.path.isfile(full):
            raise ValueError("not a regular file in the clone: " + edit["path"])
        with open(full, "rb") as handle:
            data = handle.read()
        head, body = b"", data
        if edit.get("head_old") is not None:
            found, rest = script_head(data)
            text = found.decode("utf-8", "replace") if found is not None else None
            info = os.lstat(full)
            if text == edit["head_new"] and (info.st_dev, info.st_ino) in inodes:
                pass  # a hardlink of a script edited above under its other name
            elif text != edit["head_old"]:
                raise ValueError("the head of {} changed since the scan".format(edit["path"]))
            else:
                head, body = edit["head_new"].encode("utf-8"), rest  # a /bin/sh head has all three lines
        result = head + pattern.sub(lambda _m: raw_new, body)
        if result != data:
            _write(full, result)
            bytecode += _drop_bytecode(full)
        edited[full] = result
        info = os.lstat(full)
        inodes.add((info.st_dev, info.st_ino))
    relinked = 0
    for link in request.get("links", []):
        full = _inside(root, link["path"])
        if not os.path.islink(full):
            raise ValueError("not a symlink in the clone: " + link["path"])
        temp = os.path.join(os.path.dirname(full), ".relocate-link-" + os.path.basename(full))
        os.symlink(link["target"], temp)
        os.replace(temp, full)
        relinked += 1
    records = _update_records(root, edited)
    return {"edited": len(edited), "relinked": relinked, "records": records, "bytecode_removed": bytecode,
            "scan": scan(root, old, {t for t in request.get("vouched") or () if isinstance(t, str)})}


#: The file a clone puts at the top of its destination before it copies anything and removes once
#: the clone is relocated (transplant.clone.cloning.MARKER): a destination holding it is what a
#: clone killed part-way left.
MARKER = ".transplant-cloning"


def _dest_state(dest):
    if not os.path.lexists(dest):
        return "absent"
    if os.path.islink(dest) or not os.path.isdir(dest):
        return "not-a-folder"
    if not os.listdir(dest):
        return "empty"
    marker = os.path.join(dest, MARKER)
    if os.path.isfile(marker) and not os.path.islink(marker) and not os.path.ismount(dest) \
            and os.path.realpath(dest) not in (os.path.realpath(os.path.expanduser("~")), "/"):
        return "interrupted"
    return "venv" if _replaceable_venv(dest) else "nonempty"


def _replaceable_venv(dest):
    """True for a folder ``--replace`` may delete: its ``pyvenv.cfg`` is a regular file with a
    ``home`` key (venv and virtualenv write one), and it is not the user's home folder, ``/`` or
    a mount point (a stray ``pyvenv.cfg`` there must not make it deletable)."""
    cfg = os.path.join(dest, "pyvenv.cfg")
    if os.path.islink(cfg) or not os.path.isfile(cfg) or os.path.ismount(dest):
        return False
    if os.path.realpath(dest) in ("/", os.path.realpath(os.path.expanduser("~"))):
        return False
    try:
        with open(cfg, "rb") as handle:
            lines = handle.read(1 << 16).decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    return any(line.partition("=")[0].strip().lower() == "home" for line in lines if "=" in line)


def _free(folder):
    try:
        info = os.statvfs(folder)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def check(request):
    """The ``check`` answer (see the module docstring)."""
    dest = os.path.normpath(request["dest"])
    parent = os.path.dirname(dest)
    while parent != "/" and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return {
        "implementation": sys.implementation.name,
        "version": platform.python_version(),
        "executable": sys.executable,
        "dest_state": _dest_state(dest),
        "real": os.path.realpath(dest),
        "overlap": _overlap(dest, request.get("source")),
        "parent": parent,
        "parent_writable": os.access(parent, os.W_OK | os.X_OK),
        "free": _free(parent),
        "exists": {p: os.path.exists(p) for p in request.get("paths", [])},
    }


def main(argv):
    """Run the operation ``argv[0]`` on the JSON request from standard input; print the answer."""
    request = json.loads(sys.stdin.read() or "{}")
    op = argv[0] if argv else ""
    try:
        if op == "check":
            answer = check(request)
        elif op == "scan":
            answer = scan(request["root"], request["old"])
        elif op == "relocate":
            answer = relocate(request)
        else:
            answer = {"error": "unknown operation " + repr(op)}
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
        answer = {"error": "{}: {}".format(type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
