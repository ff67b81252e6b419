"""What the host scripts share (stdlib only, Python 3.9+): RECORD's hash form, pip's script head, the venv, the file stream's frames, the end of a script nobody reads.

Not a host script itself: :func:`transplant.remote.source` sends this module's source ahead of
every script that imports it (as ``_transplant_common``), the way the ELF reader's request
carries pyelftools; imported on the controller, the scripts take it from beside them.
"""

import base64
import csv
import hashlib
import io
import json
import os
import posixpath
import struct
import sys

#: The second line of pip's ``#!/bin/sh`` form of a console script (pip's ``_build_shebang``,
#: used when the interpreter's path is too long for a shebang or holds a space) starts with this.
SH_EXEC = b"'" * 3 + b"exec'"
#: The third line of that form: it closes, for Python, the string the second line opens.
SH_CLOSE = b"' " + b"'" * 3


def record_hash_of(digest):
    """RECORD's form of a sha256 ``digest`` (32 bytes): ``sha256=`` + urlsafe base64 without padding
    (PEP 376; the binary distribution format's RECORD)."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def record_hash(data):
    """RECORD's hash of ``data`` (bytes): :func:`record_hash_of` its sha256."""
    return record_hash_of(hashlib.sha256(data).digest())


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


def script_head(data):
    """Split a script's bytes into (head, body).

    The head is the shebang line, plus the second and third lines of pip's ``#!/bin/sh``
    form (``exec`` of the interpreter, used when its path is too long for a shebang, and the
    line that closes, for Python, the string the second line opens).
    Returns (None, data) when there is no shebang.
    """
    if not data.startswith(b"#!"):
        return None, data
    first, sep, rest = data.partition(b"\n")
    head = first + sep
    if first.strip() == b"#!/bin/sh" and rest.startswith(SH_EXEC):
        second, sep2, rest = rest.partition(b"\n")
        head += second + sep2
        third, sep3, after = rest.partition(b"\n")
        if third.rstrip(b"\r") == SH_CLOSE:  # the line that closes line 2's string for Python
            head, rest = head + third + sep3, after
    return head, rest


def record_identity(data, site, scripts):
    """The normalised identity of a RECORD: ``record:sha256=<urlsafe b64, no padding>`` of
    its parsed CSV rows, with the hash and size fields of every row under the scripts folder
    blanked; None when ``data`` is not UTF-8 or not CSV.

    :param data: the RECORD file's bytes.
    :param site: the venv-relative folder its rows are relative to (the site-packages
        folder holding the dist-info folder), POSIX.
    :param scripts: the venv-relative scripts folder (``bin``), POSIX.

    Rows are serialised canonically (a JSON list of the rows' fields), so CSV quoting and
    line endings do not count; empty rows are skipped. A row's path is placed by joining it
    to ``site`` (PEP 376: RECORD paths are relative to the folder holding the dist-info
    folder) and normalising, with no filesystem access. The blanking is transplant's rule:
    apply rewrites console scripts' shebangs for the target's prefix and sets their rows to
    the files as written (as pip does for the scripts it generates), so those fields differ
    between donor and target by design. The probe and the applier both use this one function.
    """
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error):
        return None
    return record_identity_of_rows(rows, site, scripts)


def record_identity_of_rows(rows, site, scripts):
    """:func:`record_identity` of a RECORD already parsed: ``rows`` as ``csv.reader`` gives them
    for its text (UTF-8, read with ``newline=""``); the same ``site`` and ``scripts``."""
    canonical = []
    append = canonical.append
    under = scripts + "/"
    base = site + "/" if site else ""
    site_normal = not site or posixpath.normpath(site) == site
    # a plain path joined to a normal site is base + path, under the scripts folder only when
    # base and the scripts folder overlap: else only the other paths need joining and looking at
    apart = site_normal and not base.startswith(under) and not under.startswith(base)
    for row in rows:
        if not row:
            continue
        path = row[0]
        if apart:
            if _plain(path):  # most rows
                append(row)
                continue
            where = posixpath.normpath(posixpath.join(site, path)) if path else ""
        elif site_normal and _plain(path):
            where = base + path  # normpath(join(site, path)) with no path arithmetic
        else:
            where = posixpath.normpath(posixpath.join(site, path)) if path else ""
        if where.startswith(under):
            row = [row[0], "", ""] + row[3:]
        append(row)
    text = json.dumps(canonical, separators=(",", ":"), ensure_ascii=True)
    return "record:" + record_hash(text.encode("ascii"))


def _plain(rel):
    """Whether a relative POSIX path is already normal (no empty, ``.`` or ``..`` part, no part
    starting with a dot, no trailing slash): ``normpath(join(site, rel))`` is then ``site/rel`` for
    a normal ``site``."""
    return (bool(rel) and rel[0] != "/" and rel[0] != "." and rel[-1] != "/" and "/." not in rel and "//" not in rel
            and "\0" not in rel)


#: The probe's content hash cache in the venv's state folder (``<venv>/.transplant/cache/``): entries
#: ``venv-relative path: [st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, hash, head, body_hash]``,
#: reused only while the five stat fields are unchanged (as git's index does).
HASH_CACHE_NAME = "hashes.json"
HASH_SCHEMA = "transplant.hashes/1"


def venv_cache_path(prefix, name):
    """``<prefix>/.transplant/cache/<name>``, or None when the venv's state folder is a symlink or
    resolves outside the venv (a host script then neither reads nor writes its cache there)."""
    state = os.path.join(prefix, ".transplant")
    if os.path.islink(state) or (os.path.exists(state) and
                                 os.path.realpath(state) != os.path.join(os.path.realpath(prefix), ".transplant")):
        return None
    return os.path.join(state, "cache", name)


def read_venv_cache(path, schema):
    """The ``entries`` object of a host script's cache document at ``path`` (written by
    :func:`write_venv_cache`), or ``{}`` when the file is absent, a symlink, or of another schema.

    :raises OSError: the file cannot be read.
    :raises ValueError: it is not JSON.
    """
    if not os.path.isfile(path) or os.path.islink(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    if isinstance(document, dict) and document.get("schema") == schema and isinstance(document.get("entries"), dict):
        return document["entries"]
    return {}


def write_venv_cache(prefix, path, schema, entries):
    """Write a host script's cache document ``{"schema": schema, "entries": entries}`` to ``path``
    in the venv's ``.transplant/cache`` folder, atomically (a temporary file renamed over it).

    The two folders are made with mode 0700 where absent; a cache folder that is a symlink or
    resolves outside ``<prefix>/.transplant/cache`` is refused, so nothing is written outside the venv.

    :raises OSError: the folder cannot be made or is refused, or the file cannot be written.
    """
    folder = os.path.dirname(path)
    for part in (os.path.dirname(folder), folder):  # makedirs gives the mode to the leaf only
        if not os.path.isdir(part):
            os.mkdir(part, 0o700)
    if os.path.realpath(folder) != os.path.join(os.path.realpath(prefix), ".transplant", "cache"):
        raise OSError("the cache folder is a symlink or leaves the venv")
    temporary = "{}.{}.tmp".format(path, os.getpid())
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"schema": schema, "entries": entries}, handle, separators=(",", ":"))
    os.replace(temporary, path)


def normal_relpath(relpath):
    """Normalise a path relative to a root and refuse one that leaves it (the rules of
    :func:`transplant.hosts.transfer.check_relpath`, shared with the stream's host scripts).

    :param relpath: POSIX path (str); inner ``..`` that stays inside the root is folded away.
    :returns: the normalised path.
    :raises ValueError: empty, absolute, NUL, the root itself, or escapes the root.
    """
    if not relpath or "\0" in relpath:
        raise ValueError("bad relative path {!r}: empty or contains NUL".format(relpath))
    if relpath.startswith("/"):
        raise ValueError("refusing absolute path {!r}: paths must be relative to the root".format(relpath))
    normal = posixpath.normpath(relpath)
    if normal == ".":
        raise ValueError("refusing {!r}: it names the root itself, not a file in it".format(relpath))
    if normal == ".." or normal.startswith("../"):
        raise ValueError("refusing {!r}: it escapes the root".format(relpath))
    return normal


#: The file stream of ``stream_send.py`` / ``stream_receive.py``: this magic, then frames. A frame
#: is FRAME (kind, path length, mode, size, mtime_ns), then the path (UTF-8, surrogateescape),
#: then ``size`` bytes: the file's content (kind ``F``), the link text (``L``), an error message
#: (``X``: the sender could not read that path; the stream ends there); kind ``E`` ends the
#: stream, its size the number of entries sent, with no path and no bytes.
STREAM_MAGIC = b"TRANSPLANT-STREAM/1\n"
FRAME = struct.Struct(">cHIQq")


#: Test hooks read on a host (the ``TRANSPLANT_TEST_*`` environment variables; unset, nothing
#: happens). This module is the one place the host scripts read them; the controller's hooks are
#: in ``transplant/testhooks.py``, which lists these too.
#: A file where each host script appends ``<what> <venv prefix>``: the suite counts how many host
#: scripts of each kind a command runs.
SCRIPT_LOG = "TRANSPLANT_TEST_SCRIPT_LOG"
#: A file where each applier process appends ``<pid> <operation>``: the suite counts the applier
#: processes an apply starts.
APPLIER_LOG = "TRANSPLANT_TEST_APPLIER_LOG"


def hook_log(hook, line):
    """Append ``line`` to the file the test hook ``hook`` (:data:`SCRIPT_LOG`,
    :data:`APPLIER_LOG`) names in this host's environment; nothing when it is unset, and a write
    that fails is ignored (a hook never changes what the script does)."""
    path = os.environ.get(hook)
    if path:
        try:
            with open(path, "a", encoding="utf-8", errors="surrogateescape") as handle:
                handle.write(line + "\n")
        except OSError:
            pass


def script_log(what):
    """Log ``<what> <venv prefix>`` to the :data:`SCRIPT_LOG` test hook's file, when set."""
    hook_log(SCRIPT_LOG, "{} {}".format(what, venv_prefix()))


def end_when_unread(before=None):
    """Watch standard output from a thread of its own and end this process once nothing reads it
    any more: the controller that started this script is gone, or gave up on it (Ctrl-C during
    ``verify``, a timeout). Over SSH that is how the remote end learns it: the controller kills
    its local ``ssh``; sshd then closes its end of the command's output (OpenSSH's master sends
    ``eow@openssh.com`` for the session of a client that died, or the connection ends), while
    the command, busy importing or waiting, would have read nothing and run on.

    For the read-only scripts of ``verify`` and the probe only: the applier finishes its step
    (a killed commit is a transaction to resume, so it is left to end on its own).

    How it ends: ``before()`` first (a script that started a process in a group of its own stops
    it there), then SIGKILL to the process group when the group is its session's own, led by
    this process or its parent (what sshd starts for a command, a shell that may run the script
    as its child, or a local ``start_new_session``: nothing else is in it but what this script
    started), else to this process alone.

    Linux reports a pipe whose reader is gone as POLLERR (a socket whose peer closed as POLLHUP)
    to a ``poll`` asking for no event, so the thread sleeps until then, costing nothing. (An sshd
    built to give commands a socket pair, not pipes, only half-closes it at ``eow``: such a
    script ends when the connection closes, which the controller's interrupt does.)

    :param before: a callable run first, in the watching thread (its errors are ignored); None: none.
    :returns: whether it watches (False when standard output is not a pipe or a socket: a file
        or a terminal says nothing of its reader, or where ``select.poll`` is missing).
    """
    import _thread
    import select
    import signal
    import stat

    try:
        mode = os.fstat(1).st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)) or not hasattr(select, "poll"):
        return False

    def watch():
        poller = select.poll()
        poller.register(1, 0)  # no event asked for: only POLLERR, POLLHUP and POLLNVAL come back
        while True:
            try:
                mask = 0
                for _, events in poller.poll():
                    mask |= events
            except OSError:
                return
            if mask & select.POLLNVAL:
                return  # not a descriptor any more: nothing to watch
            if mask & (select.POLLERR | select.POLLHUP):
                break
        if before is not None:
            try:
                before()
            except BaseException:  # noqa: BLE001 - ending anyway
                pass
        try:
            group = os.getpgrp()
            if group == os.getsid(0) and group in (os.getpid(), os.getppid()):
                os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    _thread.start_new_thread(watch, ())
    return True


#: How a process killed by SIGILL is named: the processor met an instruction it does not have,
#: which for a shared object that loaded means code built for CPU features (an x86-64 level,
#: AVX-512) this CPU lacks. The controller adds the flags that differ from the donor's CPU.
ILLEGAL_INSTRUCTION = "illegal instruction (SIGILL): the object needs CPU features this CPU lacks"

#: What :mod:`faulthandler` writes, after ``Fatal Python error: ``, for each fatal signal it
#: catches (CPython's ``Modules/faulthandler.c``, ``faulthandler_handlers``), by signal name.
FAULT_NAMES = {"Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Illegal instruction": "SIGILL",
               "Floating point exception": "SIGFPE", "Aborted": "SIGABRT"}

#: The line the imports script writes on standard error before each import of its own process,
#: so that a process a signal ended says which import killed it.
IMPORTING = "transplant: importing "


def ended(returncode):
    """How a child process ended, in words, from its exit status as :mod:`subprocess` gives it
    (an int; negative: the number of the signal that killed it; None: no status came).

    A signal is named by its name (``signal.Signals``: ``SIGSEGV``, ``SIGBUS``, ``SIGABRT``) and
    its description (``signal.strsignal``); SIGILL as :data:`ILLEGAL_INSTRUCTION`; a number this
    platform has no name for, as a number. ``ended(-11)``: ``killed by SIGSEGV (segmentation
    fault)``; ``ended(3)``: ``exited with code 3``.
    """
    import signal

    if returncode is None:
        return "ended without an exit status"
    if returncode >= 0:
        return "exited with code {}".format(returncode)
    number = -returncode
    try:
        named = signal.Signals(number)
    except ValueError:
        return "killed by signal {}".format(number)
    if named == signal.SIGILL:
        return ILLEGAL_INSTRUCTION
    said = signal.strsignal(named)
    said = said.split(":")[0] if said else None  # glibc's "Real-time signal 3"; musl adds no colon either
    return "killed by {}{}".format(named.name, " ({})".format(said[:1].lower() + said[1:]) if said else "")


def fault_signal(text):
    """The signal (a positive number) that :mod:`faulthandler`'s ``Fatal Python error: <what>``
    line in ``text`` (a process's standard error, str) names, the last such line counting; None
    when there is none. Over SSH a command a signal ended exits with 255 (the client reports no
    signal), so the line its faulthandler wrote is how the controller learns which signal."""
    import signal

    found = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Fatal Python error: "):
            name = FAULT_NAMES.get(line[len("Fatal Python error: "):].strip())
            if name is not None and hasattr(signal, name):
                found = int(getattr(signal, name))
    return found


def died_of(returncode, text):
    """The signal that ended a process, from its exit status (negative: the signal, as
    :mod:`subprocess` gives it) or else its standard error (``text``: :func:`fault_signal`);
    None when it exited by itself, as far as either says."""
    if returncode is not None and returncode < 0:
        return -returncode
    return fault_signal(text)


def last_import(text):
    """The name after the last :data:`IMPORTING` line of ``text`` (the imports script's standard
    error), or None."""
    found = None
    for line in text.splitlines():
        if line.startswith(IMPORTING):
            found = line[len(IMPORTING):].strip()[:200] or None
    return found
