"""The donor's verify results recorded with a snapshot, standing in for a donor that is gone (edge).

verify takes the donor as its reference (:mod:`transplant.verify.runner`): a stage that fails in
the target is run the same way in the donor's venv on its host, and what fails identically there
is what the donor runs, not something this host broke. After a host failure the donor is gone:
``recover`` and every manifest whose donor is a snapshot (``snapshot: ID`` or ``oci://``) have no
host to ask. So :func:`record` runs, when the snapshot is taken, what verify would ask the donor:

* ``stage_imports`` of every import name the manifest's verify block checks (its ``imports``
  and the names of the overlaid distributions, as :func:`transplant.verify.ladder.import_names`
  derives them, less ``skip_imports``);
* ``stage_native`` of every shared object native-load loads (the overlaid distributions'), after
  importing torch where the venv has it, as native-load does;
* ``stage_server_args`` and ``stage_smoke`` with the manifest's settings, where it sets them.

The record (:data:`SCHEMA`) is a key of the snapshot's index document; :func:`recorded_runner`
answers the runner's questions to the donor from it (a subset of a recorded report, or nothing
when the question was not recorded), each answer marked with when it was recorded
(:func:`provenance`: said in every reason that uses it).

Why the record may excuse a failure: it is part of the snapshot, covered by the index's digest,
and comes from where the snapshot's files come from. Whoever can change it can already change
every byte the target gets, so it is trusted exactly as far as the snapshot is; a plan memo or
any other state file never stands in for the donor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeGuard

from transplant.core import verify_stages
from transplant.core.inventory import Inventory
from transplant.core.manifest import VerifySettings
from transplant.errors import TransplantError
from transplant.hosts.host import Host
from transplant.hosts.probing import run_script
from transplant.verify import ladder

__all__ = ["SCHEMA", "record", "check_record", "recorded_runner", "provenance", "checked_names",
           "server_args_argv"]

SCHEMA = "transplant.donor-verify/1"
#: The host scripts whose reports a record may hold (those the runner asks the donor to run: the
#: requirable stages' of the stage table).
SCRIPTS = tuple(row.script for row in verify_stages.STAGES if row.requirable and row.script)
#: Most runs one record holds (four are written); a longer list is a damaged record.
MAX_RUNS = 16


def checked_names(inventory: Inventory, settings: VerifySettings, venv: str) -> tuple[list[str], list[str], list[str]]:
    """What verify's imports and native-load stages check in a venv whose inventory is ``inventory``:
    ``(import names, shared objects (absolute paths under venv), preload (["torch"] or []))``.

    The same rule as the runner's: the overlaid distributions' import names and ``verify.imports``
    (without an overlay, the distributions those names belong to), less ``verify.skip_imports``.
    """
    dists = ladder.overlaid(inventory, settings.overlay)
    if not settings.overlay and settings.imports:
        dists = ladder.dists_for_imports(inventory, settings.imports)
    names = [n for n in ladder.import_names(dists if settings.overlay else [], settings.imports)
             if n not in settings.skip_imports]
    preload = ["torch"] if "torch" in inventory.latest() else []
    return names, ladder.shared_objects(dists, venv), preload


def server_args_argv(settings: VerifySettings) -> list[str] | None:
    """The arguments ``stage_server_args`` gets for the manifest's ``verify.server_args`` (None
    when it sets none): the entry point, the attributes wanted (JSON) and the server arguments."""
    check = settings.server_args
    if check is None:
        return None
    wanted = {"attrs": sorted(check.expect), "resolve": check.resolve}
    return [check.entry, json.dumps(wanted), *check.args]


def record(settings: VerifySettings, donor: Host, venv: str, inventory: Inventory, *,
           timeout: float | None = None, now: float | None = None) -> dict[str, Any]:
    """Run in the donor's venv, on its host, what verify would ask the donor (see the module
    docstring), the four runs at once; a run that cannot be made is recorded with its error (and
    excuses nothing later).

    :param inventory: the donor's inventory (the snapshot's).
    :param timeout: seconds for each run (the manifest's ``verify.timeout`` where None).
    :param now: the record's time, seconds since the epoch (the clock's where None).
    :returns: the record, ``{"schema", "recorded", "runs": [{"script", "args", "request",
        "report"} or {..., "error"}]}``.
    """
    names, paths, preload = checked_names(inventory, settings, venv)
    runs: list[tuple[str, list[str], dict[str, Any] | None]] = []
    if names:
        runs.append(("stage_imports", names, None))
    if paths:
        runs.append(("stage_native", [], {"paths": paths, "preload": preload}))
    argv = server_args_argv(settings)
    if argv is not None:
        runs.append(("stage_server_args", argv, None))
    if settings.smoke_device is not None:
        runs.append(("stage_smoke", [settings.smoke_device], None))
    limit = settings.timeout if timeout is None else timeout

    def one(run: tuple[str, list[str], dict[str, Any] | None]) -> dict[str, Any]:
        script, args, request = run
        entry: dict[str, Any] = {"script": script, "args": args, "request": request}
        try:
            entry["report"] = {**run_script(donor, venv, script, args, request=request, env=dict(settings.env),
                                            timeout=limit), "prefix": venv.rstrip("/")}
        except TransplantError as exc:
            entry["error"] = exc.message
        return entry

    with ThreadPoolExecutor(max_workers=max(1, len(runs)), thread_name_prefix="donor-record") as pool:
        entries = list(pool.map(one, runs))
    return {"schema": SCHEMA, "recorded": time.time() if now is None else now, "runs": entries}


def check_record(document: Any) -> dict[str, Any]:
    """``document`` if it has a record's shape, for a snapshot index's reader.

    :raises ValueError: another schema, a script verify never asks the donor to run, a run
        without a report or an error, more than :data:`MAX_RUNS` runs.
    """
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"donor_verify: not a {SCHEMA} record")
    if not isinstance(document.get("recorded"), (int, float)) or isinstance(document.get("recorded"), bool):
        raise ValueError("donor_verify: 'recorded' is not a time")
    runs = document.get("runs")
    if not isinstance(runs, list) or len(runs) > MAX_RUNS:
        raise ValueError(f"donor_verify: 'runs' is not a list of at most {MAX_RUNS}")
    for run in runs:
        if not isinstance(run, dict) or run.get("script") not in SCRIPTS:
            raise ValueError(f"donor_verify: a run of none of {', '.join(SCRIPTS)}")
        if not isinstance(run.get("args"), list) or not all(isinstance(a, str) for a in run["args"]):
            raise ValueError(f"donor_verify: {run['script']}'s args are not strings")
        if not isinstance(run.get("report"), dict) and not isinstance(run.get("error"), str):
            raise ValueError(f"donor_verify: {run['script']} has neither a report nor an error")
    return document


def provenance(report: Mapping[str, Any] | None) -> str | None:
    """How a donor report was had, when it is a recorded one: ``recorded with snapshot ID on
    2026-12-06 04:30 UTC (3 h ago)``; None for a report the donor gave now."""
    said = report.get("recorded") if isinstance(report, Mapping) else None
    if not isinstance(said, Mapping):
        return None
    return f"recorded with snapshot {said.get('snapshot')} on {when(float(said.get('at') or 0.0))}"


def when(at: float) -> str:
    """``2026-12-06 04:30 UTC (3 h ago)`` for the epoch seconds ``at``."""
    return f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(at))} ({age(time.time() - at)})"


def age(seconds: float) -> str:
    """``42 s ago``, ``12 min ago``, ``3 h ago``, ``5 days ago``; ``in the future`` for a
    negative age (a controller clock behind the donor's)."""
    if seconds < 0:
        return "in the future"
    for size, unit in ((86400, "days"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def recorded_runner(document: Mapping[str, Any], snapshot: str) -> Any:
    """A :data:`transplant.verify.runner.DonorRun` answering from a record (:func:`check_record`'s).

    ``stage_imports`` of some names: the recorded results of those names among them (a name not
    recorded is left out, and so excuses nothing); ``stage_native`` of some venv-relative paths
    with a preload: the recorded results of those paths when the preload is the recorded one;
    ``stage_server_args`` and ``stage_smoke``: the recorded report of the same arguments. Each
    answer carries ``recorded: {"snapshot", "at"}`` (:func:`provenance`).

    :raises TransplantError: (from the returned function) the question was not recorded, or its
        run failed then: the runner then has no donor answer, and nothing is excused.
    """
    runs = list(document.get("runs") or [])
    mark = {"recorded": {"snapshot": snapshot, "at": document.get("recorded")}}

    def find(script: str) -> dict[str, Any]:
        for run in runs:
            if run.get("script") == script and isinstance(run.get("report"), dict):
                return run
        raise TransplantError(f"the snapshot's record has no {script} report")

    def answer(script: str, args: list, request: Mapping[str, Any] | None) -> Mapping[str, Any]:
        run = find(script)
        report = run["report"]
        if script == "stage_imports":
            wanted = set(args)
            return {**report, "imports": [i for i in report.get("imports", []) if i.get("name") in wanted], **mark}
        if script == "stage_native":
            asked = (request or {}).get("paths") or []
            recorded = run.get("request") or {}
            if list((request or {}).get("preload") or []) != list(recorded.get("preload") or []):
                raise TransplantError("the snapshot's record loaded its shared objects after another preload")
            prefix = str(report.get("prefix") or "").rstrip("/") + "/"
            wanted = {prefix + str(p) for p in asked}
            return {**report, "libraries": [lib for lib in report.get("libraries", [])
                                            if lib.get("path") in wanted], **mark}
        if list(run.get("args") or []) != list(args):
            raise TransplantError(f"the snapshot's record ran {script} with other arguments")
        return {**report, **mark}

    return answer


def has_record(document: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    """Whether a snapshot's ``donor_verify`` holds at least one report."""
    if not document:
        return False
    return any(isinstance(r.get("report"), dict) for r in document.get("runs") or [])


def summary(document: Mapping[str, Any] | None, snapshot: str, created: float) -> str:
    """The line verify says about its donor when the donor is a snapshot: whether recorded results
    stand in for it, and their age."""
    if not has_record(document):
        return (f"the donor is snapshot {snapshot} (taken {when(created)}), which holds no "
                f"verify results of the donor: nothing failing here is compared with the donor")
    assert document is not None
    scripts: Sequence[str] = [r["script"] for r in document.get("runs", []) if isinstance(r.get("report"), dict)]
    at = float(document.get("recorded") or created)
    return (f"the donor is snapshot {snapshot}: its verify results recorded on {when(at)[:-1]}; "
            f"{', '.join(s.removeprefix('stage_').replace('_', '-') for s in scripts)}) stand in for the donor")
