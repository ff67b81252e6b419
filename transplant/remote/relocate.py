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
  ``top``: the names at the top of ``root`` but ``.transplant``; ``lock``: whether
  ``root/.transplant/lock`` exists; ``identity``: this machine's boot id and the
  ``[device, inode]`` of ``root``'s real path and of each folder above it (``check``
  compares a destination with it, so a symlink cannot lead a clone into its source).
* ``relocate`` (run by the clone's own interpreter): ``{"root", "old", "new", "edits",
  "links"}``; each edit ``{"path", "head_old", "head_new"}`` (both null: no head change)
  replaces the file's head (a plain shebang turned into pip's ``#!/bin/sh`` form also gets
  that form's third line, ``' '''``), then every whole-path ``old`` in the rest of the file by
  ``new``; each link ``{"path", "target"}`` is re-made pointing at ``target``. Then every
  RECORD row naming an edited file gets its new ``sha256=`` hash and size, the cached
  bytecode of an edited ``.py`` file is removed, and the tree is scanned again: the answer
  is ``{"edited", "relinked", "records", "bytecode_removed", "scan": <scan answer>}``.

Edited files are written to a temporary name and renamed (mode kept), except files with
other hardlinks inside the clone, which are rewritten in place so the links stay links.
Nothing outside ``root`` is written; a path that leaves ``root`` is refused.
"""

import codecs
import csv
import io
import json
import os
import platform
import re
import stat
import sys
import tempfile

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


def _file_hit(full, old, pattern):
    """(named, nul, utf8, head text) for one regular file, read once in blocks (a large file
    is never held whole): whether it names ``old``, holds a NUL byte, decodes as UTF-8."""
    named = nul = False
    utf8 = True
    decoder = codecs.getincrementaldecoder("utf-8")()
    head = None
    tail = b""
    keep = len(old) + 16
    try:
        with open(full, "rb") as handle:
            first = True
            while True:
                block = handle.read(_CHUNK)
                if not block:
                    break
                if first:
                    first = False
                    found, _ = script_head(block[:_HEAD_MAX])
                    if found is not None:
                        try:
                            head = found.decode("utf-8")
                        except UnicodeDecodeError:
                            head = None
                if not nul and b"\0" in block:
                    nul = True
                if utf8 and not nul:
                    try:
                        decoder.decode(block)
                    except UnicodeDecodeError:
                        utf8 = False
                window = tail + block
                if not named and old in window and pattern.search(window):
                    named = True
                if named and nul:
                    break
                tail = window[-keep:]
            if utf8 and not nul:
                decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        utf8 = False
    except OSError:
        return False, False, False, None
    return named, nul, utf8, head


def scan(root, old):
    """The ``scan`` answer (see the module docstring)."""
    root = os.path.normpath(root)
    raw = old.encode("utf-8", "surrogateescape")
    pattern = _pattern(raw)
    hits, links, external = [], [], []
    files = size = 0
    for folder, dirs, names in os.walk(root):
        if folder == root and _SKIP in dirs:
            dirs.remove(_SKIP)
        dirs.sort()
        for name in list(dirs):
            full = os.path.join(folder, name)
            if os.path.islink(full):  # os.walk does not descend into it; report it as a link
                names.append(name)
        for name in sorted(names):
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            try:
                info = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(full)
                if target.startswith("/") and pattern.search(target.encode("utf-8", "surrogateescape")):
                    links.append({"path": rel, "target": target})
                elif target.startswith("/"):
                    external.append({"path": rel, "target": target})
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            files += 1
            size += info.st_size
            named, nul, utf8, head = _file_hit(full, raw, pattern)
            if named:
                hits.append({"path": rel, "binary": nul or not utf8, "nul": nul, "head": head})
    return {"hits": hits, "links": links, "external": external, "files": files, "bytes": size,
            "top": sorted(n for n in os.listdir(root) if n != _SKIP),
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
            "scan": scan(root, old)}


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
