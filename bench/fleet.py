"""Bytes read from the donor when one manifest rebuilds 1, 4 and 8 targets.

Usage::

    .venv/bin/python -m bench.fleet [--scale 0.02] [--counts 1,4,8] [--out BENCHMARKS-fleet.md]

Starts a donor and 8 target lab hosts, builds the synthetic serving-shaped venvs of
:mod:`bench.workload` (donor +cu130; every target the same +cu128 venv, hardlinked from
one pristine copy), and applies the overlay to N targets two ways, each from an empty
snapshot store:

* **fleet** (what ``transplant apply`` does with several targets): the donor is captured
  once into a snapshot on the controller, which serves every target. The bytes read from
  the donor are rsync's own count for that one capture.
* **each from the donor** (one ``transplant apply`` per target): every target's files
  are relayed from the donor through the controller. The donor's share is half of what
  crossed the wire (the relay's first leg).

Donor logins are counted in the donor sshd's log ("Accepted publickey").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from transplant.controller.documents import load_manifest
from transplant.fleet.run import run_fleet, serve_from_snapshot
from transplant.hosts.host import HostSpec, SSHOptions
from transplant.lab import Lab
from transplant.core.manifest import Endpoint
from transplant.core.units import human_bytes
from transplant.donor.sources import open_donor

from .run import OVERLAY
from .workload import build_venv, differing_files

VENV, PRISTINE = "/srv/bench", "/srv/bench-pristine"
TARGETS = tuple(f"t{i}" for i in range(1, 9))


def _logins(lab: Lab) -> int:
    return lab.hosts["donor"].log.read_text(errors="replace").count("Accepted publickey")


def _reset(lab: Lab, names: list[str]) -> None:
    for name in names:
        lab.hosts[name].run(["rm", "-rf", VENV])
        subprocess.run(["cp", "-al", str(lab.hosts["t1"].path(PRISTINE)), str(lab.hosts[name].path(VENV))], check=True)


def measure(lab: Lab, work: Path, count: int, mode: str) -> dict:
    """Apply to ``count`` targets in ``mode`` (``fleet`` or ``each``); bytes and logins on the donor."""
    names = list(TARGETS[:count])
    _reset(lab, names)
    os.environ["TRANSPLANT_STATE_DIR"] = str(work / f"state-{mode}-{count}")
    manifest = load_manifest(work / "bench.yaml")
    ssh = SSHOptions(identity_file=lab.identity_file, known_hosts=lab.known_hosts)
    targets = [Endpoint(host=HostSpec.parse(lab.hosts[n].spec), venv=VENV) for n in names]
    before = _logins(lab)
    started = time.monotonic()
    with ExitStack() as stack:
        opened = open_donor(manifest, ssh, stack)
        read = 0
        if mode == "fleet":
            opened, donor_read = serve_from_snapshot(opened, work / f"state-{mode}-{count}" / "snapshots", stack)
            read = donor_read.bytes
        results = run_fleet("apply", manifest, targets, opened, ssh, jobs=4)
    seconds = time.monotonic() - started
    failed = [r for r in results if r.code != 0]
    if failed:
        raise RuntimeError(f"{mode} x{count}: {failed[0].target}: {failed[0].error}")
    if mode == "each":
        read = sum(r.applied.bytes_moved for r in results if r.applied) // 2
    return {"targets": count, "mode": mode, "donor_bytes": read, "donor_logins": _logins(lab) - before,
            "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the measurements, print the table and write it to ``--out``."""
    parser = argparse.ArgumentParser(prog="bench.fleet")
    parser.add_argument("--scale", type=float, default=0.02, help="workload scale (1 = about 2 GB)")
    parser.add_argument("--counts", default="1,4,8", help="numbers of targets")
    parser.add_argument("--out", default="BENCHMARKS-fleet.md")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="transplant-bench-fleet-", dir="/tmp"))
    rows = []
    try:
        with Lab(work / "lab", ("donor", *TARGETS[:max(counts)])) as lab:
            donor = build_venv(lab.hosts["donor"].path(VENV), "donor", args.scale)
            build_venv(lab.hosts["t1"].path(PRISTINE), "target", args.scale, common=donor)
            (work / "bench.yaml").write_text(
                f"version: 1\ndonor: {{host: \"{lab.hosts['donor'].spec}\", venv: {VENV}}}\n"
                f"target: {{host: \"{lab.hosts['t1'].spec}\", venv: {VENV}}}\n"
                f"ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}\n"
                f"overlay: {json.dumps(OVERLAY)}\n")
            for count in counts:
                for mode in ("fleet", "each"):
                    rows.append(measure(lab, work, count, mode))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _, diff = differing_files(args.scale)
    lines = [
        "# Bytes read from the donor, per number of targets",
        "",
        f"Machine: {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}; loopback "
        f"sshd hosts. Workload: `bench.workload` at scale {args.scale} (differing bytes {human_bytes(diff)}). "
        f"Generated by `.venv/bin/python -m bench.fleet`.",
        "",
        "| targets | fleet: donor bytes | fleet: donor logins | each from the donor: donor bytes | "
        "each: donor logins | fleet seconds | each seconds |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for count in counts:
        f = next(r for r in rows if r["targets"] == count and r["mode"] == "fleet")
        e = next(r for r in rows if r["targets"] == count and r["mode"] == "each")
        lines.append(f"| {count} | {human_bytes(f['donor_bytes'])} | {f['donor_logins']} | "
                     f"{human_bytes(e['donor_bytes'])} | {e['donor_logins']} | {f['seconds']} | {e['seconds']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
