"""Verify stage ``native-load``: dlopen every shared object of the overlaid distributions.

Usage: ``<venv>/bin/python -c SOURCE < request.json`` with the request
``{"paths": [absolute .so paths], "preload": ["torch"]}``. The loading happens in a child
interpreter of the same venv (``sys.executable``), one file after the other with
``RTLD_NOW`` (every undefined symbol resolved at once, as the dynamic loader would when
the library is used); the modules in ``preload`` are imported first, since extensions
built against torch name ``libc10.so`` without a path and rely on torch having loaded it.
A child that dies on a file (a constructor that crashes) is replaced by a new one, which
goes on after that file; the file is reported with the signal.

Prints ``{"preload": [{"name", "ok", "error"}], "libraries": [{"path", "ok", "error",
"seconds"}]}``; ``error`` is the loader's own message (``libfoo.so.1: cannot open shared
object file...``, ``/x/libbar.so: undefined symbol: baz``). Stdlib only.
"""

import json
import subprocess
import sys

# The child: import the preloads, then load each path named on stdin (one per line), printing
# "begin" before and the result after, so a crash is pinned on the file that caused it.
CHILD = r'''
import ctypes, json, os, sys, time
out = sys.stdout
preload = json.loads(sys.argv[1])
for name in preload:
    try:
        __import__(name)
        out.write(json.dumps({"preload": name, "ok": True, "error": None}) + "\n")
    except BaseException as exc:
        out.write(json.dumps({"preload": name, "ok": False, "error": "{}: {}".format(type(exc).__name__, exc)[:500]}) + "\n")
    out.flush()
mode = os.RTLD_NOW | os.RTLD_LOCAL
for line in sys.stdin:
    path = line.rstrip("\n")
    if not path:
        continue
    out.write(json.dumps({"begin": path}) + "\n")
    out.flush()
    started = time.monotonic()
    try:
        ctypes.CDLL(path, mode=mode)
        error = None
    except OSError as exc:
        error = str(exc)
    out.write(json.dumps({"path": path, "ok": error is None, "error": error,
                          "seconds": round(time.monotonic() - started, 3)}) + "\n")
    out.flush()
'''


def _run_child(paths, preload):
    """Load ``paths`` in one child; returns (results, preload results, crashed path or None, how)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(preload)], input="\n".join(paths) + "\n",
                          capture_output=True, text=True)
    results, loaded, begun = [], [], None
    for line in proc.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a library that prints to stdout from its constructor
        if not isinstance(item, dict):
            continue
        if "preload" in item:
            loaded.append({"name": item["preload"], "ok": item["ok"], "error": item["error"]})
        elif "begin" in item:
            begun = item["begin"]
        elif "path" in item:
            results.append(item)
            begun = None
    how = None
    if begun is not None:
        how = ("killed by signal {}".format(-proc.returncode) if proc.returncode < 0
               else "the process exited with code {}".format(proc.returncode))
        tail = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []
        if tail:
            how += " ({})".format(tail[0][:300])
    return results, loaded, begun, how


def main():
    request = json.loads(sys.stdin.read() or "{}")
    paths = [p for p in request.get("paths", []) if isinstance(p, str)]
    preload = [p for p in request.get("preload", []) if isinstance(p, str)]
    results, preloaded = [], None
    remaining = list(paths)
    while remaining:
        done, loaded, crashed, how = _run_child(remaining, preload)
        if preloaded is None:
            preloaded = loaded
        results.extend(done)
        seen = {r["path"] for r in done}
        if crashed is None:
            # the child stopped before a file without a "begin" (it died during the preload)
            missing = [p for p in remaining if p not in seen]
            if missing and not done:
                results.extend({"path": p, "ok": False, "error": "the loader process died before loading it",
                                "seconds": 0.0} for p in missing)
                break
            remaining = missing
            continue
        results.append({"path": crashed, "ok": False, "error": how, "seconds": 0.0})
        index = remaining.index(crashed)
        remaining = remaining[index + 1:]
    sys.stdout.write(json.dumps({"preload": preloaded or [], "libraries": results}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
