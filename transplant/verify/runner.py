"""Run the verify ladder in the target venv (edge).

Each stage runs in a fresh interpreter of the target venv with the manifest's
``verify.env`` and a timeout; its report is judged by :mod:`transplant.verify.judges`,
:mod:`transplant.verify.ladder` and :mod:`transplant.verify.judges`. Stages, cheapest first:
``interpreter``, ``imports``, ``native-load``, ``library-provenance``, ``requirements``,
``server-args`` (and ``server-args-resolve`` when asked for), ``smoke``, ``serve``,
``jit-caches``. A stage that has nothing to check is a skip with its reason, never a pass.
The stages are the rows of :data:`transplant.core.verify_stages.STAGES`, run in its order and
groups: a row that names its script, request and judge runs from the row alone
(:func:`_from_row`); the ladder's own stages have bodies here (:data:`_BODIES`), functions of the
one :class:`_Ladder` the stages of a run share.

``interpreter`` runs first (it takes the live inventory the others read); then the stages
that do not depend on each other (:data:`GROUP`) run at once, each its own host process, at
most :data:`PARALLEL` at a time; then ``smoke`` and ``serve`` one after the other (they use
the GPU and a port). The results are in the order of :data:`STAGES` whatever order they
finish in. ``imports``, ``library-provenance`` and ``native-load`` share one interpreter: the
imports script imports the names, then torch, then reports the provenance script's facts, and
forks native-load's loader once it has imported torch and nothing else (the names begin with
torch; else before its first import), which loads the shared objects the second line of its
input names: torch is imported once. Without an overlay the import names need no inventory, so
that interpreter starts beside the inventory's (its shared objects are sent once the inventory
names them), and the imports stages' seconds count from then; ``verify HOST:VENV`` starts it
even before loading this module (:mod:`transplant.verify.early`, ``run_stages(started=...)``). When that process fails (it dies,
runs past its timeout) or guessed wrong whether torch is installed, native-load runs its own.
When the package of ``verify.server_args``' parser is among the import names, the process that
imports it (the imports process or one of its workers) forks server-args' child right after that
import (:func:`transplant.verify.early.server_args_fork`): the parser's report is the one its own
process would print, without a second import of torch and the framework; a child that dies
without answering leaves server-args to run its own process as before, one past its deadline
fails the stage as a timed-out process does. ``smoke``'s check runs the same way in a child the
imports process forks right after importing torch (only while CUDA is not initialized there:
else, or when torch does not import, smoke runs its own process), so torch is imported once.
The inventory the stages read looks on disk only at the shared objects (the probe's
``record: "shared"``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, replace
from typing import Any, NamedTuple

from transplant.core import verify_stages
from transplant.verify import judges, ladder
from transplant.verify.early import Started, early_names as _early_names, first_line, second_line, \
    server_args_fork, smoke_fork, start_imports
from transplant.core.findings import requirement_findings
from transplant.core.units import clip
from transplant.errors import HostError, ProbeError, TransplantError
from transplant.hosts.host import Host
from transplant.core.inventory import Inventory
from transplant.core.manifest import VerifySettings
from transplant.hosts.probing import WaitingScript, run_script, take_inventory
from transplant.core.rules.recordless import judge_stale_modules, stale_extension_modules
from transplant.verify.judges import StageResult, judge_imports, judge_requirements, judge_server_args, judge_smoke
from transplant.remote._common import ILLEGAL_INSTRUCTION
from transplant.reporting import QUIET, Reporter

__all__ = ["run_stages", "donor_reader", "STAGES", "GROUP", "PARALLEL"]

#: The ladder's stages, in the order of its results (the rows of :data:`transplant.core.verify_stages.STAGES`).
STAGES = verify_stages.NAMES

#: The stages that run at once after ``interpreter`` (the table's ``parallel`` rows that are steps
#: of their own: not ``server-args-resolve``, judged from ``server-args``' report): each reads only
#: the live inventory (and the donor's) and runs its own host process, which neither writes nor
#: holds anything the others use. ``jit-caches`` is one of them only when it just looks; with
#: ``clear_jit_caches`` it runs last, alone, as it removes folders the other stages' imports (and
#: the server of ``serve``) may be writing.
GROUP = tuple(row.name for row in verify_stages.STAGES if row.group == "parallel"
              and not (row.script is None and any(need != "interpreter" for need in row.needs)))

#: How many stages of :data:`GROUP` run at a time by default: the three that import torch
#: (``imports``, ``native-load``, ``library-provenance``) and one light one. Not the
#: controller's core count: the stages run on the target, whose cores the controller does not
#: know before the inventory, and on a host with fewer cores the processes share them at no
#: cost beyond their memory (about 1 GB each with torch imported).
PARALLEL = 4

#: The JIT caches the ``jit-caches`` stage looks at (``transplant/remote/stage_jit.py``), by the
#: names ``verify --clear-jit-caches=NAMES`` takes.
JIT_CACHES = ("triton", "flashinfer", "torch-inductor")


class Outcome(NamedTuple):
    """What a stage's body found: (status, reason, details), and for a skip its cause, for a
    stage with items it could not check those items (see :class:`StageResult`)."""

    status: str
    reason: str
    details: Mapping[str, Any]
    cause: str | None = None
    unchecked: tuple[Mapping[str, str], ...] = ()


#: What a stage's body returns: an :class:`Outcome`, or its first three fields.
Answer = Outcome | tuple[str, str, Mapping[str, Any]]


def _skip(cause: str, reason: str, details: Mapping[str, Any] | None = None) -> Outcome:
    return Outcome("skip", reason, details or {}, cause)


#: The skip of a stage that cannot run because the target's interpreter could not (its failure is said once).
_NOT_RUN = "the target's interpreter could not be run (see interpreter)"


def _timed(name: str, body: Callable[[], tuple], started: float | None = None) -> StageResult:
    """Run a stage's body (an :class:`Outcome`, or its first three fields): its result, or a
    fail naming the host error it raised; ``seconds`` from ``started`` (a
    :func:`time.monotonic` value; None: now)."""
    started = time.monotonic() if started is None else started
    cause: str | None = None
    unchecked: tuple[Mapping[str, str], ...] = ()
    try:
        status, reason, details, cause, unchecked = Outcome(*body())
    except (HostError, ProbeError) as exc:
        timed_out = re.search(r"timed out after ([0-9.]+) s", str(exc))
        if timed_out:  # the message would quote the whole script (python -c SOURCE)
            reason = (f"ran past its timeout of {timed_out.group(1)} s and was stopped; give it longer with "
                      f"verify.timeout (verify.serve.timeout for serve)")
        else:
            reason = str(exc) if len(str(exc)) <= 2000 else str(exc)[:1000] + " ... " + str(exc)[-900:]
        status, details = "fail", {}
    return StageResult(name=name, status=status, reason=reason, seconds=time.monotonic() - started, details=details,
                       cause=cause if status == "skip" else None, unchecked=tuple(unchecked))


def _interpreter_facts(inv: Inventory) -> dict[str, Any]:
    cfg = inv.interpreter.pyvenv_cfg or {}
    return {"version": str(inv.interpreter.version), "implementation": inv.interpreter.implementation,
            "home": cfg.get("home"), "home_exists": inv.interpreter.home_exists,
            "executable": inv.interpreter.executable}


def run_stages(
    settings: VerifySettings,
    *,
    target: Host,
    venv: str,
    donor_inventory: Callable[[], Inventory | None] | None = None,
    reporter: Reporter = QUIET,
    clear_jit_caches: bool | Sequence[str] = False,
    donor_run: DonorRun | None = None,
    parallel: int = PARALLEL,
    started: Started | None = None,
    manifest: bool = True,
) -> list[StageResult]:
    """Run every verify stage and return their results in order (see :data:`STAGES`).

    :param settings: the manifest's verify settings (or ones built from the command line);
        ``settings.overlay`` names the distributions whose import names and shared objects
        are checked besides ``settings.imports``.
    :param donor_inventory: returns the donor's inventory, or None when there is no donor to
        compare with. It is the reference of the ``interpreter`` stage (same implementation
        and ``major.minor``) and of ``requirements``: an unmet requirement fails only when
        the donor's environment satisfies it; one the donor cannot meet either is a warning.
        Without a donor nothing can be compared, so every unmet requirement fails. It is read
        in a thread of its own while the target's inventory is taken.
    :param reporter: told each stage's name as a step when it starts, and after each stage
        ends how many of the stages that run have ended (``done`` of the number of rows the
        result will have: :data:`STAGES` less ``server-args-resolve`` unless it is asked for; the
        last report is all of them); a reporter with an ``ended(name)`` method is also told each
        stage's name as it ends (before that progress), so it can show only those running. The stages of
        :data:`GROUP` overlap, so their steps come from several threads, in the order they
        start, and one step's start does not end the one before; ``done`` never goes down.
    :param clear_jit_caches: the JIT caches whose folders to remove (names of
        :data:`JIT_CACHES`; True: all of them; False or empty: none, the folders are only
        listed); only those folders, and only with the refusals of ``stage_jit._removable``.
        When any is named the stage runs last, alone.
    :param donor_run: runs a host script in the donor's venv (``(script, args, request) ->
        report``, with ``{venv}`` in a request path standing for the donor's prefix), or None
        when the donor cannot run code (a snapshot, unreachable). The donor is the reference:
        the imports and shared objects that fail on the target, and a failed ``smoke`` or
        ``server-args``, are run the same way there; what fails there with the same error class
        is what the donor runs, not checkable better here (an unchecked item of a passing
        stage, or a ``donor-identical`` skip, with the donor's evidence), unless
        ``settings.required`` names the stage (:func:`transplant.verify.ladder.donor_shared_imports`,
        ``donor_shared_objects``, ``failure_class``). What fails only on the target fails,
        with the facts that differ where the inventories know them (a system library, the
        driver). It is called from several threads at once.
    :param parallel: how many stages of :data:`GROUP` run at a time (at least 1; 1 runs them
        one after the other, in the ladder's order, and starts nothing beside the inventory).
    :param started: the imports process the command started ahead
        (:func:`transplant.verify.early.start_imports` with these settings, target and venv), or
        None: then it is started here when it can be. Taken over (and ended when unused, as with
        ``parallel`` 1 or other settings).
    :param manifest: whether ``settings`` come from a manifest; False (``verify HOST:VENV``,
        settings built from the command line): a stage skipped for want of its settings says
        how to give them, without naming a manifest the command does not have.
    :raises ValueError: ``parallel`` below 1.
    A stage whose host script cannot run or answers nonsense (an unreachable host, a timeout,
    a missing interpreter) is a fail with that reason; the other stages still run.
    """
    clearing = JIT_CACHES if clear_jit_caches is True else tuple(clear_jit_caches or ())
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    rows = verify_stages.STAGES
    ctx = _Ladder(settings=settings, target=target, venv=venv, env=dict(settings.env), timeout=settings.timeout,
                  reporter=reporter, clearing=clearing, donor_run=donor_run, manifest=manifest,
                  has_donor=donor_inventory is not None,
                  # the stages that run (each a row of the result): server-args-resolve only when asked for
                  total=sum(1 for row in rows if row.shown is None or row.shown(settings)))

    # Without an overlay the import names do not depend on the inventory: their process starts now,
    # beside the inventory's (torch among the provenance modules, and preloaded for native-load, only
    # if it is installed; the inventory then says whether that was the right guess, see provenance
    # and native below). The shared objects native-load loads come on its input once the inventory
    # has named them.
    early_names = _early_names(settings)
    if started is not None and (parallel == 1 or started.names != early_names or started.venv != venv
                                or started.env != ctx.env):
        started.close()  # not what this ladder would start: it runs its own, or none
        started = None
    if started is None and early_names and parallel > 1:
        started = start_imports(settings, target, venv)
    ctx.early_start = started.at if started is not None else time.monotonic()
    ctx.early = started.script if started is not None else None
    with ThreadPoolExecutor(max_workers=2) as pool, ExitStack() as closing:
        if ctx.early is not None:
            closing.callback(ctx.early.close)  # ends it when unasked (an error of the controller's own)
        ctx.donor_future = pool.submit(donor_inventory) if donor_inventory else None
        for row in rows:
            if row.group == "first":
                ctx.run(row.name, _body(ctx, row))
        _derive(ctx, early_names)
        tasks = [_task(ctx, row, rows) for row in rows if row.group == "parallel" and not _follows(row, rows)
                 and not (row.name == "jit-caches" and clearing)]
        with ThreadPoolExecutor(max_workers=min(parallel, len(tasks)), thread_name_prefix="verify") as stages:
            for future in [stages.submit(each) for each in tasks]:
                future.result()  # a stage's own failure is its result; this raises only a bug's error

    for row in rows:
        if row.group == "serial":
            ctx.run(row.name, _body(ctx, row))
    if clearing:  # it removes folders the other stages' imports (and serve's server) may be writing: last, alone
        ctx.run("jit-caches", _body(ctx, verify_stages.stage("jit-caches")))
    return [ctx.results[name] for name in verify_stages.names(rows) if name in ctx.results]


class _Ladder:
    """What the stages of one :func:`run_stages` share: its arguments, the inventories, the
    results so far, and what the imports process hands the stages that read it (``joint``)."""

    def __init__(self, *, settings: VerifySettings, target: Host, venv: str, env: dict[str, str],
                 timeout: float | None, reporter: Reporter, clearing: tuple[str, ...], donor_run: DonorRun | None,
                 manifest: bool, has_donor: bool, total: int) -> None:
        self.settings, self.target, self.venv, self.env, self.timeout = settings, target, venv, env, timeout
        self.reporter, self.clearing, self.donor_run, self.manifest = reporter, clearing, donor_run, manifest
        self.has_donor, self.total = has_donor, total
        self.results: dict[str, StageResult] = {}
        self.ended = 0
        self.lock = threading.Lock()
        self.told_ended = getattr(reporter, "ended", None)  # optional: told which overlapping step ended
        self.donor_future: Any = None
        self.live: Inventory | None = None
        self.early: WaitingScript | None = None
        self.early_start = 0.0
        # what the interpreter's inventory decides (see _derive)
        self.dists: list[Any] = []
        self.names: list[str] = []
        self.skipped = ""
        self.shipped: list[str] = []
        self.modules: list[str] = []
        self.native_paths: list[str] = []
        self.preload: list[str] = []
        self.sharing = False
        self.use_early = False
        self.joint: dict[str, Any] = {}
        self.joint_done = threading.Event()
        # the imports process's server-args child (None: server-args runs its own process)
        self.server_args_fork: dict[str, Any] | None = None
        # the imports process's smoke child (None: smoke runs its own process)
        self.smoke_fork: dict[str, Any] | None = None
        self.imports_answered = threading.Event()  # the imports process answered (or could not)
        self.resolved: dict[str, Any] = {}

    def donor(self) -> Inventory | None:
        """The donor's inventory (waited for), or None: no donor, or it could not be read."""
        return self.donor_future.result() if self.donor_future else None

    def finish(self, *done: StageResult) -> None:
        """Keep the results (an illegal instruction in a reason said by the CPU flags the donor's
        CPU has and this host's lacks: :func:`judges.name_cpu_gap`) and report how many of the
        stages that run have ended."""
        done = tuple(self.cpu_named(r) for r in done)
        with self.lock:  # the count and its report together, so that ``done`` never goes down
            self.results.update((r.name, r) for r in done)
            self.ended += len(done)
            for r in done:
                if self.told_ended is not None:
                    self.told_ended(r.name)
            self.reporter.progress(self.ended, self.total)

    def cpu_named(self, result: StageResult) -> StageResult:
        """``result`` with an illegal instruction (SIGILL) in its reason named by the CPU flags
        that differ (the inventories' ``cpu_flags``); the result as it is otherwise. A stage that
        died of SIGILL here fails whatever the donor does: its CPU having what this one lacks is
        why it passes there."""
        if ILLEGAL_INSTRUCTION not in result.reason or self.live is None:
            return result
        theirs = self.donor()
        return replace(result, reason=judges.name_cpu_gap(result.reason, self.live.cpu_flags,
                                                          theirs.cpu_flags if theirs is not None else None))

    def run(self, name: str, body: Callable[[], Answer]) -> StageResult:
        """Run one stage's body as its step and keep its result."""
        self.reporter.step(name)
        result = _timed(name, body)
        self.finish(result)
        return result

    def driver_facts(self) -> tuple[bool, str | None]:
        """(whether a missing driver library fails here, the fact that differs when it does
        for want of the driver the donor's host has): a target without a driver checks no
        driver library, unless the donor's host has one, where the same stage ran."""
        live = self.live
        if live is None or live.nvidia.available:
            return True, None
        theirs = self.donor()
        if theirs is None or not theirs.nvidia.available:
            return False, None
        return True, (f"the donor's host has the NVIDIA driver ({theirs.nvidia.driver_version or '?'}) and this "
                      f"host has none ({live.nvidia.reason or 'no driver'})")

    def against_donor(self, stage: str, status: str, reason: str, report: Mapping[str, Any], args: list,
                      request: Mapping[str, Any] | None,
                      judge: Callable[[Mapping[str, Any]], tuple[str, str]]) -> Outcome:
        """A stage that failed in the target, run the same way in the donor's venv on its host: a
        skip (``donor-identical``, with the donor's evidence) when it fails there with the same
        class (:func:`ladder.failure_class`), unless ``verify.required`` names the stage; else the
        failure as it is, saying how the donor fared (``judge``: the stage's judge of a report)."""
        mine = ladder.failure_class(stage, report)
        if self.donor_run is None or stage in self.settings.required or mine is None:
            return Outcome(status, reason, report)
        script = verify_stages.stage(stage).script
        assert script is not None
        theirs = _on_donor(self.donor_run, script, args, request)
        if theirs is None:
            return Outcome(status, reason + "; the donor could not run this stage to compare", report)
        yours = ladder.failure_class(stage, theirs)
        if yours == mine:
            evidence = str(theirs.get("reason") or theirs.get("error") or mine)
            said = "the donor says the same" if evidence == str(report.get("reason") or report.get("error")) \
                else f"the donor: {clip(evidence, 300)}"
            return Outcome("skip", f"fails identically in the donor ({mine}): {reason}; {said}{_recorded(theirs)}",
                           {**report, "donor": dict(theirs)}, "donor-identical")
        verdict, why = judge(theirs)
        return Outcome(status, (f"{reason}; the donor passes this stage" if verdict == "pass"
                                else f"{reason}; the donor fails it otherwise ({clip(why, 300)})") + _recorded(theirs),
                       {**report, "donor": dict(theirs)})


def _derive(ctx: _Ladder, early_names: Sequence[str]) -> None:
    """What the target's inventory decides for the stages after the interpreter: the import names,
    the shared objects, and whether one process imports for imports, library-provenance and
    native-load."""
    live, settings, venv = ctx.live, ctx.settings, ctx.venv
    dists = ladder.overlaid(live, settings.overlay) if live is not None else []
    if live is not None and not settings.overlay and settings.imports:
        dists = ladder.dists_for_imports(live, settings.imports)
    ctx.dists = dists
    ctx.names = [n for n in ladder.import_names(dists if settings.overlay else [], settings.imports)
                 if n not in settings.skip_imports]
    ctx.skipped = "".join(f"; skipped {name} (verify.skip_imports: {why})"
                          for name, why in settings.skip_imports.items())
    ctx.shipped = ladder.shared_objects(live.latest().values(), venv) if live is not None else []
    torch = ["torch"] if live is not None and "torch" in live.latest() else []
    ctx.modules = torch + [n for n in ctx.names if n != "torch"]
    # the shared objects native-load loads, after importing preload
    ctx.native_paths = ladder.shared_objects(dists, venv) if live is not None else []
    ctx.preload = torch
    # one process imports the names, then what library-provenance imports besides (torch), and
    # reports both, and forks native-load's loader once it has imported preload: two
    # interpreters importing the same torch would cost twice its import
    ctx.sharing = live is not None and bool(ctx.names)
    ctx.use_early = ctx.early is not None and ctx.names == list(early_names) and live is not None
    # the server-args child is forked by the imports process once it has imported the parser's
    # package: neither torch nor the framework is imported a second time (about 6 s of CPU for sglang)
    ctx.server_args_fork = server_args_fork(settings, ctx.names) if ctx.sharing else None
    # and smoke's child right after torch (only while CUDA is not initialized there): smoke imports
    # torch no second time (about 2 s of CPU)
    ctx.smoke_fork = smoke_fork(settings) if ctx.sharing and ctx.preload else None


def _follows(row: verify_stages.Stage, rows: Sequence[verify_stages.Stage]) -> bool:
    """Whether ``row`` runs right after a ``parallel`` stage it needs, in that stage's thread."""
    parallel = {r.name for r in rows if r.group == "parallel"}
    return any(need in parallel for need in row.needs)


def _task(ctx: _Ladder, row: verify_stages.Stage, rows: Sequence[verify_stages.Stage]) -> Callable[[], None]:
    """One thread's work among the ``parallel`` stages: ``row``, then the stages that need it."""
    after = [r for r in rows if row.name in r.needs and r.group == "parallel"]
    own = _TASKS.get(row.name)
    if own is not None:
        return lambda: own(ctx)

    def task() -> None:
        ctx.run(row.name, _body(ctx, row))
        for each in after:
            ctx.run(each.name, _body(ctx, each))
    return task


def _body(ctx: _Ladder, row: verify_stages.Stage) -> Callable[[], Answer]:
    """The stage's body: the runner's own for the ladder's stages that need more than their row
    (:data:`_BODIES`), else its script run with its row's request and its report judged."""
    own = _BODIES.get(row.name)
    if own is not None:
        return lambda: own(ctx)
    return lambda: _from_row(ctx, row)


def _requested(ctx: _Ladder, row: verify_stages.Stage) -> verify_stages.Request | Answer:
    """Its row's request when the settings ask for the stage and the target's inventory was
    taken; else the skip that says which (``not-requested`` naming the setting, ``not-run``). A
    row without a request of its own runs its script with none."""
    request = row.request(ctx.settings) if row.request is not None else verify_stages.Request()
    if request is None:
        return _skip("not-requested", _not_asked(row.what or row.name, row.setting or row.name, ctx.manifest))
    if ctx.live is None and "interpreter" in row.needs:
        return _skip("not-run", _NOT_RUN)
    return request


def _when_asked(name: str) -> Callable[[Callable[[_Ladder, verify_stages.Request], Answer]], Callable[[_Ladder], Answer]]:
    """A stage body of the runner's own given its row's request, run only when
    :func:`_requested` gives one (else that skip is the stage's answer)."""
    def wrap(body: Callable[[_Ladder, verify_stages.Request], Answer]) -> Callable[[_Ladder], Answer]:
        def run(ctx: _Ladder) -> Answer:
            request = _requested(ctx, verify_stages.stage(name))
            return body(ctx, request) if isinstance(request, verify_stages.Request) else request

        return run

    return wrap


def _from_row(ctx: _Ladder, row: verify_stages.Stage) -> Answer:
    """A stage run from its row alone: skipped when its settings do not ask for it or the
    inventory could not be taken; else its script's report, judged."""
    request = _requested(ctx, row)
    if not isinstance(request, verify_stages.Request):
        return request
    if row.script is None:
        raise ValueError(f"verify stage {row.name!r} has no script and no body of the runner's own")
    report = run_script(ctx.target, ctx.venv, row.script, list(request.args), request=request.document,
                        env=ctx.env, timeout=ctx.timeout if request.timeout is None else request.timeout)
    status, reason = judge_of(row)(report)
    return status, reason, report


def judge_of(row: verify_stages.Stage) -> Callable[..., tuple[str, str]]:
    """The function of :mod:`transplant.verify.judges` the row names.

    :raises AttributeError: the judges have no function of that name.
    """
    found = getattr(judges, row.judge)
    if not callable(found):
        raise AttributeError(f"transplant.verify.judges.{row.judge} is not a function")
    return found


def _interpreter(ctx: _Ladder) -> Answer:
    # RECORD's rows, with the disk's facts only for the shared objects (the stages look at no other file
    # through the inventory): not 50,000 lstats and their rows for a CUDA stack
    live = take_inventory(ctx.target, ctx.venv, record="shared", timeout=ctx.timeout)
    ctx.live = live
    theirs = ctx.donor()
    facts = _interpreter_facts(live)
    expected = _interpreter_facts(theirs) if theirs is not None else None
    own = _ABI_SUFFIX.search(f"x{live.interpreter.ext_suffix or ''}")
    foreign = sorted(p for d in live.distributions for p in d.files
                     if (m := _ABI_SUFFIX.search(p)) is not None and (own is None or m.group(1) != own.group(1)))
    status, reason = judges.judge_interpreter(facts, expected, python=ctx.settings.python, foreign=foreign)
    return status, reason, {"target": facts, "donor": expected}


#: An extension module's ABI tag in its file name (PEP 3149: ``x.cpython-311-x86_64-linux-gnu.so``).
_ABI_SUFFIX = re.compile(r"\.(cpython-\d+[a-z]*)-[^/]*\.so$")


def _imports_and_facts(ctx: _Ladder) -> dict[str, Any]:
    """The imports script's report of the import names: see :func:`first_line`."""
    early, timeout = ctx.early, ctx.timeout
    if ctx.use_early:
        assert early is not None
        left = None if timeout is None else max(0.1, timeout - (time.monotonic() - ctx.early_start))
        try:
            report = early.ask_document(second_line(ctx.native_paths), left)
        except HostError as exc:
            if "gave no reply within" in str(exc):  # as run_script says it, for the stage's reason
                raise HostError(f"{ctx.target.label}:{ctx.venv}: stage_imports timed out after {timeout:g} s") from None
            raise
        if report is not None:
            ctx.joint["native_sent"] = True
            return report
    request = first_line(ctx.modules, [], ctx.preload, False, ctx.server_args_fork, ctx.smoke_fork) + \
        second_line(ctx.native_paths)
    report = run_script(ctx.target, ctx.venv, "stage_imports", ctx.names, request=request, env=ctx.env,
                        timeout=timeout)
    ctx.joint["native_sent"] = True
    return report


def _imports(ctx: _Ladder) -> Answer:
    try:
        return _imports_body(ctx)
    finally:
        ctx.imports_answered.set()
        ctx.joint_done.set()


def _imports_body(ctx: _Ladder) -> Answer:
    live, settings, joint = ctx.live, ctx.settings, ctx.joint
    if live is None:  # the interpreter stage failed and said why; that error is said once
        return _skip("not-run", _NOT_RUN)
    if not ctx.names:
        return _skip("nothing-to-check", "no import names: no overlay distributions found and no "
                                         "verify.imports" + ctx.skipped)
    try:
        report = _imports_and_facts(ctx)
    except (HostError, ProbeError) as exc:
        joint["error"] = exc  # library-provenance fails with the same reason; the forked stages run their own
        raise
    joint["server_args"] = report.pop("server_args", None)
    joint["smoke"] = report.pop("smoke", None)
    ctx.imports_answered.set()  # before the donor is asked about the imports that failed
    joint["provenance"] = report.pop("provenance", None)
    joint["native"] = report.pop("native", None)
    joint["native_preload"] = report.pop("native_preload", None)
    driver, gap = ctx.driver_facts()
    gpu = [n for n, wants in settings.needs.items() if "gpu" in wants]
    status, reason = judge_imports(report, driver=driver, needs_gpu=gpu)
    shared: set[str] = set()
    if status == "fail" and ctx.donor_run is not None and "imports" not in settings.required:
        # the donor is the reference: a name failing there with the same exception class is what the
        # donor runs, not checkable better here (verify.required: [imports] makes it fail regardless)
        failed = [i["name"] for i in report.get("imports", []) if not i.get("ok")]
        answer = _on_donor(ctx.donor_run, "stage_imports", failed, None) if failed else None
        shared = ladder.donor_shared_imports(report, answer)
        status, reason = judge_imports(report, driver=driver, donor_shared=shared, needs_gpu=gpu)
        reason += _recorded(answer)
    unchecked = judges.imports_unchecked(report, driver=driver, donor_shared=shared, needs_gpu=gpu)
    details = {**report, "derived_from": [d.display_name for d in ctx.dists], "skipped": dict(settings.skip_imports)}
    if status == "fail":
        theirs = ctx.donor()
        gaps = dict.fromkeys(g for g in (ladder.system_library_gap(
            i.get("error"), live.system_sonames, theirs.system_sonames if theirs else None)
            for i in report.get("imports", []) if not i.get("ok")) if g)
        reason += "".join(f"; {g}" for g in [*gaps, *([gap] if gap else [])])
    return Outcome(status, reason + ctx.skipped, details, _cause_of(unchecked) if status == "skip" else None,
                   unchecked)


def _native(ctx: _Ladder) -> Answer:
    live, venv, joint, preload = ctx.live, ctx.venv, ctx.joint, ctx.preload
    if live is None:
        return _skip("not-run", _NOT_RUN)
    paths = ladder.shared_objects(ctx.dists, venv)
    if not paths:
        if not ctx.dists:  # the imports named no installed distribution (a module of no RECORD)
            return _skip("nothing-to-check", "no distribution to check: the imports named none the venv "
                                             "has installed")
        return _skip("nothing-to-check", "the distributions checked ship no shared objects (" + (
            ", ".join(d.display_name for d in ctx.dists)) + ")")
    # the venv's library keys (every RECORD's rows) before the wait, not after the imports process
    shipped = ladder.record_library_keys(live.distributions)
    report = None
    if ctx.sharing:  # the imports process's loader child, unless that process failed or guessed wrong
        ctx.joint_done.wait()
        if joint.get("native_sent") and joint.get("native_preload") == preload:
            report = joint.get("native")
    if not isinstance(report, dict):
        report = run_script(ctx.target, venv, "stage_native", request={"paths": paths, "preload": preload},
                            env=ctx.env, timeout=ctx.timeout)
    driver, gap = ctx.driver_facts()
    theirs_inventory = ctx.donor()
    system = theirs_inventory.system_sonames if theirs_inventory is not None else None
    shared: set[str] = set()
    kinds = judges.native_kinds(report, driver=driver, shipped=shipped, donor_system=system)
    if any(k == "fail" for k, _ in kinds.values()) and ctx.donor_run is not None \
            and "native-load" not in ctx.settings.required:
        failed = [lib["path"] for lib in report.get("libraries", []) if not lib.get("ok")
                  and not lib.get("skipped") and str(lib["path"]).startswith(venv.rstrip("/") + "/")]
        rel = [p[len(venv.rstrip("/")) + 1:] for p in failed]
        theirs = _on_donor(ctx.donor_run, "stage_native", [], {"paths": rel, "preload": preload})
        shared = ladder.donor_shared_objects(report, theirs, venv)
    if shared:
        kinds = judges.native_kinds(report, driver=driver, shipped=shipped, donor_shared=shared,
                                    donor_system=system)
    status, reason = judges.native_verdict(report, kinds, venv)
    if shared:
        reason += _recorded(theirs)
    unchecked = judges.native_unchecked(report, kinds, venv)
    if status == "fail" and gap:
        reason += f"; {gap}"
    return Outcome(status, reason, report, _cause_of(unchecked) if status == "skip" else None, unchecked)


def _provenance(ctx: _Ladder) -> Answer:
    live, shipped, modules, joint = ctx.live, ctx.shipped, ctx.modules, ctx.joint
    if live is None:
        return _skip("not-run", _NOT_RUN)
    if not shipped and not modules:
        return _skip("nothing-to-check", "the venv ships no shared libraries, so none can be shadowed")
    if not modules:
        return _skip("nothing-to-check", "nothing to import (no torch, no import names)")
    if "error" in joint:
        raise joint["error"]
    report = joint.get("provenance")
    if not isinstance(report, dict) or [i.get("name") for i in report.get("imported", [])] != modules:
        # not shared, answered without it, or it guessed wrong whether torch is installed
        report = run_script(ctx.target, ctx.venv, "stage_provenance", request={"modules": modules}, env=ctx.env,
                            timeout=ctx.timeout)
    stale = stale_extension_modules(report, live)
    status, reason = judge_stale_modules(stale, ctx.venv) or (
        judges.judge_provenance(report, shipped) if shipped else
        ("skip", "the venv ships no shared libraries, so none can be shadowed"))
    # a skip with libraries to check means nothing could be imported: the imports stage says why
    cause = ("not-run" if shipped else "nothing-to-check") if status == "skip" else None
    return Outcome(status, reason, {"conflicts": ladder.provenance_conflicts(report, shipped),
                                    "stale_modules": stale,
                                    "cuda_torch_libraries": ladder.cuda_torch_libraries(report), **report},
                   cause)


def _requirements(ctx: _Ladder) -> Answer:
    live = ctx.live
    if live is None:
        return _skip("not-run", _NOT_RUN)
    theirs = ctx.donor()
    donor_env = theirs.latest() if theirs is not None else None
    findings = requirement_findings(live.latest(), live.interpreter.markers,
                                    reference=[donor_env] if donor_env else [], venv=ctx.venv, donor=donor_env)
    status, reason = judge_requirements(findings, donor=donor_env is not None)
    if theirs is None and ctx.has_donor:
        reason += " (the donor could not be read, so every unmet requirement counts)"
    return status, reason, {"findings": [asdict(f) for f in findings]}


def _resolve_cause(ctx: _Ladder, report: Mapping[str, Any]) -> str:
    """Why :func:`judges.judge_resolve` skipped, by the host's facts: no resolution step, no
    model files, else no driver or no device."""
    if not report.get("ran"):
        return "nothing-to-check"
    if report.get("config_json") is False:
        return "no-model"
    return "no-driver" if ctx.live is not None and not ctx.live.nvidia.available else "no-device"


@_when_asked("server-args")
def _server_args(ctx: _Ladder, request: verify_stages.Request) -> Answer:
    check = ctx.settings.server_args
    assert check is not None  # its row asks for the stage only when the check is set
    report = _forked_report(ctx, ctx.server_args_fork, "server_args", "stage_server_args")
    if report is None:  # no child, or it ended without answering: the stage's own process says how
        report = run_script(ctx.target, ctx.venv, "stage_server_args", list(request.args), env=ctx.env,
                            timeout=ctx.timeout)
    ctx.resolved.update(report.get("resolve") or {})
    status, reason = judge_server_args(check.expect, report)
    if status == "fail":
        return ctx.against_donor("server-args", status, reason, report, list(request.args), None,
                                 lambda theirs: judge_server_args(check.expect, theirs))
    return status, reason, report


def _forked_report(ctx: _Ladder, fork: dict[str, Any] | None, key: str, script: str) -> dict[str, Any] | None:
    """The report under ``key`` of the imports process's document (its child that ran ``script``),
    once that process has answered; None when ``fork`` (the request) is None or the child gave
    none (not forked, the imports process failed, or the child died: then the stage runs its own
    process, which says how it ends there).

    :raises HostError: the child had not answered by its deadline (as a timed-out process of its own).
    """
    if fork is None:
        return None
    ctx.imports_answered.wait()
    report = ctx.joint.get(key)
    if not isinstance(report, dict) or "died" in report:
        return None
    if "timed_out" in report:
        raise HostError(f"{ctx.target.label}:{ctx.venv}: {script} timed out after {ctx.timeout:g} s")
    return report


def _server_args_stages(ctx: _Ladder) -> None:
    """``server-args``, then ``server-args-resolve`` judged from its report when asked for."""
    ctx.reporter.step("server-args")
    started = _timed("server-args", lambda: _server_args(ctx))
    row = verify_stages.stage("server-args-resolve")
    if row.shown is not None and not row.shown(ctx.settings):
        ctx.finish(started)  # server-args-resolve, not asked for, does not run (nor count)
        return
    resolved = ctx.resolved
    cause: str | None = "not-run"
    if resolved:
        status, reason = judges.judge_resolve(resolved)
        cause = _resolve_cause(ctx, resolved) if status == "skip" else None
    else:
        status, reason = "skip", f"not run: the arguments did not parse ({started.status})"
    ctx.finish(started, StageResult(name="server-args-resolve", status=status, reason=reason, cause=cause,
                                    seconds=float(resolved.get("seconds") or 0.0), details=resolved))


def _jit(ctx: _Ladder) -> Answer:
    if ctx.live is None:
        return _skip("not-run", _NOT_RUN)
    report = run_script(ctx.target, ctx.venv, "stage_jit", request={"clear": list(ctx.clearing)}, env=ctx.env,
                        timeout=ctx.timeout)
    caches = report.get("caches", [])
    status, reason = judges.judge_jit_caches(caches, cleared=bool(ctx.clearing))
    return status, reason, report


def _imports_stages(ctx: _Ladder) -> None:
    """``imports``, then ``library-provenance``: one process when it imports for both (then both
    count their seconds from its start), else each its own."""
    if not ctx.sharing:
        ctx.run("imports", lambda: _imports(ctx))
        ctx.run("library-provenance", lambda: _provenance(ctx))
        return
    started = ctx.early_start if ctx.use_early else time.monotonic()
    ctx.reporter.step("imports")
    ctx.reporter.step("library-provenance")
    ctx.finish(_timed("imports", lambda: _imports(ctx), started))
    ctx.finish(_timed("library-provenance", lambda: _provenance(ctx), started))


@_when_asked("smoke")
def _smoke(ctx: _Ladder, request: verify_stages.Request) -> Answer:
    settings, live = ctx.settings, ctx.live
    assert live is not None  # _requested skipped the stage without the target's inventory
    report = _forked_report(ctx, ctx.smoke_fork, "smoke", "stage_smoke")
    if report is None:
        report = run_script(ctx.target, ctx.venv, "stage_smoke", list(request.args), env=ctx.env,
                            timeout=ctx.timeout)
    status, reason = judge_smoke(report)
    if status == "skip":  # the smoke script skips only a venv without torch, the device left to auto
        return _skip("no-torch", reason, report)
    if report.get("missing") == "torch":  # a device named in the manifest: by the donor's venv, not its text
        theirs = ctx.donor()
        if theirs is not None and "torch" not in theirs.latest():
            return _skip("no-torch", f"{reason}; the donor's venv has no torch either", report)
        if theirs is not None:
            return Outcome("fail", f"{reason}; the donor's venv has torch {theirs.latest()['torch'].raw_version}",
                           report)
    if status == "fail" and report.get("unavailable") == "cuda" and not live.nvidia.available:
        _, gap = ctx.driver_facts()
        if gap is None:  # neither host has a driver: a device named in the manifest cannot be had here
            return _skip("no-driver", f"smoke: {{device: cuda}} needs a GPU, and neither this host nor the "
                                      f"donor's has the NVIDIA driver ({live.nvidia.reason or 'no driver'})",
                         report)
        return Outcome("fail", f"{reason}; {gap}", report)
    if status == "fail":
        return ctx.against_donor("smoke", status, reason, report, list(request.args), None, judge_smoke)
    # what ran on the CPU, or not at all, for want of a GPU: not checked here (--strict fails it)
    cause = "no-driver" if not live.nvidia.available else "no-device"
    unchecked = tuple({"item": str(sub.get("name")), "cause": cause, "evidence": str(sub.get("reason"))}
                      for sub in report.get("subchecks", []) if sub.get("status") == "skip"
                      and sub.get("needs") == "gpu")
    if report.get("device") == "cpu" and settings.smoke_device == "auto":
        _, gap = ctx.driver_facts()
        if gap:  # the donor's host would have run it on its GPU: this host lost what serving needs
            return Outcome("fail", f"{reason}; {gap}", report)
        unchecked = ({"item": "cuda", "cause": cause, "evidence": str(report.get("reason"))}, *unchecked)
    return Outcome(status, reason, report, None, unchecked)


@_when_asked("serve")
def _serve(ctx: _Ladder, request: verify_stages.Request) -> Answer:
    check = ctx.settings.serve
    assert check is not None  # its row asks for the stage only when the check is set
    report = run_script(ctx.target, ctx.venv, "stage_serve", request=request.document, env=ctx.env,
                        timeout=request.timeout)
    status, reason = judges.judge_serve(report, check.answer, max_tokens=check.max_tokens)
    return status, reason, report


#: The bodies of the ladder's stages that need more than their row (a process shared with other
#: stages, the donor as the reference, a judge given more than the report), by stage name. A new
#: stage needs none: :func:`_from_row` runs it from its row.
_BODIES: dict[str, Callable[[_Ladder], Answer]] = {
    "interpreter": _interpreter, "imports": _imports, "native-load": _native, "library-provenance": _provenance,
    "requirements": _requirements, "server-args": _server_args, "smoke": _smoke, "serve": _serve, "jit-caches": _jit}

#: The ``parallel`` stages that run the stages needing them their own way, by stage name.
_TASKS: dict[str, Callable[[_Ladder], None]] = {"imports": _imports_stages, "server-args": _server_args_stages}


def _cause_of(unchecked: Sequence[Mapping[str, str]]) -> str:
    """The cause of a stage none of whose items could be checked: ``no-driver`` when any needs
    the driver, else that of the first item (``nothing-to-check`` when there is none)."""
    causes = [u["cause"] for u in unchecked]
    if "no-driver" in causes:
        return "no-driver"
    return causes[0] if causes else "nothing-to-check"


def _not_asked(what: str, key: str, manifest: bool) -> str:
    """A stage's skip reason when its ``verify.KEY`` setting is absent: ``no verify.KEY in the
    manifest``, or without a manifest ``no WHAT given: ...`` naming where it is given."""
    if manifest:
        return f"no verify.{key} in the manifest"
    return f"no {what} given: verify with a manifest that sets verify.{key} to run this stage"


#: Runs a host script in the donor's venv: ``(script, args, request) -> report``; a request's
#: ``paths`` are relative to the donor's prefix and made absolute by the runner.
DonorRun = Callable[[str, list, "Mapping[str, Any] | None"], Mapping[str, Any]]


def _on_donor(donor_run: DonorRun, script: str, args: list, request: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The donor's report for the same check, or None when it cannot be had (the donor
    answers an error: then nothing is excused)."""
    try:
        return donor_run(script, args, request)
    except TransplantError:
        return None


def _recorded(answer: Mapping[str, Any] | None) -> str:
    """``; the donor's results recorded with snapshot ID on DATE (AGE)`` for an answer from a
    snapshot's record (:mod:`transplant.verify.recorded`), else nothing: a reason that uses the
    donor's word says when the donor said it."""
    from transplant.verify.recorded import provenance

    said = provenance(answer)
    return f"; the donor's results {said}" if said else ""


def donor_reader(read: Callable[[], Inventory]) -> Callable[[], Inventory | None]:
    """Wrap a donor probe so that an unreachable donor gives None instead of an error."""

    def attempt() -> Inventory | None:
        try:
            return read()
        except TransplantError:
            return None

    return attempt
