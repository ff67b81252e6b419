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

The preload modules (torch) are imported first, before the loader child is forked. With
``"jobs": N`` (or ``"auto"``: this host's CPUs, at most 4) the other names are imported by up to
N processes at once: this one and workers forked from it once the preload is imported (each
name's package in one of them, so a stack's shared imports are not repeated in each), each
answering its names' results and, for the provenance report, what it mapped; the document is the
one a single process importing every name would give, in the order of the names.

The request may also hold ``"server_args": {"argv": [...], "after": NAME, "deadline": SECONDS,
"source": TEXT}``, TEXT being ``stage_server_args.py`` and NAME one of the names (the top-level
package of the parser's module): the process that imports NAME (this one or a worker) forks a
child right after that import succeeds, which runs that script's ``report(argv)`` as
``<venv>/bin/python - ARGV...`` would (``sys.argv`` as there) and answers it through a pipe, so
that the server-args stage imports neither torch nor the framework a second time. The document
then also holds ``"server_args"``: that report; ``{"died": HOW}`` when the child ended without
answering; ``{"timed_out": SECONDS}`` when it had not answered ``deadline`` seconds after this
process started (it is then killed); null when NAME failed to import or was not imported (the
controller then runs the script in a process of its own, as it does without the fork).

The request may also hold ``"smoke": {"argv": [DEVICE], "deadline": SECONDS, "source": TEXT}``,
TEXT being ``stage_smoke.py``: right after the preload (torch), and only when torch imported and
CUDA is not initialized in this process (``torch.cuda.is_initialized()``: a child forked after
that cannot use the GPU), a child is forked that runs that script's ``report(argv)`` as
``<venv>/bin/python - DEVICE`` would, so that smoke imports torch no second time. The document then
also holds ``"smoke"``: that report, ``{"died": HOW}``, ``{"timed_out": SECONDS}`` (as for
server-args), or null when no child was forked (the controller runs smoke's own process).

A signal that ends this process (an extension module whose code needs a CPU feature this CPU lacks
dies of SIGILL) leaves faulthandler's ``Fatal Python error: ...`` on stderr, after a
``transplant: importing NAME`` line written before each import of this process's own: the
controller names the signal and the import from them (over SSH the exit status says no signal).
A worker a signal ended fails its names with the signal's name (``_common.ended``).
"""

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback

try:
    from _transplant_common import IMPORTING, ended
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import IMPORTING, ended


def _version(module, name):
    version = getattr(module, "__version__", None)
    if version is not None:
        return str(version)
    try:
        from importlib import metadata

        top = name.split(".")[0]
        for dist in _packages_distributions(metadata).get(top, []):
            return metadata.version(dist)
    except Exception:  # noqa: BLE001 - metadata may be broken; the version is optional
        return None
    return None


#: ``importlib.metadata.packages_distributions()`` of this process, by the ``sys.path`` it read:
#: it reads every distribution's RECORD (about 0.3 s of CPU for a CUDA stack's 200), and a stack
#: has several names without ``__version__``.
_DISTRIBUTIONS = {}  # type: dict


def _packages_distributions(metadata):
    key = tuple(sys.path)
    if key not in _DISTRIBUTIONS:
        _DISTRIBUTIONS.clear()
        _DISTRIBUTIONS[key] = metadata.packages_distributions()
    return _DISTRIBUTIONS[key]


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


#: When this process started (:func:`time.monotonic`): the server-args child's deadline counts from it.
_STARTED = time.monotonic()


def main(names, request):
    import faulthandler

    # a signal that ends this process (an extension module's code needing a CPU feature this CPU
    # lacks dies of SIGILL) is said on stderr, which the controller reads when no report comes:
    # over SSH the exit status says no signal; the IMPORTING lines say which import it was
    faulthandler.enable(all_threads=False)
    native = request.get("native")
    forked = None
    # native-load's loader is forked once this process has imported its preload modules (torch)
    # and nothing else: they are imported first (a name among them keeps its result), so that
    # neither the loader nor an import worker imports torch a second time
    preload = _preload(native) if native else []
    done = {}
    for name in preload:
        outcome = _import(name, said=True)
        if name in names:
            done[name] = outcome
    if native:
        forked = _fork_loader(native, preload)
    smoke = _smoke_child(request.get("smoke"), preload)
    rest = [n for n in names if n not in done]
    groups = _groups(rest, _jobs(request.get("jobs")))
    server_args = request.get("server_args")
    workers = [_Worker(group, request.get("provenance"), server_args) for group in groups[1:]]
    parser = _ServerArgsFork(server_args)
    for name in groups[0] if groups else []:
        done[name] = _import(name, said=True)
        parser.after(name, done[name])
    facts = []
    answered = parser.collect()
    smoked = smoke.collect(_deadline(request.get("smoke"))) if smoke is not None else None
    for worker in workers:
        got = worker.collect()
        done.update(got["imports"])
        if got.get("facts"):
            facts.append(got["facts"])
        if got.get("server_args") is not None:
            answered = got["server_args"]
    results = [done[n] for n in names if n in done]
    document = {"imports": results}
    if request.get("provenance"):
        document["provenance"] = _merged(_provenance(request["provenance"], results), facts)
    if native:
        document["native"] = forked.report() if forked is not None else None
        document["native_preload"] = preload
    if server_args:
        document["server_args"] = answered
    if request.get("smoke"):
        document["smoke"] = smoked
    sys.stdout.write(json.dumps(document) + "\n")
    return 0


def _import(name, said=False):
    """Import ``name``: its result (``{"name", "ok", "version", "file", "outside", "error", "seconds"}``);
    ``said``: first an :data:`IMPORTING` line on stderr (this script's own process)."""
    if said:
        sys.stderr.write(IMPORTING + name + "\n")
        sys.stderr.flush()
    started = time.monotonic()
    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - a failing import is the finding
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = "{}:{}".format(last[0].filename, last[0].lineno) if last else None
        return {"name": name, "ok": False, "version": None, "file": None,
                "error": "{}: {}".format(type(exc).__name__, exc)[:2000], "where": where,
                "seconds": round(time.monotonic() - started, 3)}
    return {"name": name, "ok": True, "version": _version(module, name),
            "file": getattr(module, "__file__", None),
            "outside": _outside(getattr(module, "__file__", None)), "error": None,
            "seconds": round(time.monotonic() - started, 3)}


def _jobs(asked):
    """How many processes import the names: the request's ``jobs`` (an int, at least 1; ``"auto"``:
    this host's usable CPUs, at most 4; absent: 1)."""
    if asked == "auto":
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        return max(1, min(4, cpus))
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 1 else 1


def _groups(names, jobs):
    """``names`` in at most ``jobs`` groups, the names of one top-level package in one group (they
    share most of their imports), the packages dealt round-robin in their order."""
    tops = {}
    for name in names:
        tops.setdefault(name.split(".")[0], []).append(name)
    groups = [[] for _ in range(min(jobs, len(tops)))]
    for index, members in enumerate(tops.values()):
        groups[index % len(groups)].extend(members)
    return groups


class _Forked:
    """A child forked from this process that runs :meth:`run` and sends its JSON answer back
    through a pipe drained by a thread (so the child never waits for the caller)."""

    def _fork(self):
        import threading

        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            os.close(read)
            code = 1
            try:
                data = json.dumps(self.run()).encode()
                while data:
                    data = data[os.write(write, data):]
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self._chunks = []
        self._thread = threading.Thread(target=self._drain, args=(read,), daemon=True)
        self._thread.start()

    def run(self):
        """The child's answer (JSON-able); runs in the child only."""
        raise NotImplementedError

    def _drain(self, fd):
        with os.fdopen(fd, "rb") as handle:
            for chunk in iter(lambda: handle.read(65536), b""):
                self._chunks.append(chunk)

    def _answer(self):
        """The child's decoded answer, or None when it sent none that decodes."""
        try:
            return json.loads(b"".join(self._chunks))
        except ValueError:
            return None


class _Worker(_Forked):
    """A child forked from this process (after the preload imports) that imports ``names`` and, when
    the request asks for provenance, says this process's facts after them."""

    def __init__(self, names, provenance, server_args=None):
        self.names, self.provenance, self.server_args = names, provenance, server_args
        self._fork()

    def run(self):
        parser = _ServerArgsFork(self.server_args)
        answer = {"imports": {}}
        for name in self.names:
            answer["imports"][name] = _import(name)
            parser.after(name, answer["imports"][name])
        answer["server_args"] = parser.collect()
        if self.provenance:
            answer["facts"] = _provenance(self.provenance, [], only_facts=True)
        return answer

    def collect(self):
        """``{"imports": {name: result}, "facts": ...}`` once the child has ended; a child that died
        without answering has each of its names failed with how it ended."""
        self._thread.join()
        _, status = os.waitpid(self.pid, 0)
        answer = self._answer()
        if answer is not None:
            return answer
        how = ended(os.waitstatus_to_exitcode(status))
        return {"imports": {n: {"name": n, "ok": False, "version": None, "file": None, "where": None,
                                "error": "SystemError: the import worker ended ({}) without answering".format(how),
                                "seconds": None} for n in self.names}}


class _ServerArgsFork:
    """The server-args child of one process: forked by :meth:`after` once the request's ``after``
    name has been imported here (and only if that import succeeded), then awaited by
    :meth:`collect`. Forking there is what the import workers do after torch: the child runs
    only the parser's Python code, touching no object of the threads this process may have
    (the pipes' drain threads, idle native pools); a child that dies or hangs for another reason
    ends only itself: it answers ``{"died": ...}`` (the controller then runs the script in a
    process of its own) or is killed at the deadline."""

    def __init__(self, request):
        self.request = request
        self.child = None

    def after(self, name, outcome):
        """Fork the child when ``name`` is the one it waits for and ``outcome`` (its import's
        result) is a success."""
        if self.request is None or self.child is not None or name != self.request.get("after") \
                or not outcome.get("ok"):
            return
        self.child = _Child(self.request)

    def collect(self):
        """The child's report, ``{"died": HOW}``, ``{"timed_out": SECONDS}``, or None when no child
        was forked here."""
        if self.child is None:
            return None
        return self.child.collect(_deadline(self.request))


def _deadline(request):
    """A forked stage's deadline as a :func:`time.monotonic` value (its request's ``deadline``, in
    seconds from this process's start), or None: no limit."""
    deadline = (request or {}).get("deadline")
    return None if deadline is None else _STARTED + float(deadline)


def _smoke_child(request, preload):
    """The smoke stage's child (:class:`_Child` running ``stage_smoke``'s ``report``), forked now:
    right after the preload, so that smoke imports torch no second time, but only when the request
    asks for it, torch was preloaded and imported, and CUDA is not initialized in this process (a
    child forked after that cannot use the GPU); else None (the controller runs smoke's own process)."""
    torch = sys.modules.get("torch")  # a torch whose import failed is not left there
    if not request or "torch" not in preload or torch is None:
        return None
    try:
        initialized = bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch that cannot say: smoke runs its own process
        initialized = True
    return None if initialized else _Child(request, "stage_smoke")


class _Child(_Forked):
    """A forked child that runs one stage script's ``report(argv)`` as ``<venv>/bin/python - ARGV...``
    would run it (the server-args child of :class:`_ServerArgsFork`, smoke's of :func:`_smoke_child`)."""

    def __init__(self, request, script="stage_server_args"):
        self.request, self.script = request, script
        self._fork()

    def run(self):
        # what the stage's libraries print goes to stderr, never into this process's document
        os.dup2(2, 1)
        argv = [str(a) for a in self.request.get("argv") or []]
        sys.argv = ["-"] + argv  # as `python - ARGV...` has it: argparse names its program from it
        script = {"__name__": "_transplant_" + self.script}
        exec(compile(self.request["source"], self.script + ".py", "exec"), script)  # noqa: S102 - transplant's own script
        return script["report"](argv)

    def collect(self, deadline):
        """The child's report once it has ended; ``deadline`` (a :func:`time.monotonic` value, or
        None: no limit): past it the child is killed and ``{"timed_out": SECONDS}`` answered."""
        import signal

        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(self.pid, 0)
            return {"timed_out": round(deadline - _STARTED, 3)}
        _, status = os.waitpid(self.pid, 0)
        report = self._answer()
        if not isinstance(report, dict):
            return {"died": ended(os.waitstatus_to_exitcode(status))}
        return report


def _merged(report, others):
    """The provenance report of this process with the shared objects and extension modules the
    import workers (``others``: their facts) mapped added: together, what one process importing
    every name would have mapped."""
    for key in ("mapped", "extension_modules", "beside_source"):
        seen = {json.dumps(v) for v in report.get(key, [])}
        for other in others:
            for value in other.get(key, []):
                if json.dumps(value) not in seen:
                    seen.add(json.dumps(value))
                    report[key].append(value)
    return report


def _preload(native):
    """The preload modules to import before anything else (those of ``optional`` only where
    installed)."""
    optional = set(native.get("optional") or ())
    return [n for n in native.get("preload", [])
            if n not in optional or importlib.util.find_spec(n) is not None]


def _fork_loader(native, preload):
    """Fork native-load's loader child now (``stage_native.Forked``): it reads its paths from the
    rest of standard input."""
    script = {"__name__": "_transplant_stage_native"}
    exec(compile(native["source"], "stage_native.py", "exec"), script)  # noqa: S102 - transplant's own script
    sys.stdout.flush()
    sys.stderr.flush()
    return script["Forked"](preload, sys.stdin.buffer)


def _provenance(request, results, only_facts=False):
    """``stage_provenance``'s report of this process, its ``modules`` imported (those not yet
    imported here, in its order; each one's outcome as it was here); ``only_facts``: this
    process's facts as they are, importing nothing more (an import worker's)."""
    if only_facts:
        script = {"__name__": "_transplant_stage_provenance"}
        exec(compile(request["source"], "stage_provenance.py", "exec"), script)  # noqa: S102 - transplant's own script
        return script["facts"]([])
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
    _code = main(sys.argv[1:], json.loads(_stdin or b"{}"))
    # once the report is written the process ends at once, as the import workers do: the teardown of a
    # CUDA stack's thousands of modules and its packages' exit handlers (about 2 s of wall time for
    # the real stack's imports process) change nothing the controller reads
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
