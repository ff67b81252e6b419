"""`transplant verify MANIFEST --json` of two transplant trees, run alternately: wall and CPU seconds.

Usage::

    .venv/bin/python -m bench.verify_ab MANIFEST --base TREE [--runs 3]

``TREE`` is a checkout of transplant to compare with (``git worktree add /tmp/base main``, or
``git archive REV | tar -x -C /tmp/base``); the other tree is this one. Each run is one
``python -m transplant verify MANIFEST --json`` with ``PYTHONPATH`` naming the tree and
``PYTHONDONTWRITEBYTECODE=1`` (nothing is written into the manifest's venvs), ``base`` then
``this`` then ``base`` ..., printing for each its wall seconds, its CPU seconds (user and system of
the command and every process it waited for: the stages' host processes on this machine, for local
venvs), the load average when it started, its exit status and each stage that ran with its seconds
(a failed one marked ``!``). The real pair's manifest is the one ``transplant init --donor
local:DONOR --target local:TARGET --out FILE`` writes (37 import names, server-args, smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import compile_transplant

ROOT = Path(__file__).resolve().parent.parent


def run_once(tree: Path, manifest: Path, state: Path) -> tuple[float, float, float, int, str]:
    """One verify of ``manifest`` by the transplant in ``tree``: (wall seconds, CPU seconds of it
    and its children, load average at its start, exit status, its stages in a few words)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "TRANSPLANT_STATE_DIR": str(state),
           "COLUMNS": "200"}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "transplant", "verify", str(manifest), "--json"], env=env,
                          capture_output=True, text=True, cwd=tree)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    try:
        stages = json.loads(done.stdout[done.stdout.find("{"):])["stages"]
        said = " ".join(f"{s['name']}={s['seconds']:.1f}" + ("" if s["status"] in ("pass", "skip") else "!")
                        for s in stages if s["status"] != "skip")
    except (ValueError, KeyError, TypeError):
        said = f"(no verify document: {done.stderr.strip()[-300:]})"
    return wall, cpu, load, done.returncode, said


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one line per run; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.verify_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--base", type=Path, required=True, help="the transplant tree to compare with")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree (default 3)")
    args = parser.parse_args(argv)
    compile_transplant()  # this tree's bytecode, as an installed transplant has it
    import compileall

    compileall.compile_dir(str(args.base / "transplant"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="transplant-bench-verify-") as state:
        for index in range(args.runs):
            for name, tree in (("base", args.base), ("this", ROOT)):
                wall, cpu, load, code, said = run_once(tree, args.manifest, Path(state))
                print(f"{name} {index + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, load {load:.2f}, exit {code} | {said}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
