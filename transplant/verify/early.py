"""The verify ladder's imports process, started as early as the command can (edge).

Without an overlay the names ``imports`` checks do not depend on the inventory (see
:mod:`transplant.verify.runner`), so their process can start before the ladder's other work,
even before the controller has loaded the modules that work needs: ``transplant verify
HOST:VENV`` starts it right after connecting (:func:`start_imports`) and hands it to
:func:`transplant.verify.runner.run_stages`. It is the ladder's longest process (it imports
torch and the stack); the controller's own start-up (about 0.3 s of CPU here) then overlaps it
instead of coming first. This module imports only what starting it needs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from transplant import remote
from transplant.core import verify_stages
from transplant.core.manifest import VerifySettings
from transplant.hosts.host import Host
from transplant.hosts.probing import WaitingScript
from transplant.verify import ladder

__all__ = ["Started", "early_names", "start_imports", "first_line", "second_line", "server_args_fork", "smoke_fork"]


@dataclass
class Started:
    """An imports process started ahead (:func:`start_imports`).

    :ivar script: the process, told the first line of its request.
    :ivar names: the import names it imports, in order.
    :ivar at: when it was started (:func:`time.monotonic`): the imports stages' seconds count from it.
    :ivar venv: the venv it runs in.
    :ivar env: the environment it was started with (``verify.env``).
    """

    script: WaitingScript
    names: list[str]
    at: float
    venv: str
    env: dict[str, str]

    def close(self) -> None:
        """End it when it goes unasked (idempotent)."""
        self.script.close()


def early_names(settings: VerifySettings) -> list[str]:
    """The import names an imports process can be started with before the inventory: those of
    ``verify.imports`` less ``verify.skip_imports``; empty with an overlay (its names come from
    the inventory)."""
    if settings.overlay:
        return []
    return [n for n in ladder.import_names([], settings.imports) if n not in settings.skip_imports]


def first_line(modules: list[str], optional: list[str], preload: list[str], guess: bool,
               server_args: dict[str, Any] | None = None, smoke: dict[str, Any] | None = None) -> bytes:
    """The first line of the imports script's request: the provenance script's ``facts`` after
    ``modules`` (``optional`` ones only where installed) under ``"provenance"``, and the loader
    child of native-load forked once ``preload`` is imported (only those installed when
    ``guess``), whose paths come on the second line (:func:`second_line`); the names imported
    by as many processes as the host has CPUs (at most 4); with ``server_args``
    (:func:`server_args_fork`'s), the server-args child forked once its package is imported; with
    ``smoke`` (:func:`smoke_fork`'s), smoke's child forked right after torch where CUDA is not
    initialized."""
    request: dict[str, Any] = {
        "jobs": "auto",
        "provenance": {"modules": modules, "optional": optional, "source": remote.source("stage_provenance").decode()},
        "native": {"preload": preload, "optional": preload if guess else [],
                   "source": remote.source("stage_native").decode()}}
    if server_args is not None:
        request["server_args"] = server_args
    if smoke is not None:
        request["smoke"] = smoke
    return json.dumps(request).encode() + b"\n"


def _deadline(timeout: float) -> float:
    """A forked stage's deadline in seconds from the imports process's start: ``verify.timeout``
    less a tenth, at most 5 s (the child is killed before the imports process runs out of time)."""
    return round(timeout - min(5.0, timeout / 10), 3)


def _stage_request(settings: VerifySettings, name: str) -> verify_stages.Request | None:
    """What the stage ``name``'s own process would be run with (its row's ``request``), or None
    when the settings ask nothing of it."""
    request = verify_stages.stage(name).request
    return request(settings) if request is not None else None


def smoke_fork(settings: VerifySettings) -> dict[str, Any] | None:
    """The imports script's ``smoke`` request: smoke's arguments (those ``stage_smoke`` gets as its
    own process), its deadline (as :func:`server_args_fork`'s) and its script; None when the
    settings ask for no smoke check. The script forks the child only after importing torch, and
    only while CUDA is not initialized there; else the stage runs its own process."""
    asked = _stage_request(settings, "smoke")
    if asked is None:
        return None
    return {"argv": list(asked.args), "deadline": _deadline(settings.timeout),
            "source": remote.source("stage_smoke").decode()}


def server_args_fork(settings: VerifySettings, names: list[str]) -> dict[str, Any] | None:
    """The imports script's ``server_args`` request: the server-args stage's arguments (those
    ``stage_server_args`` gets as its own process), the top-level package of ``verify.server_args``'
    entry after whose import the child is forked, and the deadline in seconds from the imports
    process's start (``verify.timeout`` less a tenth, at most 5 s: the child is killed before the
    imports process itself runs out of time). None when there is no such check or that package is
    not among ``names`` (the import names, in the imports script's order): then the stage runs its
    own process."""
    check = settings.server_args
    if check is None:
        return None
    top = check.entry.partition(":")[0].split(".")[0]
    asked = _stage_request(settings, "server-args")
    if top not in names or asked is None:
        return None
    return {"argv": list(asked.args), "after": top, "deadline": _deadline(settings.timeout),
            "source": remote.source("stage_server_args").decode()}


def second_line(paths: list[str]) -> bytes:
    """The second line of the imports script's request: the shared objects native-load loads."""
    return json.dumps({"paths": paths}).encode() + b"\n"


def start_imports(settings: VerifySettings, target: Host, venv: str) -> Started | None:
    """Start the imports process of ``settings`` in ``venv`` now, before the inventory: torch among
    the provenance modules, and preloaded for native-load, only if it is installed (the
    inventory later says whether that guess was right).

    :returns: the started process, or None when it cannot start early (an overlay, no import
        names); a process that failed to spawn is returned too (``script.started`` False: the
        ladder then runs the script as usual and reports its error).
    """
    names = early_names(settings)
    if not names:
        return None
    env = dict(settings.env)
    at = time.monotonic()
    script = WaitingScript(target, venv, "stage_imports", names, env=env)
    script.tell(first_line(["torch"] + [n for n in names if n != "torch"], ["torch"], ["torch"], True,
                           server_args_fork(settings, names), smoke_fork(settings)))
    return Started(script=script, names=names, at=at, venv=venv, env=env)
