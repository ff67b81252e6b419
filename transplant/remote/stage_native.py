"""Verify stage ``native-load``: dlopen every shared object of the overlaid distributions.

Usage: ``<venv>/bin/python -c SOURCE < request.json`` with the request
``{"paths": [absolute .so paths], "preload": ["torch"]}``. The loading happens in a child
interpreter of the same venv (``sys.executable``), one file after the other with
``RTLD_NOW`` (every undefined symbol resolved at once, as the dynamic loader would when
the library is used); the modules in ``preload`` are imported first, since extensions
built against torch name ``libc10.so`` without a path and rely on torch having loaded it.
A child that dies on a file (a constructor that crashes) is replaced by a new one, which
goes on after that file; the file is reported with the signal, named (``SIGSEGV``; SIGILL as
an illegal instruction: code for CPU features this CPU lacks).

Before loading, each file's ELF header (``e_ident`` class and data, ``e_machine``; read with
:mod:`struct`, the System V gABI layout) is compared with the running interpreter's: an object
built for another machine or ELF class (the AArch64 stubs an x86_64 wheel carries for
cross-compiling) cannot be loaded here by construction, so it is not dlopened and gets
``skipped`` (``"built for aarch64 (e_machine 183, 64-bit), this interpreter is x86_64 (e_machine 62,
64-bit)"``).

A load that fails on a missing soname is followed by the dynamic loader's own list of every
dependency it cannot find (``LD_TRACE_LOADED_OBJECTS=1 <PT_INTERP of the interpreter> FILE``,
as ldd(1) runs it with glibc's loader: the file is mapped with its dependencies, none of its
code runs), less the sonames already loaded in the process (the preloads',
asked with ``RTLD_NOLOAD``): ``missing``. dlopen's message names only the first one.
Such a file is first loaded again after all the others, in rounds while a round loads one
more: a library that names a sibling of the venv without a path (torchaudio's
``_torchaudio.so`` and ``libtorchaudio.so``, auditwheel's grafted ``*.libs`` folders) finds it
once the sibling is loaded, as the package's own code loads it by path first. One that loads
then is ``ok`` with ``first_error``.

Or run inside ``stage_imports`` (:class:`Forked`): its first loader child is forked from that
process once it has imported the preloads, so torch is not imported by another interpreter;
it reads its paths from the rest of that process's standard input, and one of its own goes on
after a file it died on.

Prints ``{"preload": [{"name", "ok", "error"}], "libraries": [{"path", "ok", "error",
"seconds", "skipped"?, "missing"?, "first_error"?}]}``; ``error`` is the loader's own message
(``libfoo.so.1: cannot open shared object file...``, ``/x/libbar.so: undefined symbol: baz``);
``skipped`` a reason (the file was not loaded); ``missing`` a sorted list of sonames, or None
when the loader could not list them. Stdlib only.
"""

import io
import json
import os
import struct
import subprocess
import sys

try:
    from _transplant_common import ended
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import ended

#: e_machine values of the System V gABI (elf.h), named as uname -m words.
_MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390", 40: "arm", 43: "sparcv9", 62: "x86_64",
             183: "aarch64", 190: "cuda", 243: "riscv", 258: "loongarch"}

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
interp = sys.argv[2] if len(sys.argv) > 2 else ""
mode = os.RTLD_NOW | os.RTLD_LOCAL


def unresolved(path):
    """Every soname the loader cannot find for path (traced as ldd does), less those loaded already."""
    if not interp:
        return None
    import re, subprocess
    try:
        env = dict(os.environ, LD_TRACE_LOADED_OBJECTS="1")
        proc = subprocess.run([interp, path], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    names = sorted(set(re.findall(r"^\s*(\S+) => not found", proc.stdout, re.M)))
    if not names and proc.returncode != 0:
        return None
    out = []
    for name in names:
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        except OSError:
            out.append(name)
    return out


def load(path):
    out.write(json.dumps({"begin": path}) + "\n")
    out.flush()
    started = time.monotonic()
    try:
        ctypes.CDLL(path, mode=mode)
        error = None
    except OSError as exc:
        error = str(exc)
    return error, time.monotonic() - started


def report(item):
    item["seconds"] = round(item["seconds"], 3)
    out.write(json.dumps(item) + "\n")
    out.flush()


pending = []
for line in sys.stdin:
    path = line.rstrip("\n")
    if not path:
        continue
    error, seconds = load(path)
    if error is not None and "cannot open shared object file" in error:
        pending.append((path, error, seconds))
        continue
    report({"path": path, "ok": error is None, "error": error, "seconds": seconds})
# A library that names another of the venv's without a path finds it once that one is loaded
# (its package loads it by path first): retry those, while a round loads one more.
progress = True
while pending and progress:
    progress, still = False, []
    for path, first, seconds in pending:
        error, more = load(path)
        if error is None:
            progress = True
            report({"path": path, "ok": True, "error": None, "seconds": seconds + more, "first_error": first})
        else:
            still.append((path, error, seconds + more))
    pending = still
for path, error, seconds in pending:
    report({"path": path, "ok": False, "error": error, "seconds": seconds, "missing": unresolved(path)})
'''


def elf_ident(path):
    """(ELF class, data encoding, e_machine) from the header of path (e_ident[EI_CLASS] at 4,
    e_ident[EI_DATA] at 5, e_machine a half-word at 18, in the file's own byte order); None
    for a file that is not ELF or cannot be read."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return None
    machine = struct.unpack("<H" if head[5] == 1 else ">H", head[18:20])[0]
    return head[4], head[5], machine


def interpreter_path(path):
    """The PT_INTERP (program interpreter, the dynamic loader) of the ELF executable path, or None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
                return None
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                phoff, = struct.unpack(end + "Q", head[32:40])
                phentsize, phnum = struct.unpack(end + "HH", head[54:58])
            else:
                phoff, = struct.unpack(end + "I", head[28:32])
                phentsize, phnum = struct.unpack(end + "HH", head[42:46])
            for index in range(min(phnum, 256)):
                handle.seek(phoff + index * phentsize)
                entry = handle.read(phentsize)
                if len(entry) < phentsize or struct.unpack(end + "I", entry[:4])[0] != 3:  # PT_INTERP
                    continue
                if head[4] == 2:
                    offset, = struct.unpack(end + "Q", entry[8:16])
                    size, = struct.unpack(end + "Q", entry[32:40])
                else:
                    offset, = struct.unpack(end + "I", entry[4:8])
                    size, = struct.unpack(end + "I", entry[16:20])
                handle.seek(offset)
                found = handle.read(min(size, 4096)).split(b"\0", 1)[0].decode("utf-8", "replace")
                return found if found.startswith("/") and os.path.exists(found) else None
    except (OSError, struct.error):
        return None
    return None


def _describe(ident):
    width = {1: "32-bit", 2: "64-bit"}.get(ident[0], "class {}".format(ident[0]))
    return "{} (e_machine {}, {})".format(_MACHINES.get(ident[2], "machine {}".format(ident[2])), ident[2], width)


def foreign(path, host):
    """Why path cannot load in this interpreter (another machine, class or byte order), or None."""
    ident = elf_ident(path)
    if ident is None or host is None or ident == host:
        return None
    return "built for {}, this interpreter is {}".format(_describe(ident), _describe(host))


def _run_child(paths, preload, interp=""):
    """Load ``paths`` in one child; returns (results, preload results, crashed path or None, how)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(preload), interp or ""],
                          input="\n".join(paths) + "\n", capture_output=True, text=True)
    return _child_outcome(proc.stdout, proc.returncode, proc.stderr)


def _child_outcome(stdout, returncode, stderr):
    """What a loader child's output (text) and exit status (negative: the signal that killed it)
    say: (results, preload results, the path it died on or None, how it died or None)."""
    results, loaded, begun = [], [], None
    for line in stdout.splitlines():
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
        how = ended(returncode) if returncode < 0 else "the process exited with code {}".format(returncode)
        said = stderr.split("Fatal Python error: ", 1)[0]  # faulthandler's stack (a forked child's) says no more
        tail = said.strip().splitlines()[-1:] if said.strip() else []
        if tail:
            how += " ({})".format(tail[0][:300])
    return results, loaded, begun, how


class Forked:
    """The first loader child forked from the calling process (``stage_imports``, once it has
    imported ``preload`` and nothing else), so that the modules it has imported are not imported a
    second time by another interpreter: the child reads the request line ``{"paths": [...]}`` from
    ``stream`` (a binary stream: the caller's standard input, which the caller reads no more),
    then does what :data:`CHILD` does for the loadable ones (``preload`` it has imported already
    are imported again only when they failed). The caller goes on with its own work and then
    calls :meth:`report`.

    Output and errors come back through pipes drained by two threads of the caller, so a child
    with much to say never waits for the caller to be done.
    """

    def __init__(self, preload, stream):
        import threading

        self.preload = list(preload)
        self.executable = os.path.realpath(sys.executable)
        self.host, self.interp = elf_ident(self.executable), interpreter_path(self.executable)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            os.close(out_r)
            os.close(err_r)
            self._child(stream, out_w, err_w)
        os.close(out_w)
        os.close(err_w)
        self._out, self._err = [], []
        self._threads = [threading.Thread(target=self._drain, args=(fd, into), daemon=True)
                         for fd, into in ((out_r, self._out), (err_r, self._err))]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _drain(fd, into):
        with os.fdopen(fd, "rb") as handle:
            for chunk in iter(lambda: handle.read(65536), b""):
                into.append(chunk)

    def _child(self, stream, out_w, err_w):
        code = 1
        try:
            os.dup2(out_w, 1)  # a constructor's printf lands in the stream read, as in a child of its own
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            line = stream.readline()
            request = json.loads(line or b"{}")
            paths = [p for p in request.get("paths", []) if isinstance(p, str)]
            sys.stdout.write(json.dumps({"request": paths}) + "\n")
            sys.stdout.flush()
            remaining = [p for p in paths if foreign(p, self.host) is None]
            sys.argv = ["-c", json.dumps(self.preload), self.interp or ""]
            sys.stdin = io.StringIO("\n".join(remaining) + "\n")
            exec(compile(CHILD, "<native-load child>", "exec"), {"__name__": "__main__"})  # noqa: S102 - this file's own child text, run in this process
            code = 0
        except BaseException:  # noqa: BLE001 - said on stderr, as a child of its own would
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def report(self):
        """Wait for the child and return this script's report (:func:`native_report`: a child of
        its own goes on after a file the forked one died on), or None when the child died before
        it said which paths it was asked for."""
        _, status = os.waitpid(self.pid, 0)
        for thread in self._threads:
            thread.join()
        stdout = b"".join(self._out).decode("utf-8", "replace")
        first, _, rest = stdout.partition("\n")
        try:
            paths = json.loads(first)["request"]
        except (ValueError, KeyError, TypeError):
            return None
        outcome = _child_outcome(rest, os.waitstatus_to_exitcode(status), b"".join(self._err).decode("utf-8", "replace"))
        return native_report(paths, self.preload, first=outcome)


def native_report(paths, preload, first=None):
    """This script's report (see the module docstring) for ``paths`` with ``preload`` imported first.

    :param first: the first loader child's outcome (as :func:`_child_outcome` gives it) when a
        :class:`Forked` child has loaded the loadable paths already; None starts one.
    """
    executable = os.path.realpath(sys.executable)
    host = elf_ident(executable)
    interp = interpreter_path(executable)
    results, preloaded = [], None
    remaining = []
    for path in paths:
        why = foreign(path, host)
        if why is None:
            remaining.append(path)
        else:
            results.append({"path": path, "ok": False, "error": None, "skipped": why, "seconds": 0.0})
    while remaining:
        if first is not None:
            (done, loaded, crashed, how), first = first, None
        else:
            done, loaded, crashed, how = _run_child(remaining, preload, interp)
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
        # the next child loads what this one did not report, the crashed file excepted (files
        # held back for a retry come before it; each round drops one file, so this ends)
        remaining = [p for p in remaining if p not in seen and p != crashed]
    order = {path: index for index, path in enumerate(paths)}
    results.sort(key=lambda item: order.get(item["path"], len(order)))  # the request's order
    return {"preload": preloaded or [], "libraries": results}


def main():
    request = json.loads(sys.stdin.read() or "{}")
    paths = [p for p in request.get("paths", []) if isinstance(p, str)]
    preload = [p for p in request.get("preload", []) if isinstance(p, str)]
    sys.stdout.write(json.dumps(native_report(paths, preload)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
