"""The planner: ``plan(manifest, donor, target, patch_files) -> Plan`` (pure core).

For each donor distribution the overlay selects, compare it with the target's and
decide the action (see :data:`transplant.core.plan.DIST_ACTIONS`) and exactly which files
move: a file is copied only when the target lacks it or its content differs; files of
the target's old version that the new one lacks are removed, unless another
distribution that stays also lists them. Patch files win over the overlay's copy of the
same path. Then the compatibility checks (:mod:`transplant.core.findings`) run on the
environment as it will be after apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import shlex
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from operator import attrgetter

from packaging.utils import NormalizedName

from transplant.core.units import agree, count
from transplant.remote._common import record_hash  # RECORD's hash form, one definition
from transplant.core.elf_facts import ElfReport
from transplant.core.findings import EnvironmentAfter, compatibility_findings
from transplant.core.closure import Closure, closure_findings, expand, expanded
from transplant.core.cuda import cuda_variant, describe_variant
from transplant.core.inventory import Distribution, FileEntry, Inventory, inside_path, link_escapes, newest, protected_path
from transplant.core.manifest import Manifest
from transplant.core.plan import Change, FileCopy, Finding, Plan, Side
from transplant.core.rules.interpreter import minor_blockers
from transplant.core.rules.venvfiles import rewritten_head

__all__ = ["PatchFile", "plan", "selected_names", "pyc_source", "patch_destination"]


@dataclass(frozen=True, kw_only=True)
class PatchFile:
    """One patch file as read on the controller.

    :ivar local: path relative to the manifest's folder.
    :ivar dest: POSIX path relative to the target's site-packages.
    :ivar hash: ``sha256=<urlsafe b64>``; :ivar size: bytes.
    """

    local: str
    dest: str
    hash: str
    size: int


def selected_names(overlay: Sequence[str], inventory: Inventory) -> list[NormalizedName]:
    """Normalised names of ``inventory``'s distributions matched by any overlay pattern, sorted."""
    return sorted({d.name for d in inventory.distributions if any(fnmatchcase(d.name, p) for p in overlay)})


def _side(label: str, host: str, inv: Inventory) -> Side:
    return Side(label=label, host=host, venv=inv.interpreter.prefix, fingerprint=inv.fingerprint,
                hostname=inv.hostname)


def _version_action(new: Distribution, old: Distribution) -> str:
    if new.version is None or old.version is None:
        return "refresh" if new.raw_version == old.raw_version else "upgrade"
    if new.version == old.version:
        return "refresh"
    if new.version.public == old.version.public:
        return "rebuild"
    return "upgrade" if new.version > old.version else "downgrade"


def _reason(action: str, new: Distribution, old: Distribution | None, copies: int, same: int) -> str:
    if old is None:
        return f"not on the target; {count(copies, 'file')} to copy"
    if action == "keep":
        return f"same version, all {count(same, 'file')} identical"
    if action == "rebuild":
        was, now = cuda_variant(old.version), cuda_variant(new.version)
        return f"same version, other CUDA build: {describe_variant(was)} -> {describe_variant(now)}"
    if action == "refresh":
        return f"same version, {count(copies, 'file')} differ" if copies != 1 else "same version, 1 file differs"
    return f"{old.raw_version} -> {new.raw_version}"


def pyc_source(path: str) -> str | None:
    """The source of a bytecode file: ``a/__pycache__/b.cpython-311.pyc`` -> ``a/b.py``; None otherwise.

    Bytecode is derived data (PEP 3147): its header records the source's mtime, so the
    same source installed at two times gives two different ``.pyc`` files. The planner
    copies a ``.pyc`` only with its source; a target ``.pyc`` whose source is identical
    stays, valid for that source.
    """
    head, sep, name = path.rpartition("/__pycache__/")
    if not sep or not name.endswith(".pyc"):
        return None
    module = name.split(".", 1)[0]
    return f"{head}/{module}.py"


def _same(donor_file: FileEntry, target_file: FileEntry | None) -> bool:
    if target_file is None or not target_file.exists:
        return False
    return donor_file.content is not None and donor_file.content == target_file.content


def _distribution_change(
    name: NormalizedName,
    new: Distribution,
    olds: list[Distribution],
    patched: set[str],
    owned_elsewhere: set[str],
    known: dict[str, FileEntry],
    findings: list[Finding],
    prefixes: tuple[str, str] = ("", ""),
    leave: frozenset[str] = frozenset(),
    target_minor: str | None = None,
) -> Change:
    old = newest(olds) if olds else None
    if new.record is None:
        findings.append(Finding(
            code="record-missing", severity="error", dists=(name,),
            message=f"{new.display_name} {new.raw_version} on the donor has no readable RECORD (missing, a symlink, "
                    f"or not CSV), so its files are unknown; it is not moved and the target's copy stays",
            hint=_reinstall_on_donor(new),
        ))
        return Change(kind="distribution", name=name, action="keep", reason="not moved: no readable RECORD on the donor",
                      from_version=old.raw_version if old else None, to_version=new.raw_version)
    target_files: dict[str, FileEntry] = {}
    for o in olds:
        target_files.update(o.files)
    copies: list[FileCopy] = []
    same = 0
    missing: list[str] = []
    compiled: list[tuple[str, str, int | None, str]] = []  # (bytecode, its source, size, content)
    unsafe = [e.record_path for e in new.record or () if e.path is None and not e.error]
    moved_links = {p: _relinked(e.symlink, p, prefixes) for p, e in new.files.items() if e.symlink is not None}
    unsafe += [f"{p} -> {e.symlink}" for p, e in new.files.items() if e.symlink is not None
               and link_escapes(p, e.symlink) and moved_links[p] is None]
    protected = [p for p in new.files if protected_path(p)]  # one test per path, kept for the loop below
    unsafe += [f"{p} (part of the venv itself)" for p in protected]
    if unsafe:
        findings.append(Finding(
            code="unsafe-path", severity="error", dists=(name,),
            message=f"{new.display_name} {new.raw_version} on the donor lists {count(len(unsafe), 'path')} that {agree(len(unsafe), 'leaves', 'leave')} the "
                    f"venv (RECORD rows or symlinks); they are never copied",
            hint=_reinstall_on_donor(new),
            files=tuple(sorted(unsafe)[:20]),
        ))
    broken = [f"{e.record_path}: {e.error}" for e in new.record or () if e.error]
    record_path = f"{new.dist_info}/RECORD"
    own_record: FileEntry | None = None  # decided once the scripts apply rewrites are known
    relocated: list[str] = []
    files, venv_own = new.files, set(protected)
    for path in sorted(files):  # the keys alone: sorting (path, entry) pairs compares tuples
        entry = files[path]
        if path in patched or entry.error or path in venv_own or path in leave:
            continue
        if path == record_path and entry.exists and entry.record_identity is not None:
            own_record = entry
            continue
        rewritten: FileCopy | None = None
        if entry.symlink is not None and link_escapes(path, entry.symlink):
            relinked = moved_links.get(path)
            if relinked is None:
                continue
            rewritten = FileCopy(path=path, size=None, hash=f"symlink:{relinked}", link=relinked)
        elif not entry.exists or (content := entry.content) is None:
            missing.append(path)
            continue
        elif entry.head is not None and (head := rewritten_head(entry.head, *prefixes, target_minor)) is not None:
            rewritten = FileCopy(path=path, size=entry.size, hash=content, head=head, body_hash=entry.body_hash)
        if rewritten is not None:  # arrives changed for the target: compare what it will be
            if rewritten.head is not None:
                relocated.append(path)
            present = target_files.get(path) or known.get(path)
            there = None if present is None or not present.exists else (
                present.script_identity if rewritten.head is not None else present.content)
            if there == rewritten.identity:
                same += 1
            else:
                copies.append(rewritten)
            continue
        present = target_files.get(path) or known.get(path)  # _same, inline: 66,000 calls on the real pair
        if present is not None and present.exists and content == present.content:
            same += 1
            continue
        assert content is not None  # bound and checked above: a rewritten copy went on at "continue"
        if path.endswith(".pyc") and (source_path := pyc_source(path)) is not None:  # a name not ending so is no bytecode
            compiled.append((path, source_path, entry.size, content))
            continue
        copies.append(FileCopy.plain(path, entry.size, content))
    if own_record is not None:
        record_copy = _record_copy(own_record, relocated, {c.path for c in copies},
                                   lambda p: target_files.get(p) or known.get(p))
        if record_copy is None:
            same += 1
        else:
            copies.append(record_copy)
    copied = {c.path for c in copies}
    for path, source, size, content in compiled:
        present = target_files.get(source) or known.get(source)
        if source in copied or source not in new.files or present is None or not present.exists:
            copies.append(FileCopy.plain(path, size, content))
        else:
            same += 1
    copies.sort(key=attrgetter("path"))
    if missing or broken:
        findings.append(Finding(
            code="record-drift", severity="warning", dists=(name,),
            message=f"{new.display_name} {new.raw_version}: RECORD lists "
                    f"{count(len(missing) + len(broken), 'entry', 'entries')} the donor does not have as regular "
                    f"files (or could not read); {agree(len(missing) + len(broken), 'it is', 'they are')} not copied",
            hint=f"reinstall it on the donor: <donor venv>/bin/python -m pip install --force-reinstall "
                 f"{shlex.quote(f'{new.display_name}=={new.raw_version}')}",
            files=tuple((broken + missing)[:20]),
        ))
    # kept: in files, patched or owned_elsewhere, three lookups (their union copied every staying path per change)
    remove = sorted({p for p, e in target_files.items() if e.exists and not e.error
                     and p not in files and p not in patched and p not in owned_elsewhere}
                    | {p for p in _stale_dist_info(olds, new)
                       if p not in files and p not in patched and p not in owned_elsewhere})
    refused = [p for p in remove if protected_path(p)]
    if refused:
        findings.append(_protected_finding(name, olds, refused))
        remove = [p for p in remove if not protected_path(p)]
    if old is None:
        action = "add"
    elif not copies and not remove:
        action = "keep"
    else:
        action = _version_action(new, old)
    return Change(
        kind="distribution", name=name, action=action,
        reason=_reason(action, new, old, len(copies), same),
        from_version=old.raw_version if old else None, to_version=new.raw_version,
        copy=tuple(copies), remove=tuple(remove), dist_info=new.dist_info, unchanged=same,
    )


def _record_copy(record: FileEntry, relocated: list[str], copied: set[str],
                 target: Callable[[str], FileEntry | None]) -> FileCopy | None:
    """The copy of a distribution's RECORD, or None when the target's is already what apply leaves.

    Without console scripts apply rewrites (``relocated``, venv-relative), RECORD is an
    ordinary file: copied verbatim unless the target's has the same hash. With them, apply
    sets their rows to the files as written on the target (pip's rule for the scripts it
    generates: a RECORD row holds the file's own sha256 and size), so the target's RECORD
    is compared by its normalised identity (rows with the hash and size of those under
    the scripts folder blanked, :attr:`FileEntry.record_identity`): it stays when that
    identity equals the donor's, none of those scripts is copied now, and each one's row
    on the target already holds the hash and size of the target's file.

    :param record: the donor's RECORD entry (hashed, ``record_identity`` set).
    :param copied: paths this change copies; :param target: the target's file at a
        venv-relative path, or None when it has none.
    """
    if not relocated:
        if _same(record, target(record.path or "")):
            return None
        return FileCopy(path=record.path or "", size=record.size, hash=record.content or "")
    wanted = FileCopy(path=record.path or "", size=record.size, hash=record.content or "",
                      record_identity=record.record_identity, record_scripts=tuple(sorted(relocated)))
    present = target(wanted.path)

    def row_right(path: str) -> bool:
        entry = target(path)
        return (entry is not None and entry.exists and entry.hash is not None
                and (entry.record_hash, entry.record_size) == (entry.hash, entry.size))

    if (present is not None and present.exists and present.record_identity == wanted.identity
            and not copied.intersection(relocated) and all(row_right(p) for p in relocated)):
        return None
    return wanted


def _reinstall_on_donor(dist: Distribution) -> str:
    """The hint for a donor distribution whose files cannot be known or trusted: reinstall it
    from its wheel (pip's ``--force-reinstall`` rewrites its files and RECORD)."""
    return (f"reinstall it on the donor from its wheel: <donor venv>/bin/python -m pip install --force-reinstall "
            f"{shlex.quote(f'{dist.display_name}=={dist.raw_version}')}")


def _relinked(link: str | None, path: str, prefixes: tuple[str, str]) -> str | None:
    """The target an absolute symlink into the donor's prefix gets on the target (the same
    path under the target's prefix), when that stays inside the venv; else None."""
    donor_prefix, target_prefix = prefixes
    if not link or not donor_prefix or not link.startswith(donor_prefix + "/"):
        return None
    inside = inside_path(link[len(donor_prefix) + 1:])
    return f"{target_prefix}/{inside}" if inside is not None else None


def _stale_dist_info(olds: list[Distribution], new: Distribution | None) -> list[str]:
    """Files of the target's dist-info folders that apply must clear so one folder remains
    (``duplicate-dist-info``): every old folder other than the donor's, by its listing on disk."""
    return [f"{o.dist_info}/{n}" for o in olds if new is None or o.dist_info != new.dist_info for n in o.listing]


def _protected_finding(name: NormalizedName, olds: list[Distribution], paths: list[str]) -> Finding:
    old = newest(olds)
    return Finding(
        code="unsafe-path", severity="error", dists=(name,),
        message=f"{old.display_name} {old.raw_version} on the target lists {count(len(paths), 'file')} of the venv itself "
                f"in its RECORD ({', '.join(paths[:5])}); they are never removed",
        hint=f"repair its RECORD on the target: {shlex.quote(old.dist_info + '/RECORD')} must not list them "
             f"(or reinstall it: <target venv>/bin/python -m pip install --force-reinstall --no-deps "
             f"{shlex.quote(f'{old.display_name}=={old.raw_version}')})",
        files=tuple(paths[:20]),
    )


def _removal(name: NormalizedName, olds: list[Distribution], owned_elsewhere: set[str],
             findings: list[Finding]) -> Change:
    """The change that uninstalls a target distribution named in the manifest's ``remove`` list."""
    files: set[str] = set()
    for o in olds:
        files.update(p for p, e in o.files.items() if e.exists and not e.error and p not in owned_elsewhere)
    files.update(p for p in _stale_dist_info(olds, None) if p not in owned_elsewhere)
    refused = sorted(p for p in files if protected_path(p))
    if refused:
        findings.append(_protected_finding(name, olds, refused))
        files -= set(refused)
    old = newest(olds)
    return Change(kind="distribution", name=name, action="remove",
                  reason=f"named in remove:; {count(len(files), 'file')} to delete",
                  from_version=old.raw_version, to_version=None, remove=tuple(sorted(files)))


def patch_destination(patch: PatchFile, target: Inventory) -> str:
    """The venv-relative path a patch file goes to on the target."""
    return f"{target.site_packages}/{patch.dest}"


def _patch_changes(patches: Sequence[PatchFile], target: Inventory) -> list[Change]:
    out = []
    for p in sorted(patches, key=lambda p: p.dest):
        dest = patch_destination(p, target)
        current = target.files.get(dest)
        if current is not None and current.exists and current.content == p.hash:
            out.append(Change(kind="patch", name=dest, action="keep", reason=f"identical to {p.local}",
                              unchanged=1))
            continue
        action = "replace" if current is not None and current.exists else "add"
        reason = f"from {p.local}" + (" (content differs)" if action == "replace" else "")
        out.append(Change(kind="patch", name=dest, action=action, reason=reason,
                          copy=(FileCopy(path=dest, size=p.size, hash=p.hash, source="patch", local=p.local),)))
    return out


def _overlay_findings(manifest: Manifest, donor: Inventory, target: Inventory) -> list[Finding]:
    findings = []
    donor_names = {d.name for d in donor.distributions}
    target_names = {d.name for d in target.distributions}
    for pattern in manifest.overlay:
        if any(fnmatchcase(n, pattern) for n in donor_names):
            continue
        is_glob = any(ch in pattern for ch in "*?[")
        on_target = sorted(n for n in target_names if fnmatchcase(n, pattern))
        where = f"; the target has {', '.join(on_target)}" if on_target else ""
        # a mistyped name: the names of either side it is one or two keystrokes from (the donor's
        # first, what an overlay can bring; a target-only one says so, as the overlay cannot bring it)
        close = [] if is_glob else [n for n in sorted(donor_names) if _typo_of(pattern, n)] + \
            [f"{n} (on the target only)" for n in sorted(target_names - donor_names) if _typo_of(pattern, n)]
        guess = f"; did you mean {' or '.join(close)}?" if close else ""
        findings.append(Finding(
            # the entry itself when the target has nothing it matches: accept: [{dists: [ENTRY]}] can name it
            code="overlay-no-match", severity="warning" if is_glob else "error", dists=tuple(on_target) or (pattern,),
            message=f"overlay entry {pattern!r} matches no distribution on the donor {donor.label}{where}{guess}",
            hint=f"remove {pattern!r} from overlay in {manifest.path}, or fix its spelling "
                 f"(names are compared after PEP 503 normalisation)",
        ))
    for name in sorted(target_names - donor_names):
        patterns = [p for p in manifest.overlay if fnmatchcase(name, p)]
        if patterns and not any(fnmatchcase(name, p) for p in manifest.remove):
            findings.append(Finding(
                code="overlay-target-only", severity="info", dists=(name,),
                message=f"{name} matches overlay {patterns[0]!r} but the donor does not have it; "
                        f"it stays on the target as it is",
                hint=f"if it should go: {shlex.quote(target.interpreter.prefix + '/bin/python')} -m pip uninstall {name}",
            ))
    return findings


def _unmatched_removals(manifest: Manifest, removed: list[NormalizedName], overlaid: list[NormalizedName],
                        target: Inventory) -> list[Finding]:
    """``remove-no-match``: a ``remove`` entry that uninstalls nothing. A warning when it looks
    like a typo (:func:`_typo_of` a name the target has) or the overlay brings that exact name;
    otherwise info: the distribution is already absent (an earlier apply removed it, or a glob
    matches only names the overlay brings), and there is nothing to do."""
    out = []
    names = sorted(d.name for d in target.distributions)
    for pattern in manifest.remove:
        if any(fnmatchcase(n, pattern) for n in removed):
            continue
        moved = [n for n in overlaid if fnmatchcase(n, pattern)]
        is_glob = any(ch in pattern for ch in "*?[")
        close = [] if is_glob or moved else [n for n in names if _typo_of(pattern, n)]
        if moved and is_glob:  # a glob that also matches a name the donor brings: as meant
            message = f"remove entry {pattern!r} removes nothing on the target; it matches {', '.join(moved)}, " \
                      f"which the overlay brings from the donor"
            hint = "nothing to do"
        elif moved:
            message = f"remove entry {pattern!r} removes nothing: the overlay brings {', '.join(moved)} from the donor"
            hint = (f"either drop {pattern!r} from remove: in {manifest.path} (the donor's {', '.join(moved)} "
                    f"arrives), or drop {', '.join(moved)} from overlay: (the target's is removed)")
        elif close:
            message = (f"remove entry {pattern!r} matches no distribution on the target; did you mean "
                       f"{' or '.join(close)}?")
            hint = f"fix its spelling in remove: in {manifest.path} (names are compared after PEP 503 normalisation)"
        else:
            message = (f"remove entry {pattern!r} matches no distribution on the target: it is already absent "
                       f"(removed by an earlier apply, or never installed)")
            hint = "nothing to do; drop the entry once no target needs it"
        out.append(Finding(
            code="remove-no-match", severity="warning" if (moved and not is_glob) or close else "info",
            dists=tuple(moved or close), message=message, hint=hint,
        ))
    return out


def _namespace_marker(path: str, entry: FileEntry, incoming: Mapping[str, tuple[str, str | None]]) -> bool:
    """Whether a shared path is an empty ``__init__.py`` on both sides: the marker several
    distributions of one namespace ship alike (``nvidia/__init__.py`` in older nvidia-*
    wheels); rewriting it changes nothing and it belongs to no one distribution."""
    return path.rsplit("/", 1)[-1] == "__init__.py" and entry.record_hash == _EMPTY == incoming[path][1]


#: RECORD's hash of an empty file (``sha256=`` + urlsafe base64 of sha256(b""), unpadded).
_EMPTY = record_hash(b"")


def _typo_of(typed: str, name: str) -> bool:
    """Whether ``typed`` looks like a misspelling of ``name``: lengths within one, and at most
    two single-character edits, a swap of neighbours counting as one (optimal string alignment
    distance). A renamed distribution (``sgl-kernel`` / ``sglang-kernel``) or a sibling
    (``torchao`` / ``torch``) differs by more, so an absent name is not taken for a typo."""
    if typed == name or abs(len(typed) - len(name)) > 1:
        return False
    prev2: list[int] = []
    prev = list(range(len(name) + 1))
    for i, a in enumerate(typed, 1):
        row = [i] + [0] * len(name)
        for j, b in enumerate(name, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a != b))
            if i > 1 and j > 1 and a == name[j - 2] and typed[i - 2] == b:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1] <= 2


def _owner_conflicts(manifest: Manifest, names: list[NormalizedName], removed: list[NormalizedName],
                     donor: Inventory, target: Inventory) -> list[Finding]:
    """``file-owner-conflict``: a target distribution that stays and an overlaid one list the
    same files in their RECORDs (a renamed distribution: sgl-kernel -> sglang-kernel, which
    write the same ``sgl_kernel/*.so``). After apply the staying RECORD would claim the
    incoming files, its leftovers would sit in the incoming package, and uninstalling it
    would delete them. Info when the donor holds both owners of those files too (what the
    donor runs, such as a shared namespace ``__init__.py``); else an error that no
    ``accept:`` or ``--force`` lets through (:data:`transplant.core.plan.UNFORCEABLE`)."""
    donor_by = donor.by_name()
    incoming: dict[str, tuple[NormalizedName, str | None]] = {}
    for n in names:
        for path, entry in newest(donor_by[n]).files.items():
            incoming.setdefault(path, (n, entry.record_hash))
    donor_latest = donor.latest()
    out = []
    for name, dists in sorted(target.by_name().items()):
        if name in names or name in removed:
            continue
        stay = newest(dists)
        shared = sorted(p for p, e in stay.files.items() if p in incoming and not _namespace_marker(p, e, incoming))
        if not shared:
            continue
        theirs = donor_latest.get(name)
        donor_too = theirs is not None and all(p in theirs.files for p in shared)
        owners = sorted({incoming[p][0] for p in shared})
        folders = sorted({p.rsplit("/", 1)[0] for p in shared})
        out.append(Finding(
            code="file-owner-conflict", severity="info" if donor_too else "error", dists=(name, *owners),
            message=f"{stay.display_name} {stay.raw_version} stays on the target and {', '.join(owners)} arrives, "
                    f"and both RECORDs list the same {count(len(shared), 'file')} (in {', '.join(folders[:3])}"
                    f"{' ...' if len(folders) > 3 else ''})"
                    + ("; the donor holds both owners of them too" if donor_too else
                       f"; after apply {stay.display_name}'s RECORD would claim files it no longer wrote, its "
                       f"own leftovers would stay inside the package, and uninstalling it would delete "
                       f"{', '.join(owners)}'s files (a renamed distribution?)"),
            hint="nothing to do" if donor_too else
                 f"add {name!r} to remove: in {manifest.path} ({', '.join(owners)} replaces it; the donor "
                 f"{'has no ' + repr(name) if theirs is None else 'has it with other files'}); the other fix: "
                 # the other fix is worded without "add ... to": plan's snippet and init take those words as edits
                 + (f"overlay the donor's build of {name!r} too (its RECORD does not list those files)"
                    if theirs is not None else f"leave {', '.join(owners)} out of overlay: (the target keeps {name})")
                 + "; this cannot be accepted or forced",
            files=tuple(shared[:10]),
        ))
    return out


def _written_by_others(names: list[NormalizedName], removed: list[NormalizedName], donor: Inventory,
                       target: Inventory) -> dict[NormalizedName, frozenset[str]]:
    """{overlaid name: paths it lists that it does not carry}: a file that two distributions'
    RECORDs list (a top-level ``build_backend.py`` both torch-c-dlpack-ext and flashinfer-python
    install) and that, on both sides, the other one wrote last: on the donor its bytes match
    the RECORD row of another donor distribution (not this one's), and on the target those of
    a distribution that stays (its RECORD row). Copying it would write a staying distribution's
    file with bytes its RECORD does not list (the donor's other version of it) while the
    overlaid distribution's own bytes are on neither side. Only files hashed on both sides count.
    """
    donor_by = donor.by_name()
    # Only a file whose donor bytes differ from its own RECORD row can qualify: few or none, so the
    # other distributions' rows are looked up for those paths alone (not every file of both venvs).
    candidates: dict[NormalizedName, list[tuple[str, str]]] = {}
    for name in names:
        new = newest(donor_by[name])
        found = [(path, content) for path, entry in new.files.items()
                 if (content := entry.content) is not None and content != entry.record_hash]
        if found:
            candidates[name] = found
    if not candidates:
        return {}
    paths = {path for found in candidates.values() for path, _ in found}
    moving = set(names) | set(removed)
    on_target: dict[str, str] = {}
    for dist in target.distributions:  # in order: the last distribution listing a path wins
        for path, entry in dist.files.items():
            if path in paths and entry.content is not None:
                on_target[path] = entry.content
    staying_wrote = {path for dist in target.distributions if dist.name not in moving
                     for path, entry in dist.files.items()
                     if path in on_target and entry.record_hash is not None and on_target[path] == entry.record_hash}
    donor_rows: dict[str, set[tuple[str, str]]] = {}
    for dist in donor.distributions:
        for path, entry in dist.files.items():
            if path in staying_wrote and entry.record_hash is not None:
                donor_rows.setdefault(path, set()).add((dist.name, entry.record_hash))
    out: dict[NormalizedName, frozenset[str]] = {}
    for name, found in candidates.items():
        left = frozenset(path for path, content in found if path in staying_wrote
                         and any(other != name and digest == content for other, digest in donor_rows.get(path, ())))
        if left:
            out[name] = left
    return out


def _accept(manifest: Manifest, findings: list[Finding]) -> list[Finding]:
    """Mark the findings the manifest's ``accept`` list names (with its reason); an entry
    that accepts nothing is reported (``accept-unused``, info), so a stale one is seen."""
    out, used = [], set()
    for f in findings:
        index = next((i for i, a in enumerate(manifest.accept) if a.matches(f.code, f.dists)), None)
        if index is not None:
            used.add(index)
        out.append(f if index is None else replace(f, accepted=manifest.accept[index].reason))
    for i, a in enumerate(manifest.accept):
        if i not in used:
            out.append(Finding(
                code="accept-unused", severity="info", dists=tuple(a.dists),
                message=f"accept[{i}] ({a.code}{' for ' + ', '.join(a.dists) if a.dists else ''}) matches no finding "
                        f"of this plan",
                hint=f"remove accept[{i}] from {manifest.path} if the fault is gone",
            ))
    return out


def _minor_move(donor: Inventory, target: Inventory) -> tuple[str, str] | None:
    """(the donor's site-packages, the target's) when both are CPython of two minors whose
    site-packages folders differ (``lib/python3.13/site-packages``, ``lib/python3.11/...``),
    both in the venv; else None (one minor: every file keeps its venv-relative path)."""
    d, t = donor.interpreter, target.interpreter
    if d.implementation != "cpython" or t.implementation != "cpython" or d.minor == t.minor:
        return None
    sites = (donor.site_packages, target.site_packages)
    if sites[0] == sites[1] or any(inside_path(s) != s for s in sites):
        return None
    return sites


def _relocated(donor: Inventory, target: Inventory, donor_site: str, target_site: str) -> tuple[Inventory, frozenset[str]]:
    """The donor's inventory as the target will hold it: each distribution that can move to the
    target's Python minor (:func:`minor_blockers`: pure Python, its files in site-packages or in
    no folder of the donor's minor) with its dist-info folder and the files under ``donor_site``
    keyed by the same path under ``target_site`` (its RECORD rows, relative to site-packages,
    are unchanged), and the generated modules' stamps (``gencode``) of its files with them; the others
    as they are. Every rule then compares like with like (a moved file with the target's file at that path).

    :returns: (that inventory, the names moved)."""
    head, moved, dists = donor_site + "/", set(), []
    paths: set[str] = set()
    for dist in donor.distributions:
        if minor_blockers(dist, donor_site, donor.interpreter.minor, target.interpreter):
            dists.append(dist)
            continue
        moved.add(dist.name)
        paths.update(e.path for e in dist.record or () if e.path is not None and e.path.startswith(head))
        record = None if dist.record is None else tuple(
            replace(e, path=target_site + e.path[len(donor_site):]) if e.path is not None and e.path.startswith(head)
            else e for e in dist.record)
        dists.append(replace(dist, dist_info=target_site + dist.dist_info[len(donor_site):], record=record))
    if not moved:
        return donor, frozenset()
    # the generated modules' stamps are keyed by path too: a moved file's stamp goes with it
    gencode = None if donor.gencode is None else {
        (target_site + p[len(donor_site):] if p in paths else p): stamp for p, stamp in donor.gencode.items()}
    return replace(donor, distributions=tuple(dists), gencode=gencode), frozenset(moved)


def _read_from(copy: FileCopy, donor_site: str, target_site: str) -> FileCopy:
    """``copy`` with ``donor_path`` set where it lands in the target's site-packages, moved there
    from the donor's (:func:`_relocated`); a file outside site-packages (a console script) keeps
    its one path."""
    if copy.source != "donor" or not copy.path.startswith(target_site + "/"):
        return copy
    return replace(copy, donor_path=donor_site + copy.path[len(target_site):])


def _not_a_venv(manifest: Manifest, target: Inventory) -> list[Finding]:
    """``target-not-a-venv``: the target prefix has no ``pyvenv.cfg`` (PEP 405: a venv is the folder
    holding one), so it is a Python installation itself (pyenv's, the system's), which other
    programs share: an error apply refuses even with ``--force`` (:data:`UNFORCEABLE`), a warning
    where the manifest's target says ``allow_shared_interpreter: true``."""
    if target.interpreter.pyvenv_cfg is not None:
        return []
    where = f"{manifest.target.host}:{target.interpreter.prefix}"
    if manifest.target.allow_shared_interpreter:
        return [Finding(code="target-not-a-venv", severity="warning", dists=(),
                        message=f"{where} is not a venv (no pyvenv.cfg): apply writes into a Python installation "
                                f"other programs share, as target.allow_shared_interpreter allows",
                        hint="make a venv for the stack instead: python3 -m venv PATH", files=("pyvenv.cfg",))]
    return [Finding(code="target-not-a-venv", severity="error", dists=(),
                    message=f"{where} is not a venv (no pyvenv.cfg): it is a Python installation itself (pyenv's, "
                            f"the system's), which other programs share; apply does not write into it, not even "
                            f"with --force",
                    hint=f"make a venv and name it as the target: python3 -m venv {target.interpreter.prefix}-venv; "
                         f"or, to write into this installation anyway, add allow_shared_interpreter: true to the "
                         f"manifest's target", files=("pyvenv.cfg",))]


def plan(manifest: Manifest, donor: Inventory, target: Inventory, patches: Sequence[PatchFile] = (), *,
         donor_elf: ElfReport | None = None, target_elf: ElfReport | None = None,
         closure: Closure | None = None) -> Plan:
    """Compute what apply must do to make ``target`` hold ``donor``'s overlay set and patches.

    :param manifest: the validated manifest (overlay patterns, labels for messages); each
        distribution its closures pull in says in its change which chain needs it.
    :param donor: the donor's inventory, with the overlaid distributions hashed.
    :param target: the target's inventory, with the overlaid distributions and the patch
        destinations hashed.
    :param patches: the patch files read on the controller, destinations already made
        venv-relative.
    :param donor_elf: ELF facts of the donor's overlaid shared objects; :param
        target_elf: of the target's others (see :mod:`transplant.pipeline.gather`); None skips
        the rules that read binaries.
    :param closure: the manifest's closures as the facts were gathered for them
        (``Facts.closure``: :func:`transplant.core.closure.expand`), so they are not computed
        twice; None computes them here from ``donor`` and ``target`` (nothing, for a manifest
        without closures).
    :returns: a :class:`Plan` whose changes are sorted (distributions by name, then
        patches by path) and whose findings are sorted by (severity, code, dists).
    """
    manifest, found = (expanded(manifest, closure), closure) if closure is not None else \
        expand(manifest, donor, target)
    findings = _overlay_findings(manifest, donor, target)
    if found is not None:
        findings += closure_findings(found, manifest.path)
    needed_by = {p.name: p.needed_by for p in (found.pulled if found is not None else ())}
    moves = _minor_move(donor, target)
    relocated: frozenset[str] = frozenset()
    if moves is not None:  # another Python minor: pure-Python distributions move to the target's site-packages
        donor, relocated = _relocated(donor, target, *moves)
    donor_by, target_by = donor.by_name(), target.by_name()
    names = selected_names(manifest.overlay, donor)
    removed = [n for n in selected_names(manifest.remove, target) if n not in names]
    findings += _unmatched_removals(manifest, removed, names, target)
    findings += _owner_conflicts(manifest, names, removed, donor, target)
    findings += _not_a_venv(manifest, target)
    patched = {patch_destination(p, target) for p in patches}
    owned_elsewhere: set[str] = set()
    known: dict[str, FileEntry] = {}
    for dist in target.distributions:
        known.update(dist.files)
        if dist.name not in names and dist.name not in removed:
            owned_elsewhere.update(dist.files)
    changes = []
    after: dict[str, Distribution] = target.latest()
    prefixes = (donor.interpreter.prefix, target.interpreter.prefix)
    leave = _written_by_others(names, removed, donor, target)
    for name in names:
        new = newest(donor_by[name])
        change = _distribution_change(name, new, target_by.get(name, []), patched, owned_elsewhere, known,
                                      findings, prefixes, leave.get(name, frozenset()), target.interpreter.minor)
        if moves is not None and name in relocated:  # the donor side reads each moved file where the donor has it
            change = replace(change, copy=tuple(_read_from(c, *moves) for c in change.copy))
        if name in needed_by:
            change = replace(change, reason=f"{change.reason}; needed by {needed_by[name]}")
        changes.append(change)
        after[name] = new
    arriving = frozenset(p for n in names for p in after[n].files)  # built once: the rules use it too
    # one union for all the removed distributions (it copies every staying file's path), none without any
    staying = owned_elsewhere | patched | arriving if removed else set()
    for name in removed:
        changes.append(_removal(name, target_by[name], staying, findings))
        del after[name]
    for folder in target.outside_folders:  # importable from outside the venv where the venv lacks the name
        for dist in target.outside:
            if dist.dist_info.startswith(folder.rstrip("/") + "/"):
                after.setdefault(dist.name, dist)
    changes.sort(key=lambda c: c.name)
    changes.extend(_patch_changes(patches, target))
    env = EnvironmentAfter(donor=donor, target=target, overlaid=tuple(names), after=after, removed=tuple(removed),
                           patch_dests=frozenset(p.dest for p in patches), donor_elf=donor_elf, target_elf=target_elf,
                           manifest=manifest.path,
                           changed=frozenset(c.name for c in changes if c.kind == "distribution" and not c.is_noop),
                           left=frozenset(p for paths in leave.values() for p in paths), arriving_paths=arriving,
                           relocated=frozenset(n for n in names if n in relocated))
    findings.extend(compatibility_findings(env))
    findings = _accept(manifest, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (order[f.severity], f.code, f.dists, f.message))
    return Plan(
        manifest=manifest.path,
        donor=_side(donor.label, str(manifest.donor.host), donor),  # type: ignore[union-attr]  # a snapshot donor is an Endpoint by now (donor.sources)
        target=_side(target.label, str(manifest.target.host), target),
        changes=tuple(changes),
        findings=tuple(findings),
        hash_patterns=manifest.overlay,
        patch_files=tuple(sorted(patched)),
    )
