"""Benchmarks: transplant's inventory, plan and apply against pip and rsync, side by side.

Usage (the README's command)::

    .venv/bin/python -m bench.run [--scales 1,2,4] [--runs 3] [--out FILE]

Starts two loopback sshd hosts (``transplant.lab``), builds the synthetic serving-shaped
venvs of :mod:`bench.workload` on them (donor +cu130, target +cu128; real ELF shared
objects with symbol tables and fatbins), and measures, each
``--runs`` times with the median reported:

* inventory of the target venv: transplant's probe (metadata, no hashing) against
  ``pip inspect`` and ``pip list``, all run on the host itself; the probe with every
  file hashed, against ``dd`` reading the largest file (the disk's sequential read, warm);
* ``transplant plan`` cold (target as built) and no-op (after apply), ``transplant apply``
  (planning itself), ``transplant apply`` right after ``transplant plan`` (the plan memo's
  plan) and a re-apply (no-op), as processes on the controller, with their peak memory;
* what an operator would do instead, run on the donor towards the target over ssh:
  ``rsync -a`` of the whole site-packages, ``rsync -a --checksum``, rsync of exactly the
  differing files (``--files-from``, with and without ``--whole-file``), and the floor:
  ``tar`` of exactly those files piped over ssh into ``tar``.

The target is reset from a hardlinked pristine copy before every apply-like run (every
writer here replaces files by rename, so the pristine copy keeps its bytes). The table is
printed, and written to ``--out`` when given, with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import compile_transplant, measured

from transplant.lab import Lab

from .real import DEFAULT_ROOT
from .workload import SITE, build_venv, differing_files

ROOT = Path(__file__).resolve().parent.parent
VENV, PRISTINE = "/srv/bench", "/srv/bench-pristine"
OVERLAY = ["torch", "torchvision", "triton", "sgl-kernel", "nvidia-*"]


def _child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """:func:`bench.measured` for transplant commands that must exit 0 or 2: (seconds, peak RSS bytes, output).

    :raises RuntimeError: any other exit status (the output's tail in the message)."""
    seconds, rss, code, out = measured(argv, env)
    if code not in (0, 2):
        raise RuntimeError(f"{shlex.join(argv)} exited {code}:\n{out[-5000:]}")
    return seconds, rss, out


def _on(host, argv: list[str], *, stdin: bytes | None = None) -> tuple[float, str]:
    """Run a command inside a lab host (its mount namespace): (seconds, stdout)."""
    started = time.monotonic()
    done = host.run(argv, input=stdin)
    return time.monotonic() - started, done.stdout.decode("utf-8", "replace")


class Bench:
    """One lab, one scale: builds the venvs and runs the measurements."""

    def __init__(self, lab: Lab, scale: float, workdir: Path) -> None:
        self.lab, self.scale, self.workdir = lab, scale, workdir
        self.donor, self.target = lab.hosts["donor"], lab.hosts["target"]
        self.files, self.diff_bytes = differing_files(scale)
        self.manifest = workdir / "bench.yaml"
        self.manifest.write_text(
            f"version: 1\ndonor: {{host: \"{self.donor.spec}\", venv: {VENV}}}\n"
            f"target: {{host: \"{self.target.spec}\", venv: {VENV}}}\n"
            f"ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}\n"
            f"overlay: {json.dumps(OVERLAY)}\n")
        self.env = {**os.environ, "TRANSPLANT_STATE_DIR": str(workdir / "state"), "COLUMNS": "200"}

    def build(self) -> float:
        """Write the donor venv and the target's pristine copy on the hosts; returns seconds."""
        started = time.monotonic()
        for host in (self.donor, self.target):
            for folder in (VENV, PRISTINE):
                host.run(["rm", "-rf", folder])
        donor = build_venv(self.donor.path(VENV), "donor", self.scale)
        build_venv(self.target.path(PRISTINE), "target", self.scale, common=donor)
        return time.monotonic() - started

    def reset(self) -> None:
        """Make the target venv the pristine copy again (hardlinks: instant, and no writer here edits in place)."""
        self.target.run(["rm", "-rf", VENV])
        self.target.run(["cp", "-al", PRISTINE, VENV])

    def ssh(self) -> str:
        """The ssh command (shell-quoted) that reaches the target from the donor, host keys checked."""
        t = self.target
        return shlex.join(["ssh", "-i", str(self.lab.identity_file), "-o", f"UserKnownHostsFile={self.lab.known_hosts}",
                           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(t.port)])

    def remote(self) -> str:
        """rsync's destination: the target venv's site-packages."""
        return f"root@{self.target.address}:{VENV}/{SITE}/"

    # -- measurements: each returns (seconds, bytes moved or None, peak RSS or None)

    def probe(self, hash_all: bool) -> tuple[float, None, None]:
        """transplant's probe run on the target host itself (no SSH): metadata only, or every file hashed."""
        from transplant import remote

        request = json.dumps({"hash": ["*"] if hash_all else [], "record": True}).encode()
        code = remote.source("probe").decode()
        seconds, _ = _on(self.target, [f"{VENV}/bin/python", "-I", "-S", "-c", code, "--stdin"], stdin=request)
        return seconds, None, None

    def pip(self, what: str) -> tuple[float, None, None]:
        """``pip inspect`` or ``pip list`` of the target venv, on the target host."""
        python = getattr(sys, "_base_executable", sys.executable)
        seconds, _ = _on(self.target, [python, "-m", "pip", "--disable-pip-version-check", "--python",
                                       f"{VENV}/bin/python", what])
        return seconds, None, None

    def read_speed(self) -> float:
        """Bytes per second ``dd`` reads the largest file (warm, as the probe's re-hash is)."""
        big = f"{VENV}/{SITE}/torch/lib/libtorch_cuda.so"
        size = self.target.path(big).stat().st_size
        self.target.run(["sh", "-c", 'cat "$1" > /dev/null', "sh", big])  # warm it, as the probe's runs are
        seconds, _ = _on(self.target, ["dd", f"if={big}", "of=/dev/null", "bs=8M", "status=none"])
        return size / seconds

    def transplant(self, command: str, *extra: str) -> tuple[float, int | None, int]:
        """A transplant command on the controller: (seconds, bytes on the wire or None, peak RSS bytes).
        An apply's own steps (``transfer 12.3 s``...) are kept in ``self.steps``."""
        seconds, rss, out = _child([sys.executable, "-m", "transplant", command, str(self.manifest), *extra],
                                   env=self.env)
        text = " ".join(out.split())
        moved = re.search(r"([\d.]+) (B|KiB|MiB|GiB) on the wire", text)
        self.steps = {name: float(sec) for name, sec in re.findall(r"(prepare|transfer|staged check|commit|check) "
                                                                    r"([\d.]+) s", text)}
        units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        exact = self.moved() if command == "apply" and moved else None  # the printed figure is rounded
        return seconds, exact or (int(float(moved.group(1)) * units[moved.group(2)]) if moved else None), rss

    def moved(self) -> int | None:
        """The bytes on the wire of the target's last applied transaction, exactly (its history entry)."""
        try:
            lines = self.target.path(f"{VENV}/.transplant/history.jsonl").read_text().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            entry = json.loads(line)
            if entry.get("event") == "applied":
                return entry.get("bytes_moved")
        return None

    def throttled(self, rate: float, compress: bool | str, files: list[str], root: str) -> tuple[float, int, None]:
        """Stream ``files`` (relative to ``root`` on the controller) to the target host through a
        link that carries at most ``rate`` bytes a second (a rate-limited copy on the controller:
        a bench-only stand-in for a slow WAN or VPN), compressed or not: (seconds, bytes on the wire)."""
        from transplant.hosts.host import HostSpec, SSHOptions, LocalHost
        from transplant.hosts.connecting import connect
        from transplant.hosts.stream import stream_files

        self.target.run(["rm", "-rf", "/srv/throttled"])
        options = SSHOptions(identity_file=self.lab.identity_file, known_hosts=self.lab.known_hosts)
        with connect(HostSpec.parse(str(self.target.spec)), options) as target:
            result = stream_files(LocalHost(), root, target, "/srv/throttled", files, compress=compress,
                                  dst_python=getattr(sys, "_base_executable", sys.executable),
                                  link=lambda source, sink: _slow_copy(source, sink, rate))
        self.target.run(["rm", "-rf", "/srv/throttled"])
        return result.seconds, result.bytes, None

    def rsync(self, *options: str, files: bool = False) -> tuple[float, int, None]:
        """rsync from the donor to the target (whole site-packages, or ``files``: the differing ones)."""
        argv = ["rsync", "-a", "--stats", *options, "-e", self.ssh()]
        stdin = None
        if files:
            argv += ["--files-from=-"]
            stdin = "\n".join(self.files).encode() + b"\n"
        seconds, out = _on(self.donor, [*argv, f"{VENV}/{SITE}/", self.remote()], stdin=stdin)
        sent = re.search(r"Total bytes sent: ([\d,]+)", out)
        return seconds, int(sent.group(1).replace(",", "")) if sent else 0, None

    def tar(self) -> tuple[float, int, None]:
        """The floor: tar of exactly the differing files, piped over ssh into tar on the target."""
        listing = self.workdir / "files.txt"
        listing.write_text("\n".join(self.files) + "\n")
        remote_tar = shlex.join(["tar", "-C", f"{VENV}/{SITE}", "-xf", "-"])
        pipeline = (f"tar -C {shlex.quote(VENV + '/' + SITE)} -cf - -T {shlex.quote(str(listing))} | "
                    f"{self.ssh()} root@{self.target.address} {shlex.quote(remote_tar)}")
        seconds, _ = _on(self.donor, ["sh", "-c", pipeline])
        return seconds, self.diff_bytes, None


def _slow_copy(source: int, sink: int, rate: float) -> None:
    """Copy ``source`` to ``sink`` until its end, at most ``rate`` bytes a second (bench only)."""
    started, sent = time.monotonic(), 0
    while True:
        data = os.read(source, 1 << 16)
        if not data:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(sink, view):]
        sent += len(data)
        ahead = sent / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)


#: The link rate of the throttled comparison, bytes a second.
SLOW_LINK = 20e6
#: How many bytes the throttled comparison streams.
SLOW_SAMPLE = 160 << 20


def slow_sample() -> tuple[str, list[str], str]:
    """(root, files, what) for the throttled comparison: real shared objects and Python sources of
    the cached real donor (read only) when present, about :data:`SLOW_SAMPLE` bytes; else None."""
    site = next(iter(sorted((DEFAULT_ROOT / "donor" / "lib").glob("python3*/site-packages"))), None)
    if site is None:
        return "", [], ""
    picked, size = [], 0
    for pattern in ("nvidia/cu13/lib/libcublas.so*", "torch/lib/libc10*.so", "torch/lib/libtorch_python.so",
                    "torch/**/*.py", "sglang/**/*.py"):
        for path in sorted(site.glob(pattern)):
            if size >= SLOW_SAMPLE:
                break
            if path.is_file() and not path.is_symlink():
                picked.append(str(path.relative_to(site)))
                size += path.stat().st_size
    return str(site), picked, f"{len(picked)} files of the real donor ({size / 2**20:.0f} MiB: cuBLAS, c10, " \
                              f"torch_python, torch and sglang sources)"


def _median(runs: list[tuple]) -> tuple[float, int | None, int | None]:
    seconds = statistics.median(r[0] for r in runs)
    moved = [r[1] for r in runs if r[1] is not None]
    rss = [r[2] for r in runs if r[2] is not None]
    return seconds, (int(statistics.median(moved)) if moved else None), (max(rss) if rss else None)


#: The groups of measurements ``--only`` chooses from.
GROUPS = ("inventory", "plan", "noop", "apply", "rsync", "floor", "slow-link")


def measure(bench: Bench, runs: int, say, only: set[str] | None = None) -> dict[str, tuple]:
    """The measurements at one scale (``only``: those groups of :data:`GROUPS`; None: all):
    name -> (median seconds, bytes moved, peak RSS)."""
    out: dict[str, tuple] = {}

    def wanted(group):
        return only is None or group in only


    def repeat(name: str, body, reset: bool = False) -> None:
        results = []
        for _ in range(runs):
            if reset:
                bench.reset()
            results.append(body())
        out[name] = _median(results)
        say(f"  {name}: {out[name][0]:.2f} s")

    bench.reset()
    if wanted("inventory"):
        repeat("inventory: transplant probe (metadata)", lambda: bench.probe(False))
        repeat("inventory: pip inspect", lambda: bench.pip("inspect"))
        repeat("inventory: pip list", lambda: bench.pip("list"))
        repeat("inventory: transplant probe (every file hashed)", lambda: bench.probe(True))
        out["disk read (dd, warm)"] = (bench.read_speed(), None, None)
        out["venv bytes"] = (float(sum(p.stat().st_size for p in bench.target.path(VENV).rglob("*")
                                       if p.is_file() and not p.is_symlink())), None, None)
    if wanted("plan"):
        repeat("transplant plan (cold)", lambda: bench.transplant("plan", "--json"), reset=True)
    if wanted("noop") and not wanted("apply"):  # the apply group measures it after its own runs
        bench.reset()
        bench.transplant("apply", "--yes")  # the no-op plan starts from the applied state
        time.sleep(RACY_WAIT)  # past the memo's racy window: the first plan keeps the memo
        out["transplant plan (no-op, the first: it keeps the plan memo)"] = bench.transplant("plan", "--json")
        repeat("transplant plan (no-op)", lambda: bench.transplant("plan", "--json"))
    if wanted("apply"):
        transfers: list[tuple] = []

        def apply_then_noops() -> tuple:
            bench.reset()
            done = bench.transplant("apply", "--yes")
            transfers.append((bench.steps.get("transfer", 0.0), done[1], None))
            return done

        repeat("transplant apply", apply_then_noops)
        out[TRANSFER_STEP] = _median(transfers)
        say(f"  {TRANSFER_STEP}: {out[TRANSFER_STEP][0]:.2f} s")

        after_steps: list[dict[str, float]] = []

        def plan_then_apply() -> tuple:
            bench.reset()
            # the operator's plan, not timed: the plan memo keeps it only when no input was written
            # within its racy window (2 s) of the probe's start, and the reset just re-linked every
            # file of the target (new ctimes): planned at once, the memo kept nothing and the apply
            # planned afresh (measured so until 2026-12-02)
            time.sleep(RACY_WAIT)
            bench.transplant("plan", "--json")
            done = bench.transplant("apply", "--yes")
            after_steps.append(dict(bench.steps))
            return done

        repeat(AFTER_PLAN, plan_then_apply)
        for name in ("prepare", "transfer", "staged check", "commit", "check"):  # apply's own steps, as it prints them
            seconds = [s[name] for s in after_steps if name in s]
            if seconds:
                out[f"{AFTER_PLAN}: its {name} step"] = (statistics.median(seconds), None, None)
        steps: dict[str, list[tuple]] = {"relay": [], "rsync": []}

        def apply_with(way: str) -> tuple:
            bench.reset()
            saved, bench.env = bench.env, {**bench.env, "TRANSPLANT_TRANSFER": way}
            try:
                done = bench.transplant("apply", "--yes")
            finally:
                bench.env = saved
            steps[way].append((bench.steps.get("transfer", 0.0), done[1], None))
            return done

        repeat("transplant apply, TRANSPLANT_TRANSFER=relay (the stream through the controller)",
               lambda: apply_with("relay"))
        out[STREAM_RELAY_STEP] = _median(steps["relay"])
        say(f"  {STREAM_RELAY_STEP}: {out[STREAM_RELAY_STEP][0]:.2f} s")
        repeat("transplant apply, TRANSPLANT_TRANSFER=rsync (the relay, before)", lambda: apply_with("rsync"))
        out[RELAY_STEP] = _median(steps["rsync"])
        bench.reset()
        bench.transplant("apply", "--yes")  # the no-op rows below start from the applied state
        # apply keeps no plan memo (its plan is of the state it then changed): the first plan keeps one,
        # once the apply's writes are older than the memo's racy window
        time.sleep(RACY_WAIT)
        out["transplant plan (no-op, the first: it keeps the plan memo)"] = bench.transplant("plan", "--json")
        repeat("transplant plan (no-op)", lambda: bench.transplant("plan", "--json"))
        repeat("transplant apply (no-op)", lambda: bench.transplant("apply", "--yes"))
    if wanted("rsync"):
        repeat("rsync -a (whole site-packages)", lambda: bench.rsync(), reset=True)
        repeat("rsync -a --checksum", lambda: bench.rsync("--checksum"), reset=True)
        repeat("rsync --files-from (differing files)", lambda: bench.rsync(files=True), reset=True)
        repeat("rsync --files-from --whole-file", lambda: bench.rsync("--whole-file", files=True), reset=True)
    if wanted("floor") or wanted("apply"):
        repeat(FLOOR, bench.tar, reset=True)
    if wanted("slow-link"):
        root, files, what = slow_sample()
        if files:
            say(f"  slow link: {what}, at {SLOW_LINK / 1e6:g} MB/s")
            for name, how in (("plain", False), ("zstd", "zstd"), ("zlib", "zlib")):
                repeat(f"slow link {SLOW_LINK / 1e6:g} MB/s: stream, {name}",
                       lambda how=how: bench.throttled(SLOW_LINK, how, files, root))
        else:
            say("  slow link: skipped (no real donor under ~/.cache/transplant/real to sample)")
    return out


FLOOR = "tar piped over ssh into tar (differing files: the floor)"
#: apply right after ``transplant plan`` of the same manifest (the operator's way: plan, read, apply):
#: apply takes the kept plan after one stat fingerprint a side instead of planning again
#: Seconds a plan waits after the target was reset, so that the plan memo keeps it (its racy window is 2 s).
RACY_WAIT = 2.5
AFTER_PLAN = "transplant apply after transplant plan (the plan memo's plan)"
TRANSFER_STEP = ("transplant apply: its transfer step (the stream, hashed as written; SSH to SSH: direct, donor -> "
                 "target)")
STREAM_RELAY_STEP = "transplant apply, TRANSPLANT_TRANSFER=relay: its transfer step (the stream through the controller)"
RELAY_STEP = "transplant apply, TRANSPLANT_TRANSFER=rsync: its transfer step (the relay)"


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB memory, {platform.system()} {platform.release()}, Python " \
           f"{platform.python_version()}; both hosts are loopback sshd hosts on this machine and one disk"


def table(results: dict[float, dict[str, tuple]], diff_bytes: dict[float, int], runs: int) -> str:
    """The markdown report: per scale, each measurement with its ratio to the baselines, then the targets."""
    lines = [f"Machine: {_machine()}.", f"Medians of {runs} runs. Generated by `.venv/bin/python -m bench.run`.", ""]
    for scale, r in results.items():
        floor = r.get(FLOOR, (None,))[0]
        lines += [f"## Scale {scale:g} (differing bytes {diff_bytes[scale] / 2**20:.0f} MiB)", "",
                  "| measurement | seconds | bytes moved | x tar floor | peak controller RSS |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, (seconds, moved, rss) in r.items():
            if name.startswith("disk read"):
                lines.append(f"| {name} | {seconds / 2**20:.0f} MiB/s | | | |")
                continue
            if name == "venv bytes":
                lines.append(f"| target venv size | {seconds / 2**30:.2f} GiB | | | |")
                continue
            ratio = f"{seconds / floor:.2f}" if floor and not name.startswith(("inventory", "slow link")) else ""
            lines.append(f"| {name} | {seconds:.2f} | {'' if moved is None else f'{moved / 2**20:.0f} MiB'} | {ratio} | "
                         f"{'' if rss is None else f'{rss / 2**20:.0f} MiB'} |")
        lines.append("")
    lines += _targets(results, diff_bytes)
    lines += _growth(results)
    return "\n".join(lines) + "\n"


#: The measurements whose growth with scale the report shows.
GROWTH = ("inventory: transplant probe (metadata)", "inventory: pip inspect", "transplant plan (cold)",
          "transplant plan (no-op)", "transplant apply", "tar piped over ssh into tar (differing files: the floor)")


def _growth(results: dict[float, dict[str, tuple]]) -> list[str]:
    """Seconds of the main measurements per scale, and each as a multiple of the smallest scale's."""
    scales = sorted(results)
    if len(scales) < 2:
        return []
    first = scales[0]
    out = ["", "## Growth with scale", "", "| measurement | " + " | ".join(f"scale {s:g}" for s in scales) + " |",
           "| --- |" + " ---: |" * len(scales)]
    for name in GROWTH:
        if any(name not in results[s] for s in scales):
            continue
        cells = [f"{results[s][name][0]:.2f} s ({results[s][name][0] / results[first][name][0]:.1f}x)"
                 for s in scales]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def _targets(results: dict[float, dict[str, tuple]], diff_bytes: dict[float, int]) -> list[str]:
    scale = min(results, key=lambda s: abs(s - 1))
    r = results[scale]

    def get(name):
        return r[name][0]

    rows = [
        ("inventory (metadata) no slower than pip inspect", lambda: get("inventory: transplant probe (metadata)"),
         lambda: get("inventory: pip inspect"), "s"),
        ("no-op plan at most 1 s", lambda: get("transplant plan (no-op)"), lambda: 1.0, "s"),
        ("apply within 1.2x of the tar floor", lambda: get("transplant apply"), lambda: 1.2 * get(FLOOR), "s"),
        ("apply after its plan within 1.2x of the tar floor", lambda: get(AFTER_PLAN), lambda: 1.2 * get(FLOOR), "s"),
        ("apply's transfer step within 1.2x of the tar floor", lambda: get(TRANSFER_STEP), lambda: 1.2 * get(FLOOR),
         "s"),
        ("apply moves at most 1.01x the differing bytes", lambda: (r["transplant apply"][1] or 0) / 2**20,
         lambda: 1.01 * diff_bytes[scale] / 2**20, "MiB"),
        ("controller memory at most 300 MiB", lambda: max(v[2] or 0 for v in r.values()) / 2**20, lambda: 300, "MiB"),
    ]
    out = [f"## Targets (scale {scale:g})", "", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for name, value, limited, unit in rows:
        try:
            got, limit = value(), limited()
        except KeyError:  # not measured in this run (--only)
            continue
        out.append(f"| {name} | {got:.2f} {unit} | {limit:.2f} {unit} | "
                   f"{'yes' if got <= limit else f'no, by {got / limit:.2f}x'} |")
    if "inventory: transplant probe (every file hashed)" not in r:
        return out
    hashed = r["inventory: transplant probe (every file hashed)"][0]
    read = r["disk read (dd, warm)"][0]
    size = r["venv bytes"][0]
    rate = size / hashed
    return out + ["", f"Full re-hash: {size / 2**30:.2f} GiB in {hashed:.2f} s = {rate / 2**20:.0f} MiB/s, "
                      f"{rate / read:.0%} of the disk's warm sequential read ({read / 2**20:.0f} MiB/s; target 80 %)."]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="1,2,4", help="comma-separated scale factors (1: about 2 GB)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (the median is reported)")
    parser.add_argument("--out", help="also write the report to this file (BENCHMARKS.md is edited by hand)")
    parser.add_argument("--only", help=f"comma-separated groups to measure, of {', '.join(GROUPS)} (apply brings "
                                       f"the floor along); default: all")
    args = parser.parse_args(argv)
    compile_transplant()  # the measured commands load bytecode, as an installed transplant does
    only = None
    if args.only:
        only = {g.strip() for g in args.only.split(",") if g.strip()}
        unknown = only - set(GROUPS)
        if unknown:
            parser.error(f"--only: unknown group(s) {', '.join(sorted(unknown))}; choose from {', '.join(GROUPS)}")
    scales = [float(s) for s in args.scales.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="transplant-bench-", dir="/tmp"))
    results: dict[float, dict[str, tuple]] = {}
    diff: dict[float, int] = {}
    try:
        with Lab(workdir / "lab", ("donor", "target")) as lab:
            for scale in scales:
                bench = Bench(lab, scale, workdir)
                print(f"scale {scale:g}: building the venvs ({bench.build():.0f} s)", flush=True)
                results[scale] = measure(bench, args.runs, lambda line: print(line, flush=True), only)
                diff[scale] = bench.diff_bytes
                report = "# Benchmarks\n\n" + table(results, diff, args.runs)
                if args.out:
                    Path(args.out).write_text(report)
                print(report, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
