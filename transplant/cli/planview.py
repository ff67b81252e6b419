"""How a plan reads at a terminal of any width (face): no version, name, path or command is ever
broken or cut.

* The changes: at 100 columns or more, where it fits with its ``why`` column at least 20 wide, a
  table whose name, action, version, files and bytes columns never wrap (the ``why`` column
  wraps between words); narrower, or where a long name would squeeze ``why``, one line per
  distribution as uv prints them: ``+ name==ver`` (arrives), ``- name==ver`` (goes),
  ``~ name old -> new`` (changes), ``= name==ver`` (kept; counted, not listed).
* The findings: never a table cell. Each is a whole line ``severity code (dists): message``,
  its sentences said once each (a hint repeated for every distribution reads once). The fixes
  follow below, each said once with the codes it serves; the manifest edits that several
  findings share (``add 'x' to remove:``, ``add 'y' to overlay``) are gathered into one
  snippet (``remove: [nvidia-*-cu12, sgl-kernel]``). Commands are printed as whole lines that
  the console never wraps, so they can be pasted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from transplant.core.units import count
from transplant.core.plan import Finding, Plan

__all__ = ["print_plan_view", "changes_table", "table_fits", "change_lines", "finding_lines", "manifest_snippet", "once", "NARROW"]

#: Below this many columns the plan is printed as lines, not a table.
NARROW = 100
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_ACTION_STYLE = {"keep": "dim", "add": "green", "upgrade": "cyan", "downgrade": "magenta", "rebuild": "bold cyan",
                 "refresh": "cyan", "replace": "cyan", "remove": "red"}
_NAME = r"[A-Za-z0-9][A-Za-z0-9._*?\[\]-]*"
# "add 'x' to remove:", "add x to overlay", "add to remove: in m.yaml: [a, b]"
_ONE = re.compile(rf"add '?({_NAME})'? to (remove|overlay)\b")
_LIST = re.compile(r"add to (remove|overlay):? in \S+?: \[([^\]]*)\]")
# "add to overlay in m.yaml: torchaudio (the donor has 2.9.1), torchcodec (the donor has 0.8.0)"
_NAMED = re.compile(r"add to (remove|overlay):? in \S+?: (?!\[)(.+)")
_NAMED_ONE = re.compile(r"(?:^|, )([A-Za-z0-9][A-Za-z0-9._*-]*) \(")


#: How a hint whose first fix is a manifest addition (gathered into the snippet) offers another
#: one, worded without "add ... to" (``; the other fix: leave x out of overlay: ...``): that part
#: is listed with the other hints, so the snippet never holds both fixes and the second is not lost.
OTHER_FIX = "the other fix: "


def _human(count: int) -> str:
    from transplant.core.units import human_bytes
    return human_bytes(count)


def once(text: str) -> str:
    """``text`` with each ``; ``-separated sentence kept once, in order of first appearance."""
    seen: list[str] = []
    for part in text.split("; "):
        if part not in seen:
            seen.append(part)
    return "; ".join(seen)


def _files(change) -> str:
    return f"{len(change.copy)}" + (f" / -{len(change.remove)}" if change.remove else "")


def _file_count(change) -> str:
    """``1 file``, ``3 files``, ``3 / -1 files`` (copied / removed): the noun agrees with the count."""
    return f"{_files(change)} files" if change.remove else count(len(change.copy), "file")


def _label(change) -> str:
    return change.name if change.kind == "distribution" else f"patch {change.name.rsplit('site-packages/', 1)[-1]}"


def changes_table(plan: Plan) -> Table:
    """One row per change; only the ``why`` column wraps, between words."""
    table = Table(title=Text(f"plan: {plan.donor.label} -> {plan.target.label}"), title_justify="left")
    for column in ("distribution / patch", "action", "from", "to", "files", "bytes"):
        table.add_column(column, no_wrap=True, justify="right" if column in ("files", "bytes") else "left")
    table.add_column("why", min_width=WHY_MIN)
    for change in plan.changes:
        table.add_row(Text(_label(change)), Text(change.action, style=_ACTION_STYLE.get(change.action, "")),
                      Text(change.from_version or "-"), Text(change.to_version or "-"), _files(change),
                      _human(change.bytes), Text(change.reason))
    return table


#: The narrowest the ``why`` column may be (characters) for the changes to print as a table.
WHY_MIN = 20


def table_fits(plan: Plan, width: int) -> bool:
    """Whether :func:`changes_table` fits ``width`` columns with its ``why`` column at least
    :data:`WHY_MIN` wide: the columns that never wrap (their widest cell or header) plus rich's
    default padding (one space each side) and the borders (one between columns and at each
    edge). A patch with a long path makes the name column wide; then the plan prints as lines
    rather than cut the ``why`` column to a few characters at the edge."""
    from rich.cells import cell_len

    rows = [(_label(c), c.action, c.from_version or "-", c.to_version or "-", _files(c), _human(c.bytes))
            for c in plan.changes]
    headers = ("distribution / patch", "action", "from", "to", "files", "bytes")
    fixed = sum(max([cell_len(h), *(cell_len(r[i]) for r in rows)]) + 2 for i, h in enumerate(headers))
    return fixed + WHY_MIN + 2 + len(headers) + 2 <= width


def change_lines(plan: Plan) -> list[Text]:
    """The changes, one line each (``+`` / ``-`` / ``~``), kept ones counted at the end."""
    out = [Text(f"plan: {plan.donor.label} -> {plan.target.label}", style="bold")]
    kept = 0
    for change in plan.changes:
        style = _ACTION_STYLE.get(change.action, "")
        if change.action == "keep":
            kept += 1
            continue
        if change.kind != "distribution":
            sign = "-" if change.action == "remove" else "+"
            out.append(Text(f"{sign} {_label(change)}", style=style))
            continue
        if change.action == "add":
            line = f"+ {change.name}=={change.to_version}"
        elif change.action == "remove":
            line = f"- {change.name}=={change.from_version}"
        else:
            line = f"~ {change.name} {change.from_version} -> {change.to_version} ({change.action})"
        out.append(Text(f"{line}  {_file_count(change)}, {_human(change.bytes)}", style=style))
    if kept:
        out.append(Text(f"= {kept} kept as they are", style="dim"))
    return out


def finding_lines(findings: Sequence[Finding]) -> list[Text]:
    """Each finding as one whole line (its sentences once each)."""
    out = []
    for f in findings:
        line = Text()
        severity = f"{f.severity} (accepted)" if f.accepted is not None else f.severity
        line.append(severity, style="dim" if f.accepted is not None else _SEVERITY_STYLE[f.severity])
        line.append(f" {f.code}")
        if f.dists:
            shown = ", ".join(f.dists[:8]) + (f" and {len(f.dists) - 8} more" if len(f.dists) > 8 else "")
            line.append(f" ({shown})", style="dim")
        line.append(f": {once(f.message)}")
        if f.accepted is not None:
            line.append(f" [accepted in the manifest: {f.accepted}]", style="italic")
        out.append(line)
    return out


def manifest_snippet(findings: Sequence[Finding]) -> tuple[dict[str, list[str]], list[tuple[str, list[str]]]]:
    """The fixes of ``findings``: the manifest additions they ask for, gathered by key
    (``{"remove": [...], "overlay": [...]}``, each name once, in order), and every other hint
    once with the codes it serves (``[(hint, [codes])]``); "nothing to do" hints are left out, and
    hints that differ only in their last word, the finding's distribution (``... pip uninstall
    NAME``), become one command naming them all.

    The additions are read from the hints' own words (``add 'x' to remove: in m.yaml``,
    ``add to remove: in m.yaml: [a, b]``), the forms the rules write.
    """
    adds: dict[str, list[str]] = {"remove": [], "overlay": []}
    other: dict[str, list[str]] = {}
    tails: dict[str, list[str]] = {}  # hints that end in the finding's distribution: "... pip uninstall NAME"
    for f in findings:
        if f.accepted is not None or not f.hint or f.hint.startswith("nothing to do"):
            continue
        hint = once(f.hint)
        found = [(key, name) for name, key in _ONE.findall(hint)]
        for key, names in _LIST.findall(hint):
            found += [(key, n.strip().strip("'\"")) for n in names.split(",") if n.strip()]
        for key, rest in _NAMED.findall(hint):
            found += [(key, n) for n in _NAMED_ONE.findall(rest)]
        if found:  # the finding's own line says the rest of it, but another fix it offers (said apart)
            for key, name in found:
                if name not in adds[key]:
                    adds[key].append(name)
            for part in hint.split("; "):
                if part.startswith(OTHER_FIX):
                    codes = other.setdefault(part, [])
                    if f.code not in codes:
                        codes.append(f.code)
            continue
        last = hint.rsplit(" ", 1)
        if len(last) == 2 and last[1] in f.dists:
            names = tails.setdefault(last[0], [])
            if last[1] not in names:
                names.append(last[1])
            codes = other.setdefault(f"\0{last[0]}", [])
        else:
            codes = other.setdefault(hint, [])
        if f.code not in codes:
            codes.append(f.code)
    # one command for the distributions whose hints differ only in their last word (pip uninstall A B C)
    other = {(f"{key[1:]} {' '.join(tails[key[1:]])}" if key.startswith("\0") else key): codes
             for key, codes in other.items()}
    return {k: v for k, v in adds.items() if v}, list(other.items())


def print_plan_view(console: Console, plan: Plan) -> None:
    """The plan as the module docstring says: changes, totals, findings, fixes."""
    if console.width < NARROW or not table_fits(plan, console.width):
        for line in change_lines(plan):
            console.print(line, highlight=False)
    else:
        console.print(changes_table(plan))
    moving = [c for c in plan.changes if not c.is_noop]
    files = sum(len(c.copy) for c in plan.changes)
    removed = sum(len(c.remove) for c in plan.changes)
    console.print(f"{count(len(moving), 'change')}: {count(files, 'file')} ({_human(plan.copy_bytes)}) to copy, "
                  f"{removed} to remove; {len(plan.changes) - len(moving)} unchanged", highlight=False)
    if not plan.findings:
        return
    console.print(Text("findings", style="bold"))
    for line in finding_lines(plan.findings):
        console.print(line, highlight=False)
    adds, other = manifest_snippet(plan.findings)
    if adds or other:
        console.print(Text("fixes", style="bold"))
    if adds:
        console.print(f"in {plan.manifest}, add:", highlight=False, markup=False)
        for key, names in adds.items():
            # one whole line each, never wrapped by the console: it is pasted into the manifest
            console.print(f"  {key}: [{', '.join(names)}]", soft_wrap=True, highlight=False, markup=False)
    for hint, codes in other:
        console.print(Text(f"{', '.join(codes)}: ", style="dim") + Text(hint), soft_wrap=True, highlight=False)
    blocking = plan.blocking
    if blocking:
        console.print(Text(f"{count(len(blocking), 'error finding')} block{'s' if len(blocking) == 1 else ''} apply (use --force to apply anyway)",
                           style="bold red"))
