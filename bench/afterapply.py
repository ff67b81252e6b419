"""The plan right after an apply, locally: the synthetic pair (:mod:`bench.workload`) on this machine.

Usage::

    .venv/bin/python -m bench.afterapply [--scales 0.25,0.5] [--runs 3]

Builds the donor (+cu130) and a pristine target (+cu128) venv in a temporary folder, both ``local``
hosts, the overlay of :mod:`bench.run`, and measures, each ``--runs`` times from a fresh hardlinked
copy of the target, the operator's way: ``transplant plan`` (not timed, once the copy is past the
memo's racy window, so it is kept), ``transplant apply --yes`` (timed), then at once ``transplant
plan --json`` (timed). Medians, as a Markdown table. To compare two checkouts, run it from each
(its ``transplant`` processes import the checkout they start in).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import compile_transplant, measured
from .run import OVERLAY, RACY_WAIT
from .workload import build_venv, differing_files


def _run(argv: list[str], env: dict[str, str]) -> float:
    seconds, _, code, out = measured([sys.executable, "-m", "transplant", *argv], env)
    if code not in (0, 2):
        raise RuntimeError(f"transplant {' '.join(argv)} exited {code}:\n{out[-3000:]}")
    return seconds


def measure(scale: float, runs: int, work: Path) -> tuple[float, float, str]:
    """(median apply seconds, median seconds of the plan right after it, what the plan said) at ``scale``."""
    donor, pristine, target = work / "donor", work / "pristine", work / "target"
    for folder in (donor, pristine, target):
        shutil.rmtree(folder, ignore_errors=True)
    build_venv(donor, "donor", scale)
    build_venv(pristine, "target", scale, common=donor)
    manifest = work / "m.yaml"
    manifest.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                        f"overlay: {json.dumps(OVERLAY)}\n")
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(work / "state"), "COLUMNS": "200"}
    applies, plans = [], []
    said = ""
    for _ in range(runs):
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run(["cp", "-al", str(pristine), str(target)], check=True)
        time.sleep(RACY_WAIT)
        _run(["plan", str(manifest), "--json"], env)
        applies.append(_run(["apply", str(manifest), "--yes"], env))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "transplant", "plan", str(manifest)], env=env,
                              capture_output=True, text=True)
        plans.append(time.monotonic() - started)
        said = " ".join((done.stdout + done.stderr).split())
    return statistics.median(applies), statistics.median(plans), said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.afterapply", description=__doc__.split("\n")[0])
    parser.add_argument("--scales", default="0.25,0.5", help="comma-separated scale factors (1: about 2 GB)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    compile_transplant()
    rows = ["| scale (differing MiB) | apply after plan | plan right after apply | that plan said |",
            "| --- | ---: | ---: | --- |"]
    with tempfile.TemporaryDirectory(prefix="bench-afterapply-") as tmp:
        for scale in (float(s) for s in args.scales.split(",")):
            apply_s, plan_s, said = measure(scale, args.runs, Path(tmp))
            memo = "memo hit" if "nothing changed on either venv" in said else "full plan"
            rows.append(f"| {scale:g} ({differing_files(scale)[1] / 2**20:.0f}) | {apply_s:.2f} s | {plan_s:.2f} s | "
                        f"{memo} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
