"""The inventory probe: one stdlib-only file run by a venv's own interpreter on its host.

Usage on a host (the controller sends this file on standard input)::

    <venv>/bin/python - [--hash PATTERN]... [--file RELPATH]... < probe.py
    <venv>/bin/python -c "$(cat probe.py)" --stdin <<< '{"hash": [...], "files": [...], "site_files": [...]}'

It prints one JSON document (schema ``transplant.inventory/1``) on standard output:
the interpreter, the venv's paths, every distribution found in site-packages with its
METADATA, WHEEL, RECORD and direct_url facts, the files named with ``--file``, and the
host's NVIDIA facts from ``nvidia-smi`` (or the reason there are none).

* ``--hash PATTERN`` (repeatable; fnmatch on PEP 503 normalised names, ``*`` for all):
  the files of matching distributions are read and hashed (sha256, RECORD's
  urlsafe-base64 form) and stat'ed; the others report only RECORD's facts.
* ``--file RELPATH`` (repeatable): a path relative to the venv prefix to hash, present
  or not (used for patch destinations); with ``--stdin``, ``site_files`` names such paths
  relative to site-packages instead, and ``"record": false`` skips RECORD (metadata only,
  for dependency checks), ``"record": "shared"`` looks on disk only at the shared objects
  (``*.so``, ``*.so.N``) RECORD lists (the others' rows have their paths alone: what verify
  reads), ``"record": "summary"`` reads RECORD alone and reports per
  distribution ``record_summary``: ``{"files": rows inside the venv (by name), "bytes": the sum
  of their RECORD size column}`` with ``record`` null (no file on disk looked at: what
  ``transplant inventory`` shows); ``"compact": true`` gives each RECORD entry as a list of
  :data:`COLUMNS` (trailing nulls left out; ``venv_path`` 1 for ``<site_packages>/<path>``,
  ``hash`` 1 for a hash equal to ``record_hash``; no ``mtime``) and the document
  ``record_columns``: about 40 % of the bytes, for the controller's plans; ``texts`` names site-packages-relative text files to return
  (``torch/version.py``), and ``paths_exist`` absolute paths whose existence to report
  (editable installs' source folders).
* Files of hashed distributions in the scripts folder also report ``head`` (shebang)
  and ``body_hash``; a hashed distribution's own RECORD, and a ``--file`` that is a
  dist-info's RECORD, also report ``record_identity`` (:func:`record_identity`);
  ``texts`` always includes the ``*.pth``, ``*.egg-link`` and ``__editable__*.py``
  files at the top of site-packages.
* ``gencode`` (a full RECORD read only): the versions stamped into the generated protobuf and
  grpc modules RECORD lists (``*_pb2.py``, ``*_pb2_grpc.py``), by venv-relative path, read from
  their first 16 KiB (:func:`_gencode`).
* ``outside`` lists the folders outside the venv the interpreter imports from (``*.pth``
  path lines, ``include-system-site-packages``) with their distributions, metadata only
  (:func:`_outside`); ``host.libcuda`` says where JIT users find ``libcuda.so``
  (:func:`_libcuda`); ``host.c_toolchain`` the C compiler and ``Python.h`` triton's launcher
  build finds (:func:`_c_toolchain`).

* ``hash_cache`` (``--stdin`` only; default true, or ``{"enabled": bool, "min_bytes": int,
  "racy_ns": int, "store": "venv"|"reply", "known": {...}}``): reuse and keep content hashes
  (see :class:`_HashCache`), in ``<venv>/.transplant/cache/hashes.json`` (``store: venv``,
  for targets) or on the controller (``store: reply``, for donors: nothing is written on the
  host). A ``store: reply`` request carries what the controller knows as group lines after
  the request's JSON on standard input, one per distribution the request hashes,
  ``<normalised name>\t<{"rel": entry} as JSON>\n`` (the controller sends only those, not
  its whole file; ``known``, a mapping, is read too, for lookups only). The probe prints,
  before its document, one line ``#hashes\t<name>\t<entries>`` per group whose entries
  changed (a file hashed again, a file gone, a distribution gone: ``{}``), holding that
  group's entries as they are now; an unchanged group gets no line. The document then
  reports ``hash_cache``: ``{"enabled", "hits", "misses", "hashed_bytes", "written", "error"?, "groups"?}``
  (``groups``: how many lines were printed).

* ``inputs`` (``--stdin`` only; true to ask): the document reports ``inputs``: ``{"digest",
  "count", "paths", "racy", "started_ns"}``, the probe's inputs (every file and folder whose
  content or listing it read or stat'ed, noted where it looks: :func:`_note`) as a sha256 over
  their lstat identities and the non-file facts (:class:`_Inputs`), their paths packed, and
  whether one was written too recently to be trusted. A request ``{"fingerprint": {"paths":
  <those paths>, "extra": [...], "since_ns": ...}}`` re-stats them and prints only the digest
  (:func:`_fingerprint`): well under a second where the full probe takes several. A request
  ``{"exists": [absolute paths]}`` prints only ``{"elsewhere": {path: exists}}`` (:func:`_elsewhere`),
  reading no distribution and no host fact.

Design rules: Python 3.9+, no imports outside the standard library, never imports the
distributions it reports (the venv may be broken), writes nothing but its own hash cache
in the venv's state folder, and only when asked to (a target's). The
controller parses the output with :func:`transplant.core.inventory.parse_inventory`; it never
imports this module's functions at run time on the controller.
"""

import csv
import fnmatch
import gc
import hashlib
import io
import json
import os
import platform
import posixpath
import re
import socket
import stat
import subprocess
import sys
import sysconfig
import time

try:
    from _transplant_common import (HASH_CACHE_NAME, HASH_SCHEMA, read_venv_cache, record_hash as _digest,
                                    record_hash_of, record_identity, record_identity_of_rows, script_head, script_log,
                                    SCRIPT_LOG, hook_log, venv_cache_path, venv_prefix, write_venv_cache)
except ImportError:  # imported on the controller: the shared module beside this script
    from ._common import (HASH_CACHE_NAME, HASH_SCHEMA, read_venv_cache, record_hash as _digest, record_hash_of,
                          record_identity, record_identity_of_rows, script_head, script_log, SCRIPT_LOG,
                          hook_log, venv_cache_path, venv_prefix, write_venv_cache)

SCHEMA = "transplant.inventory/1"
_NORMALIZE = re.compile(r"[-_.]+")
_CHUNK = 1 << 20


def normalize(name):
    """PEP 503 normalised form of a distribution name."""
    return _NORMALIZE.sub("-", name).lower()


def file_hash(path):
    """Return (``sha256=<urlsafe b64, no padding>``, size in bytes) of a file, or (None, None)."""
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as handle:
            while True:
                block = handle.read(_CHUNK)
                if not block:
                    break
                size += len(block)
                digest.update(block)
    except OSError:
        return None, None
    return record_hash_of(digest.digest()), size


def venv_scheme():
    """The sysconfig install scheme the venv's interpreter uses at run time.

    The probe runs with ``-I -S``, so ``site`` never sets ``sys.prefix`` to the venv and
    ``sysconfig``'s default scheme is the base install's. On Debian and Ubuntu that is the
    patched ``posix_local`` (``<prefix>/local/lib/pythonX.Y/dist-packages``), which no venv
    uses. CPython 3.11 and later name the venv's scheme ``venv`` (what ``get_preferred_scheme``
    answers once ``sys.prefix != sys.base_prefix``); before 3.11 a venv uses ``posix_prefix``
    (``nt`` on Windows), which Debian left unpatched for venvs.
    Source: the ``sysconfig`` documentation, "Installation paths" and ``get_preferred_scheme``.
    """
    if "venv" in sysconfig.get_scheme_names():
        return "venv"
    return "nt" if os.name == "nt" else "posix_prefix"


def venv_paths(prefix):
    """sysconfig's install paths for ``prefix`` (purelib, platlib, scripts...): in the scheme the
    venv's interpreter uses at run time (:func:`venv_scheme`) where ``prefix`` holds a
    ``pyvenv.cfg``, else (a base install, a conda environment) in the interpreter's default one."""
    base = {"base": prefix, "platbase": prefix, "installed_base": prefix, "installed_platbase": prefix}
    if os.path.isfile(os.path.join(prefix, "pyvenv.cfg")):
        return sysconfig.get_paths(scheme=venv_scheme(), vars=base)
    return sysconfig.get_paths(vars=base)


def _unseen_sites(prefix, sites):
    """``{venv-relative folder: dist-info count}`` for the site folders of the venv in every other
    scheme this interpreter knows (Debian's ``posix_local``, ``posix_prefix``...) that hold
    ``*.dist-info`` folders when the probe's own ``sites`` hold none: a venv the probe would
    otherwise report as empty while its interpreter imports distributions from there."""
    base = {"base": prefix, "platbase": prefix, "installed_base": prefix, "installed_platbase": prefix}
    out = {}
    for scheme in sysconfig.get_scheme_names():
        try:
            paths = sysconfig.get_paths(scheme=scheme, vars=base, expand=True)
        except (KeyError, ValueError):
            continue
        for key in ("purelib", "platlib"):
            folder = paths.get(key)
            rel = _inside(prefix, folder) if folder else None
            if rel is None or folder in sites or rel in out:
                continue
            try:
                found = sum(1 for n in os.listdir(folder) if n.endswith(".dist-info"))
            except OSError:
                continue
            if found:
                out[rel] = found
    return out


_REALPATHS: "dict[str, str]" = {}


def _real(folder):
    """os.path.realpath, memoised per folder (a probe resolves the same folders thousands of times)."""
    real = _REALPATHS.get(folder)
    if real is None:
        parent, name = os.path.split(folder)
        if not os.path.isabs(folder) or not name or parent == folder or name in (os.curdir, os.pardir):
            real = os.path.realpath(folder)
        else:
            # One lstat per folder: the parent's real path is memoised too.
            candidate = os.path.join(_real(parent), name)
            real = os.path.realpath(candidate) if os.path.islink(candidate) else candidate
        _REALPATHS[folder] = real
    return real


_BASES: "dict[str, str]" = {}  # prefix -> its normalised form with one trailing "/" ("" for a relative prefix)


def _inside(prefix, path):
    """Path relative to prefix (POSIX), or None when it escapes the prefix.

    Both the normalised path and the real location of its folder (symlinks resolved)
    must stay inside the prefix: a symlinked folder pointing elsewhere counts as escaping.
    """
    norm = os.path.normpath(path)
    base = _BASES.get(prefix)
    if base is None:
        base = _BASES[prefix] = os.path.normpath(prefix).rstrip("/") + "/" if os.path.isabs(prefix) else ""
    if base and os.sep == "/" and norm.startswith("/"):
        # The common case, without relpath's abspath/commonprefix work per file.
        if not norm.startswith(base):
            return None
        rel = norm[len(base):]
    else:
        rel = os.path.relpath(norm, prefix)
        if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep):
            return None
    real_prefix = _real(prefix)
    parent = _real(os.path.dirname(norm))
    if parent != real_prefix and not parent.startswith(real_prefix + os.sep):
        return None
    return rel.replace(os.sep, "/")


def _read(path):
    """Text of a metadata file, or None when absent, unreadable, or a symlink."""
    _note(path)
    if os.path.islink(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _read_record(path):
    """``(text, plain)`` of a RECORD: its text as :func:`_read` gives it (None when absent,
    unreadable or a symlink), and whether its rows are those :func:`record_identity` parses: the
    bytes are UTF-8 (the decoding replaced nothing) and hold no quote, so no field spans a line
    and the newline translation (pip writes RECORD with ``\r\n``) ends the same rows at the same
    places. Then the identity is made of the rows parsed once, not of the file read and parsed
    again (on a large venv a noticeable share of the probe)."""
    _note(path)
    if os.path.islink(path):
        return None, False
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None, False
    try:
        text = data.decode("utf-8")
        plain = '"' not in text
    except UnicodeDecodeError:
        text, plain = data.decode("utf-8", "replace"), False
    if "\r" in text:  # what reading in text mode does: universal newlines
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text, plain


def _identity_of_rows(rows, plain, full, rel, size):
    """:func:`_record_identity_of` of the RECORD at ``full`` (venv-relative ``rel``, ``size``
    bytes by its lstat) from its ``rows`` when ``plain`` (:func:`_read_record`); read again
    otherwise."""
    if not plain:
        return _record_identity_of(full, rel)
    if size is None or size > _RECORD_MAX:
        return None
    return record_identity_of_rows(rows, posixpath.dirname(posixpath.dirname(rel)), _OPTIONS["scripts"])


def _header_parser():
    """email's ``HeaderParser`` (imported here, not with the probe: a fingerprint parses no
    METADATA, and email's modules are a large share of the probe's start-up imports)."""
    import email.parser

    return email.parser.HeaderParser()


def _metadata(text):
    if text is None:
        return None
    message = _header_parser().parsestr(text)
    return {
        "name": message.get("Name"),
        "version": message.get("Version"),
        "summary": message.get("Summary"),
        "requires_python": message.get("Requires-Python"),
        "requires_dist": message.get_all("Requires-Dist") or [],
    }


def _wheel(text):
    if text is None:
        return None
    message = _header_parser().parsestr(text)
    purelib = (message.get("Root-Is-Purelib") or "").strip().lower() == "true"
    return {
        "generator": message.get("Generator"),
        "root_is_purelib": purelib,
        "tags": message.get_all("Tag") or [],
    }


def _plain(rel):
    """Whether a RECORD path is relative and already normal (no empty, ``.`` or ``..`` part, no
    part starting with a dot, no trailing slash): then ``normpath(join(site, rel))`` is
    ``site + "/" + rel``, with no path arithmetic. A path that is not plain takes the general
    route (:func:`_inside`), which gives the same answers, only slower."""
    return (rel[0] != "/" and rel[0] != "." and rel[-1] != "/" and "/." not in rel and "//" not in rel
            and "\0" not in rel)


_FOLDERS: "dict[tuple[str, str], bool]" = {}  # (prefix, folder) -> whether a file there stays inside the prefix (see _row_path)


def _row_path(prefix, site, site_rel, rel):
    """(full path, venv-relative POSIX path or None) of a RECORD row ``rel`` of ``site``: exactly
    ``full = normpath(join(site, rel))`` and ``_inside(prefix, full)``.

    For a plain ``rel`` (:func:`_plain`) in a site-packages inside the prefix (``site_rel`` not
    None, ``site`` normalised) the lexical check cannot fail, so :func:`_inside`'s answer
    depends only on the real location of the file's folder: it is asked once per folder (a
    symlinked folder leaving the venv still escapes) and the relative path is a concatenation.
    """
    if site_rel is not None and _plain(rel):
        full = site + "/" + rel
        folder = full[:full.rfind("/")]
        ok = _FOLDERS.get((prefix, folder))
        if ok is None:
            ok = _FOLDERS[(prefix, folder)] = _inside(prefix, full) is not None
        return full, (site_rel + "/" + rel if ok else None)
    full = os.path.normpath(os.path.join(site, rel))
    return full, _inside(prefix, full)


def _lexical(prefix, path):
    """Whether ``normpath(path)`` lies strictly inside ``prefix``, by the names alone (symlinks
    are not looked at: for counts, never for what is read or written)."""
    norm = os.path.normpath(path)
    base = os.path.normpath(prefix).rstrip("/") + "/"
    return norm.startswith(base) and len(norm) > len(base)


def _record(dist_dir, site, prefix, hashed, summary=False, shared=False, group=None):
    """The RECORD entries of a distribution (dicts in the probe's wire form), or None when it
    has no readable RECORD; with ``summary``, ``{"files": rows inside the venv, "bytes": sum of
    their RECORD size column}`` instead, from RECORD alone (no file or folder on disk is looked
    at: "inside" by the names, :func:`_lexical`); with ``shared``, only the shared objects'
    rows (:data:`_SHARED_OBJECT`) have the disk's facts and RECORD's hash and size, the others
    their paths alone. ``group``: the hash cache's group of the files hashed (the
    distribution's normalised name)."""
    text, plain = _read_record(os.path.join(dist_dir, "RECORD"))
    if text is None:
        return None
    entries = []
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        if summary:
            return {"files": 0, "bytes": 0, "error": "RECORD is not valid CSV: {}".format(exc)[:300]}
        entries = [{"path": "", "venv_path": None, "record_hash": None, "record_size": None,
                    "error": "RECORD is not valid CSV: {}".format(exc)[:300]}]
        return _compact(entries, None) if _OPTIONS.get("compact") else entries
    norm_site = os.path.normpath(site)
    site_rel = _inside(prefix, norm_site)
    if _OPTIONS.get("compact") and not summary:
        return _record_rows(rows, plain, dist_dir, norm_site, site_rel, prefix, hashed, shared, group)
    count = total = 0
    for row in rows:
        if not row or not row[0]:
            continue
        rel = row[0]
        record_hash = row[1] if len(row) > 1 and row[1] else None
        try:
            record_size = int(row[2]) if len(row) > 2 and row[2] else None
        except ValueError:
            record_size = None
        if summary:
            # lexically inside: a summary looks at no file or folder on disk
            if (site_rel is not None and _plain(rel)) or _lexical(prefix, os.path.join(norm_site, rel)):
                count += 1
                total += record_size or 0
            continue
        full, venv_path = _row_path(prefix, norm_site, site_rel, rel)
        if shared and not _SHARED_OBJECT.search(rel):
            entries.append({"path": rel, "venv_path": venv_path, "record_hash": None, "record_size": None})
            continue
        entry = {
            "path": rel,
            "venv_path": venv_path,
            "record_hash": record_hash,
            "record_size": record_size,
        }
        if venv_path is not None:
            facts, st = _file_facts_stat(full)
            entry.update(facts)
            if "size" in facts and rel.endswith(_GENERATED_ENDS):
                _GENCODE.append((venv_path, full))
            if hashed and "size" in entry:
                script = venv_path.startswith(_OPTIONS["scripts"] + "/")
                # the lstat just taken is the hash cache's key: no second lstat per file
                _HASH_JOBS.append((entry, full, script, [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                          st.st_ctime_ns], group, venv_path, entry["size"]))
        entries.append(entry)
    if summary:
        return {"files": count, "bytes": total}
    own = _inside(prefix, os.path.join(dist_dir, "RECORD")) if hashed else None
    if own is not None:
        for entry in entries:
            if entry["venv_path"] == own and entry.get("size") is not None:
                identity = _identity_of_rows(rows, plain, os.path.join(dist_dir, "RECORD"), own, entry["size"])
                if identity is not None:
                    entry["record_identity"] = identity
    return entries


def _record_rows(rows, plain, dist_dir, site, site_rel, prefix, hashed, shared, group):
    """The compact form of :func:`_record` (``"compact": true``): each RECORD row built once as
    its list of :data:`COLUMNS` (what :func:`_compact` makes of :func:`_record`'s dict entries,
    the same values), in one loop per RECORD: one lstat per row inside the venv, noted as an input
    in the same order with the same identity (:class:`_Inputs`, fed a RECORD at a time), the
    folder's check of :func:`_row_path` asked once per folder. A hashed file's row is left with
    all its columns until :func:`_run_hash_jobs` fills its hash (:func:`_finish_row`).

    :param rows: RECORD's parsed CSV rows; ``plain``: whether they are the rows its identity is
        made of (:func:`_read_record`); ``site``: the normalised site-packages folder;
        ``site_rel``: its venv-relative path (None when it is not inside the venv).
    """
    out = []
    append = out.append
    lstat, readlink = os.lstat, os.readlink
    is_lnk, is_reg = stat.S_ISLNK, stat.S_ISREG
    shared_object = _SHARED_OBJECT.search
    inputs = _INPUTS
    noted, ids = [], _INPUTS.array("q") if inputs is not None else None
    note_ids = ids.extend if ids is not None else None
    folders = _FOLDER_OK.setdefault(prefix, {})
    scripts = _OPTIONS["scripts"] + "/"
    own = _inside(prefix, os.path.join(dist_dir, "RECORD")) if hashed else None
    own_rows = []
    jobs = _HASH_JOBS
    site_slash = site + "/"
    rel_slash = site_rel + "/" if site_rel is not None else None
    real_prefix = _real(prefix)
    real_prefix_slash = real_prefix + os.sep
    for row in rows:
        if not row:
            continue
        rel = row[0]
        if not rel:
            continue
        record_hash = row[1] if len(row) > 1 and row[1] else None
        try:
            record_size = int(row[2]) if len(row) > 2 and row[2] else None
        except ValueError:
            record_size = None
        # _row_path, the plain case inline
        if rel_slash is not None and _plain(rel):
            full = site_slash + rel
            folder = full[:full.rfind("/")]
            ok = folders.get(folder)
            if ok is None:
                # _inside's answer for a plain path under a site inside the prefix: where the
                # folder really is (symlinks resolved)
                real = _real(folder)
                ok = folders[folder] = real == real_prefix or real.startswith(real_prefix_slash)
            venv_path = rel_slash + rel if ok else None
            column = 1 if ok else None
        else:
            full = os.path.normpath(os.path.join(site, rel))
            venv_path = _inside(prefix, full)
            column = 1 if venv_path is not None and rel_slash is not None and venv_path == rel_slash + rel \
                else venv_path
        if shared and not shared_object(rel):
            append([rel, column] if column is not None else [rel])
            continue
        if venv_path is None:
            entry = [rel, None, record_hash, record_size]
            while entry[-1] is None:
                entry.pop()
            append(entry)
            continue
        try:
            st = lstat(full)
        except OSError:
            st = None
        if inputs is not None:
            noted.append(full)
            if st is None:
                note_ids(_ABSENT)
            else:
                try:
                    note_ids((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode))
                except OverflowError:
                    _wrapped(ids, st)
                    inputs.check_racy(st)
        if st is None:
            append([rel, column, record_hash, record_size, False])
            continue
        mode = st.st_mode
        if is_reg(mode):
            if rel.endswith(_GENERATED_ENDS) and not shared:
                _GENCODE.append((venv_path, full))
            if hashed:
                entry = [rel, column, record_hash, record_size, True, st.st_size, mode & 0o7777, None, None, None,
                         None, None, None, None]
                jobs.append((entry, full, venv_path.startswith(scripts),
                             [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns], group, venv_path,
                             st.st_size))
                if venv_path == own:
                    own_rows.append(entry)
            else:
                entry = [rel, column, record_hash, record_size, True, st.st_size, mode & 0o7777]
        elif is_lnk(mode):
            entry = [rel, column, record_hash, record_size, True, None, mode & 0o7777, readlink(full)]
        else:
            entry = [rel, column, record_hash, record_size, True, None, mode & 0o7777, None, True]
        append(entry)
    if inputs is not None and noted:
        inputs.note_block(noted, ids)
    for entry in own_rows:
        identity = _identity_of_rows(rows, plain, os.path.join(dist_dir, "RECORD"), own, entry[5])
        if identity is not None:
            entry[13] = identity
    return out


#: prefix -> {folder: whether a file there stays inside the prefix} (:func:`_record_rows`).
_FOLDER_OK: "dict[str, bool]" = {}


def _finish_row(row, digest, head, body):
    """Fill a hashed compact row's ``hash`` (1 when it equals ``record_hash``), ``head`` and
    ``body_hash`` and leave out its trailing nulls."""
    row[10] = 1 if digest is not None and digest == row[2] else digest
    row[11], row[12] = head, body
    while row[-1] is None:
        row.pop()


#: A shared object's file name (``*.so``, ``*.so.N``): ``transplant.core.import_names.SHARED_OBJECT``.
_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


#: The columns of a RECORD row in the compact form (``"compact": true``), in order.
COLUMNS = ("path", "venv_path", "record_hash", "record_size", "exists", "size", "mode", "symlink", "not_a_file",
           "error", "hash", "head", "body_hash", "record_identity")


_RARE = frozenset(COLUMNS[7:])


def _compact(entries, site_rel):
    """RECORD entries (dicts) as rows: lists of :data:`COLUMNS`' values with the trailing nulls
    left out, ``venv_path`` 1 when it is ``<site_rel>/<path>`` and ``hash`` 1 when it equals
    ``record_hash``; ``mtime`` is left out (nothing on the controller reads it)."""
    rows = []
    prefix = (site_rel + "/") if site_rel is not None else None
    for entry in entries:
        get = entry.get
        venv_path, digest = get("venv_path"), get("hash")
        if venv_path is not None and prefix is not None and venv_path == prefix + entry["path"]:
            venv_path = 1
        if digest is not None and digest == get("record_hash"):
            digest = 1
        row = [entry["path"], venv_path, get("record_hash"), get("record_size"), get("exists"), get("size"),
               get("mode")]
        if not _RARE.isdisjoint(entry):  # a symlink, not a file, an error, hashed: the other columns
            row += [get("symlink"), get("not_a_file"), get("error"), digest, get("head"), get("body_hash"),
                    get("record_identity")]
        while row[-1] is None:
            row.pop()
        rows.append(row)
    return rows


def _is_record(rel):
    """Whether a venv-relative POSIX path is a distribution's RECORD (``<site>/<name>.dist-info/RECORD``)."""
    folder, _, name = rel.rpartition("/")
    return name == "RECORD" and folder.endswith(".dist-info") and "/" in folder


def _record_identity_of(full, rel):
    """:func:`record_identity` of the RECORD at ``full`` (venv-relative ``rel``), or None when
    it cannot be read (or is larger than 256 MiB) or does not parse."""
    _note(full)
    try:
        if os.path.islink(full) or os.path.getsize(full) > _RECORD_MAX:
            return None
        with open(full, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return record_identity(data, posixpath.dirname(posixpath.dirname(rel)), _OPTIONS["scripts"])


class _Inputs:
    """The inputs of one probe, as it looks at them: each noted path (in the order noted; a path
    looked at twice is noted twice) adds its identity (:func:`_stat_identity`: six 64-bit integers,
    machine order) to an array hashed a few thousand at a time, and its name to a compressed
    list of paths, so that nothing per file is kept in memory. The digest is sha256 over those
    identities, then over the sha256 of the packed paths and the non-file facts: the
    fingerprint mode feeds the same paths, in the same order, with their identities now
    (:meth:`stat_all`: one lstat and one array append per path, no text formatted per file);
    while nothing changed the two digests are equal.

    ``racy`` is set when an input's mtime or ctime is at least ``limit_ns`` (the probe's start
    less :data:`_RACY_NS`, this host's clock): a write in the same clock tick as its lstat would
    leave its identity unchanged, so a memo must not trust this probe.
    """

    def __init__(self, limit_ns=None, pack=True):
        import zlib
        from array import array

        self.array = array
        self.ids = array("q")
        self.digest = hashlib.sha256()
        self.packer = zlib.compressobj(1) if pack else None  # level 1: a third of level 6's CPU, 20 % larger
        self.packed = []
        self.pending = []
        self.count = 0
        self.limit_ns = limit_ns
        self.racy = False

    def _flush(self):
        self.digest.update(self.ids.tobytes())
        self.ids = self.array("q")
        pending, self.pending = self.pending, []
        if self.packer is not None and pending:
            self.packed.append(self.packer.compress(("\0".join(pending) + "\0").encode("utf-8", "surrogateescape")))

    def note(self, path, st):
        """Note ``path`` with its lstat result ``st`` (None: absent)."""
        _append(self.ids, st)
        self.pending.append(path)
        self.count += 1
        if len(self.pending) >= 8192:
            self._flush()
        if st is not None and self.limit_ns is not None and \
                (st.st_mtime_ns >= self.limit_ns or st.st_ctime_ns >= self.limit_ns):
            self.racy = True

    def note_block(self, paths, ids):
        """Note ``paths`` with their identities ``ids`` (an array of six values per path, as
        :func:`_append` gives them): the same digest, packed paths and racy flag as :meth:`note`
        called once per path, in order (the paths are packed in the same chunks of 8192)."""
        limit = self.limit_ns
        if limit is not None and not self.racy and ids and \
                (max(ids[3::6]) >= limit or max(ids[4::6]) >= limit):
            self.racy = True
        start = 0
        while start < len(paths):
            room = 8192 - len(self.pending)
            part = paths[start:start + room]
            self.pending.extend(part)
            self.ids.extend(ids[start * 6:(start + len(part)) * 6])
            start += len(part)
            if len(self.pending) >= 8192:
                self._flush()
        self.count += len(paths)

    def check_racy(self, st):
        """Set ``racy`` when ``st``'s mtime or ctime is at or after the limit (as :meth:`note`)."""
        if self.limit_ns is not None and (st.st_mtime_ns >= self.limit_ns or st.st_ctime_ns >= self.limit_ns):
            self.racy = True

    def stat_all(self, paths):
        """Note each of ``paths`` with its ``os.lstat`` now, in order: :meth:`note`'s identities
        with no racy check, no packing and no call per path (the fingerprint's loop)."""
        ids, lstat = self.ids, os.lstat
        extend = ids.extend
        for path in paths:
            try:
                st = lstat(path)
            except (OSError, ValueError):
                extend(_ABSENT)
                continue
            try:
                extend((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode))
            except OverflowError:
                _wrapped(ids, st)
        self.count += len(paths)

    def finish(self, facts, paths_text):
        """The hex digest: the identities, then sha256 of ``paths_text`` (the packed paths) and
        the non-file ``facts`` (canonical JSON)."""
        self._flush()
        self.digest.update(b"\1" + hashlib.sha256(paths_text.encode("ascii")).digest())
        self.digest.update(b"\1" + json.dumps(facts, sort_keys=True, separators=(",", ":")).encode())
        return self.digest.hexdigest()

    def report(self, facts):
        """The document's ``inputs``: ``{"digest", "count", "paths" (NUL-terminated, zlib,
        base64), "racy", "started_ns"}``."""
        import base64

        self._flush()
        self.packed.append(self.packer.flush())
        paths = base64.b64encode(b"".join(self.packed)).decode("ascii")
        return {"digest": self.finish(facts, paths), "count": self.count, "paths": paths,
                "racy": self.racy, "started_ns": self.limit_ns + _RACY_NS}


#: The probe's inputs (``"inputs": true`` in the request; see :class:`_Inputs`): noted where a
#: file is read, stat'ed or listed (like a compiler's depfile); None: not noted.
_INPUTS = None
#: The identity of an absent path (no lstat result has a negative inode).
_ABSENT = (-1, -1, -1, -1, -1, -1)
_WRAP = 1 << 64


def _stat_identity(st):
    """What of an ``os.lstat`` result shows a change: ``(st_dev, st_ino, st_size, st_mtime_ns,
    st_ctime_ns, st_mode)`` as signed 64-bit integers (a value outside that range wrapped, as
    the same value always is); :data:`_ABSENT` for None. A folder's mtime and ctime change when
    an entry is added or removed; ctime changes on any write, chmod or rename and cannot be set
    back (git's index uses the same fields)."""
    if st is None:
        return _ABSENT
    values = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
    return tuple(v if -(1 << 63) <= v < (1 << 63) else (v + (1 << 63)) % _WRAP - (1 << 63) for v in values)


def _append(ids, st):
    """Append :func:`_stat_identity` of ``st`` to the array ``ids``."""
    if st is None:
        ids.extend(_ABSENT)
        return
    try:
        ids.extend((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode))
    except OverflowError:
        _wrapped(ids, st)


def _wrapped(ids, st):
    """After appending ``st``'s identity to ``ids`` overflowed part way: take back the part
    appended (``ids`` holds whole identities, six values each) and append the wrapped one."""
    partial = len(ids) % 6
    if partial:
        del ids[-partial:]
    ids.extend(_stat_identity(st))


_UNSET = object()


def _note(path, st=_UNSET):
    """Note ``path`` as an input of this probe with its lstat (``st`` when the caller has just
    taken it; None when it is absent). Returns None."""
    if _INPUTS is None:
        return None
    if st is _UNSET:
        try:
            st = os.lstat(path)
        except (OSError, ValueError):
            st = None
    _INPUTS.note(path, st)
    return None


def _unpack(text, raw=False):
    """The paths an inputs report packed, in order (none for an empty text): text, or with
    ``raw`` the bytes the file system sees (what ``os.lstat`` of the text path would pass it,
    without encoding each path again, a noticeable share of the fingerprint loop's time),
    where this interpreter's file system encoding is UTF-8 with surrogateescape (the packing's
    own: the same bytes); text paths elsewhere."""
    if not text:
        return []
    import base64
    import zlib

    joined = zlib.decompress(base64.b64decode(text))
    if raw and sys.getfilesystemencoding().lower() in ("utf-8", "utf8") \
            and sys.getfilesystemencodeerrors() == "surrogateescape":
        return joined.split(b"\0")[:-1]
    return joined.decode("utf-8", "surrogateescape").split("\0")[:-1]


def _non_file_facts(prefix, paths, host, interpreter):
    """What the probe reports that is not read from a noted file: the host section (hostname,
    NVIDIA, libcuda), the interpreter (version, glibc, markers...) and the venv's paths."""
    return {"host": host, "interpreter": interpreter, "prefix": prefix,
            "paths": [paths["purelib"], paths["platlib"], paths["scripts"]]}


def _host_facts():
    """The document's ``host`` section: each part of :data:`HOST_PARTS` under its key."""
    shared = {}
    return {key: part(shared) for key, part in HOST_PARTS.items()}


def _loader_cache(shared):
    """:func:`_ldconfig`'s answer, run once per probe however many parts read it (``shared``:
    what the parts of one :func:`_host_facts` compute once)."""
    if "ldconfig" not in shared:
        shared["ldconfig"] = _ldconfig()
    return shared["ldconfig"]


#: The host's facts, each reported under its key in the document's ``host`` section (the key the
#: plan memo's fingerprint digests with the rest of the section: a fact that changes makes a kept
#: plan stale). A part is a function of ``shared`` (see :func:`_loader_cache`) returning
#: JSON-ready data. The controller reads each through its row of ``HOST_FACTS`` in
#: transplant.core.inventory (its parser and the Inventory field it fills).
HOST_PARTS = {
    "hostname": lambda shared: socket.gethostname(),
    "machine": lambda shared: platform.machine(),
    "nvidia": lambda shared: _nvidia(),
    "libcuda": lambda shared: _libcuda(_loader_cache(shared)),
    "libcuda_loaded": lambda shared: _libcuda_loaded(_loader_cache(shared)),
    "sonames": lambda shared: _system_sonames(_loader_cache(shared)),
    "cpu": lambda shared: _cpu(),
    "jit_compilers": lambda shared: _jit_compilers(),
    "c_toolchain": lambda shared: _c_toolchain(),
}

#: The compilers triton's launcher build tries when ``CC`` is unset, in its order (triton
#: python/triton/runtime/build.py ``_build``, triton-lang/triton commit 15484adc: ``CC``, else
#: ``shutil.which("gcc")``, else ``shutil.which("clang")``).
_TRITON_COMPILERS = ("gcc", "clang")
#: The longest text :func:`_c_toolchain` reports per string (a ``CC`` value, a path, a version line).
_MAX_TEXT = 512


def _first_line(data):
    """The first non-blank line of ``data`` (bytes), stripped and bounded, or None."""
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:_MAX_TEXT]
    return None


def _c_toolchain():
    """What triton's launcher build (``_build``, see :data:`_TRITON_COMPILERS`) would use in
    this process's environment: ``{"compiler": {"source": "CC"|"gcc"|"clang", "command": the
    name or path, "path": what PATH resolves it to (None: nothing runnable by that name),
    "version": the first line of ``<path> --version`` (None: it failed or printed nothing)}
    or None when ``CC`` is unset and neither name is on PATH, "include": the interpreter's
    include folder triton passes with ``-I`` (``sysconfig.get_paths`` of the default scheme,
    Debian's ``posix_local`` read as ``posix_prefix``, as triton does), "python_h": whether
    that folder holds ``Python.h``, "os": {"id", "id_like", "version_id"} of
    ``/etc/os-release`` (None where there is none)}``. ``--version`` runs with a 10 s limit."""
    import shutil

    cc, source = os.environ.get("CC"), "CC"
    if cc is None:
        for name in _TRITON_COMPILERS:
            if shutil.which(name):
                cc, source = name, name
                break
    compiler = None
    if cc is not None:
        # triton runs CC as one argv[0] (no shell): a name found on PATH, or a path
        path = shutil.which(cc) if cc.strip() else None
        version = None
        if path:
            out = _run_version(path)
            if not isinstance(out, str):
                version = _first_line(out.stdout) or _first_line(out.stderr)
        compiler = {"source": source, "command": cc[:_MAX_TEXT], "path": path[:_MAX_TEXT] if path else None,
                    "version": version}
    try:
        scheme = sysconfig.get_default_scheme() if hasattr(sysconfig, "get_default_scheme") else \
            sysconfig._get_default_scheme()
        if scheme == "posix_local":
            scheme = "posix_prefix"
        include = sysconfig.get_paths(scheme=scheme).get("include")
    except (KeyError, ValueError, AttributeError):
        include = None
    return {
        "compiler": compiler,
        "include": include[:_MAX_TEXT] if include else None,
        "python_h": bool(include) and os.path.isfile(os.path.join(include, "Python.h")),
        "os": _os_release(),
    }


def _os_release():
    """``{"id", "id_like", "version_id"}`` from ``/etc/os-release`` (each None when absent,
    values bounded), or None when the file cannot be read."""
    try:
        with open("/etc/os-release", encoding="utf-8", errors="replace") as handle:
            text = handle.read(16384)
    except OSError:
        return None
    found = {}
    for line in text.splitlines()[:200]:
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "ID_LIKE", "VERSION_ID"):
            found[key.strip().lower()] = value.strip().strip("\"'")[:64]
    return {"id": found.get("id"), "id_like": found.get("id_like"), "version_id": found.get("version_id")}


def _cpu():
    """``{"flags": [...]}``: the CPU's feature flags as the kernel reports them (the first
    ``flags`` line of ``/proc/cpuinfo``, x86), or None where there is none (another
    architecture, no ``/proc``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle):
                if number > 10000:
                    break
                name, sep, value = line.partition(":")
                if sep and name.strip() == "flags":
                    return {"flags": sorted(set(value.split()))[:1000]}
    except OSError:
        pass
    return None


#: Where a triton wheel carries its ``ptxas``, relative to site-packages (recent triton, then the
#: 2.x layout); triton's ``TRITON_PTXAS_PATH`` names another one.
_TRITON_PTXAS = ("triton/backends/nvidia/bin/ptxas", "triton/third_party/cuda/bin/ptxas")
#: Where NVIDIA's nvcc wheels put ``nvcc``, relative to site-packages (nvidia-cuda-nvcc-cu12; the
#: CUDA 13 wheels' shared ``nvidia/cu13`` tree).
_WHEEL_NVCC = ("nvidia/cuda_nvcc/bin/nvcc", "nvidia/cu13/bin/nvcc")
_RELEASE = re.compile(r"release (\d{1,3})\.(\d{1,3}), V(\d{1,3}(?:\.\d{1,6}){1,3})")


def _run_version(path):
    """``<path> --version`` (no shell, no input, 10 s at most): the finished process, or why it
    could not run (300 characters at most)."""
    try:
        return subprocess.run([path, "--version"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)[:300]


def _compiler_version(path, source):
    """``{"path", "source", "release": "12.8"|None, "build": "12.8.93"|None, "error": str|None}``
    for the compiler at ``path``: its ``--version`` (10 s at most, the first 4 KiB read), whose
    line "Cuda compilation tools, release 12.8, V12.8.93" gives the release."""
    out = {"path": path[:4096], "source": source, "release": None, "build": None, "error": None}
    run = _run_version(path)
    if isinstance(run, str):
        out["error"] = run
        return out
    match = _RELEASE.search(run.stdout[:4096].decode("utf-8", "replace"))
    if match:
        out["release"] = "{}.{}".format(match.group(1), match.group(2))
        out["build"] = match.group(3)
    else:
        out["error"] = "exit {}: no release line".format(run.returncode)
    return out


def _jit_compilers():
    """The compilers the JIT users of this venv run, as this process's environment finds them:
    ``{"triton_ptxas": ..., "nvcc": ..., "wheel_nvcc": [...]}``, each a
    :func:`_compiler_version` (or None / [] where there is none). triton's ``ptxas``:
    ``TRITON_PTXAS_PATH``, else the one its wheel carries in site-packages. ``nvcc``: as
    flashinfer's ``get_cuda_path`` looks (``CUDA_HOME``, ``CUDA_PATH``, the folder above the
    ``nvcc`` on ``PATH``, ``/usr/local/cuda``), then ``<that>/bin/nvcc``. ``wheel_nvcc``: the
    ``nvcc`` of NVIDIA's nvcc wheels in site-packages."""
    import shutil

    prefix = venv_prefix()
    paths = venv_paths(prefix)
    sites = list(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    ptxas = None
    named = os.environ.get("TRITON_PTXAS_PATH") or None
    # a relative path names a file in whatever folder the serving process starts in, which this
    # probe cannot know: that compiler is reported as unknown (None), not guessed
    if named:
        if os.path.isabs(named):
            ptxas = _compiler_version(named, "TRITON_PTXAS_PATH")
    else:
        for site in sites:
            found = [os.path.join(site, rel) for rel in _TRITON_PTXAS if os.path.isfile(os.path.join(site, rel))]
            if found:
                ptxas = _compiler_version(found[0], "triton")
                break
    home, source = None, None
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            home, source = os.environ[variable], variable
            break
    if home is not None and not os.path.isabs(home):
        home = None  # relative: as TRITON_PTXAS_PATH above, unknown
    elif home is None and source is None:
        on_path = shutil.which("nvcc")
        if on_path:
            if os.path.isabs(on_path):  # one found through a relative PATH entry is as unknowable
                home, source = os.path.dirname(os.path.dirname(on_path)), "PATH"
        elif os.path.exists("/usr/local/cuda"):
            home, source = "/usr/local/cuda", "default"
    nvcc = None
    if home is not None and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        nvcc = _compiler_version(os.path.join(home, "bin", "nvcc"), source)
    wheel = [_compiler_version(os.path.join(site, rel), "wheel")
             for site in sites for rel in _WHEEL_NVCC if os.path.isfile(os.path.join(site, rel))]
    return {"triton_ptxas": ptxas, "nvcc": nvcc, "wheel_nvcc": wheel[:4]}


def _fingerprint(request):
    """The ``fingerprint`` mode: re-stat the inputs a full probe noted (``paths``, as its
    ``inputs.paths``) and recompute the non-file facts: ``{"schema", "inputs": digest (equal to
    the full probe's while nothing changed), "count", "extra": digest over ``extra`` (absolute
    paths outside the probe's inputs, stat'ed following symlinks: the libstdc++ the ELF script
    found, editable sources), "extra_racy": whether one of those was written within
    :data:`_RACY_NS` of ``since_ns`` (the probe's ``started_ns``, this host's clock) or after}``.
    Reads no file's content."""
    import threading

    host, raised = {}, []

    def host_facts():
        try:
            host.update(_host_facts())
        except BaseException as exc:  # noqa: BLE001 - raised below, in this thread, as before
            raised.append(exc)

    # nvidia-smi and ldconfig run while the inputs are unpacked and stat'ed (a plain thread:
    # concurrent.futures would be one more import on the way to the first lstat)
    facts_thread = threading.Thread(target=host_facts, daemon=True)
    facts_thread.start()
    prefix = venv_prefix()
    paths = venv_paths(prefix)
    packed = request.get("paths") or ""
    names = _unpack(packed, raw=True)
    now = _Inputs(pack=False)
    now.stat_all(names)
    facts_thread.join()
    if raised:
        raise raised[0]
    rel = {k: _inside(prefix, paths[k]) for k in ("purelib", "platlib", "scripts")}
    facts = _non_file_facts(prefix, rel, host, _interpreter(prefix))
    since = request.get("since_ns")
    extra = _Inputs(since - _RACY_NS if isinstance(since, int) else None, pack=False)
    wanted = sorted(p for p in request.get("extra") or [] if isinstance(p, str))
    for path in wanted:
        try:
            st = os.stat(path)  # followed: where it leads counts
        except (OSError, ValueError):
            st = None
        extra.note(path, st)
    return {"schema": "transplant.fingerprint/2", "inputs": now.finish(facts, packed), "count": len(names),
            "extra": extra.finish({}, "\0".join(wanted).encode("utf-8", "surrogateescape").hex()),
            "extra_racy": extra.racy}



_HASH_JOBS: "list[tuple]" = []
_HASHED_GROUPS: "set[str]" = set()  # the normalised names of the distributions whose files were queued for hashing
_OPTIONS = {"record": True, "scripts": "bin"}
_WORKERS = max(1, min(8, os.cpu_count() or 1))
_SCRIPT_MAX = 1 << 20
_TEXT_MAX = 64 * 1024
_RECORD_MAX = 256 << 20


def _script_facts(path):
    """(hash, head text, body hash) of a console script; head and body hash None without a shebang."""
    try:
        if os.path.getsize(path) > _SCRIPT_MAX:
            return file_hash(path)[0], None, None
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None, None, None
    head, body = script_head(data)
    try:
        text = head.decode("utf-8") if head is not None else None
    except UnicodeDecodeError:
        text = None  # a head that is not UTF-8 cannot be rewritten byte for byte: it is copied as it is
    if text is None:
        return _digest(data), None, None
    return _digest(data), text, _digest(body)


def _run_hash_jobs():
    """Hash every queued file, on a few threads (hashlib releases the GIL on large reads).

    Files in the scripts folder also get ``head`` (the shebang line or lines) and
    ``body_hash`` (the hash of what follows), so that a script whose shebang names
    another prefix can still be compared by its body.
    """
    import concurrent.futures

    jobs, _HASH_JOBS[:] = list(_HASH_JOBS), []
    if not jobs and not _OPTIONS.get("hash_cache_lines", "").strip():
        return  # (known groups sent and nothing hashed: their distributions are gone, said below)
    cache = _HashCache(_OPTIONS.get("prefix"), _OPTIONS.get("hash_cache", True))

    def fill(entry, facts):
        digest, head, body = facts
        if type(entry) is list:  # a compact row (_record_rows)
            _finish_row(entry, digest, head, body)
            return
        entry["hash"] = digest
        if head is not None:
            entry["head"], entry["body_hash"] = head, body

    # the cache's answers first, in this thread (a thread per known file costs more than the lookup)
    misses = []
    if cache.enabled:
        # _HashCache.get written out (one dict lookup and one comparison per file)
        entries, fresh, group_of = cache.entries, cache.fresh, cache.group_of
        for job in jobs:
            rel = job[5]
            known = entries.get(rel)
            if known is not None and known[:5] == job[3]:
                fresh[rel] = known
                group_of[rel] = job[4]
                fill(job[0], known[5:])
            else:
                misses.append(job)
        cache.hits += len(jobs) - len(misses)
        cache.misses += len(misses)
    else:
        misses = jobs

    def work(job):
        entry, full, script, key, group, rel, size = job
        facts = _script_facts(full) if script else (file_hash(full)[0], None, None)
        cache.put(rel, key, facts, size or 0, group)
        return facts

    if misses:
        with concurrent.futures.ThreadPoolExecutor(max_workers=_WORKERS) as pool:
            for job, facts in zip(misses, pool.map(work, misses)):
                fill(job[0], facts)
    _OPTIONS["hash_cache_report"] = cache.save()


class _HashCache:
    """Content hashes of the venv's files, kept in ``<venv>/.transplant/cache/hashes.json``.

    An entry is reused only while the file's ``(st_dev, st_ino, st_size, st_mtime_ns,
    st_ctime_ns)`` is unchanged, as git's index does; an entry whose mtime or ctime lies
    within :data:`_RACY_NS` of the probe's start is not stored ("racily clean": a write in the
    same clock tick would not change the key). The cache is written only when this run hashed
    at least ``min_bytes`` (a request option, default 32 MiB: below that re-hashing is cheaper
    than the write), never through a symlinked or escaping state folder, and any error
    reading or writing it only turns it off for this run (reported in ``hash_cache``). The
    applier's commit adds entries too, for the files it renamed into place whose content its
    ``check`` verified, under the rule its ``_Warm`` states (``applier.py``): so the plan right
    after an apply reads none of them again.
    """

    def __init__(self, prefix, options):
        import threading

        self.options = options if isinstance(options, dict) else {"enabled": bool(options)}
        self.enabled = bool(self.options.get("enabled", True)) and prefix is not None
        self.min_bytes = int(self.options.get("min_bytes", 32 << 20))
        self.racy_ns = int(self.options.get("racy_ns", _RACY_NS))
        self.started = time.time_ns()
        self.lock = threading.Lock()
        self.entries, self.fresh = {}, {}
        self.groups, self.group_of = {}, {}  # store reply: the groups the controller sent; rel -> group
        self.hits = self.misses = self.hashed_bytes = 0
        self.error = None
        self.path, self.prefix = None, prefix
        self.store = self.options.get("store", "venv")
        if not self.enabled:
            return
        if self.store == "reply":
            # The controller keeps this cache (a donor is never written to): it sends the groups
            # of the distributions this request hashes and takes back the groups that changed.
            self.entries = _entries(self.options.get("known"))
            try:
                self.groups = _groups(_OPTIONS.pop("hash_cache_lines", ""))
            except ValueError as exc:
                self.groups, self.error = {}, "the known groups are malformed, not used: {}".format(exc)[:200]
            for entries in self.groups.values():
                self.entries.update(entries)
            return
        self.path = venv_cache_path(prefix, HASH_CACHE_NAME)
        if self.path is None:
            self.enabled, self.error = False, "the state folder is a symlink or leaves the venv"
            return
        try:
            self.entries = _entries(read_venv_cache(self.path, HASH_SCHEMA))
        except (OSError, ValueError) as exc:
            self.error = "unreadable, rebuilt: {}".format(exc)[:200]

    def get(self, rel, key, group=None):
        # (asked from one thread only: _run_hash_jobs looks every job up before its threads start)
        if not self.enabled or key is None:
            return None
        known = self.entries.get(rel)
        if known is not None and known[:5] == key:
            self.hits += 1
            self.fresh[rel] = known
            self.group_of[rel] = group
            return known[5:]
        self.misses += 1
        return None

    def put(self, rel, key, facts, size, group=None):
        if not self.enabled or key is None or facts[0] is None:
            return
        with self.lock:
            self.hashed_bytes += size
            if max(key[3], key[4]) < self.started - self.racy_ns:
                self.fresh[rel] = key + list(facts)
                self.group_of[rel] = group

    def save(self):
        report = {"enabled": self.enabled, "hits": self.hits, "misses": self.misses, "hashed_bytes": self.hashed_bytes,
                  "written": False}
        if self.error:
            report["error"] = self.error
        if self.enabled and self.store == "reply":
            report["groups"] = self._print_changed_groups()
            return report
        if not self.enabled or self.hashed_bytes < self.min_bytes or not self.misses:
            return report
        merged = dict(self.entries)
        merged.update(self.fresh)
        try:
            write_venv_cache(self.prefix, self.path, HASH_SCHEMA, merged)
            report["written"] = True
        except OSError as exc:
            report["error"] = "not written: {}".format(exc)[:200]
        return report


    def _print_changed_groups(self):
        """Print ``#hashes\t<group>\t<entries>`` for each group whose entries are not those the
        controller sent: every group hashed this run (its entries: the files of this run, so a
        changed file's old entry and a removed file's entry are gone) and every group sent but
        not hashed (its distribution is gone: ``{}``). Returns how many lines were printed."""
        now = {}
        for rel, entry in self.fresh.items():
            group = self.group_of.get(rel)
            if group is not None:
                now.setdefault(group, {})[rel] = entry
        printed = 0
        for group in sorted(set(self.groups) | _HASHED_GROUPS):
            if not group or "\t" in group or "\n" in group:
                continue
            entries = now.get(group, {})
            if entries != self.groups.get(group, {}):  # (a group neither sent nor holding an entry: none)
                sys.stdout.write("#hashes\t{}\t{}\n".format(group, json.dumps(entries, separators=(",", ":"))))
                printed += 1
        return printed


def _groups(text):
    """The known groups of a ``store: reply`` request (the lines after its JSON):
    ``{group: entries}``, each line ``<group>\t<JSON object>``; blank lines are skipped.

    :raises ValueError: a line without a tab or whose JSON is not an object.
    """
    groups = {}
    for line in text.split("\n"):
        if not line.strip():
            continue
        group, tab, body = line.partition("\t")
        if not tab:
            raise ValueError("a group line without a tab")
        entries = json.loads(body)
        if not isinstance(entries, dict):
            raise ValueError("group {!r} is not an object".format(group))
        groups[group] = _entries(entries)
    return groups




def _entries(mapping):
    """The well-formed entries of a hash cache (``rel: [dev, ino, size, mtime_ns, ctime_ns, hash,
    head, body_hash]``); anything else is dropped (it is only re-hashed)."""
    if not isinstance(mapping, dict):
        return {}
    return {k: v for k, v in mapping.items() if isinstance(v, list) and len(v) == 8}
_RACY_NS = 2 * 10 ** 9


def _file_facts(full, hashed):
    """Presence, kind, mode and (when hashed) content facts of one file."""
    facts, _ = _file_facts_stat(full)
    if hashed and "size" in facts:
        facts["hash"], _ = file_hash(full)
    return facts


def _file_facts_stat(full):
    """(presence, kind, mode and size facts of one file, its ``os.lstat`` result or None); the
    lstat is noted as an input (:func:`_note`)."""
    try:
        st = os.lstat(full)
    except OSError:
        st = None
    if _INPUTS is not None:
        _INPUTS.note(full, st)
    if st is None:
        return {"exists": False}, None
    facts = {"exists": True, "mode": st.st_mode & 0o7777, "mtime": st.st_mtime}
    if stat.S_ISLNK(st.st_mode):
        facts["symlink"] = os.readlink(full)
        return facts, st
    if not stat.S_ISREG(st.st_mode):
        facts["not_a_file"] = True
        return facts, st
    facts["size"] = st.st_size
    return facts, st


def _direct_url(dist_dir):
    """PEP 610 ``direct_url.json`` as an object; ``{"unreadable": true}`` when it is not a
    JSON object (or larger than 64 KiB); None when absent."""
    path = os.path.join(dist_dir, "direct_url.json")
    _note(path)
    if not os.path.lexists(path):
        return None
    text = _read_small(path)
    try:
        value = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        value = None
    return value if isinstance(value, dict) else {"unreadable": True}


def _listing(dist_dir):
    """Names of the regular files directly in a dist-info folder (sorted, at most 200)."""
    _note(dist_dir)
    try:
        names = sorted(os.listdir(dist_dir))
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(dist_dir, n)) and not os.path.islink(os.path.join(dist_dir, n))][:200]


def _distributions(site, prefix, patterns, with_record=True):
    found = []
    _note(site)
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return found
    for entry in names:
        if not (entry.endswith(".dist-info") or entry.endswith(".egg-info")):
            continue
        dist_dir = os.path.join(site, entry)
        _note(dist_dir)
        if not os.path.isdir(dist_dir):
            continue
        metadata = _metadata(_read(os.path.join(dist_dir, "METADATA"))
                             or _read(os.path.join(dist_dir, "PKG-INFO")))
        stem = entry.rsplit(".", 1)[0]
        fallback_name, _, fallback_version = stem.partition("-")
        name = (metadata or {}).get("name") or fallback_name
        hashed = any(fnmatch.fnmatchcase(normalize(name), p) for p in patterns)
        if hashed:
            _HASHED_GROUPS.add(normalize(name))
        top_level = _read(os.path.join(dist_dir, "top_level.txt"))
        installer = _read(os.path.join(dist_dir, "INSTALLER"))
        found.append({
            "name": name,
            "version": (metadata or {}).get("version") or fallback_version or None,
            "dist_info": entry,
            "site_packages": _inside(prefix, site),
            "metadata_present": metadata is not None,
            "summary": (metadata or {}).get("summary"),
            "requires_python": (metadata or {}).get("requires_python"),
            "requires_dist": (metadata or {}).get("requires_dist", []),
            "installer": installer.strip() if installer else None,
            "requested": _note(os.path.join(dist_dir, "REQUESTED")) or os.path.exists(os.path.join(dist_dir, "REQUESTED")),
            "direct_url": _direct_url(dist_dir),
            "wheel": _wheel(_read(os.path.join(dist_dir, "WHEEL"))),
            "top_level": [t for t in (top_level or "").split() if t],
            "entry_points": _read(os.path.join(dist_dir, "entry_points.txt")),
            "hashed": hashed,
            "listing": _listing(dist_dir),
            "record": _record(dist_dir, site, prefix, hashed and with_record is True, shared=with_record == "shared",
                              group=normalize(name))
            if with_record in (True, "shared") else None,
        })
        if with_record == "summary":
            found[-1]["record_summary"] = _record(dist_dir, site, prefix, False, summary=True)
    return found


def _glibc():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    except (AttributeError, ValueError, IndexError, OSError):
        name, version = platform.libc_ver()
        return version if name == "glibc" else None


def _marker_environment():
    """The PEP 508 marker variables of this interpreter (as packaging computes them)."""
    impl = sys.implementation
    version = "{0.major}.{0.minor}.{0.micro}".format(impl.version)
    if impl.version.releaselevel != "final":
        version += impl.version.releaselevel[0] + str(impl.version.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def _pyvenv_cfg(prefix):
    text = _read(os.path.join(prefix, "pyvenv.cfg"))
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _interpreter(prefix):
    cfg = _pyvenv_cfg(prefix)
    home = (cfg or {}).get("home")
    return {
        "executable": sys.executable,
        "prefix": prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "version": platform.python_version(),
        "implementation": sys.implementation.name,
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "abi_tag": "cp{}{}".format(*sys.version_info[:2]) if sys.implementation.name == "cpython" else None,
        "machine": platform.machine(),
        "glibc": _glibc(),
        "pyvenv_cfg": cfg,
        "home_exists": os.path.isdir(home) if home else None,
        "markers": _marker_environment(),
    }


def _nvidia():
    """NVIDIA driver and GPU facts from nvidia-smi, or the reason there are none."""
    import shutil

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"available": False, "reason": "no nvidia-smi on PATH"}
    query = ["--query-gpu=name,compute_cap,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run([exe] + query, capture_output=True, timeout=30, check=False)
        header = subprocess.run([exe], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"available": False, "reason": "nvidia-smi failed: {}".format(exc)}
    module = _kernel_module()
    if out.returncode != 0:
        # nvidia-smi prints its failures ("couldn't communicate with the NVIDIA driver", "Driver/library
        # version mismatch") on stdout: a driver that is there and broken, not an absent one
        tail = (out.stdout + out.stderr).decode("utf-8", "replace").strip()[-300:]
        return {"available": False, "reason": "nvidia-smi exited {}: {}".format(out.returncode, tail),
                "failure": tail or "exit {}".format(out.returncode), "kernel_module": module}
    gpus, driver = [], None
    for row in csv.reader(io.StringIO(out.stdout.decode("utf-8", "replace"))):
        if len(row) < 4:
            continue
        name, cap, memory, driver = (cell.strip() for cell in row[:4])
        try:
            memory_mib = int(float(memory))
        except ValueError:
            memory_mib = None
        gpus.append({"name": name, "compute_capability": cap, "memory_mib": memory_mib})
    match = re.search(r"CUDA Version:\s*([0-9.]+)", header.stdout.decode("utf-8", "replace"))
    return {
        "available": True,
        "driver_version": driver,
        "cuda_version": match.group(1) if match else None,
        "gpus": gpus,
        "kernel_module": module,
    }


def _kernel_module():
    """The loaded NVIDIA kernel module's version from ``/proc/driver/nvidia/version``, or None."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+([0-9][0-9.]{0,31})", text)
    return match.group(1) if match else None


def _ldconfig():
    """(whether ``ldconfig -p`` ran, ``[(file name, path)]`` of the loader cache it prints)."""
    ran, entries = False, []
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if not os.path.exists(exe):
            continue
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        ran = out.returncode == 0
        for line in out.stdout.decode("utf-8", "replace").splitlines():
            if "=>" in line:
                left, path = line.split("=>", 1)
                name = left.strip().split(" ", 1)[0]
                if name:
                    entries.append((name, path.strip()))
        break
    return ran, entries


#: The most names :func:`_system_sonames` reports (a large host's cache holds a few thousand).
_MAX_SONAMES = 20000


def _system_sonames(cache):
    """The library file names the host's dynamic loader finds without help from the venv:
    ``{"ldconfig": whether ``ldconfig -p`` ran, "names": sorted names}`` from the loader cache
    and the ``LD_LIBRARY_PATH`` folders this process sees (ld.so(8): a DT_NEEDED name without a
    slash is looked up by file name there). A 32-bit library of the same name on a multilib
    host counts too. ``cache``: :func:`_ldconfig`'s answer."""
    ran, entries = cache
    names = {name for name, _ in entries}
    for folder in (os.environ.get("LD_LIBRARY_PATH") or "").split(":"):
        if folder:
            try:
                names.update(n for n in os.listdir(folder) if ".so" in n)
            except OSError:
                pass
    return {"ldconfig": ran, "names": sorted(names)[:_MAX_SONAMES]}


def _libcuda(cache):
    """Where a JIT user (triton's ``libcuda_dirs``) finds the driver library to link with
    ``-lcuda``: ``TRITON_LIBCUDA_PATH`` if set, else the folders of ``libcuda.so*`` in
    ``ldconfig -p``, else the ``LD_LIBRARY_PATH`` folders holding ``libcuda.so.1``. The link
    needs the unversioned ``libcuda.so`` there. Returns ``{"searched": [folders], "versioned":
    [libcuda.so.1 paths], "unversioned": [libcuda.so paths], "ldconfig": bool, "triton_libcuda_path":
    str|None}`` as this process sees them (its environment, not a service's). ``cache``:
    :func:`_ldconfig`'s answer."""
    env_path = os.environ.get("TRITON_LIBCUDA_PATH") or None
    ran, cached = cache
    folders = [os.path.dirname(path) for name, path in cached if name.startswith("libcuda.so")]
    if env_path:
        folders = [env_path if os.path.isdir(env_path) else os.path.dirname(env_path)]
    elif not folders:
        folders = [f for f in (os.environ.get("LD_LIBRARY_PATH") or "").split(":")
                   if f and os.path.exists(os.path.join(f, "libcuda.so.1"))]
    searched = list(dict.fromkeys(folders))
    return {
        "searched": searched,
        "versioned": [os.path.join(f, "libcuda.so.1") for f in searched if os.path.exists(os.path.join(f, "libcuda.so.1"))],
        "unversioned": [os.path.join(f, "libcuda.so") for f in searched if os.path.exists(os.path.join(f, "libcuda.so"))],
        "ldconfig": ran,
        "triton_libcuda_path": env_path,
    }


#: The folders ld.so(8) searches last, after ``LD_LIBRARY_PATH`` and its cache.
_LOADER_DEFAULTS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")
#: The driver library's file name with its version (``libcuda.so.570.124.06``), as the driver and the
#: cuda-compat package name the file ``libcuda.so.1`` links to.
_LIBCUDA_VERSIONED = re.compile(r"^libcuda\.so\.([0-9]{1,4}(?:\.[0-9]{1,4}){1,3})$")


def _regular_head(path, size, follow=True):
    """The first ``size`` bytes of the regular file at ``path``, or None when it is absent,
    unreadable or not a regular file. Opened without blocking, so a FIFO or a device planted
    under a name the probe reads (``libcuda.so.1`` on ``LD_LIBRARY_PATH``, a generated module
    swapped between its stat and its open) is passed over instead of holding the probe until
    the controller's timeout; with ``follow`` False a symlink is not followed either."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _own_word_size(path):
    """Whether ``path`` is an ELF object of this process's word size (a multilib host's 32-bit
    ``libcuda.so.1`` is in the loader cache too; ld.so passes it over). Reads 5 bytes of a
    regular file (:func:`_regular_head`)."""
    head = _regular_head(path, 5)
    return head is not None and len(head) == 5 and head[:4] == b"\x7fELF" and head[4] == (2 if sys.maxsize > 2 ** 32 else 1)


def _libcuda_loaded(cache):
    """The ``libcuda.so.1`` the dynamic loader resolves for a process of this interpreter, in
    ld.so(8)'s order: the ``LD_LIBRARY_PATH`` folders as this process's environment has them, the
    loader cache (its first ``libcuda.so.1`` of this word size, the one ld.so takes: the cache keeps
    the order of ld.so.conf's folders), then the default folders. A RUNPATH of the object that
    opens it is not followed. ``cache``: :func:`_ldconfig`'s answer.

    Returns ``{"path": the path found, "real": the file it resolves to, "version": the version
    that file's name carries (``libcuda.so.570.124.06`` -> ``570.124.06``) or None, "how":
    "LD_LIBRARY_PATH" | "ld.so.cache" | "default"}``, or None when no folder holds one."""
    found = None
    for folder in (os.environ.get("LD_LIBRARY_PATH") or "").split(":"):
        candidate = os.path.join(folder, "libcuda.so.1") if folder else None
        if candidate and _own_word_size(candidate):
            found = (candidate, "LD_LIBRARY_PATH")
            break
    if found is None:
        for name, path in cache[1]:
            if name == "libcuda.so.1" and path.startswith("/") and _own_word_size(path):
                found = (path, "ld.so.cache")
                break
    if found is None:
        for folder in _LOADER_DEFAULTS:
            candidate = os.path.join(folder, "libcuda.so.1")
            if _own_word_size(candidate):
                found = (candidate, "default")
                break
    if found is None:
        return None
    path, how = found
    real = os.path.realpath(path)
    match = _LIBCUDA_VERSIONED.match(os.path.basename(real))
    return {"path": path[:4096], "real": real[:4096], "version": match.group(1) if match else None, "how": how}


def _pth_folders(folder):
    """Folders the ``*.pth`` files at the top of ``folder`` add to ``sys.path``, as ``site``
    does: each line that is not blank, a comment or an ``import`` line, joined to ``folder``,
    when it is an existing folder; ``[(folder, pth file name)]``."""
    out = []
    _note(folder)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".pth"))
    except OSError:
        return out
    for name in names:
        text = _read_small(os.path.join(folder, name)) or ""
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                continue
            full = os.path.normpath(os.path.join(folder, line))
            if os.path.isdir(full):
                out.append((full, name))
    return out


def _outside(prefix, sites):
    """Folders outside the venv whose distributions the venv's interpreter imports, and those
    distributions (metadata only): the base interpreter's site-packages when pyvenv.cfg has
    ``include-system-site-packages = true`` (``site.getsitepackages`` of the base prefix), and
    the folders ``*.pth`` files add (in the venv's site-packages and in those folders, one level).
    ``[{"folder", "why", "distributions": [...]}]`` in ``sys.path`` order."""
    import site as site_module

    found, seen = [], {os.path.realpath(s) for s in sites}
    queue = [(f, "{} in {}".format(name, _inside(prefix, s) or s)) for s in sites for f, name in _pth_folders(s)]
    cfg = _pyvenv_cfg(prefix) or {}
    if cfg.get("include-system-site-packages", "").strip().lower() == "true":
        base = getattr(sys, "base_prefix", sys.prefix)
        try:
            system = site_module.getsitepackages([base])
        except Exception:  # noqa: BLE001 - an odd build of site: nothing found
            system = []
        for folder in system:
            if os.path.isdir(folder):
                queue.append((folder, "include-system-site-packages = true"))
                queue.extend((f, "{} in {}".format(name, folder)) for f, name in _pth_folders(folder))
    for folder, why in queue:
        real = os.path.realpath(folder)
        if real in seen or _inside(prefix, folder) is not None or len(found) >= 64:
            continue
        seen.add(real)
        dists = _distributions(folder, prefix, [], with_record=False)
        for d in dists:
            d["site_packages"] = folder
        found.append({"folder": folder, "why": why, "distributions": dists})
    return found


def _read_small(full):
    """Text of a small regular file (at most 64 KiB, not a symlink), or None."""
    _note(full)
    try:
        if os.path.islink(full) or not os.path.isfile(full) or os.path.getsize(full) > _TEXT_MAX:
            return None
    except OSError:
        return None
    return _read(full)


def _texts(site, prefix, requested):
    """venv-relative path -> text, for the site-packages-relative files asked for and for
    every ``*.pth``, ``*.egg-link`` and ``__editable__*.py`` file at the top of
    site-packages (they map import names to folders elsewhere); larger files give None."""
    names = list(requested)
    _note(site)
    try:
        names += sorted(n for n in os.listdir(site)
                        if n.endswith((".pth", ".egg-link")) or (n.startswith("__editable__") and n.endswith(".py")))
    except OSError:
        pass
    out = {}
    for rel in names:
        full = os.path.normpath(os.path.join(site, rel))
        inside = _inside(prefix, full)
        if inside is not None:
            out[inside] = _read_small(full)
    return out


#: The names protoc (``*_pb2.py``) and grpcio-tools (``*_pb2_grpc.py``) give the modules they generate.
_GENERATED_ENDS = ("_pb2.py", "_pb2_grpc.py")
#: (venv-relative path, full path) of each generated module RECORD lists, regular files inside the
#: venv (filled while RECORD rows are read; :func:`_gencode` reads their stamps).
_GENCODE: "list[tuple[str, str]]" = []
#: How much of a generated module's start is read: the stamp follows the imports (protoc's header is
#: about 600 bytes; a grpc stub imports each message module its services use before its stamp).
_GENCODE_HEAD = 16 * 1024
#: The most generated modules whose stamps one probe reports.
_GENCODE_MAX = 20000
#: protoc's version check in a ``_pb2.py`` (protobuf's python generator, ``PrintTopBoilerplate``,
#: since protoc 27.0 / protobuf 5.27.0): domain, major, minor, patch, suffix.
_PROTOBUF_STAMP = re.compile(
    r"^_runtime_version\.ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.(PUBLIC|GOOGLE_INTERNAL),"
    r"\s*([0-9]{1,6}),\s*([0-9]{1,6}),\s*([0-9]{1,6}),\s*'([0-9A-Za-z.+-]{0,32})',", re.M)
#: grpcio-tools' version check in a ``_pb2_grpc.py`` (grpc's ``src/compiler/python_generator.cc``,
#: ``PrintPreamble``).
_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9][0-9A-Za-z.+-]{0,63})'$", re.M)


def _gencode():
    """venv-relative path -> the version stamped into a generated module RECORD lists:
    ``protobuf <DOMAIN> <major>.<minor>.<patch><suffix>`` for a ``_pb2.py`` calling
    ``ValidateProtobufRuntimeVersion``, ``grpc <version>`` for a ``_pb2_grpc.py`` setting
    ``GRPC_GENERATED_VERSION``; modules without a stamp are left out. Only the first
    :data:`_GENCODE_HEAD` bytes of each are read (not following a symlink)."""
    out = {}
    jobs, _GENCODE[:] = _GENCODE[:_GENCODE_MAX], []  # taken, as the hash jobs are: one probe's modules
    for rel, full in jobs:
        data = _regular_head(full, _GENCODE_HEAD, follow=False)
        if data is None:
            continue
        head = data.decode("utf-8", "replace")
        if rel.endswith("_pb2_grpc.py"):
            match = _GRPC_STAMP.search(head)
            if match:
                out[rel] = "grpc " + match.group(1)
        else:
            match = _PROTOBUF_STAMP.search(head)
            if match:
                out[rel] = "protobuf {} {}.{}.{}{}".format(*match.groups())
    return out


def _elsewhere(paths):
    """Absolute path -> whether it exists on this host (stat only; editable installs' sources)."""
    return {p: os.path.exists(p) for p in paths if isinstance(p, str) and p.startswith("/") and "\0" not in p}


def _say_identity(path):
    """``--identity PATH``: say PATH's identity on standard output before the request is read, as
    the controller's identity script would (``transplant/hosts/identity.py``): one line
    ``transplant-identity BOOT_ID ST_DEV ST_INO`` (symlinks followed), ``transplant-identity -`` when
    it cannot be told; logged as ``identity PATH`` (the testing hook)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
    except OSError:
        boot = ""
    try:
        info = os.stat(path)
        said = "{} {} {}".format(boot, info.st_dev, info.st_ino) if boot else "-"
    except (OSError, ValueError):
        said = "-"
    sys.stdout.write("transplant-identity {}\n".format(said))
    sys.stdout.flush()
    hook_log(SCRIPT_LOG, "identity {}".format(path))


def _arguments(argv):
    global _INPUTS
    if len(argv) == 3 and argv[:2] == ["--stdin", "--identity"]:
        _say_identity(argv[2])
        argv = ["--stdin"]
    if argv == ["--stdin"]:
        # the request's JSON, then (a donor's, hash_cache store reply) the known hash groups' lines
        text = sys.stdin.buffer.read().decode("utf-8")
        request, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
        _OPTIONS["hash_cache_lines"] = text[end:]
        del text
        if isinstance(request.get("fingerprint"), dict):
            return request["fingerprint"], None
        if isinstance(request.get("exists"), list):
            return request["exists"], "exists"
        if request.get("inputs") is True:
            _INPUTS = _Inputs(time.time_ns() - _RACY_NS)
        prefix = venv_prefix()
        site = venv_paths(prefix)["purelib"]
        files = list(request.get("files", []))
        for rel in request.get("site_files", []):
            files.append(os.path.relpath(os.path.join(site, rel), prefix).replace(os.sep, "/"))
        record = request.get("record", True)
        _OPTIONS["record"] = record if record in ("summary", "shared") else bool(record)
        _OPTIONS["compact"] = request.get("compact") is True
        _OPTIONS["texts"] = [t for t in request.get("texts", []) if isinstance(t, str)]
        _OPTIONS["elsewhere"] = list(request.get("paths_exist", []))
        _OPTIONS["hash_cache"] = request.get("hash_cache", True)
        return [normalize(p) for p in request.get("hash", [])], files
    patterns, files = [], []
    it = iter(argv)
    for arg in it:
        if arg == "--hash":
            patterns.append(normalize(next(it, "*")))
        elif arg == "--file":
            files.append(next(it, ""))
        else:
            raise SystemExit("probe: unknown argument {!r}".format(arg))
    return patterns, files


def main(argv):
    """Print the inventory document of the running interpreter's venv; return 0."""
    started = time.time()
    patterns, files = _arguments(argv)
    if files is None:  # the fingerprint mode: patterns is its request
        script_log("fingerprint")
        sys.stdout.write(json.dumps(_fingerprint(patterns), sort_keys=True, separators=(",", ":")) + "\n")
        return 0
    if files == "exists":  # the exists mode: patterns is the list of paths
        script_log("exists")
        sys.stdout.write(json.dumps({"elsewhere": _elsewhere(patterns)}, separators=(",", ":")) + "\n")
        return 0
    script_log("probe")
    # No cyclic garbage collection: the probe makes a few hundred thousand rows and lists and no
    # cycle, and each collection their allocations set off walks all of them (a tenth of the
    # real donor's probe); reference counting frees everything as usual, and the process ends.
    gc.disable()
    prefix = venv_prefix()
    paths = venv_paths(prefix)
    sites = []
    for key in ("purelib", "platlib"):
        if paths[key] not in sites:
            sites.append(paths[key])
    _OPTIONS["scripts"] = _inside(prefix, paths["scripts"]) or "bin"
    _OPTIONS["prefix"] = prefix
    distributions = []
    for site in sites:
        distributions.extend(_distributions(site, prefix, patterns, _OPTIONS["record"]))
    _run_hash_jobs()
    unseen = {} if distributions else _unseen_sites(prefix, sites)
    extra = {}
    for rel in files:
        full = os.path.normpath(os.path.join(prefix, rel))
        inside = _inside(prefix, full)
        extra[rel] = {"venv_path": inside}
        if inside is not None:
            extra[rel].update(_file_facts(full, True))
            if "hash" in extra[rel] and inside.startswith(_OPTIONS["scripts"] + "/"):
                _, head, body = _script_facts(full)
                if head is not None:
                    extra[rel]["head"], extra[rel]["body_hash"] = head, body
            if "hash" in extra[rel] and _is_record(inside):
                identity = _record_identity_of(full, inside)
                if identity is not None:
                    extra[rel]["record_identity"] = identity
    host, interpreter = _host_facts(), _interpreter(prefix)
    rel = {k: _inside(prefix, paths[k]) for k in ("purelib", "platlib", "scripts")}
    document = {
        "schema": SCHEMA,
        "host": host,
        "interpreter": interpreter,
        "paths": {
            "prefix": prefix,
            "purelib": rel["purelib"],
            "platlib": rel["platlib"],
            "scripts": rel["scripts"],
        },
        "distributions": distributions,
        "outside": _outside(prefix, sites),
        "files": extra,
        "texts": _texts(paths["purelib"], prefix, _OPTIONS.get("texts", [])),
        "elsewhere": _elsewhere(_OPTIONS.get("elsewhere", [])),
        "probe_seconds": round(time.time() - started, 3),
    }
    if unseen:
        document["unseen"] = unseen
    if _OPTIONS["record"] is True:  # every RECORD row looked at on disk: the generated modules' stamps
        document["gencode"] = _gencode()
    if "hash_cache_report" in _OPTIONS:
        document["hash_cache"] = _OPTIONS["hash_cache_report"]
    if _INPUTS is not None:
        document["inputs"] = _INPUTS.report(_non_file_facts(prefix, rel, host, interpreter))
    if _OPTIONS.get("compact"):
        document["record_columns"] = list(COLUMNS)  # (the rows were built in that form: _record_rows)
    sys.stdout.write(json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
