"""The verify ladder's stages, each declared once (pure core): one :class:`Stage` row per stage.

The runner (:mod:`transplant.verify.runner`) runs them from this table, in its order; the names
of its rows are the stages' names in the results, the JSON and JUnit reports and the progress
lines, and the manifest's ``verify.required`` accepts the names of its requirable rows.

A stage that runs its host script with a request made from the verify settings and judges the
script's report needs no code of its own in the runner: its row names the script
(``transplant/remote/stage_*.py``, found there by :mod:`transplant.remote`), how its request is
made (:attr:`Stage.request`) and its judge (a function of :mod:`transplant.verify.judges`, named
here so that this table stays in the core the manifest reads). The stages below have bodies of
their own in the runner (a shared process, the donor as the reference), found by their names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # the manifest reads this table for verify.required: no import back at run time
    from transplant.core.manifest import VerifySettings

__all__ = ["Stage", "Request", "STAGES", "NAMES", "GROUPS", "REQUIRABLE", "stage", "names", "requirable"]

#: When a stage runs: ``first`` (the interpreter: it takes the inventory the others read), then the
#: ``parallel`` ones at once (each its own host process, reading only the inventories), then the
#: ``serial`` ones one after the other (they use the GPU and a port).
GROUPS = ("first", "parallel", "serial")


class Request(NamedTuple):
    """What a stage's host script is given: its arguments, its JSON request on stdin (None:
    none), and its timeout in seconds (None: ``verify.timeout``)."""

    args: tuple[str, ...] = ()
    document: Mapping[str, Any] | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Stage:
    """One row of the ladder.

    :ivar name: the stage's name in results, reports and ``verify.required``.
    :ivar script: its host script (``transplant/remote/<script>.py``), or None when it runs none
        of its own (it reads the inventory, or another stage's report).
    :ivar request: its script's :class:`Request` made from the verify settings, None returned when
        the settings do not ask for the stage (a ``not-requested`` skip naming :attr:`setting`);
        None: the runner's own body for the stage makes it.
    :ivar judge: the name of the function of :mod:`transplant.verify.judges` that judges its
        report, ``(report) -> (status, reason)`` for a stage run from its row alone.
    :ivar needs: the stages whose outcome it reads: every stage but the first reads the target's
        inventory (``interpreter``), and is a ``not-run`` skip when that could not be taken; a
        ``parallel`` stage that needs another ``parallel`` one runs right after it, in its thread.
    :ivar group: one of :data:`GROUPS`.
    :ivar requirable: whether it runs again in the donor when it fails in the target, so that
        ``verify.required`` may name it (the runner's own body for the stage compares; a stage
        run from its row alone is not compared with the donor: its failure is a failure).
    :ivar setting: the ``verify.KEY`` that asks for it (in a ``not-requested`` skip's reason), or
        None when it always runs.
    :ivar what: what the setting gives, in the reason of that skip without a manifest
        (``no WHAT given``).
    :ivar shown: whether the settings make it a row of the result (None: always).
    """

    name: str
    script: str | None
    judge: str
    group: str
    needs: tuple[str, ...] = ("interpreter",)
    request: Callable[[VerifySettings], Request | None] | None = None
    requirable: bool = False
    setting: str | None = None
    what: str | None = None
    shown: Callable[[VerifySettings], bool] | None = None


def _server_args(settings: VerifySettings) -> Request | None:
    check = settings.server_args
    if check is None:
        return None
    wanted = {"attrs": sorted(check.expect), "resolve": check.resolve}
    return Request((check.entry, json.dumps(wanted), *check.args))


def _resolving(settings: VerifySettings) -> bool:
    return settings.server_args is not None and settings.server_args.resolve


def _smoke(settings: VerifySettings) -> Request | None:
    return None if settings.smoke_device is None else Request((settings.smoke_device,))


def _serve(settings: VerifySettings) -> Request | None:
    check = settings.serve
    if check is None:
        return None
    # the script keeps its own deadline and always stops the server; this timeout is the backstop
    return Request(document={"command": list(check.command), "health": check.health, "path": check.path,
                             "body": dict(check.body), "config": dict(check.config) if check.config else None,
                             "deadline": check.timeout}, timeout=check.timeout + 60)


#: The ladder, cheapest first: the order of its results.
STAGES: tuple[Stage, ...] = (
    Stage("interpreter", None, "judge_interpreter", "first", needs=()),
    Stage("imports", "stage_imports", "judge_imports", "parallel", requirable=True),
    Stage("native-load", "stage_native", "native_verdict", "parallel", requirable=True),
    Stage("library-provenance", "stage_provenance", "judge_provenance", "parallel",
          needs=("interpreter", "imports")),
    Stage("requirements", None, "judge_requirements", "parallel"),
    Stage("server-args", "stage_server_args", "judge_server_args", "parallel", request=_server_args,
          requirable=True, setting="server_args", what="server arguments"),
    Stage("server-args-resolve", None, "judge_resolve", "parallel", needs=("interpreter", "server-args"),
          shown=_resolving),
    Stage("smoke", "stage_smoke", "judge_smoke", "serial", request=_smoke, requirable=True, setting="smoke",
          what="smoke check"),
    Stage("serve", "stage_serve", "judge_serve", "serial", request=_serve, setting="serve", what="serve check"),
    Stage("jit-caches", "stage_jit", "judge_jit_caches", "parallel"),
)


def stage(name: str) -> Stage:
    """The row named ``name``.

    :raises KeyError: no stage of that name.
    """
    for row in STAGES:
        if row.name == name:
            return row
    raise KeyError(name)


def names(stages: Sequence[Stage] | None = None) -> tuple[str, ...]:
    """The stages' names in the ladder's order (of :data:`STAGES` when ``stages`` is None, read
    when called, so that a row added to the table is named)."""
    return tuple(row.name for row in (STAGES if stages is None else stages))


def requirable(stages: Sequence[Stage] | None = None) -> tuple[str, ...]:
    """The names ``verify.required`` accepts: the requirable rows', in the ladder's order."""
    return tuple(row.name for row in (STAGES if stages is None else stages) if row.requirable)


#: The stages' names, in the ladder's order.
NAMES = names()

#: The stages ``verify.required`` may name.
REQUIRABLE = requirable()
