"""Verify stage ``jit-caches``: the JIT kernel caches of the service user, and whom they were built for.

Usage: ``<venv>/bin/python -c SOURCE < request.json`` with ``{"clear": false}``. Runs as the
user (and with the environment) the service runs with. The folders, as each library
chooses them:

- triton: ``$TRITON_CACHE_DIR``, else ``${TRITON_HOME:-~}/.triton/cache``; each compiled
  kernel's metadata JSON records ``triton_version``.
- flashinfer: ``${FLASHINFER_WORKSPACE_BASE:-~}/.cache/flashinfer``; its first level is
  one folder per flashinfer version (``0.7.2/90/cached_ops``).
- torch inductor: ``$TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>``; its
  compiled triton kernels record ``triton_version`` (inductor records no torch version).

The installed versions are read from the venv's metadata (nothing is imported). ``clear``
names the caches to remove (a list of the names above; ``true``: all three): each such folder
that exists is removed, and nothing else, unless ``_removable`` refuses it (a symlink on the way,
a relative path, a system, home, temp or venv folder or one holding them, a mount point, another
user's folder): then its ``error`` says why. These folders are the user's, shared by every venv
the user runs, so the controller sends only names the operator gave (``--clear-jit-caches=NAMES``).

Prints ``{"caches": [{"name", "path", "library" (whose version ``versions`` are), "exists", "files", "bytes", "versions",
"installed", "scanned", "removed", "error"}]}``. Stdlib only.
"""

import getpass
import json
import os
import re
import shutil
import sys
import tempfile
from importlib import metadata

_SCAN_LIMIT = 5000  # metadata files read per folder


def _installed(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _folders():
    home = os.path.expanduser("~")
    env = os.environ
    triton = env.get("TRITON_CACHE_DIR") or os.path.join(env.get("TRITON_HOME") or home, ".triton", "cache")
    flashinfer = os.path.join(env.get("FLASHINFER_WORKSPACE_BASE") or home, ".cache", "flashinfer")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "uid_{}".format(os.getuid())
    inductor = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    triton_version = _installed("triton", "pytorch-triton")
    return [("triton", triton, "triton", triton_version),
            ("flashinfer", flashinfer, "flashinfer", _installed("flashinfer-python", "flashinfer")),
            ("torch-inductor", inductor, "triton", triton_version)]


def _scan(name, path):
    files, size, versions, scanned = 0, 0, set(), 0
    for root, dirs, names in os.walk(path):
        if name == "flashinfer" and root == path:
            versions.update(d for d in dirs if re.match(r"^\d+\.\d+", d))
        for fname in names:
            full = os.path.join(root, fname)
            try:
                size += os.lstat(full).st_size
            except OSError:
                continue
            files += 1
            if name != "flashinfer" and fname.endswith(".json") and scanned < _SCAN_LIMIT:
                scanned += 1
                try:
                    with open(full, encoding="utf-8", errors="replace") as handle:
                        text = handle.read(1 << 20)
                    found = re.search(r'"triton_version"\s*:\s*"([^"]+)"', text)
                    if found:
                        versions.add(found.group(1))
                except OSError:
                    pass
    return files, size, sorted(versions), scanned


# System folders no cache may live in or be: removing under them would break the host.
# (Not /root, /var/lib or /run: a service user's home or temp folder may lie there.)
_SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr")


def _holds(outer, inner):
    """True when folder ``inner`` is ``outer`` or lies under it (both real, absolute paths)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _removable(path):
    """Why ``path`` may not be removed (a sentence), or None when it may.

    Refused: a relative path; a path with a symlink in it (itself or a parent: the folder
    removed must be the one named); ``/`` or a top-level folder; a system folder or anything
    under one (``_SYSTEM``); the home folder, the temp folder, the current folder or the venv,
    or a folder holding any of them; a folder inside the venv; a mount point; a folder owned
    by another user.
    """
    if not os.path.isabs(path):
        return "it is a relative path ({}); set the variable to an absolute path".format(path)
    norm = os.path.normpath(path)
    real = os.path.realpath(path)
    if real != norm:
        return "a symlink leads to it (it is really {}); remove it by hand if you mean to".format(real)
    if real.count("/") < 2 or real == "/":
        return "it is / or a top-level folder"
    for system in _SYSTEM:
        if _holds(system, real) or _holds(real, system):
            return "it is or lies in the system folder {}".format(system)
    guarded = [("the home folder", os.path.expanduser("~")), ("the temp folder", tempfile.gettempdir()),
               ("the current folder", os.getcwd()), ("the venv", sys.prefix)]
    for what, folder in guarded:
        folder = os.path.realpath(folder)
        if _holds(real, folder):
            return "it is or holds {} ({})".format(what, folder)
    venv = os.path.realpath(sys.prefix)
    if _holds(venv, real):
        return "it lies inside the venv ({})".format(venv)
    if os.path.ismount(real):
        return "it is a mount point"
    try:
        owner = os.lstat(real).st_uid
    except OSError as exc:
        return "it cannot be read: {}".format(exc)
    if owner != os.geteuid():
        return "it belongs to another user (uid {})".format(owner)
    return None


def main():
    request = json.loads(sys.stdin.read() or "{}")
    clear = request.get("clear") or []
    caches = []
    for name, path, library, installed in _folders():
        item = {"name": name, "path": path, "library": library, "exists": os.path.isdir(path), "files": 0, "bytes": 0,
                "versions": [], "installed": installed, "scanned": 0, "removed": False, "error": None}
        if item["exists"]:
            item["files"], item["bytes"], item["versions"], item["scanned"] = _scan(name, path)
            if clear is True or name in clear:
                refused = _removable(path)
                if refused:
                    item["error"] = "not removed: {}".format(refused)
                else:
                    try:
                        shutil.rmtree(path)
                        item["removed"] = True
                    except OSError as exc:
                        item["error"] = "removing it failed: {}".format(exc)
        caches.append(item)
    sys.stdout.write(json.dumps({"caches": caches}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
