"""Renderers (face): rich tables for people, JSON for programs."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from transplant.core.inventory import Inventory
from transplant.core.units import human_bytes
from transplant.core.plan import Finding, Plan
from transplant.verify.judges import VERIFY_SCHEMA, StageResult

__all__ = ["rule", "history_table", "plan_table", "findings_table", "stages_table", "inventory_table",
           "verify_json", "verify_junit", "print_plan"]

#: The widest a separator line is drawn (characters): a console laid out for a pipe or a file is
#: thousands of columns wide so that nothing wraps, and a rule that wide is noise in a log.
RULE_MAX_WIDTH = 100


def rule(console: Console, title: str = "") -> None:
    """Print a separator line with ``title``, as wide as the console but at most
    :data:`RULE_MAX_WIDTH` characters."""
    from rich.rule import Rule

    console.print(Rule(Text(title)), width=min(console.width, RULE_MAX_WIDTH))


_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "skip": "yellow"}
_ACTION_STYLE = {"keep": "dim", "add": "green", "upgrade": "cyan", "downgrade": "magenta", "rebuild": "bold cyan",
                 "refresh": "cyan", "replace": "cyan", "remove": "red"}


def plan_table(plan: Plan) -> Table:
    """One row per change: distribution or patch, action, from, to, files (copy / remove), bytes, why."""
    table = Table(title=Text(f"plan: {plan.donor.label} -> {plan.target.label}"), title_justify="left")
    for column in ("distribution / patch", "action", "from", "to", "files", "bytes", "why"):
        table.add_column(column, overflow="fold", justify="right" if column in ("files", "bytes") else "left",
                         no_wrap=column in ("action", "files", "bytes"))
    for change in plan.changes:
        files = f"{len(change.copy)}" + (f" / -{len(change.remove)}" if change.remove else "")
        name = change.name if change.kind == "distribution" else f"patch {change.name.rsplit('site-packages/', 1)[-1]}"
        table.add_row(Text(name), Text(change.action, style=_ACTION_STYLE.get(change.action, "")),
                      Text(change.from_version or "-"), Text(change.to_version or "-"), files,
                      human_bytes(change.bytes), Text(change.reason))
    return table


def findings_table(findings: Sequence[Finding], title: str = "findings") -> Table:
    """Severity, code, what was found, and the fix."""
    table = Table(title=title, title_justify="left", show_lines=True)
    for column in ("severity", "code", "found", "fix"):
        table.add_column(column, overflow="fold")
    for f in findings:
        severity = Text(f.severity, style=_SEVERITY_STYLE[f.severity])
        found = Text(f.message)
        if f.accepted is not None:
            severity = Text(f"{f.severity} (accepted)", style="dim")
            found.append(f"\naccepted in the manifest: {f.accepted}", style="italic")
        table.add_row(severity, f.code, found, Text(f.hint))
    return table


def print_plan(console: Console, plan: Plan) -> None:
    """The plan's changes, totals, findings and fixes, readable at any width (see :mod:`transplant.cli.planview`)."""
    from transplant.cli.planview import print_plan_view

    print_plan_view(console, plan)


def stages_table(results: Sequence[StageResult], title: str) -> Table:
    """Stage, status, seconds, reason."""
    table = Table(title=title, title_justify="left")
    for column in ("stage", "status", "seconds", "reason"):
        table.add_column(column, overflow="fold", justify="right" if column == "seconds" else "left")
    for r in results:
        table.add_row(r.name, Text(r.status.upper(), style=_STATUS_STYLE[r.status]), f"{r.seconds:.1f}", Text(r.reason))
    return table


def verify_json(results: Sequence[StageResult], target: str, *, strict: bool = False) -> str:
    """``{"schema", "target", "ok", "strict", "counts": {"pass", "fail", "skip"}, "causes": {CAUSE:
    [STAGE or STAGE:ITEM]}, "verdict", "stages": [{"name", "status", "reason", "cause", "unchecked",
    "seconds", "details"}]}``; ``ok`` is false when a stage failed (skips are counted apart)."""
    from transplant.verify.verdict import causes_of, counts, verdict_line

    doc: dict[str, Any] = {"schema": VERIFY_SCHEMA, "target": target, "strict": strict,
                           "ok": not any(r.status == "fail" for r in results),
                           "counts": counts(results), "causes": causes_of(results),
                           "verdict": verdict_line(results, strict_mode=strict),
                           "stages": [r.to_dict() for r in results]}
    return json.dumps(doc, indent=2, sort_keys=True, default=str)


def verify_junit(results: Sequence[StageResult], target: str) -> str:
    """The results as JUnit XML (the format CI systems read): one ``<testsuite name="transplant
    verify TARGET">`` with one ``<testcase>`` per stage; a fail carries ``<failure message>``,
    a skip ``<skipped message>`` (never counted as passed); the reason is also in
    ``<system-out>``."""
    from xml.etree import ElementTree as ET

    suite = ET.Element("testsuite", name=f"transplant verify {target}", tests=str(len(results)),
                       failures=str(sum(r.status == "fail" for r in results)), errors="0",
                       skipped=str(sum(r.status == "skip" for r in results)),
                       time=f"{sum(r.seconds for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="transplant.verify", name=r.name, time=f"{r.seconds:.3f}")
        if r.status == "fail":
            ET.SubElement(case, "failure", message=r.reason, type="fail").text = r.reason
        elif r.status == "skip":
            ET.SubElement(case, "skipped", message=f"[{r.cause or 'not-run'}] {r.reason}")
        ET.SubElement(case, "system-out").text = r.reason
    suites = ET.Element("testsuites")
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def inventory_table(inv: Inventory) -> Table:
    """One row per distribution: name, version, files in RECORD, RECORD's bytes, installer.

    Files are the RECORD rows inside the venv; bytes are the sum of those rows' RECORD size
    column, with or without ``--files`` (the summary's ``record_bytes``, or each file's
    ``record_size``): the column keeps one meaning whatever the options, and its header says
    which (sizes on disk, where ``--files`` looked at them, are in ``--json``)."""
    table = Table(title=f"{inv.label} (Python {inv.interpreter.version}, {inv.interpreter.machine}, "
                        f"glibc {inv.interpreter.glibc}; {inv.nvidia.reason or inv.nvidia.driver_version})",
                  title_justify="left")
    for column in ("distribution", "version", "files", "bytes (RECORD)", "installer"):  # names and versions never wrap
        table.add_column(column, justify="right" if column in ("files", "bytes (RECORD)") else "left",
                         no_wrap=column != "installer")
    for d in inv.distributions:
        if d.record is None and d.record_files is not None:
            count, size = d.record_files, d.record_bytes or 0
        else:
            count, size = len(d.files), sum(e.record_size or 0 for e in d.files.values())
        table.add_row(Text(d.display_name), Text(d.raw_version or "?"), str(count), human_bytes(size),
                      Text(d.installer or "-"))
    return table


def history_table(transactions: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
                  where: str) -> Group | Text:
    """Transactions of a target, then one line per transaction naming its source: id, state, paths (those it leaves, as ``status``
    counts them; older records without them show their step count), and the events recorded for each.

    :param events: history entries ``{"id", "event", "time": epoch seconds, ...}``; a
        ``verified`` event carries ``ok`` (bool, written by :func:`transplant.recover.provenance.record_verified`)
        and is shown as ``verify passed`` or ``verify failed`` (``verify ?`` when ``ok`` is not a
        bool): the word "verified" alone read as a success for verifies that failed. The verify
        events of one transaction are folded into one entry where it had more than one, at the place of its
        last (``verify failed 12:00:09 (5 verifies: 3 passed, 2 failed)``): a target verified every few
        minutes by a timer made the events cell thousands of entries long. An outcome with
        ``completed_by: "host"`` (a commit its host script completed after the controller died,
        recorded later by :func:`transplant.apply.txn.record_completed`) is shown as ``applied by the host``.
    :param where: the target, for the title.
    :returns: the table and its source lines; with no transaction, the one line
        ``no transactions in WHERE`` (a table without rows read as a fault of the output).
    """
    if not transactions:
        return Text(f"no transactions in {where}: transplant has applied nothing to this venv")
    table = Table(title=f"transactions in {where}", title_justify="left")
    longest = max((len(str(t["id"])) for t in transactions), default=2)
    table.add_column("id", no_wrap=True, min_width=longest)  # an id is typed back whole (rollback --to ID)
    for column in ("state", "paths", "events"):  # paths: the unit status counts
        table.add_column(column, no_wrap=column in ("state", "paths"))
    by_id: dict[str, list[str]] = {}
    verifies: dict[str, list[str]] = {}  # per transaction: each verify's outcome (passed, failed, ?), in order
    for event in events:
        if not isinstance(event, Mapping):
            continue
        stamp_at = event.get("time")
        try:
            stamp = time.strftime("%H:%M:%S", time.gmtime(stamp_at)) if isinstance(stamp_at, (int, float)) else "?"
        except (OverflowError, OSError, ValueError):
            stamp = "?"
        name = str(event.get("event"))
        key = str(event.get("id"))
        shown = by_id.setdefault(key, [])
        if name == "verified":
            ok = event.get("ok")
            outcome = "passed" if ok is True else "failed" if ok is False else "?"
            outcomes = verifies.setdefault(key, [])
            outcomes.append(outcome)
            if len(outcomes) > 1:  # one entry for them all, where the last one stands
                shown[:] = [entry for entry in shown if not entry.startswith("verify ")]
                tally = ", ".join(f"{outcomes.count(o)} {o}" for o in ("passed", "failed", "?") if o in outcomes)
                shown.append(f"verify {outcome} {stamp} ({len(outcomes)} verifies: {tally})")
            else:
                shown.append(f"verify {outcome} {stamp}")
            continue
        if event.get("completed_by") == "host":
            name = f"{name} by the host"
        shown.append(f"{name} {stamp}")
    for t in transactions:
        table.add_row(Text(str(t["id"])), Text(str(t["state"])),
                      str(t.get("paths", t.get("steps", ""))), Text(", ".join(by_id.get(str(t["id"]), []))))
    # the sources (a host and venv path each) below the table, whole: a path is never cut inside a cell
    sources = [Text(f"{t['id']} from {t.get('source') or '?'}") for t in transactions]
    return Group(table, *sources)
