"""Verify stage ``library-provenance``: which shared libraries the process really mapped.

Usage: ``<venv>/bin/python -c SOURCE < request.json`` with ``{"modules": ["torch", ...]}``.
Imports each module (a failure is recorded, not fatal), then reads ``/proc/self/maps``
for every mapped file, and reports what decides where the dynamic loader looks:
``LD_LIBRARY_PATH`` and ``LD_PRELOAD`` as set, and the folders of ``/etc/ld.so.conf``
(with its ``include`` files), each also as a real path.

Also lists the files of the extension modules the interpreter imported (modules whose
loader is :class:`importlib.machinery.ExtensionFileLoader`), as real paths: Python imports
those by path from ``sys.path``, the dynamic loader never looks them up by soname.

Prints ``{"prefix", "prefix_real", "imported": [{"name", "ok", "error"}], "mapped":
[real paths], "extension_modules": [real paths], "beside_source": [[extension, source]],
"ld_library_path": [[entry, real]],
"ld_preload": [[entry, real]], "ld_so_conf": [[folder, real]]}``. Stdlib only, apart from
the modules it imports.
"""

import glob
import json
import os
import sys


def _real(entry):
    # an empty LD_LIBRARY_PATH entry means the current folder to the loader
    return os.path.realpath(entry or ".")


def _ld_so_conf(path="/etc/ld.so.conf", depth=0):
    folders = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return folders
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include") and depth < 4:
            pattern = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
            if not pattern.startswith("/"):
                pattern = os.path.join(os.path.dirname(path), pattern)
            for name in sorted(glob.glob(pattern)):
                folders.extend(_ld_so_conf(name, depth + 1))
        elif line.startswith("/"):
            folders.append(line)
    return folders


def _mapped():
    paths = []
    seen = set()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            if not path.startswith("/") or path in seen or path.endswith(" (deleted)"):
                continue
            seen.add(path)
            paths.append(path)
    return paths


def _extension_modules():
    from importlib.machinery import ExtensionFileLoader

    paths = set()
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None)
        if isinstance(getattr(spec, "loader", None), ExtensionFileLoader) and isinstance(origin, str):
            paths.add(os.path.realpath(origin))
    return sorted(paths)


def _beside_source(extensions):
    """[extension, source] for each extension module file with a ``<module>.py`` in its folder
    (the import system tries extension modules first, so the ``.py`` is never imported)."""
    pairs = []
    for path in extensions:
        source = os.path.join(os.path.dirname(path), os.path.basename(path).split(".", 1)[0] + ".py")
        if os.path.isfile(source):
            pairs.append([path, os.path.realpath(source)])
    return pairs


def main():
    request = json.loads(sys.stdin.read() or "{}")
    imported = []
    for name in request.get("modules", []):
        try:
            __import__(name)
            imported.append({"name": name, "ok": True, "error": None})
        except BaseException as exc:  # noqa: BLE001 - recorded; the imports stage judges it
            imported.append({"name": name, "ok": False, "error": "{}: {}".format(type(exc).__name__, exc)[:500]})
    sys.stdout.write(json.dumps(facts(imported)) + "\n")
    return 0


def facts(imported):
    """The report (see the module docstring) of this process as it is now, after the imports
    ``imported`` (``[{"name", "ok", "error"}]``) says it tried. ``stage_imports`` calls it too,
    after its own imports, so that one process serves both stages."""
    env = os.environ
    lib_path = env.get("LD_LIBRARY_PATH")
    preload = env.get("LD_PRELOAD")
    extensions = _extension_modules()
    report = {
        "prefix": sys.prefix,
        "prefix_real": os.path.realpath(sys.prefix),
        "imported": imported,
        "mapped": _mapped(),
        "extension_modules": extensions,
        "beside_source": _beside_source(extensions),
        "ld_library_path": [[e, _real(e)] for e in lib_path.split(":")] if lib_path is not None else [],
        "ld_preload": [[e, _real(e)] for e in preload.replace(" ", ":").split(":") if e] if preload else [],
        "ld_so_conf": [[f, os.path.realpath(f)] for f in _ld_so_conf()],
    }
    return report


if __name__ == "__main__":
    import faulthandler

    # a fatal signal (SIGILL from code for CPU features this CPU lacks, SIGSEGV) is said on stderr,
    # which the controller reads when no report comes: over SSH the exit status names no signal
    faulthandler.enable(all_threads=False)
    sys.exit(main())
