"""The real pair as a benchmark workload: the cached seed stacks, read only.

Usage::

    .venv/bin/python -m bench.real [--root ~/.cache/transplant/real] [--out FILE]

``ROOT`` holds the ``donor`` and ``target`` venvs that ``scripts/real-stacks`` installs
(about 11 GB and 50,000 files each), each finished only when it holds
``.transplant-real-complete``; without both, the workload is skipped with the reason
(exit 0). Nothing here writes to either venv: only plans run (a plan writes nothing but the
target's content-hash cache in ``<target>/.transplant/cache``), and ``TRANSPLANT_STATE_DIR``
is a temporary folder (the donor's hash cache lives there, then goes). Measured, one run
each, as processes on this machine with their peak RSS:

* ``transplant inventory local:<target>`` (metadata: RECORD alone) against ``pip inspect`` of
  the same venv, and ``inventory --files`` (every RECORD file looked at on disk);
* ``transplant plan`` of the calibrated forward manifest
  (``python -m transplant.lab.realstacks manifest DONOR TARGET OUT --calibrated``): first
  with ``TRANSPLANT_HASH_CACHE=0`` (no hash cache: every overlaid file hashed, the cold
  case), then twice with the caches on (the first fills the donor's and keeps the plan memo,
  the second, with ``TRANSPLANT_PLAN_MEMO=0``, is the warm plan the issue's target names), then
  once more as an operator's second plan (the memo's plan: two fingerprints, nothing read);
* a no-op plan: the same pair with an overlay of the distributions that are byte-identical
  on both sides (same dist-info name and RECORD) and no removals, so that nothing is left
  to change, three times (the second and third with warm caches; each with its peak RSS). A
  plan of a venv against itself is refused by design, and the after-apply scenario needs a
  5-minute clone;
* ``transplant verify local:<venv> --imports torch,sglang,flashinfer,sgl_kernel`` of each
  venv as it is (as the real test tier does): without a manifest nothing is recorded, the JIT
  caches are only looked at, and the stages' interpreters run with
  ``PYTHONDONTWRITEBYTECODE=1``, so nothing is written into either venv. ``--verify-only``
  measures these two alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, UTC
from pathlib import Path

from . import compile_transplant, measured

__all__ = ["DEFAULT_ROOT", "MARKER", "VERIFY_IMPORTS", "missing", "identical_distributions", "measure", "plan_summary",
           "verify_summary", "report", "main"]

DEFAULT_ROOT = Path.home() / ".cache" / "transplant" / "real"
MARKER = ".transplant-real-complete"
ROOT = Path(__file__).resolve().parent.parent
#: What verify imports on each side (the real test tier's list).
VERIFY_IMPORTS = "torch,sglang,flashinfer,sgl_kernel"


def missing(root: Path) -> str | None:
    """Why the real pair under ``root`` cannot be measured (a sentence), or None when both
    venvs are there and complete (``<venv>/bin/python`` and the marker file)."""
    for side in ("donor", "target"):
        venv = root / side
        if not (venv / "bin" / "python").exists():
            return f"no {side} venv at {venv} (scripts/real-stacks installs the real pair)"
        if not (venv / MARKER).is_file():
            return f"the {side} venv at {venv} is incomplete (no {MARKER}: its install did not finish)"
    return None


def _site(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{venv}: no lib/python3*/site-packages")
    return found[0]


def identical_distributions(donor: Path, target: Path) -> list[str]:
    """Names (normalised as PEP 503 does) of the distributions whose dist-info folder (name and
    version) and RECORD are the same bytes in both venvs: an overlay of them leaves nothing to change."""
    names = []
    target_site = _site(target)
    for info in sorted(_site(donor).glob("*.dist-info")):
        other = target_site / info.name
        record, other_record = info / "RECORD", other / "RECORD"
        if other_record.is_file() and record.is_file() and record.read_bytes() == other_record.read_bytes():
            names.append(re.sub(r"[-_.]+", "-", info.name[:-len(".dist-info")].rsplit("-", 1)[0]).lower())
    return names


def _pip(venv: Path) -> list[str]:
    """``pip inspect`` of ``venv``: its own pip when it has one, else this interpreter's with ``--python``."""
    if list(_site(venv).glob("pip-*.dist-info")):
        return [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "inspect"]
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(venv / "bin" / "python"),
            "inspect"]


def measure(root: Path, say=print, *, verify_only: bool = False) -> dict[str, tuple[float, int, int, str]]:
    """Every measurement of the real pair: name -> (seconds, peak RSS in bytes, exit status,
    :func:`plan_summary` of a plan, :func:`verify_summary` of a verify, or "").

    :param verify_only: measure only the verify of each side.

    :raises RuntimeError: a step could not run (its output in the message).
    """
    from transplant.lab.realstacks import CALIBRATED_OVERLAY, manifest_data

    import yaml

    donor, target = root / "donor", root / "target"
    work = Path(tempfile.mkdtemp(prefix="transplant-bench-real-", dir="/tmp"))
    out: dict[str, tuple[float, int, int, str]] = {}
    try:
        env = {**os.environ, "TRANSPLANT_STATE_DIR": str(work / "state"), "COLUMNS": "200",
               "PYTHONDONTWRITEBYTECODE": "1"}

        def step(name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
            seconds, rss, code, text = measured(argv, env={**env, **(extra or {})})
            what = plan_summary(text) if argv[:4] == plan[:4] else verify_summary(text) if argv[:4] == verify else ""
            out[name] = (seconds, rss, code, what)
            say(f"  {name}: {seconds:.2f} s, {rss / 2**20:.0f} MiB, exit {code} {what}")

        plan = [sys.executable, "-m", "transplant", "plan", "--json"]
        verify = [sys.executable, "-m", "transplant", "verify"]
        for side, venv in (("target", target), ("donor", donor)):
            step(f"verify: {side}", [*verify, f"local:{venv}", "--imports", VERIFY_IMPORTS, "--json"])
        if verify_only:
            return out
        forward = work / "forward.yaml"
        subprocess.run([sys.executable, "-m", "transplant.lab.realstacks", "manifest", str(donor), str(target),
                        str(forward), "--calibrated"], check=True, cwd=ROOT)
        same = [n for n in identical_distributions(donor, target) if n not in {o.lower() for o in CALIBRATED_OVERLAY}]
        noop = work / "noop.yaml"
        noop.write_text(yaml.safe_dump(manifest_data(str(donor), str(target), overlay=same, remove=[]),
                                       sort_keys=False))
        say(f"real pair at {root}: no-op overlay of {len(same)} identical distributions")
        step("inventory: transplant (metadata)", [sys.executable, "-m", "transplant", "inventory", f"local:{target}"])
        step("inventory: transplant --files (every RECORD file looked at)",
             [sys.executable, "-m", "transplant", "inventory", f"local:{target}", "--files"])
        step("inventory: pip inspect", _pip(target))
        step("plan forward, no hash cache (cold)", [*plan, str(forward)], {"TRANSPLANT_HASH_CACHE": "0"})
        step("plan forward, filling the hash caches", [*plan, str(forward)])
        step("plan forward, warm hash caches", [*plan, str(forward)], {"TRANSPLANT_PLAN_MEMO": "0"})
        step("plan forward, nothing changed since (the plan memo's plan)", [*plan, str(forward)])
        step("plan with nothing to change, first", [*plan, str(noop)])
        step("plan with nothing to change, warm", [*plan, str(noop)])
        step("plan with nothing to change, warm again", [*plan, str(noop)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def plan_summary(text: str) -> str:
    """What a ``plan --json`` output says, in a few words: files to copy and to remove, the
    blocking findings' codes (or why the output could not be read)."""
    import json

    start = text.find("{")
    try:
        plan, _ = json.JSONDecoder().raw_decode(text, start) if start >= 0 else (None, 0)
    except ValueError as exc:
        return f"(no plan document: {exc})"
    if not isinstance(plan, dict):
        return "(no plan document)"
    changes = plan.get("changes", [])
    copy = sum(len(c.get("copy", [])) for c in changes)
    remove = sum(len(c.get("remove", [])) for c in changes)
    blocking = sorted({f["code"] for f in plan.get("findings", []) if f.get("severity") == "error"
                       and f.get("accepted") is None})
    return f"{copy} file(s) to copy, {remove} to remove; blocking: {', '.join(blocking) or 'none'}"


def verify_summary(text: str) -> str:
    """What a ``verify --json`` output says, in a few words: each stage that ran with its
    seconds (a failed one marked), or why the output could not be read."""
    import json

    start = text.find("{")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, start) if start >= 0 else (None, 0)
    except ValueError as exc:
        return f"(no verify document: {exc})"
    if not isinstance(doc, dict) or not isinstance(doc.get("stages"), list):
        return "(no verify document)"
    ran = [f"{s['name']} {s['seconds']:.1f} s" + (" FAILED" if s["status"] == "fail" else "")
           for s in doc["stages"] if s.get("status") != "skip"]
    return ", ".join(ran) or "every stage skipped"


def report(results: dict[str, tuple[float, int, int, str]], root: Path) -> str:
    """The markdown section: every measurement, then each target of the issue met or missed."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Real pair ({root}, measured {stamp}, load average {os.getloadavg()[0]:.1f}, one run each)", "",
             "| measurement | seconds | peak RSS | exit | plan or stages |", "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {name} | {s:.2f} | {rss / 2**20:.0f} MiB | {code} | {what} |"
              for name, (s, rss, code, what) in results.items()]

    def get(name):
        return results[name][0]

    plans = [v for k, v in results.items() if k.startswith("plan")]
    rows = []
    if plans:
        rows = [("inventory (metadata) no slower than pip inspect", get("inventory: transplant (metadata)"),
                 get("inventory: pip inspect"), "s"),
                ("plan of the real pair at most 8 s (warm)", get("plan forward, warm hash caches"), 8.0, "s"),
                ("plan's controller RSS at most 300 MB", max(v[1] for v in plans) / 1e6, 300.0, "MB"),
                ("plan with nothing to change at most 1 s (warm)", get("plan with nothing to change, warm"), 1.0, "s")]
        noop = [v for k, v in results.items() if k.startswith("plan with nothing")]
        if noop:
            rows.append(("no-op plan's controller RSS at most 300 MB", max(v[1] for v in noop) / 1e6, 300.0, "MB"))
        if "plan with nothing to change, warm again" in results:
            rows.append(("plan with nothing to change at most 1 s (warm, again)",
                         get("plan with nothing to change, warm again"), 1.0, "s"))
    rows += [(f"verify of the real {side} at most 15 s", get(f"verify: {side}"), 15.0, "s")
             for side in ("target", "donor") if f"verify: {side}" in results]
    lines += ["", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for name, got, limit, unit in rows:
        lines.append(f"| {name} | {got:.2f} {unit} | {limit:.2f} {unit} | "
                     f"{'yes' if got <= limit else f'no, by {got / limit:.2f}x'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure the real pair (or say why not); returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.real", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(DEFAULT_ROOT), help="folder holding the donor and target venvs")
    parser.add_argument("--out", help="also write the markdown section to this file")
    parser.add_argument("--verify-only", action="store_true", help="measure only the verify of each venv")
    args = parser.parse_args(argv)
    root = Path(args.root).expanduser()
    why = missing(root)
    if why is not None:
        print(f"real pair: skipped: {why}")
        return 0
    compile_transplant()  # the measured commands load bytecode, as an installed transplant does
    section = report(measure(root, verify_only=args.verify_only), root)
    print(section)
    if args.out:
        Path(args.out).write_text(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
