"""``transplant clone`` against ``cp -a`` (one host) and ``rsync -aH`` / ``tar`` over ssh (two hosts).

Usage::

    .venv/bin/python -m bench.clone [--scales 0.03,0.5] [--runs 3] [--ssh/--no-ssh] [--dir /tmp] [--profile DIR]

At each scale a real venv (``python -m venv``) gets :mod:`bench.workload`'s donor distributions
(scale 0.03: about 2,800 files in 60 MiB; 0.5: about 29,000 files in 1 GiB; real ELF shared
objects) and, on top, what a venv holds that names its prefix: console scripts whose shebang
runs ``PREFIX/bin/python``, a ``.pth`` file and small text modules naming ``PREFIX/...``, and
binary files (a NUL byte) naming it. Measured, each ``--runs`` times into a fresh destination,
alternating, the median reported:

* local: ``transplant clone local:SRC local:DST --json`` (a process on the controller) against
  ``cp -a SRC DST``;
* SSH (two loopback sshd lab hosts, ``transplant.lab``): ``transplant clone HOST1:SRC HOST2:DST``
  against ``rsync -aH`` and ``tar -c | ssh tar -x`` run on the source host straight to the other
  (what an operator with a key between the hosts would do; the clone relays through the
  controller, which holds the keys).

Every run starts from a warm page cache for the source (each command reads it in turn) and after
a ``sync``. The target: the clone within 2x the reference (``cp -a`` locally, ``rsync -aH`` over
SSH); the ratio reported is the median of each run's own ratio (the two measured minutes apart),
since the disk's speed moves with the machine's other load. ``--dir /dev/shm`` copies in memory:
the clone's own work against the copy's, without the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import compile_transplant
from .workload import SITE, build_venv

ROOT = Path(__file__).resolve().parent.parent
SRC, DST = "/srv/clone-src", "/srv/clone-dst"


def add_prefix_files(venv: Path, prefix: str, scale: float) -> int:
    """Files naming ``prefix`` (as the venv's own host sees it) beside the workload's: console
    scripts, a ``.pth`` file, ``direct_url.json`` files, binary files (left as they are: a warning). Returns how many were written."""
    count = max(10, int(200 * scale))
    site = venv / SITE
    written = 0
    for i in range(count):
        script = venv / "bin" / f"tool{i}"
        script.write_text(f"#!{prefix}/bin/python\nimport sys\nfrom common_000 import main\nsys.exit(main())\n")
        script.chmod(0o755)
        info = site / f"common_{i % 250:03d}-1.0.0.dist-info"
        (info / "direct_url.json").write_text(json.dumps({"url": f"file://{prefix}/src/common_{i % 250:03d}",
                                                          "dir_info": {"editable": False}}))
        (site / "common_001" / f"blob{i}.bin").write_bytes(b"\0\1" * 100 + f"{prefix}/lib".encode() + b"\0" * 50)
        written += 3
    (site / "bench-extra.pth").write_text(f"{prefix}/extra\n")
    return written + 1


def _median(values: list[float]) -> float:
    return statistics.median(values)


#: CPU seconds (user and system) of the processes each :func:`_timed` ran, in order (a local
#: command's whole tree: every process it started is waited for); less moved by the machine's
#: other load than the wall-clock time.
CPU: list[float] = []


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(argv: list[str], env: dict[str, str] | None = None, *, check: bool = True) -> tuple[float, str]:
    before = _cpu()
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - started
    CPU.append(_cpu() - before)
    if check and done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv[:6])} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return seconds, done.stdout


def _clone(argv: list[str], env: dict[str, str], profile: Path | None) -> tuple[float, dict]:
    profiled = [] if profile is None else ["-m", "cProfile", "-o", str(profile)]
    seconds, out = _timed([sys.executable, *profiled, "-m", "transplant", "clone", *argv, "--json"], env)
    doc = json.loads(out[out.index("{"):out.rindex("}") + 1])
    if doc["leftovers"]["text"] or doc["leftovers"]["links"]:
        raise RuntimeError(f"the clone left text files naming the old prefix: {doc['leftovers']}")
    return seconds, doc


def local(scale: float, runs: int, work: Path, env: dict[str, str], profile: Path | None, say=print) -> dict:
    """Local rows at ``scale``: name -> median seconds, with the venv's files and bytes."""
    src = work / f"local-{scale}" / "src"
    build_venv(src, "donor", scale)
    add_prefix_files(src, str(src), scale)
    clone_s: list[float] = []
    cp_s: list[float] = []
    doc: dict = {}
    clone_cpu: list[float] = []
    cp_cpu: list[float] = []
    for run in range(runs):
        for dest in (work / f"local-{scale}" / "clone", work / f"local-{scale}" / "cp"):
            shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["sync"], check=True)
        seconds, _ = _timed(["cp", "-a", str(src), str(work / f"local-{scale}" / "cp")])
        cp_s.append(seconds)
        cp_cpu.append(CPU[-1])
        subprocess.run(["sync"], check=True)
        prof = None if profile is None else profile / f"local-{scale}-{run + 1}.prof"
        seconds, doc = _clone([f"local:{src}", f"local:{work / f'local-{scale}' / 'clone'}"], env, prof)
        clone_s.append(seconds)
        clone_cpu.append(CPU[-1])
        say(f"  local {scale}: clone {seconds:.2f} s, cp -a {cp_s[-1]:.2f} s")
    shutil.rmtree(work / f"local-{scale}", ignore_errors=True)
    return {"files": doc["files"], "bytes": doc["bytes"], "edited": len(doc["edited"]),
            "transplant clone": _median(clone_s), "cp -a": _median(cp_s), "runs": runs,
            "ratio": _median([c / r for c, r in zip(clone_s, cp_s, strict=True)]),
            "cpu": (_median(clone_cpu), _median(cp_cpu))}


def ssh(scale: float, runs: int, work: Path, env: dict[str, str], profile: Path | None, say=print) -> dict:
    """SSH rows at ``scale`` between two lab hosts: name -> median seconds."""
    from transplant.lab import Lab

    with Lab(work / f"lab-{scale}", ("src", "dst")) as lab:
        s, d = lab.hosts["src"], lab.hosts["dst"]
        build_venv(s.path(SRC), "donor", scale)
        add_prefix_files(s.path(SRC), SRC, scale)
        keys = ["--identity-file", str(lab.identity_file), "--known-hosts", str(lab.known_hosts)]
        ssh_cmd = shlex.join(["ssh", "-i", str(lab.identity_file), "-o", f"UserKnownHostsFile={lab.known_hosts}",
                              "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(d.port)])

        def on_src(command: str) -> float:
            started = time.monotonic()
            done = s.run(["sh", "-c", command])
            if done.returncode != 0:
                raise RuntimeError(f"{command} failed: {done.stderr.decode()[-2000:]}")
            return time.monotonic() - started

        rows: dict[str, list[float]] = {"transplant clone": [], "rsync -aH over ssh": [], "tar over ssh": []}
        doc: dict = {}
        for run in range(runs):
            for folder in (DST, "/srv/rsync-dst", "/srv/tar-dst"):
                d.run(["rm", "-rf", folder])
            d.run(["mkdir", "/srv/tar-dst"])
            rows["rsync -aH over ssh"].append(on_src(
                f"rsync -aH -e {shlex.quote(ssh_cmd)} {SRC}/ root@{d.address}:/srv/rsync-dst/"))
            rows["tar over ssh"].append(on_src(
                f"tar -C {SRC} -cf - . | {ssh_cmd} root@{d.address} tar -C /srv/tar-dst -xf -"))
            prof = None if profile is None else profile / f"ssh-{scale}-{run + 1}.prof"
            seconds, doc = _clone([f"{s.spec}:{SRC}", f"{d.spec}:{DST}", *keys], env, prof)
            rows["transplant clone"].append(seconds)
            say(f"  ssh {scale}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()))
        for folder in (DST, "/srv/rsync-dst", "/srv/tar-dst"):
            d.run(["rm", "-rf", folder])
    ratios = [c / r for c, r in zip(rows["transplant clone"], rows["rsync -aH over ssh"], strict=True)]
    return {"files": doc["files"], "bytes": doc["bytes"], "edited": len(doc["edited"]), "runs": runs,
            "ratio": _median(ratios), **{k: _median(v) for k, v in rows.items()}}


def table(results: list[tuple[str, float, dict]]) -> str:
    """The Markdown table: one row per (where, scale), the clone against its reference."""
    lines = ["| where | scale | files | MiB | edited | transplant clone | reference (local: CPU s of the clone / of cp) | x reference (median of the "
             "runs' ratios) | limit 2x |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for where, scale, row in results:
        ref = "cp -a" if where == "local" else "rsync -aH over ssh"
        others = "" if where == "local" else f"; tar over ssh {row['tar over ssh']:.2f} s"
        ratio = row["ratio"]
        cpu = f" (CPU {row['cpu'][0]:.2f} / {row['cpu'][1]:.2f} s)" if "cpu" in row else ""
        lines.append(f"| {where} | {scale} | {row['files']} | {row['bytes'] / (1 << 20):.0f} | {row['edited']} | "
                     f"{row['transplant clone']:.2f} s | {ref} {row[ref]:.2f} s{others}{cpu} | {ratio:.2f}x | "
                     f"{'met' if ratio <= 2 else f'missed, by {ratio / 2:.2f}x'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the clone benchmark and print its table; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.clone", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="0.03,0.5", help="workload scales (0.03: 60 MiB, 0.5: 1 GiB)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (the median is reported)")
    parser.add_argument("--ssh", action=argparse.BooleanOptionalAction, default=True,
                        help="also between two loopback sshd lab hosts (see transplant.lab)")
    parser.add_argument("--local", action=argparse.BooleanOptionalAction, default=True, help="the local rows")
    parser.add_argument("--dir", default="/tmp", help="where the venvs are made and copied (a disk; /dev/shm: memory)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run each transplant clone under cProfile, its profile written into DIR")
    args = parser.parse_args(argv)
    compile_transplant()  # the measured commands load bytecode, as an installed transplant does
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="transplant-bench-clone-", dir=args.dir))
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(work / "state"), "COLUMNS": "200"}
    results: list[tuple[str, float, dict]] = []
    started = time.monotonic()
    load = os.getloadavg()[0]
    try:
        for scale in (float(s) for s in args.scales.split(",")):
            runners: list[tuple[str, Callable]] = []
            if args.local:
                runners.append(("local", local))
            if args.ssh:
                runners.append(("SSH", ssh))
            for where, runner in runners:
                results.append((where, scale, runner(scale, args.runs, work, env, args.profile)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.dir}: {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}; "
          f"load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"{time.monotonic() - started:.0f} s in all; medians of {args.runs}\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
