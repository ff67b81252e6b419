"""Run the verify stages in the target venv (edge).

Each stage runs in a fresh interpreter of the target venv with the manifest's
``verify.env`` and a timeout; its report is judged by :mod:`transplant.verdicts`.
Stages, cheapest first: ``imports``, ``requirements``, ``server-args``, ``smoke``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
import time
from collections.abc import Callable, Mapping

from .checks import requirement_findings
from .errors import HostError, TransplantError
from .hosts import Host
from .inventory import Inventory
from .manifest import VerifySettings
from .probing import run_script, take_inventory
from .verdicts import StageResult, judge_imports, judge_requirements, judge_server_args, judge_smoke

__all__ = ["run_stages"]

Announce = Callable[[str], None]


def _timed(name: str, body: Callable[[], tuple[str, str, Mapping]]) -> StageResult:
    started = time.monotonic()
    try:
        status, reason, details = body()
    except HostError as exc:
        status, reason, details = "fail", str(exc), {}
    return StageResult(name=name, status=status, reason=reason, seconds=time.monotonic() - started, details=details)


def run_stages(
    settings: VerifySettings,
    *,
    target: Host,
    venv: str,
    donor_inventory: Callable[[], Inventory | None] | None = None,
    announce: Announce | None = None,
) -> list[StageResult]:
    """Run every verify stage and return their results in order.

    :param settings: the manifest's verify settings (or ones built from the command line).
    :param donor_inventory: returns the donor's inventory for the requirements stage's
        reference, or None when there is no donor to compare with. An unmet requirement
        fails the stage only when the donor's environment satisfies it (the target lacks
        what the donor shows can be had); one the donor cannot meet either is a warning.
        Without a donor nothing can be compared, so every unmet requirement fails.
    :param announce: called with each stage's name before it runs (for progress).
    :raises HostError: only when the target cannot be reached at all.
    """
    env = dict(settings.env)
    timeout = settings.timeout
    results = []

    def step(name: str) -> None:
        if announce:
            announce(name)

    step("imports")

    def imports() -> tuple[str, str, Mapping]:
        if not settings.imports:
            return "skip", "no import names given (verify.imports)", {}
        report = run_script(target, venv, "stage_imports", settings.imports, env=env, timeout=timeout)
        status, reason = judge_imports(report)
        return status, reason, report

    results.append(_timed("imports", imports))

    step("requirements")

    def requirements() -> tuple[str, str, Mapping]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            donor_future = pool.submit(donor_inventory) if donor_inventory else None
            live = take_inventory(target, venv, record=False, timeout=timeout)
            donor = donor_future.result() if donor_future else None
        donor_env = donor.latest() if donor is not None else None
        findings = requirement_findings(live.latest(), live.interpreter.markers,
                                        reference=[donor_env] if donor_env else [], venv=venv, donor=donor_env)
        status, reason = judge_requirements(findings)
        if donor is None and donor_inventory is not None:
            reason += " (the donor could not be read, so every unmet requirement counts)"
        return status, reason, {"findings": [asdict(f) for f in findings]}

    results.append(_timed("requirements", requirements))

    step("server-args")

    def server_args() -> tuple[str, str, Mapping]:
        check = settings.server_args
        if check is None:
            return "skip", "no verify.server_args in the manifest", {}
        args = [check.entry, json.dumps(sorted(check.expect)), *check.args]
        report = run_script(target, venv, "stage_server_args", args, env=env, timeout=timeout)
        status, reason = judge_server_args(check.expect, report)
        return status, reason, report

    results.append(_timed("server-args", server_args))

    step("smoke")

    def smoke() -> tuple[str, str, Mapping]:
        if settings.smoke_device is None:
            return "skip", "no verify.smoke in the manifest", {}
        report = run_script(target, venv, "stage_smoke", [settings.smoke_device], env=env, timeout=timeout)
        status, reason = judge_smoke(report)
        return status, reason, report

    results.append(_timed("smoke", smoke))
    return results


def donor_reader(read: Callable[[], Inventory]) -> Callable[[], Inventory | None]:
    """Wrap a donor probe so that an unreachable donor gives None instead of an error."""

    def attempt() -> Inventory | None:
        try:
            return read()
        except TransplantError:
            return None

    return attempt
