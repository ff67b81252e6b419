"""What a clone must rewrite, and whether a clone still points back (pure core).

A venv names its own prefix in files that tools wrote for it: ``pyvenv.cfg`` (its
``command``), console scripts' shebangs (PEP 427's ``#!python`` rewritten at install),
the activate scripts of each shell (``bin/activate``, ``activate.csh``, ``activate.fish``,
``Activate.ps1``...), absolute RECORD rows (PEP 376 / the wheel spec allow them),
``.pth`` files (``site``), setuptools' ``__editable__`` finders and ``.egg-link`` files,
PEP 610's ``direct_url.json``, and Jupyter ``kernel.json`` files. The host script
``transplant/remote/relocate.py`` reports every file and symlink that names the old prefix
(:func:`decide` turns that report into edits) and scans the clone again after the edits
(:func:`judge` turns that into what is left). Shebangs are rewritten by
:func:`transplant.core.rules.venvfiles.rewritten_head`, the same rule apply uses.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transplant.core.rules.venvfiles import rewritten_head
from transplant.core.units import agree

__all__ = ["Edit", "Relink", "Relocation", "Leftovers", "check_venv_path", "check_clone_paths", "relocatable_kind",
           "decide", "judge", "bytecode", "outside_venv", "preflight"]

#: Characters a clone's path may hold: the activate scripts quote the prefix for their shell,
#: and a path without blanks, quotes, ``$``, backquotes or backslashes needs no quoting in any;
#: no ``:`` either, which would split ``PATH`` (``$VIRTUAL_ENV/bin:$PATH``).
_SAFE = re.compile(r"[A-Za-z0-9._+@=,/~-]+\Z")
_SITE = r"lib/[^/]+/site-packages"
#: Bytes a destination filesystem must have free beyond the clone's size (as apply's staging check).
MARGIN = 16 << 20
_KINDS = (
    (re.compile(r"pyvenv\.cfg\Z"), "pyvenv.cfg"),
    (re.compile(r"bin/(activate|activate\.[A-Za-z0-9]+|Activate\.ps1)\Z"), "activate script"),
    (re.compile(r"bin/[^/]+\Z"), "script"),
    (re.compile(_SITE + r"/[^/]+\.dist-info/RECORD\Z"), "RECORD"),
    (re.compile(_SITE + r"/[^/]+\.dist-info/direct_url\.json\Z"), "direct_url.json"),
    (re.compile(_SITE + r"/[^/]+\.egg-info/installed-files\.txt\Z"), "installed-files.txt"),
    (re.compile(_SITE + r"/__editable__[^/]*\.py\Z"), "editable finder"),
    (re.compile(_SITE + r"/[^/]+\.pth\Z"), ".pth file"),
    (re.compile(_SITE + r"/[^/]+\.egg-link\Z"), ".egg-link file"),
    (re.compile(r"share/jupyter/kernels/[^/]+/kernel\.json\Z"), "Jupyter kernel.json"),
)


def check_venv_path(path: object, what: str) -> str:
    """A venv path given for a clone, checked.

    :param what: how the message names it (``the source``, ``target.base``).
    :returns: the path, unchanged.
    :raises ValueError: not a string, not absolute, not normalised (``//``, ``..``, ``.``,
        a trailing ``/``), ``/`` itself, or with a character outside letters, digits and
        ``._+@=,/~-`` (a blank, a quote, ``$``... would need quoting in the activate scripts, a
        ``:`` would split ``PATH``).
    """
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what}: expected an absolute venv path, got {path!r}")
    if not path.startswith("/"):
        raise ValueError(f"{what}: {path!r} is not an absolute path")
    if posixpath.normpath(path) != path or path.startswith("//"):
        raise ValueError(f"{what}: {path!r} is not normalised; write {posixpath.normpath(path)!r}")
    if path == "/":
        raise ValueError(f"{what}: '/' cannot be a venv")
    if not _SAFE.match(path):
        raise ValueError(f"{what}: {path!r} has a character a venv path may not hold here (a blank, a quote, $, a "
                         f"backquote, a backslash, a colon or a control character)")
    return path


def check_clone_paths(source: str, dest: str, *, same_host: bool) -> None:
    """Refuse a clone onto its own source, or (on one host) into or around it.

    :raises ValueError: the message says which.
    """
    if not same_host:
        return
    if source == dest:
        raise ValueError(f"the destination {dest} is the source itself")
    if dest.startswith(source + "/"):
        raise ValueError(f"the destination {dest} is inside the source {source}")
    if source.startswith(dest + "/"):
        raise ValueError(f"the source {source} is inside the destination {dest}")


def relocatable_kind(path: str) -> str | None:
    """The kind of a venv-relative path a clone rewrites (``script``, ``RECORD``, ``.pth file``...),
    or None for a file the clone leaves as it is."""
    for pattern, kind in _KINDS:
        if pattern.match(path):
            return kind
    return None


def bytecode(path: str) -> bool:
    """True for cached bytecode (``__pycache__/*.pyc``): its ``co_filename`` names the prefix it
    was compiled in, and Python corrects that at import (``importlib``'s ``_fix_up_module``)."""
    return path.endswith(".pyc") and "/__pycache__/" in f"/{path}"


@dataclass(frozen=True, kw_only=True)
class Edit:
    """One file of the clone to rewrite.

    :ivar path: relative to the venv.
    :ivar kind: what it is (see :func:`relocatable_kind`).
    :ivar head_old: the script head as scanned, or None when the head stays.
    :ivar head_new: the head to write instead (from ``rewritten_head``), or None.
    """

    path: str
    kind: str
    head_old: str | None = None
    head_new: str | None = None

    def to_request(self) -> dict[str, Any]:
        """The edit as the host script's ``relocate`` operation reads it."""
        return {"path": self.path, "head_old": self.head_old, "head_new": self.head_new}


@dataclass(frozen=True, kw_only=True)
class Relink:
    """An absolute symlink into the old prefix, re-made to point at the same path under the new one."""

    path: str
    old_target: str
    target: str


@dataclass(frozen=True, kw_only=True)
class Leftovers:
    """What still names the old prefix: ``text`` files (an error), ``binary`` files (a
    warning; ``bytecode`` is the part of them that is ``__pycache__/*.pyc``), and ``links``
    (absolute symlinks into it, an error). Paths are relative to the venv, sorted."""

    text: tuple[str, ...] = ()
    binary: tuple[str, ...] = ()
    links: tuple[str, ...] = ()

    @property
    def bytecode(self) -> tuple[str, ...]:
        """The binary files that are cached bytecode."""
        return tuple(p for p in self.binary if bytecode(p))

    @property
    def errors(self) -> bool:
        """True when a text file or a symlink still names the old prefix."""
        return bool(self.text or self.links)


@dataclass(frozen=True, kw_only=True)
class Relocation:
    """What a clone rewrites, decided from a scan of the source.

    :ivar old: the source's prefix; :ivar new: the clone's.
    :ivar edits: files to rewrite, sorted by path.
    :ivar links: symlinks to re-make, sorted by path.
    :ivar expected: what the clone will still name the old prefix in (files no rule
        rewrites): the same classes as the scan after the clone reports.
    """

    old: str
    new: str
    edits: tuple[Edit, ...]
    links: tuple[Relink, ...]
    expected: Leftovers

    def to_request(self, root: str) -> dict[str, Any]:
        """The host script's ``relocate`` request for the clone at ``root``."""
        return {"root": root, "old": self.old, "new": self.new, "edits": [e.to_request() for e in self.edits],
                "links": [{"path": ln.path, "target": ln.target} for ln in self.links]}


def _moved(target: str, old: str, new: str) -> str | None:
    if target == old:
        return new
    if target.startswith(old + "/"):
        return new + target[len(old):]
    return None


def decide(old: str, new: str, scan: Mapping[str, Any]) -> Relocation:
    """Turn a scan of the source (the host script's ``scan`` answer) into a :class:`Relocation`.

    Files of a relocatable kind without a NUL byte (UTF-8 or not: the prefix is ASCII, so a
    Latin-1 script is rewritten too) get every whole-path ``old`` replaced by ``new``;
    scripts whose shebang runs an interpreter inside ``old`` get their head from
    ``rewritten_head`` (the ``#!/bin/sh`` + ``exec`` form when the new path is too long
    for a shebang). Absolute symlinks into ``old`` are repointed. Everything else that
    names ``old`` is left as it is and listed in ``expected``.

    :raises KeyError: the scan lacks ``hits`` or ``links``.
    """
    edits, text, binary, links, dangling = [], [], [], [], []
    for hit in scan["hits"]:
        path = hit["path"]
        kind = relocatable_kind(path)
        if hit.get("binary") and (kind is None or hit.get("nul", True)):
            binary.append(path)
        elif kind is None:
            text.append(path)
        else:
            head = hit.get("head")
            new_head = rewritten_head(head, old, new) if head is not None and kind == "script" else None
            edits.append(Edit(path=path, kind=kind, head_old=head if new_head is not None else None,
                              head_new=new_head))
    for link in scan["links"]:
        moved = _moved(link["target"], old, new)
        if moved is None:
            dangling.append(link["path"])
        else:
            links.append(Relink(path=link["path"], old_target=link["target"], target=moved))
    return Relocation(old=old, new=new, edits=tuple(sorted(edits, key=lambda e: e.path)),
                      links=tuple(sorted(links, key=lambda ln: ln.path)),
                      expected=Leftovers(text=tuple(sorted(text)), binary=tuple(sorted(binary)),
                                         links=tuple(sorted(dangling))))


def judge(scan: Mapping[str, Any]) -> Leftovers:
    """What a scan of the clone (for the old prefix) still finds.

    :raises KeyError: the scan lacks ``hits`` or ``links``.
    """
    text = sorted(h["path"] for h in scan["hits"] if not h.get("binary"))
    binary = sorted(h["path"] for h in scan["hits"] if h.get("binary"))
    return Leftovers(text=tuple(text), binary=tuple(binary), links=tuple(sorted(ln["path"] for ln in scan["links"])))


def outside_venv(paths: Sequence[str], old: str) -> list[str]:
    """The absolute paths (editable source folders, ``.pth`` folders) that do not travel with a
    clone of the venv ``old`` because they lie outside it; sorted, without repeats."""
    return sorted({p for p in paths if p != old and not p.startswith(old + "/")})


def preflight(
    *,
    source: str,
    dest: str,
    dest_venv: str,
    pyvenv_cfg: Mapping[str, str] | None,
    implementation: str,
    version: str,
    check: Mapping[str, Any] | None,
    tried: Sequence[str],
    editable: Sequence[str],
    external: Sequence[Mapping[str, str]],
    lock: bool,
    replace: bool,
    size: int = 0,
    pth: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """Whether a clone may start: (problems, warnings), each one line ``what; fix: how``.

    :param source: ``HOST:VENV`` of the source, :param dest: of the destination (for messages).
    :param dest_venv: the destination venv's path; missing folders above it are made by the
        clone (:func:`missing_parents`), so only the nearest existing one must be writable.
    :param pyvenv_cfg: the source's ``pyvenv.cfg`` values (None: it has none).
    :param implementation: the source interpreter's (``cpython``); :param version: its ``3.11.7``.
    :param check: the host script's ``check`` answer from the destination's base interpreter,
        or None when none of ``tried`` (the interpreters looked for under ``home``) started;
        its ``overlap`` (the destination is, is inside or holds the source, symlinks resolved)
        is a problem.
    :param editable: editable source folders outside the source venv.
    :param external: the source's absolute symlinks out of the venv (``bin/python -> /usr/bin/python3.11``).
    :param lock: the source holds a transplant lock (an apply running or interrupted).
    :param replace: ``--replace`` was given: an existing venv at the destination may go.
    :param size: bytes of the source's regular files; the destination's filesystem must have
        them free plus :data:`MARGIN` (not checked when ``replace`` lets an old venv go, whose
        space comes back, nor when the destination could not say).
    :param pth: folders outside the venv that its ``.pth`` files add to ``sys.path`` (not
        editable installs); one the destination lacks is a warning (``site`` skips it).
    """
    problems: list[str] = []
    warnings: list[str] = []
    home = (pyvenv_cfg or {}).get("home")
    if pyvenv_cfg is None or not home:
        problems.append(f"{source} has no pyvenv.cfg with a home; it is not a venv made by venv or virtualenv; "
                        f"fix: name the venv's own folder (the one holding pyvenv.cfg)")
    if lock:
        problems.append(f"{source} holds a transplant lock (.transplant/lock): an apply is running there or was "
                        f"interrupted, so its files may be half-changed; fix: wait for it, or finish it with "
                        f"'transplant apply MANIFEST --resume' (or --rollback)")
    if home and check is None:
        problems.append(f"pyvenv.cfg's home {home} has no Python on the destination {dest} (tried "
                        f"{', '.join(tried)}); the clone's python would not start; fix: install Python "
                        f"{'.'.join(version.split('.')[:2])} at {home} there, or clone to a host that has it")
    if check is not None:
        if (check["implementation"], _minor(check["version"])) != (implementation, _minor(version)):
            problems.append(f"the destination's Python at {home} is {check['implementation']} {check['version']}, "
                            f"the source venv runs {implementation} {version}; its extension modules and "
                            f"site-packages folder (python{_minor(version)}) need the same Python; fix: clone to a "
                            f"host with {implementation} {_minor(version)} at {home}")
        elif check["version"] != version:
            warnings.append(f"the destination's Python is {check['version']}, the source's {version} (same "
                            f"{_minor(version)}, so the same ABI)")
        state, overlap, real = check["dest_state"], check.get("overlap"), check.get("real", dest_venv)
        if overlap:
            what = {"same": "is the source itself", "inside": "lies inside the source",
                    "contains": "holds the source"}.get(overlap, "overlaps the source")
            problems.append(f"the destination {dest} {what} (its real path is {real}, symlinks resolved); fix: "
                            f"choose a path outside the source and not above it")
        elif state == "not-a-folder":
            problems.append(f"the destination {dest} exists and is not a folder; fix: choose another path")
        elif state == "interrupted" and not replace:
            problems.append(f"an interrupted clone is here: {dest} holds what a clone stopped part-way left (its "
                            f".transplant-cloning marker); --replace removes it: transplant clone {source} {dest} "
                            f"--replace (or remove it yourself: rm -rf {shlex.quote(dest_venv)})")
        elif state == "nonempty" or (state == "venv" and not replace):
            problems.append(f"the destination {dest} exists and is not empty; fix: choose another path"
                            + (", or pass --replace to delete that venv first" if state == "venv" else
                               " (--replace only deletes a venv: a folder whose pyvenv.cfg has a home key, not a "
                               "home folder or a mount point)"))
        # a missing parent folder is made, as python -m venv, virtualenv and conda do (see missing_parents);
        # the nearest folder that exists must be writable (checked below)
        free = check.get("free")
        if isinstance(free, int) and free < size + MARGIN and not (replace and state in ("venv", "interrupted")):
            problems.append(f"the destination's filesystem at {check.get('parent')} has {_mib(free)} free; the "
                            f"clone needs {_mib(size)} plus {_mib(MARGIN)}; fix: free space there, or choose "
                            f"another filesystem")
        if not check.get("parent_writable", False):
            problems.append(f"{check.get('parent')} on the destination is not writable, so {dest_venv} cannot be "
                            f"made there; fix: choose a writable place, or fix its permissions")
        exists = check.get("exists", {})
        missing = [p for p in editable if not exists.get(p, False)]
        if missing:
            problems.append(f"{agree(len(missing), 'an editable install imports', 'editable installs import')} from "
                            f"{', '.join(missing)}, which the destination lacks; "
                            f"the clone's imports would fail; fix: put the source there at the same path, or "
                            f"reinstall the project as a regular install in the source venv (pip install --no-deps "
                            f"--force-reinstall SOURCE)")
        absent = [p for p in pth if not exists.get(p, False)]
        if absent:
            warnings.append(f"{agree(len(absent), 'a .pth file of the venv adds', '.pth files of the venv add')} "
                            f"{', '.join(absent)} to sys.path, which the destination "
                            f"lacks; Python skips a missing folder, so what it holds will not import in the clone")
        dangling = [f"{e['path']} -> {e['target']}" for e in external if not exists.get(e["target"], False)]
        if dangling:
            problems.append(f"{agree(len(dangling), 'a symlink of the venv points', 'symlinks of the venv point')} to "
                            f"{', '.join(dangling)}, which the destination "
                            f"lacks; fix: install that there, or recreate the venv's links")
    return problems, warnings


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def missing_parents(dest_venv: str, existing: str) -> list[str]:
    """The folders above ``dest_venv`` that a clone makes, outermost first, given ``existing``
    (the nearest existing folder above it, the host script's ``check.parent``); [] when its
    parent exists. As ``python -m venv`` (and virtualenv, conda) make them too.

    >>> missing_parents("/srv/a/b/venv", "/srv")
    ['/srv/a', '/srv/a/b']
    """
    out: list[str] = []
    folder = posixpath.dirname(dest_venv)
    while folder != existing and folder not in ("/", ""):
        out.append(folder)
        folder = posixpath.dirname(folder)
    return out[::-1]
