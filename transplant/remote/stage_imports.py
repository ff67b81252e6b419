"""Verify stage ``imports``: import each name and say its version and where it came from.

Usage: ``<venv>/bin/python - NAME... < stage_imports.py``. Prints one JSON document:
``{"imports": [{"name", "ok", "version", "file", "outside", "error", "seconds"}]}``, where
``outside`` is the ``sys.path`` folder a module came from when that is outside the venv
(a ``.pth`` line, the system site-packages), else null. Stdlib only;
runs in a fresh interpreter of the target venv with the manifest's environment.

Or ``<venv>/bin/python -c SOURCE NAME... < request.json`` with ``{"provenance": {"modules":
[...], "optional": [...], "source": TEXT}}``, TEXT being ``stage_provenance.py``: after the
names, the modules not imported yet are imported too (one of ``optional`` only when
``importlib.util.find_spec`` finds it: it is left out of ``imported`` otherwise), and the
document also holds ``"provenance"``, that script's report of this process (its ``facts``),
so that the ``library-provenance`` stage needs no second interpreter to import the same torch.

The request may also hold ``"native": {"preload": [...], "optional": [...], "source": TEXT}``,
TEXT being ``stage_native.py``: then the request is the first line of stdin, and the second
line ``{"paths": [...]}`` is native-load's, read by its loader child (``stage_native.Forked``),
forked once this process has imported the preload modules (those of ``optional`` only where
installed) and nothing else: after the leading names that are those modules, in their order;
else before the first import. The document then also holds ``"native"``, stage_native's
report (null when the child died before saying which paths it was asked), and
``"native_preload"``, the modules it preloaded.
"""

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback


def _version(module, name):
    version = getattr(module, "__version__", None)
    if version is not None:
        return str(version)
    try:
        from importlib import metadata

        top = name.split(".")[0]
        for dist in metadata.packages_distributions().get(top, []):
            return metadata.version(dist)
    except Exception:  # noqa: BLE001 - metadata may be broken; the version is optional
        return None
    return None


def _outside(path):
    """The ``sys.path`` folder holding ``path`` when it lies outside the venv (``sys.prefix``), else None."""
    if not path:
        return None
    real = os.path.realpath(path)
    prefix = os.path.realpath(sys.prefix)
    if real == prefix or real.startswith(prefix + os.sep):
        return None
    folders = sorted((os.path.realpath(p) for p in sys.path if p), key=len, reverse=True)
    return next((f for f in folders if real.startswith(f + os.sep)), os.path.dirname(real))


def main(names, request):
    results = []
    native = request.get("native")
    forked = None
    # native-load's loader is forked once this process has imported its preload modules (torch)
    # and nothing else: where the names begin with them, after those imports; else before any
    preload, fork_at = _preload(native, names) if native else ([], None)
    for index, name in enumerate(names + [None]):
        if index == fork_at:
            forked = _fork_loader(native, preload, results)
        if name is None:
            break
        started = time.monotonic()
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - a failing import is the finding
            last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            where = "{}:{}".format(last[0].filename, last[0].lineno) if last else None
            results.append({"name": name, "ok": False, "version": None, "file": None,
                            "error": "{}: {}".format(type(exc).__name__, exc)[:2000], "where": where,
                            "seconds": round(time.monotonic() - started, 3)})
            continue
        results.append({"name": name, "ok": True, "version": _version(module, name),
                        "file": getattr(module, "__file__", None),
                        "outside": _outside(getattr(module, "__file__", None)), "error": None,
                        "seconds": round(time.monotonic() - started, 3)})
    document = {"imports": results}
    if request.get("provenance"):
        document["provenance"] = _provenance(request["provenance"], results)
    if native:
        document["native"] = forked.report() if forked is not None else None
        document["native_preload"] = preload
    sys.stdout.write(json.dumps(document) + "\n")
    return 0


def _preload(native, names):
    """(the preload modules, installed ones only among ``optional``; the index in ``names`` of the
    name before which the loader is forked: after the leading names that are the preloads, in
    their order, so that it has imported those and nothing else; the loader imports the others)."""
    optional = set(native.get("optional") or ())
    preload = [n for n in native.get("preload", [])
               if n not in optional or importlib.util.find_spec(n) is not None]
    at = 0
    while at < len(preload) and at < len(names) and names[at] == preload[at]:
        at += 1
    return preload, at


def _fork_loader(native, preload, results):
    """Fork native-load's loader child now (``stage_native.Forked``): it reads its paths from the
    rest of standard input."""
    script = {"__name__": "_transplant_stage_native"}
    exec(compile(native["source"], "stage_native.py", "exec"), script)  # noqa: S102 - transplant's own script
    sys.stdout.flush()
    sys.stderr.flush()
    return script["Forked"](preload, sys.stdin.buffer)


def _provenance(request, results):
    """``stage_provenance``'s report of this process, its ``modules`` imported (those not yet
    imported here, in its order; each one's outcome as it was here)."""
    done = {r["name"]: {"name": r["name"], "ok": r["ok"], "error": r["error"] and r["error"][:500]} for r in results}
    optional = set(request.get("optional") or ())
    imported = []
    for name in request.get("modules", []):
        if name not in done and name in optional and importlib.util.find_spec(name) is None:
            continue  # not installed here: not imported, as the controller asks when it does not know yet
        if name not in done:
            try:
                __import__(name)
                done[name] = {"name": name, "ok": True, "error": None}
            except BaseException as exc:  # noqa: BLE001 - recorded; the imports stage judges it
                done[name] = {"name": name, "ok": False, "error": "{}: {}".format(type(exc).__name__, exc)[:500]}
        imported.append(done[name])
    script = {"__name__": "_transplant_stage_provenance"}
    exec(compile(request["source"], "stage_provenance.py", "exec"), script)  # noqa: S102 - transplant's own script
    return script["facts"](imported)


if __name__ == "__main__":
    # with a request, the script came with -c and the request is its first line on stdin (the rest is
    # native-load's, read by its loader child); with "-", stdin was the script
    _stdin = sys.stdin.buffer.readline() if not sys.argv[0] == "-" else b""
    sys.exit(main(sys.argv[1:], json.loads(_stdin or b"{}")))
