"""Apply helper on the target: remove files and keep the venv's transplant state folder.

Usage: ``<venv>/bin/python - < applier.py`` is not possible (stdin carries the script),
so the controller runs ``<venv>/bin/python -c <this file's text> OP`` with a JSON
request on standard input. Operations:

* ``remove``: ``{"paths": [venv-relative POSIX paths]}``. Each path must stay inside
  the venv prefix once normalised and once symlinks in its parent folders are resolved;
  otherwise nothing at all is removed and the reply names the path. Folders left empty
  by a removal are removed, up to (not including) site-packages or the prefix.
* ``record``: ``{"entry": {...}}`` appends one JSON line to
  ``<venv>/.transplant/history.jsonl`` (created with mode 0700).
* ``heads``: ``{"scripts": [{"path", "head", "body_hash"}]}`` rewrites the shebang of
  console scripts copied from the donor: the file's head (its ``#!`` line, or the two
  lines of pip's ``#!/bin/sh`` form) is replaced by ``head`` after checking that the
  rest hashes to ``body_hash``; written to a temporary name in the same folder with the
  same mode, fsynced and renamed into place (other hardlinks keep their bytes).

Prints one JSON document: ``{"ok", "removed", "missing", "error"}``. Stdlib only.
"""

import base64
import hashlib
import json
import os
import sys
import tempfile

STATE = ".transplant"


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


_PROTECTED = ("pyvenv.cfg", ".transplant")


def _resolve(prefix, rel):
    """Full path of a venv-relative path, or None when it leaves the venv or is part of the
    venv itself (pyvenv.cfg, bin/python*, bin/activate*, .transplant/)."""
    if not rel or rel.startswith("/") or "\0" in rel:
        return None
    norm = os.path.normpath(rel)
    top = norm.split(os.sep)[0]
    name = os.path.basename(norm)
    if top in _PROTECTED or (os.path.dirname(norm) == "bin" and (name.startswith(("python", "activate", "Activate")))):
        return None
    full = os.path.normpath(os.path.join(prefix, rel))
    real_prefix = os.path.realpath(prefix)
    parent = os.path.realpath(os.path.dirname(full))
    if not (parent == real_prefix or parent.startswith(real_prefix + os.sep)):
        return None
    return os.path.join(parent, os.path.basename(full))


def remove(prefix, paths):
    resolved = []
    for rel in paths:
        full = _resolve(prefix, rel)
        if full is None:
            return {"ok": False, "error": "refused: {!r} leaves the venv {} or is part of the venv itself".format(rel, prefix),
                    "removed": 0, "missing": []}
        resolved.append(full)
    for full in resolved:
        if os.path.isdir(full) and not os.path.islink(full):
            return {"ok": False, "error": "refused: {!r} is a folder, not a file".format(os.path.relpath(full, prefix)),
                    "removed": 0, "missing": []}
    removed, missing, parents, failed = 0, [], set(), []
    for full in resolved:
        try:
            os.unlink(full)
            removed += 1
        except FileNotFoundError:
            missing.append(os.path.relpath(full, prefix))
        except OSError as exc:
            failed.append("{}: {}".format(os.path.relpath(full, prefix), exc.strerror))
        parents.add(os.path.dirname(full))
    if failed:
        return {"ok": False, "error": "could not remove {} file(s): {}".format(len(failed), "; ".join(failed[:5])),
                "removed": removed, "missing": missing}
    stop = {os.path.realpath(prefix)}
    for folder in sorted(parents, key=len, reverse=True):
        while folder not in stop and folder.startswith(os.path.realpath(prefix) + os.sep):
            if os.path.basename(folder) == "site-packages":
                break
            try:
                entries = os.listdir(folder)
                if entries == ["__pycache__"]:
                    pyc = os.path.join(folder, "__pycache__")
                    if not os.listdir(pyc):
                        os.rmdir(pyc)
                        entries = []
                if entries:
                    break
                os.rmdir(folder)
            except OSError:
                break
            folder = os.path.dirname(folder)
    return {"ok": True, "error": None, "removed": removed, "missing": missing}


def _split_head(data):
    """(head, body) of a script: the shebang line, plus the exec line of pip's /bin/sh form."""
    if not data.startswith(b"#!"):
        return None, data
    first, sep, rest = data.partition(b"\n")
    head = first + sep
    if first.strip() == b"#!/bin/sh" and rest.startswith(b"'" * 3 + b"exec'"):
        second, sep2, rest = rest.partition(b"\n")
        head += second + sep2
    return head, rest


def heads(prefix, scripts):
    done = []
    for item in scripts:
        rel = item.get("path", "")
        full = _resolve(prefix, rel)
        if full is None:
            return {"ok": False, "error": "refused: {!r} leaves the venv {} or is part of the venv itself".format(rel, prefix), "removed": 0,
                    "missing": []}
        try:
            st = os.lstat(full)
            with open(full, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            return {"ok": False, "error": "{}: {}".format(rel, exc.strerror), "removed": 0, "missing": []}
        head, body = _split_head(data)
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        if head is None or digest != item.get("body_hash"):
            return {"ok": False, "error": "{}: not the script the plan copied (its body hashes to {})".format(
                rel, digest), "removed": 0, "missing": []}
        new = item.get("head", "").encode("utf-8") + body
        fd, tmp = tempfile.mkstemp(prefix=".transplant-", dir=os.path.dirname(full))
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(new)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, st.st_mode & 0o7777)
            os.rename(tmp, full)
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            return {"ok": False, "error": "{}: {}".format(rel, exc.strerror), "removed": 0, "missing": []}
        done.append(rel)
    return {"ok": True, "error": None, "removed": 0, "missing": [], "rewritten": done}


def record(prefix, entry):
    state = os.path.join(prefix, STATE)
    os.makedirs(state, mode=0o700, exist_ok=True)
    with open(os.path.join(state, "history.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return {"ok": True, "error": None, "removed": 0, "missing": []}


def main(argv):
    prefix = venv_prefix()
    request = json.load(sys.stdin)
    op = argv[0] if argv else ""
    if op == "remove":
        reply = remove(prefix, request.get("paths", []))
    elif op == "record":
        reply = record(prefix, request.get("entry", {}))
    elif op == "heads":
        reply = heads(prefix, request.get("scripts", []))
    else:
        reply = {"ok": False, "error": "unknown operation {!r}".format(op), "removed": 0, "missing": []}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
