"""The real pair's forward apply as a benchmark workload, against ``tar`` of exactly the files it copies.

Usage::

    .venv/bin/python -m bench.realapply [--root ~/.cache/transplant/real] [--out FILE] [--keep]

The cached real stacks (``scripts/real-stacks``) are read only: the target is cloned first
(``transplant clone``, about 11 GB) into a work folder made here, and every apply, rollback and
floor writes only inside that folder. A hardlinked copy of the clone, made once, resets it
between runs (at the clone's own path, so its prefix stays right; every writer of transplant
replaces files by rename, so the copy keeps its bytes). Measured, one run each, as processes
on this machine (the first two plans fill the hash caches, as an operator's earlier plans would):

* ``transplant plan`` of the calibrated forward manifest, warm, then ``transplant apply --yes``
  right after it (the operator's order: it reuses the plan the memo kept), then ``transplant plan``
  at once (the operator's "did it take?");
* the floor: ``tar -cf - -T FILES | tar -xf -`` of exactly the files that apply copied, from the
  donor into an empty folder (as warm in the page cache as the apply's reads were), and the same
  until a ``sync`` returns (apply returns with its files on disk: the fairer floor of the two);
* ``transplant rollback --yes`` of that apply;
* ``transplant apply --yes`` with no plan before it (it plans itself), on the target as reset.

``--keep`` leaves the work folder (its path is printed) for a look afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, UTC
from pathlib import Path

from . import compile_transplant
from .real import DEFAULT_ROOT, missing

__all__ = ["measure", "report", "main"]

ROOT = Path(__file__).resolve().parent.parent
_STEPS = re.compile(r"(prepare|transfer|staged check|commit|check) ([\d.]+) s")


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run ``argv`` on the controller: (seconds, stdout then stderr).

    :raises RuntimeError: a non-zero exit (the output's tail in the message)."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds, done.stdout + done.stderr


def _steps(text: str) -> str:
    """An apply's own steps as it printed them (``prepare 1.2 s, transfer 60.1 s, ...``)."""
    return ", ".join(f"{name} {sec} s" for name, sec in _STEPS.findall(" ".join(text.split())))


def _tar_pipe(source: Path, listing: Path, dest: Path) -> None:
    """``tar -C SOURCE -cf - -T LISTING | tar -C DEST -xf -``, as two processes joined by a pipe.

    :raises RuntimeError: either side exited non-zero."""
    pack = subprocess.Popen(["tar", "-C", str(source), "-cf", "-", "-T", str(listing)], stdout=subprocess.PIPE)
    unpack = subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=pack.stdout)
    assert pack.stdout is not None  # stdout=PIPE
    pack.stdout.close()
    if pack.wait() != 0 or unpack.returncode != 0:
        raise RuntimeError(f"the tar floor failed (exit {pack.returncode} / {unpack.returncode})")


def measure(root: Path, work: Path, say=print) -> dict[str, tuple[float, str]]:
    """Every measurement: name -> (seconds, what it printed of itself in a few words).

    :param work: an empty folder of this benchmark's own (everything is written inside it).
    :raises RuntimeError: a step failed (its output in the message).
    """
    donor, target, pristine = root / "donor", work / "target", work / "pristine"
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(work / "state"), "COLUMNS": "200"}
    t = [sys.executable, "-m", "transplant"]
    out: dict[str, tuple[float, str]] = {}

    def step(name: str, argv: list[str], note=lambda text: "") -> str:
        seconds, text = _run(argv, env)
        out[name] = (seconds, note(text))
        say(f"  {name}: {seconds:.2f} s {out[name][1]}")
        return text

    def reset() -> None:
        shutil.rmtree(target)
        subprocess.run(["cp", "-al", str(pristine), str(target)], check=True)
        time.sleep(2.5)  # older than the plan memo's racy window, as a venv is between two commands

    say(f"cloning {root / 'target'} into {target} (about 11 GB)")
    step("clone of the real target", [*t, "clone", f"local:{root / 'target'}", f"local:{target}"])
    subprocess.run(["cp", "-al", str(target), str(pristine)], check=True)
    manifest = work / "forward.yaml"
    subprocess.run([sys.executable, "-m", "transplant.lab.realstacks", "manifest", str(donor), str(target),
                    str(manifest), "--calibrated"], check=True, cwd=ROOT)
    reset()
    plan = [*t, "plan", str(manifest), "--json"]
    step("plan, filling the hash caches", plan)
    step("plan, warm", plan)
    time.sleep(2.5)
    text = step("plan, warm, kept for the apply", plan)
    document, _ = json.JSONDecoder().raw_decode(text, text.index("{"))
    files = [cp["path"] for c in document["changes"] for cp in c["copy"] if cp["source"] == "donor"]
    step("apply right after plan", [*t, "apply", str(manifest), "--yes"], _steps)
    step("plan right after apply (the operator's check)", plan)
    listing = work / "files.txt"
    listing.write_text("".join(f"{path}\n" for path in files))
    floor = work / "floor"
    floor.mkdir()
    os.sync()  # the apply's own writes on disk first: the floor starts with nothing dirty
    started = time.monotonic()
    _tar_pipe(donor, listing, floor)
    out["tar floor"] = (time.monotonic() - started, f"{len(files)} files")
    os.sync()  # apply returns with its files on disk (each larger file's fdatasync, the commit's sync)
    out["tar floor, then sync (on disk, as apply leaves its files)"] = (time.monotonic() - started, "")
    say(f"  tar floor: {out['tar floor'][0]:.2f} s, {len(files)} files; with the sync "
        f"{out['tar floor, then sync (on disk, as apply leaves its files)'][0]:.2f} s")
    shutil.rmtree(floor)
    step("rollback", [*t, "rollback", str(manifest), "--yes"])
    reset()
    step("apply, planning itself", [*t, "apply", str(manifest), "--yes"], _steps)
    return out


def report(results: dict[str, tuple[float, str]], root: Path) -> str:
    """The markdown section: every measurement, and the apply's ratios to the tar floor."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    floor = results["tar floor"][0]
    lines = [f"## Real pair's forward apply ({root}, measured {stamp}, load average {os.getloadavg()[0]:.1f})", "",
             "| measurement | seconds | x tar floor | steps |", "| --- | ---: | ---: | --- |"]
    lines += [f"| {name} | {s:.2f} | {s / floor:.2f} | {what} |" for name, (s, what) in results.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure the real pair's apply (or say why not); returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.realapply", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(DEFAULT_ROOT), help="folder holding the donor and target venvs")
    parser.add_argument("--out", help="also write the markdown section to this file")
    parser.add_argument("--keep", action="store_true", help="leave the work folder (about 11 GB) afterwards")
    args = parser.parse_args(argv)
    root = Path(args.root).expanduser()
    why = missing(root)
    if why is not None:
        print(f"real apply: skipped: {why}")
        return 0
    compile_transplant()
    work = Path(tempfile.mkdtemp(prefix="transplant-bench-realapply-", dir="/tmp"))
    try:
        section = report(measure(root, work), root)
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(section)
    if args.out:
        Path(args.out).write_text(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
