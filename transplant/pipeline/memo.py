"""The plan memo (edge): a plan with nothing changed on either venv since the last one is not made again.

A full plan asks both probes for their *inputs* (every file and folder whose content or listing
the probe read or stat'ed, with its lstat identity, and the non-file facts it reports: see
``inputs`` in :mod:`transplant.remote.probe`) and keeps, on the controller, the plan's result with
both digests in ``<state>/plan-memo/<key>.memo`` (its JSON, zlib-compressed). The key (:func:`memo_key`) is everything else a
plan depends on: the donor (a live host and venv, or a snapshot by its id: immutable), the target,
the manifest (its text and its effective form), the patch files' contents, transplant's own code
(every file of the installed package, pyelftools' and packaging's versions) and the controller
settings that change a plan (``TRANSPLANT_HASH_CACHE``).

The next plan with the same key first asks both hosts for their digest, side by side (the probe's
``fingerprint`` mode: one lstat per input, no file read); when both match it returns the kept
plan, else it plans afresh and keeps that. The processes asked are usually the probes the ``plan``
command started as it began (:func:`transplant.cli.warm.connect_early`), waiting for a request.
What the ELF reads and symbol lookups read are files among the probe's inputs (RECORD rows), but
the libstdc++ the target's interpreter loads and the editable installs' source folders lie outside
the venv: they are stat'ed as ``extra`` paths.

Trust: a memo is written only when no input was written within two seconds of the probe's start
or after it (``racy``: a write in the same clock tick leaves an identity unchanged, as git's
index says). An input changed after the probe stat'ed it (while the plan read it, or later) has
another ctime by then, so the next fingerprint differs and the next plan is a full one; the
``extra`` paths, which the probe did not stat, are stat'ed once after the plan under the same
rule. ``TRANSPLANT_PLAN_MEMO=0`` on the controller turns the memo off (every plan is made afresh
and none is kept); ``1`` or unset keeps it on; any other value is refused. ``apply`` reuses a kept plan but
keeps none (and removes it once its transaction committed: :func:`forget`), and says in one line why it plans afresh when it does not reuse one (:func:`recall`'s reason);
its stale-plan check under the lock asks the target's fingerprint again for a kept plan
(:class:`Recalled`'s ``target_inputs``) and probes the target afresh when that differs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import sys
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from transplant.controller.regular_file import NotRegular, read_regular
from transplant.controller.state import default_state_dir, private_folder, refuse_loose
from transplant.core.kept_plan import kept_plan_problems
from transplant.core.manifest import Manifest
from transplant.core.plan import Plan, plan_from_dict, write_plan
from transplant.core.planner import PatchFile
from transplant.donor.sources import DonorSource
from transplant.errors import PlanError, StateError, TransplantError
from transplant.hosts.host import Host
from transplant.hosts.probing import fingerprint

__all__ = ["memo_enabled", "memo_key", "Recalled", "recall", "remember", "forget", "MEMO_SCHEMA"]

MEMO_SCHEMA = "transplant.plan-memo/3"


def memo_enabled() -> bool:
    """Whether plans use the memo: not when the controller's ``TRANSPLANT_PLAN_MEMO`` is ``0``;
    yes when it is ``1`` or unset.

    :raises TransplantError: any other value (``off``, ``false``: one that reads as "off" must not
        quietly leave the memo on).
    """
    value = os.environ.get("TRANSPLANT_PLAN_MEMO", "1")
    if value not in ("0", "1"):
        raise TransplantError(f"environment variable TRANSPLANT_PLAN_MEMO={value!r}: not 0 or 1; nothing was read",
                              hint="TRANSPLANT_PLAN_MEMO=0 plans afresh (the memo off); 1 or unset keeps it on")
    return value == "1"


@cache
def code_identity() -> str:
    """sha256 hex over every file of the installed ``transplant`` package (paths and bytes,
    caches left out), pyelftools', packaging's and the controller Python's versions: a plan made
    by other code is not reused."""
    import elftools
    import packaging

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(f"{sys.version}\0{elftools.__version__}\0{packaging.__version__}\0".encode())
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def memo_key(manifest: Manifest, source: DonorSource, target: Host, patches: Sequence[PatchFile]) -> str | None:
    """sha256 hex of what a plan depends on besides both venvs' contents (the module docstring);
    None when the donor source keeps no plan (its ``memo_identity``: a registry snapshot's).

    :raises OSError: never (an unreadable manifest file counts as empty: its effective form is
        in the key anyway).
    """
    donor = source.memo_identity()
    if donor is None:
        return None
    try:
        text = Path(manifest.path).read_bytes()
    except OSError:
        text = b""
    parts = [MEMO_SCHEMA, donor, f"target {target.label} {manifest.target.venv}", repr(manifest),
             repr(sorted((p.local, p.dest, p.hash, p.size) for p in patches)), code_identity(),
             "hash-cache " + os.environ.get("TRANSPLANT_HASH_CACHE", "1")]
    digest = hashlib.sha256(text)
    for part in parts:
        digest.update(b"\0" + part.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _path(key: str) -> Path:
    return default_state_dir() / "plan-memo" / f"{key[:32]}.memo"


@dataclass(frozen=True)
class Recalled:
    """A kept plan whose venvs did not change: :ivar plan: the plan; :ivar planned_at: when it was
    made (seconds since the epoch); :ivar target_inputs: what the target's fingerprint was asked
    and answered: ``{"paths": packed input paths, "digest", "extra_paths": [absolute paths],
    "extra": digest}`` (apply's stale-plan check asks the same again under the lock)."""

    plan: Plan
    planned_at: float
    target_inputs: dict[str, Any]


def _sides(memo: dict[str, Any], source: DonorSource, target: Host, venv: str) -> list[tuple[Host, str, dict[str, Any]]]:
    sides = [(target, venv, memo["target"])]
    if memo.get("donor") is not None:
        if source.live is None:  # only a live donor's fingerprint is kept: the memo was edited
            raise ValueError("a donor fingerprint kept for a donor that is not live")
        sides.append((source.live, source.venv, memo["donor"]))
    return sides


def _ask(sides: list[tuple[Host, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Both hosts' fingerprints, side by side."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(fingerprint, host, venv, side["paths"], side.get("extra_paths", []))
                   for host, venv, side in sides]
        return [f.result() for f in futures]


def recall(key: str, source: DonorSource, target: Host, venv: str, *, manifest: Manifest,
           patches: Sequence[PatchFile]) -> Recalled | str:
    """The kept plan for ``key`` when both venvs' fingerprints equal those it was kept with;
    else why not, in a few words for one line (``the donor changed since the last plan``): there
    is none kept, it is unreadable, anything differs, or a host does not answer (the full plan
    that follows reports that properly). Costs nothing beyond the fingerprints it asks anyway.

    The memo is trusted no more than a saved plan: it is refused when another user could have
    written it (or a folder it lies in), and its plan when it holds what ``manifest`` does not
    allow (:func:`transplant.core.kept_plan.kept_plan_problems`: another target or donor, a
    distribution the overlay does not select, one ``remove:`` does not name, a patch file not
    the manifest's): an edit after ``plan`` kept it.

    :param manifest: the effective manifest planned (the donor as opened, the target planned against).
    :param patches: its patch files as read now.
    :raises StateError: the memo, the plan-memo folder or the state folder is owned by another
        user or writable by group or others (the hint is the chmod/chown).
    :raises PlanError: the memo's plan holds what the manifest does not allow (the hint removes it).
    """
    path = _path(key)
    refuse_loose(path, "the plan memo")
    try:
        packed = read_regular(path, MAX_MEMO_BYTES)  # a FIFO put there is not waited on
        inflate = zlib.decompressobj()
        text = inflate.decompress(packed, MAX_MEMO_TEXT)
        del packed
        if inflate.unconsumed_tail or not inflate.eof:
            raise ValueError("over the limit, or cut short")
        memo = json.loads(text)
        del text
    except FileNotFoundError:
        return "no plan kept for this manifest (none made yet, or one too recent to keep)"
    except (OSError, ValueError, RecursionError, zlib.error, NotRegular):
        return "the kept plan could not be read"
    if not isinstance(memo, dict) or memo.get("schema") != MEMO_SCHEMA or memo.get("key") != key \
            or not _plausible_time(memo.get("planned_at")):
        return "the kept plan could not be read"
    try:
        sides = _sides(memo, source, target, venv)
        answers = _ask(sides)
    except (TransplantError, OSError):
        return "a venv could not be asked whether it changed"
    except (KeyError, TypeError, ValueError):
        return "the kept plan could not be read"
    for (_, _, side), answer, which in zip(sides, answers, ("target", "donor"), strict=False):
        if answer.get("inputs") != side.get("digest"):
            return f"the {which} changed since the last plan"
        if side.get("extra_paths") and answer.get("extra") != side.get("extra"):
            return f"a file the {which}'s plan read outside the venv changed since the last plan"
    try:
        kept = Recalled(plan_from_dict(memo["plan"], source=str(path)), float(memo["planned_at"]), dict(memo["target"]))
    except (TransplantError, KeyError, TypeError, ValueError):
        return "the kept plan could not be read"
    problems = kept_plan_problems(kept.plan, manifest, patches)
    if problems:
        quoted = shlex.quote(str(path))
        raise PlanError(
            f"{path}: refusing the kept plan of {manifest.path} (the plan memo): it holds what the manifest does "
            f"not allow, so it was changed after plan kept it: " + "; ".join(problems[:5])
            + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "") + "; nothing was changed",
            hint=f"remove it, then plan afresh: rm {quoted} && transplant plan {shlex.quote(manifest.path)}")
    return kept


def remember(key: str, plan: Plan, started: float, *, source: DonorSource, target: Host, venv: str,
             donor_inputs: Any, target_inputs: Any, target_extra: Sequence[str]) -> bool:
    """Keep ``plan`` for ``key`` (atomically: a temporary file renamed over the last one), with
    each probe's digest, when both probes reported trustworthy inputs (``racy`` false). A change
    after the probe stat'ed an input (while the plan read it, or later) gives it another ctime
    (it is older than the racy window), so the next fingerprint differs: nothing is checked
    again here but the ``target_extra`` paths, whose identities the probe did not note (one
    fingerprint of those alone, no input re-stat'ed; not kept when one is as recent as the probe).
    A failure only costs the next plan's speed.

    The plan is written in one walk (:func:`transplant.core.plan.write_plan`) through a zlib
    stream, never held as a dict or a string: the real pair's forward plan (66,700 files to copy)
    costs about 0.5 s to keep and nothing in the controller's peak memory.

    :param started: when the plan's gathering started (seconds since the epoch), shown by the
        next plan that reuses it.
    :param donor_inputs: the donor probe's ``Inventory.inputs``; None for a snapshot donor.
    :param target_inputs: the target probe's.
    :param target_extra: absolute paths on the target the plan read outside the probe's inputs.
    :returns: whether a memo was written.
    """
    wanted = [("target", target_inputs)] + ([("donor", donor_inputs)] if source.live is not None else [])
    if any(not isinstance(i, dict) or i.get("racy") is not False or not isinstance(i.get("paths"), str)
           or not isinstance(i.get("digest"), str) for _, i in wanted):
        return False
    memo: dict[str, Any] = {"schema": MEMO_SCHEMA, "key": key, "planned_at": started, "donor": None}
    for side, inputs in wanted:
        memo[side] = {"paths": inputs["paths"], "digest": inputs["digest"],
                      "extra_paths": sorted(set(target_extra)) if side == "target" else []}
    try:
        answer = fingerprint(target, venv, "", memo["target"]["extra_paths"], since_ns=target_inputs.get("started_ns"))
    except TransplantError:
        return False
    if answer.get("extra_racy") is not False or not isinstance(answer.get("extra"), str):
        return False
    memo["target"]["extra"] = answer["extra"]
    path = _path(key)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        private_folder(path.parent)  # 0700, each folder made (the state folder too): nobody else writes a memo
        if path.parent.is_symlink() or not path.parent.is_dir():
            return False  # the memos live in a real folder of the state folder's own, or nowhere
        refuse_loose(path.parent, "the plan memo's folder")
        # 0600 whatever the umask: a memo others could write would be refused when read
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                               0o600), "wb") as handle:
            packer = zlib.compressobj(1)

            def write(text: str) -> None:
                handle.write(packer.compress(text.encode("ascii")))

            write(json.dumps(memo, separators=(",", ":"))[:-1] + ',"plan":')  # the header object, left open
            write_plan(plan, write)
            write("}")
            handle.write(packer.flush())
        os.replace(temporary, path)
    except (OSError, StateError):
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder, or plan-memo is a file: nothing was written
        return False
    _prune(path.parent)
    return True


def forget(key: str) -> bool:
    """Remove the memo kept for ``key`` (a committed apply changed its target, so its plan can
    only be refused by the next fingerprint, which costs a second on the real pair: without it
    the next plan plans at once). Only a regular file of the memo's own name is removed; any
    error is ignored (the memo is then refused as stale, as before).

    :returns: whether a memo was removed.
    """
    path = _path(key)
    try:
        if path.is_symlink() or not path.is_file():
            return False
        path.unlink()
    except OSError:
        return False
    return True


#: A memo's file name (the first 32 hex digits of its key; ``.json`` was the first form's), and one
#: being written (``.<pid>.tmp``): pruning touches no other name.
_MEMO_NAME = re.compile(r"[0-9a-f]{32}\.(memo|json)(\.[0-9]+\.tmp)?\Z")


def _prune(folder: Path) -> None:
    """Keep the :data:`MAX_MEMOS` newest memos in ``folder`` (the memos of other manifests, targets
    and transplant versions go), and remove what a killed plan left being written (an hour old).
    Only names of :data:`_MEMO_NAME`'s form are looked at; a failure (another plan pruned first)
    is ignored."""
    try:
        names = [p for p in folder.iterdir() if _MEMO_NAME.match(p.name) and p.is_file() and not p.is_symlink()]
        dated = [(p.stat().st_mtime, p) for p in names]
    except OSError:
        return
    now = time.time()
    memos = sorted(((at, p) for at, p in dated if p.suffix != ".tmp"), reverse=True)
    for _at, old in memos[MAX_MEMOS:] + [(at, p) for at, p in dated if p.suffix == ".tmp" and at < now - 3600]:
        try:
            old.unlink(missing_ok=True)
        except OSError:
            pass


def _plausible_time(value: object) -> bool:
    """Whether ``value`` is a memo's ``planned_at``: a finite number of seconds since the epoch
    that ``time.localtime`` can show (1970 to 9999)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value < 253402300800


#: The largest memo file read (bytes, compressed) and the most text it may inflate to: the real
#: pair's forward memo is 33.8 MB of text, 5.0 MB compressed; a file past these is not a memo.
MAX_MEMO_BYTES = 64 << 20
MAX_MEMO_TEXT = 256 << 20


#: How many memos the state folder keeps (the newest; a memo of the first form, ``<key>.json``,
#: counts among them until it is the oldest).
MAX_MEMOS = 16


def planned_when(at: float) -> str:
    """``2026-12-01 22:05:11 UTC``-style local time of a kept plan, for the one line said on reuse."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
