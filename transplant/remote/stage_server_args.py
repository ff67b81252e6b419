"""Verify stage ``server-args``: call the framework's own argument parser.

Usage: ``<venv>/bin/python - ENTRY ATTR_JSON ARG... < stage_server_args.py`` where ENTRY
is ``module:function`` (sglang's ``sglang.srt.server_args:prepare_server_args``), called
with the list of ARGs, and ATTR_JSON a JSON list of attribute names to read from the
result. Prints one JSON document: ``{"ok", "values": {attr: {"repr", "name", "value"}},
"error", "exit_code"}``. A parser that rejects the arguments (argparse exits with code
2 and prints the reason on stderr) is reported with ``ok`` false and its message.
ATTR_JSON may also be ``{"attrs": [...], "resolve": true}``: after parsing, the deeper
resolution step the framework itself offers is run as well. For sglang that is
``ServerArgs.resolve_once()`` (0.5.2x: the resolution pipeline that reads the model's
config.json and the platform; older releases resolve inside the parser, and then there is
nothing more to run). Its outcome is ``"resolve": {"ran", "ok", "error", "kind",
"seconds", "model_path", "config_json", "gpu"}``: ``kind`` is the exception's class and
its base classes' names; ``config_json`` whether ``<model_path>/config.json`` exists;
``gpu`` whether torch (if loaded) sees a CUDA device. The step runs with ``HF_HUB_OFFLINE``
and ``TRANSFORMERS_OFFLINE`` set to 1 unless ``verify.env`` sets them: verify never
downloads a model. Stdlib only.
"""

import contextlib
import importlib
import io
import json
import sys
import os
import time
import traceback


def _describe(value):
    out = {"repr": repr(value)[:500], "name": None, "value": None}
    name = getattr(value, "name", None)
    if isinstance(name, str):
        out["name"] = name
    inner = getattr(value, "value", value)
    if inner is None or isinstance(inner, (str, int, float, bool)):
        out["value"] = inner
    else:
        out["value"] = str(inner)[:500]
    return out


def _gpu():
    torch = sys.modules.get("torch")
    if torch is None:
        return os.path.exists("/dev/nvidia0") or None
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken torch answers "unknown", as no torch does
        return False


def _resolve(parsed):
    out = {"ran": False, "ok": False, "error": None, "kind": [], "seconds": 0.0, "method": None,
           "model_path": None, "config_json": None, "gpu": None}
    model_path = getattr(parsed, "model_path", None)
    if isinstance(model_path, str):
        out["model_path"] = model_path
        out["config_json"] = os.path.isfile(os.path.join(model_path, "config.json"))
    method = getattr(parsed, "resolve_once", None)
    if not callable(method):
        out["error"] = "{} has no separate resolution step (resolve_once); its parser already resolved".format(
            type(parsed).__name__)
        return out
    out["ran"] = True
    out["method"] = "{}.resolve_once".format(type(parsed).__name__)
    # verify never downloads a model: a missing model folder must show as missing
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    started = time.monotonic()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            method()
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - what it needs is the finding
        tb = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = " at {}:{}".format(tb[0].filename, tb[0].lineno) if tb else ""
        out["error"] = "{}: {}{}".format(type(exc).__name__, exc, where)[:2000]
        out["kind"] = [k.__name__ for k in type(exc).__mro__]
    out["seconds"] = round(time.monotonic() - started, 3)
    out["gpu"] = _gpu()
    return out


def main(argv):
    sys.stdout.write(json.dumps(report(argv)) + "\n")
    return 0


def report(argv):
    """The report ``main`` prints for ``argv`` (``ENTRY ATTR_JSON ARG...``), as a dict; also called
    in a child that ``stage_imports`` forks once it has imported the entry's package."""
    entry, wanted = argv[0], json.loads(argv[1])
    attrs = wanted.get("attrs", []) if isinstance(wanted, dict) else wanted
    resolve = isinstance(wanted, dict) and bool(wanted.get("resolve"))
    args = list(argv[2:])
    module_name, _, func_name = entry.partition(":")
    captured = io.StringIO()
    result = {"ok": False, "values": {}, "error": None, "exit_code": None, "stderr": None}
    try:
        module = importlib.import_module(module_name)
        func = module
        for part in func_name.split("."):
            func = getattr(func, part)
        with contextlib.redirect_stderr(captured):
            parsed = func(args)
    except SystemExit as exc:
        result["exit_code"] = exc.code if isinstance(exc.code, int) else 1
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        result["error"] = (lines[-1] if lines else "the parser exited with code {}".format(exc.code))[:2000]
    except BaseException as exc:  # noqa: BLE001 - the failure is the finding
        tb = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = " at {}:{}".format(tb[0].filename, tb[0].lineno) if tb else ""
        result["error"] = "{}: {}{}".format(type(exc).__name__, exc, where)[:2000]
    else:
        result["ok"] = True
        for attr in attrs:
            if hasattr(parsed, attr):
                result["values"][attr] = _describe(getattr(parsed, attr))
        if resolve:
            result["resolve"] = _resolve(parsed)
    tail = captured.getvalue().strip()
    result["stderr"] = tail[-2000:] if tail else None
    return result


if __name__ == "__main__":
    import faulthandler

    # a fatal signal (SIGILL from code for CPU features this CPU lacks, SIGSEGV) is said on stderr,
    # which the controller reads when no report comes: over SSH the exit status names no signal
    faulthandler.enable(all_threads=False)
    _code = main(sys.argv[1:])
    # once the report is written the process ends at once, as the import workers do: the teardown of a
    # CUDA stack's thousands of modules and its packages' exit handlers (about 2 s of wall time for
    # the real stack's imports process) change nothing the controller reads
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
