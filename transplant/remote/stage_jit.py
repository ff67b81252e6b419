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

The installed versions are read from the venv's metadata (nothing is imported). With
``clear`` true each existing folder is removed (a real folder only: never a symlink, never
the home folder, ``/`` or a folder holding the venv) and nothing else.

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


def _removable(path):
    """Why ``path`` may not be removed, or None."""
    real = os.path.realpath(path)
    if os.path.islink(path):
        return "it is a symlink"
    home = os.path.realpath(os.path.expanduser("~"))
    venv = os.path.realpath(sys.prefix)
    if real in ("/", home) or home.startswith(real.rstrip("/") + "/") or venv == real \
            or venv.startswith(real.rstrip("/") + "/"):
        return "it is /, the home folder or holds it, or holds the venv"
    return None


def main():
    request = json.loads(sys.stdin.read() or "{}")
    caches = []
    for name, path, library, installed in _folders():
        item = {"name": name, "path": path, "library": library, "exists": os.path.isdir(path), "files": 0, "bytes": 0,
                "versions": [], "installed": installed, "scanned": 0, "removed": False, "error": None}
        if item["exists"]:
            item["files"], item["bytes"], item["versions"], item["scanned"] = _scan(name, path)
            if request.get("clear"):
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
