"""Rules on the venv's own files: ``editable-install``, ``script-prefix``, ``record-drift``
(pure core).

Editable installs are recognised by PEP 610's ``direct_url.json`` (``dir_info.editable``),
setuptools' ``__editable__`` finders (their ``MAPPING``) and path ``.pth`` files, and
the legacy ``.egg-link`` files. RECORD hashes are PEP 376 / the wheel spec's
``sha256=<urlsafe b64>``.
"""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
from urllib.parse import unquote, urlparse

from transplant.remote._common import SH_CLOSE, SH_EXEC  # pip's script head, one definition
from transplant.core.inventory import Distribution, Inventory
from transplant.core.plan import Finding
from transplant.core.rules.env import EnvironmentAfter, describe, pip
from transplant.core.units import agree, count

__all__ = ["pth_paths", "editable_sources", "editable_findings", "shebang_interpreter", "rewritten_head", "script_findings",
           "drift_findings"]

_SH_EXEC = SH_EXEC.decode("ascii")  # pip's /bin/sh form: the second line starts with this
_SH_CLOSE = SH_CLOSE.decode("ascii")  # its third line, which closes for Python the string the second opens
_MAPPING = re.compile(r"^MAPPING\s*(?::[^=\n]*)?=\s*(\{.*?\})\s*$", re.M | re.S)
_SHOWN = 10


class _Unreadable(Exception):
    """An editable-install mapping that cannot be read as data."""


def _finder_paths(text: str) -> list[str]:
    """The folders of a setuptools ``__editable__`` finder's ``MAPPING`` literal (read as data
    with ``ast.literal_eval``, never run).

    :raises _Unreadable: no literal ``MAPPING`` dict.
    """
    match = _MAPPING.search(text)
    if not match:
        raise _Unreadable("no MAPPING = {...} literal")
    try:
        mapping = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise _Unreadable("its MAPPING is not a literal") from None
    if not isinstance(mapping, dict):
        raise _Unreadable("its MAPPING is not a dict")
    return [v for v in mapping.values() if isinstance(v, str)]


def pth_paths(text: str) -> list[str]:
    """The absolute folders a ``.pth`` file adds to ``sys.path`` (its lines starting with ``/``;
    ``import`` lines and comments are not paths), in file order."""
    return [line.strip() for line in text.splitlines()
            if line.strip().startswith("/") and not line.startswith(("import ", "import\t", "#"))]


def editable_sources(dist: Distribution, inv: Inventory) -> list[str]:
    """Absolute folders an editable install of ``dist`` imports from, on ``inv``'s host (sorted).

    Read from ``direct_url.json`` (a local ``file://`` URL with ``dir_info.editable``), the
    ``__editable__`` finders and ``.pth`` files its RECORD lists, and a
    ``<name>.egg-link`` at the top of site-packages.
    """
    return _editable(dist, inv)[0]


def _editable(dist: Distribution, inv: Inventory) -> tuple[list[str], list[str]]:
    """(source folders, mapping files that could not be read) of an editable install."""
    paths: set[str] = set()
    unread: list[str] = []
    info = dist.direct_url or {}
    dir_info = info.get("dir_info") if isinstance(info, dict) else None
    if isinstance(dir_info, dict) and dir_info.get("editable") is True and isinstance(info.get("url"), str):
        parsed = urlparse(info["url"])
        if parsed.scheme == "file" and parsed.path and parsed.netloc in ("", "localhost"):
            paths.add(unquote(parsed.path))
    for rel in dist.files:
        if not rel.endswith((".py", ".pth")):  # neither a finder nor a .pth (the name ends the path)
            continue
        base = rel.rsplit("/", 1)[-1]
        is_finder = base.startswith("__editable__") and base.endswith(".py")
        if not (is_finder or base.endswith(".pth")):
            continue
        text = inv.texts.get(rel)
        if text is None:
            unread.append(f"{rel} (too large or unreadable)")
        elif is_finder:
            try:
                paths.update(_finder_paths(text))
            except _Unreadable as exc:
                unread.append(f"{rel} ({exc})")
        else:
            paths.update(pth_paths(text))
    for rel, text in inv.texts.items():
        stem = rel.rsplit("/", 1)[-1]
        if stem.endswith(".egg-link") and text and \
                re.sub(r"[-_.]+", "-", stem[:-len(".egg-link")]).lower() == dist.name:
            first = text.splitlines()[0].strip() if text.splitlines() else ""
            if first.startswith("/"):
                paths.add(first)
    return sorted(posixpath.normpath(p) for p in paths if "\0" not in p), unread


def editable_findings(env: EnvironmentAfter) -> list[Finding]:
    """``editable-install``: an overlaid distribution is an editable install on the donor
    whose source folder is not on the target (error; the import would fail), or is
    there (info: the target then runs whatever that folder holds)."""
    out = []
    for name in env.overlaid:
        dist = env.after[name]
        sources, unread = _editable(dist, env.donor)
        if unread:
            out.append(Finding(
                code="editable-install", severity="warning", dists=(name,),
                message=f"{describe(dist)} looks like an editable install, but its mapping could not be read as "
                        f"data: {', '.join(unread[:3])}; where it imports from was not checked",
                hint=f"reinstall it as a regular install on the donor ({pip(env.donor.interpreter.prefix)} install "
                     f"--no-deps --force-reinstall SOURCE), or check the mapping by hand",
                files=tuple(u.split(" (", 1)[0] for u in unread[:_SHOWN]),
            ))
        if not sources:
            continue
        missing = [p for p in sources if not env.target.elsewhere.get(p, False)]
        donor_python = shlex.quote(f"{env.donor.interpreter.prefix}/bin/python")
        if missing:
            out.append(Finding(
                code="editable-install", severity="error", dists=(name,),
                message=f"{describe(dist)} is an editable install on the donor importing from "
                        f"{', '.join(missing[:_SHOWN])}{' and more' if len(missing) > _SHOWN else ''}, which does "
                        f"not exist on the target; copying its dist-info and "
                        f"finder would leave 'import' failing there",
                hint=f"reinstall it from its source as a regular install on the donor: {donor_python} -m pip install "
                     f"--no-deps --force-reinstall {shlex.quote(missing[0])}; or remove {name!r} from overlay",
                files=tuple(missing[:_SHOWN]),
            ))
        else:
            out.append(Finding(
                code="editable-install", severity="info", dists=(name,),
                message=f"{describe(dist)} is an editable install importing from {', '.join(sources[:_SHOWN])}, which exists "
                        f"on the target too; the target runs whatever that folder holds there",
                hint=f"to pin the code, reinstall it as a regular install on the donor: {donor_python} -m pip install "
                     f"--no-deps --force-reinstall {shlex.quote(sources[0])}",
            ))
    return out


def shebang_interpreter(head: str) -> str | None:
    """The interpreter a script head runs: ``#!/v/bin/python`` -> ``/v/bin/python``;
    ``#!/usr/bin/env /v/bin/python`` -> ``/v/bin/python``; pip's ``#!/bin/sh`` +
    ``'''exec' "/v/bin/python" "$0" "$@"`` form -> ``/v/bin/python``; None otherwise
    (also for a head that does not parse)."""
    lines = head.splitlines()
    if not lines or not lines[0].startswith("#!"):
        return None
    if lines[0].strip() == "#!/bin/sh" and len(lines) > 1 and lines[1].startswith(_SH_EXEC):
        try:
            parts = shlex.split(lines[1][len(_SH_EXEC):], posix=True)
        except ValueError:
            return None
        return parts[0] if parts else None
    words = lines[0][2:].strip().split()
    if len(words) > 1 and words[0].endswith("/env"):
        words = [w for w in words[1:] if not w.startswith("-")]
    return words[0] if words else None


#: Longest interpreter line a shebang may carry here (the kernel reads 128 bytes before Linux 5.1).
_SHEBANG_MAX = 127


def rewritten_head(head: str, donor_prefix: str, target_prefix: str, target_minor: str | None = None) -> str | None:
    """The head a script must get on the target when its interpreter lies in the donor's
    prefix, or None when it needs no rewrite.

    :param target_minor: the target interpreter's ``major.minor`` (``3.12``), or None (the same
        interpreter as the donor's: a clone). A versioned name the target's venv does not have
        (the donor's ``bin/python3.11`` in a 3.12 venv) becomes the target's own
        (``bin/python3.12``): a venv holds ``python``, ``python3`` and ``python3.N`` of its minor alone.

    The interpreter becomes the target's ``bin/<same name>``; when that path has a space
    or a shell character, or is too long for a shebang, pip's ``#!/bin/sh`` + ``'''exec'``
    form is written with the path shell-quoted, all three lines of it (as pip's script maker
    does; a script's head in that form is those three lines, as the probe splits it).
    """
    interpreter = shebang_interpreter(head)
    if interpreter is None or donor_prefix == target_prefix or not interpreter.startswith(donor_prefix + "/"):
        return None
    new = target_prefix + interpreter[len(donor_prefix):]
    folder, _, base = new.rpartition("/")
    versioned = re.fullmatch(r"python(\d+\.\d+)", base)
    if target_minor is not None and versioned and versioned.group(1) != target_minor:
        new = f"{folder}/python{target_minor}"
    ending = "\r\n" if head.splitlines(keepends=True)[0].endswith("\r\n") else "\n"
    sh_form = head.startswith("#!/bin/sh") and len(head.splitlines()) > 1
    if sh_form or len(new) + 2 > _SHEBANG_MAX or any(ch in new for ch in " \t\"'$`\\"):
        return f"#!/bin/sh{ending}{_SH_EXEC} {shlex.quote(new)} \"$0\" \"$@\"{ending}{_SH_CLOSE}{ending}"
    return f"#!{new}{ending}"


def script_findings(env: EnvironmentAfter) -> list[Finding]:
    """``script-prefix``: overlaid console scripts whose shebang names the donor's prefix
    (info: apply rewrites them for the target's interpreter)."""
    donor_prefix, target_prefix = env.donor.interpreter.prefix, env.target.interpreter.prefix
    minor = env.target.interpreter.minor
    out = []
    for name in env.overlaid:
        dist = env.after[name]
        heads = {p: (e.head, new) for p, e in dist.files.items()
                 if e.head is not None and (new := rewritten_head(e.head, donor_prefix, target_prefix, minor)) is not None}
        scripts = sorted(heads)
        if scripts:
            # the interpreters the shebangs actually name (bin/python3, bin/python3.11...), not a guess, and
            # those apply writes (the target's own bin/python3.12 where the donor's was 3.11)
            named = sorted({shebang_interpreter(old) or f"{donor_prefix}/bin/python" for old, _ in heads.values()})
            theirs = ", ".join(named)
            ours = ", ".join(sorted({shebang_interpreter(new) or f"{target_prefix}/bin/python"
                                     for _, new in heads.values()}))
            out.append(Finding(
                code="script-prefix", severity="info", dists=(name,),
                message=f"{describe(dist)}: {count(len(scripts), 'console script')} {agree(len(scripts), 'starts', 'start')} with the donor's "
                        f"interpreter {theirs}; apply rewrites {agree(len(scripts), 'its', 'their')} first line to {ours}",
                hint="nothing to do: apply rewrites them (and verify checks the result)",
                files=tuple(scripts[:_SHOWN]),
            ))
    return out


def _recompiled(path: str, dist: Distribution) -> bool:
    """Whether ``path`` is bytecode whose source is intact (its hash is RECORD's): the
    interpreter rewrites such a ``.pyc`` whenever it sees fit (PEP 3147/552: the header
    holds the source's mtime), so a difference is a recompile, not an edit."""
    head, sep, name = path.rpartition("/__pycache__/")
    if not sep or not name.endswith(".pyc"):
        return False
    source = dist.files.get(f"{head}/{name.split('.', 1)[0]}.py")
    return source is not None and source.hash is not None and source.hash == source.record_hash


def _drifted(dist: Distribution, skip: set[str]) -> tuple[list[str], list[str]]:
    changed, missing = [], []
    files = dist.files
    for path in sorted(files):  # the keys alone: sorting (path, entry) pairs compares tuples
        entry = files[path]
        if path in skip or entry.record_hash is None or entry.error or entry.symlink is not None:
            continue
        if not entry.exists:
            missing.append(path)
        elif entry.hash is not None and entry.hash != entry.record_hash and not _recompiled(path, dist):
            changed.append(path)
    return changed, missing


def _relocated_here(donor: Distribution, target: Distribution, donor_prefix: str, target_prefix: str,
                    target_minor: str | None = None) -> set[str]:
    """Console scripts of ``target`` that are exactly what apply makes of the donor's script:
    its body with the head :func:`rewritten_head` gives. They are apply's own edit, not a
    local one, whatever their RECORD row says (an apply before RECORD rows were set kept
    the donor's row; a plan now copies RECORD again to set it)."""
    out = set()
    theirs = target.files  # built on each access: once here, not once per file
    for path, entry in donor.files.items():
        there = theirs.get(path)
        if entry.head is None or there is None:
            continue
        head = rewritten_head(entry.head, donor_prefix, target_prefix, target_minor)
        if head is not None and there.script_identity == f"script:{entry.body_hash}:{head}":
            out.add(path)
    return out


def drift_findings(env: EnvironmentAfter) -> list[Finding]:
    """``record-drift`` for content: files of overlaid distributions whose bytes differ from
    their RECORD hash, on the donor (hand edits the manifest does not declare as patches:
    they would travel silently) and on the target (local edits apply overwrites).

    On the target, a console script that is the donor's relocated by apply (its shebang
    rewritten for the target's prefix, :func:`_relocated_here`) is not a local edit and is
    not reported; apply sets its RECORD row to the file as written. Files the planner leaves
    (``env.left``: another distribution wrote them last, on both sides) are not reported either,
    nor a target file whose bytes are the donor's (the donor's drift, reported on the donor's
    side: apply leaves them, and what the donor runs is not the target's fault)."""
    out = []
    # a file another distribution wrote last on both sides (env.left) is that one's, not drift
    donor_skip = {f"{env.donor.site_packages}/{d}" for d in env.patch_dests} | env.left
    target_skip = {f"{env.target.site_packages}/{d}" for d in env.patch_dests} | env.left
    for name in env.overlaid:
        dist = env.after[name]
        changed, _ = _drifted(dist, donor_skip)
        if changed:
            site = env.donor.site_packages + "/"
            example = changed[0][len(site):] if changed[0].startswith(site) else changed[0]
            out.append(Finding(
                code="record-drift", severity="warning", dists=(name,),
                message=f"{describe(dist)} on the donor: {count(len(changed), 'file')} {agree(len(changed), 'differs from its', 'differ from their')} "
                        f"RECORD hash and {agree(len(changed), 'is', 'are')} not declared as patches; "
                        f"{agree(len(changed), 'it is', 'they are')} copied as {agree(len(changed), 'it is', 'they are')}: {', '.join(changed[:_SHOWN])}",
                hint=f"if they are hand patches, declare them in {env.manifest} (patches: [{{source: patches/"
                     f"{example}, dest: {example}}}]); otherwise reinstall on the donor: "
                     f"{pip(env.donor.interpreter.prefix)} install --force-reinstall --no-deps "
                     f"{shlex.quote(f'{dist.display_name}=={dist.raw_version}')}",
                files=tuple(changed[:_SHOWN]),
            ))
        donor_files = dist.files
        for old in env.target.by_name().get(name, []):
            moved = _relocated_here(dist, old, env.donor.interpreter.prefix, env.target.interpreter.prefix,
                                    env.target.interpreter.minor)
            changed, _ = _drifted(old, target_skip | moved)
            if changed:  # bytes the donor has too (its drift, said above) are not the target's edit: apply keeps them
                theirs = old.files
                changed = [p for p in changed if donor_files.get(p) is None or donor_files[p].hash != theirs[p].hash]
            if changed and old.hashed:
                out.append(Finding(
                    code="record-drift", severity="warning", dists=(name,),
                    message=f"{describe(old)} on the target: {count(len(changed), 'file')} {agree(len(changed), 'differs from its', 'differ from their')} "
                            f"RECORD hash (local edits); apply replaces {agree(len(changed), 'it', 'them')} with the "
                            f"donor's: {', '.join(changed[:_SHOWN])}",
                    hint=f"to keep an edit, declare it as a patch in {env.manifest}",
                    files=tuple(changed[:_SHOWN]),
                ))
    return out
