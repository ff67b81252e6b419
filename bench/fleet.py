"""Bytes read from the donor when one manifest rebuilds 1, 4 and 8 targets.

Usage::

    .venv/bin/python -m bench.fleet [--scale 0.02] [--counts 1,4,8] [--out FILE]

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

With ``--registry`` a third way is measured: the snapshot is pushed once to a loopback OCI
registry (Debian's ``docker-registry``, :class:`transplant.lab.registry.LabRegistry`) and
the manifest's donor is ``{snapshot: oci://...}``: every target pulls its blobs straight
from the registry. Reported: the controller's bytes (file bytes relayed to targets, plus the
blobs the controller pulled itself to read the shared objects for the plan) and the registry
bytes per target (what each target's pull received).
"""

from __future__ import annotations

import argparse
import contextlib
import io
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

from transplant.controller.manifest_file import load_manifest
from transplant.fleet.run import run_fleet, serve_from_snapshot
from transplant.hosts.host import HostSpec, SSHOptions
from transplant.lab import Lab
from transplant.core.manifest import Endpoint
from transplant.core.units import human_bytes
from transplant.donor.registry_snapshot import RegistrySource
from transplant.donor.sources import open_donor
from transplant.donor.store import object_key, object_sizes

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


def _usage(registry_pid: int | None, sshd_pids: list[int] = []) -> dict[str, float]:  # noqa: B006 - never mutated
    """What the machine has used so far: CPU seconds of all cores (busy, and in all), of this process
    and its children (the controller), of the registry process, of what the targets' sshd ran and
    reaped (``sshd_pids``: each sshd's children's time, the sessions and their commands, counted once
    they end), and bytes the disks read and wrote (the whole machine's: other work's included)."""
    import resource

    ticks = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    out = {"busy": (sum(fields[:8]) - idle) / ticks, "all": sum(fields[:8]) / ticks, "iowait": fields[4] / ticks}
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["controller"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    out["registry"] = out["targets"] = 0.0
    if registry_pid is not None:
        stat = Path(f"/proc/{registry_pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["registry"] = (int(stat[11]) + int(stat[12])) / ticks
    for pid in sshd_pids:  # fields 16 and 17 (cutime, cstime): the reaped children's CPU
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["targets"] += (int(stat[13]) + int(stat[14])) / ticks
    read = written = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        parts = line.split()
        if len(parts) > 9 and parts[2].startswith(("vd", "sd", "nvme")) and not parts[2][-1].isdigit():
            read += int(parts[5]) * 512
            written += int(parts[9]) * 512
    out["disk_read"], out["disk_written"] = float(read), float(written)
    return out


def measure_registry(lab: Lab, work: Path, count: int, reference: str, ca: Path,
                     registry_pid: int | None = None) -> dict:
    """Apply to ``count`` targets from the registry snapshot ``reference``: controller and registry
    bytes, and what the machine used meanwhile (:func:`_usage`)."""
    names = list(TARGETS[:count])
    _reset(lab, names)
    os.environ["TRANSPLANT_STATE_DIR"] = str(work / f"state-registry-{count}")
    text = (work / "bench.yaml").read_text().splitlines()
    text[1] = f"donor: {{snapshot: {reference}, ca: {ca}}}"
    (work / "bench-registry.yaml").write_text("\n".join(text) + "\n")
    manifest = load_manifest(work / "bench-registry.yaml")
    ssh = SSHOptions(identity_file=lab.identity_file, known_hosts=lab.known_hosts)
    targets = [Endpoint(host=HostSpec.parse(lab.hosts[n].spec), venv=VENV) for n in names]
    sshd = [pid for pid in (lab.hosts[n].pid for n in names) if pid is not None]
    before = _usage(registry_pid, sshd)
    started = time.monotonic()
    with ExitStack() as stack:
        opened = open_donor(manifest, ssh, stack)
        results = run_fleet("apply", opened.manifest, targets, opened, ssh, jobs=4)
        source = opened.source
        assert isinstance(source, RegistrySource)  # the manifest's donor is the registry snapshot
        pulls = dict(source.pulls)
        controller_pulled = source.client.bytes_received
        patches = {object_key(p["hash"]) for p in source.snapshot.patches}
        layers = sum(int(layer["size"]) for layer in {d["digest"]: d for d in source.layer_of.values()}.values())
        files_pulled = sum(size for name, size in object_sizes(source.snapshot.store).items()
                           if name not in patches)
    seconds = time.monotonic() - started
    after = _usage(registry_pid, sshd)
    used = {k: after[k] - before[k] for k in after}
    failed = [r for r in results if r.code != 0]
    if failed:
        raise RuntimeError(f"registry x{count}: {failed[0].target}: {failed[0].error}")
    per_target = [p.registry_bytes for p in pulls.values()]
    return {"targets": count, "mode": "registry", "relayed_bytes": sum(r.applied.bytes_moved for r in results if r.applied),
            "controller_pulled": controller_pulled, "controller_files": files_pulled, "registry_bytes_per_target": max(per_target, default=0),
            "direct": sum(p.how == "registry" for p in pulls.values()), "seconds": round(seconds, 1),
            "registry_bytes_all": sum(per_target), "layers_bytes": layers,
            "cpu_busy": round(used["busy"] / used["all"], 2) if used["all"] else None,
            "iowait": round(used["iowait"] / used["all"], 2) if used["all"] else None,
            "controller_cpu": round(used["controller"], 1), "registry_cpu": round(used["registry"], 1),
            "targets_cpu": round(used["targets"], 1),
            "disk_written": int(used["disk_written"]), "disk_read": int(used["disk_read"]),
            "load": round(os.getloadavg()[0], 1)}


def _push(lab: Lab, work: Path, registry) -> tuple[str, int]:
    """Snapshot the donor and push it to the lab registry; returns (pinned reference, bytes uploaded)."""
    from transplant.cli import main as cli

    os.environ["TRANSPLANT_REGISTRY_USER"], os.environ["TRANSPLANT_REGISTRY_PASSWORD"] = registry.user, registry.password
    os.environ["TRANSPLANT_STATE_DIR"] = str(work / "state-push")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli(["snapshot", str(work / "bench.yaml"), "--push", f"oci://{registry.host}/bench/snap:v1",
                    "--ca", str(registry.ca), "--json"])
    if code != 0:
        raise RuntimeError(f"snapshot --push failed ({code}): {buffer.getvalue()[-2000:]}")
    doc = json.loads(buffer.getvalue())
    return doc["pushed"], doc["bytes_uploaded"]


def main(argv: list[str] | None = None) -> int:
    """Run the measurements, print the table and write it to ``--out`` when given."""
    parser = argparse.ArgumentParser(prog="bench.fleet")
    parser.add_argument("--scale", type=float, default=0.02, help="workload scale (1 = about 2 GB)")
    parser.add_argument("--counts", default="1,4,8", help="numbers of targets")
    parser.add_argument("--out", help="also write the table to this file (BENCHMARKS.md is edited by hand)")
    parser.add_argument("--registry", action="store_true",
                        help="also apply from a snapshot in a loopback OCI registry (needs docker-registry)")
    parser.add_argument("--only-registry", action="store_true",
                        help="only the registry rows (implies --registry): not the fleet and each-from-the-donor ones")
    args = parser.parse_args(argv)
    args.registry = args.registry or args.only_registry
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
            for count in ([] if args.only_registry else counts):
                for mode in ("fleet", "each"):
                    rows.append(measure(lab, work, count, mode))
                    print(json.dumps(rows[-1]), flush=True)
            if args.registry:
                from transplant.lab.registry import LabRegistry

                with LabRegistry(work / "registry") as registry:
                    reference, uploaded = _push(lab, work, registry)
                    for count in counts:
                        pid = registry._proc.pid if registry._proc else None  # its CPU time is read from /proc
                        rows.append({**measure_registry(lab, work, count, reference, registry.ca, pid),
                                     "pushed": uploaded})
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
    for count in ([] if args.only_registry else counts):
        f = next(r for r in rows if r["targets"] == count and r["mode"] == "fleet")
        e = next(r for r in rows if r["targets"] == count and r["mode"] == "each")
        lines.append(f"| {count} | {human_bytes(f['donor_bytes'])} | {f['donor_logins']} | "
                     f"{human_bytes(e['donor_bytes'])} | {e['donor_logins']} | {f['seconds']} | {e['seconds']} |")
    registry_rows = [r for r in rows if r["mode"] == "registry"]
    if registry_rows:
        lines += [
            "",
            "## From a snapshot in an OCI registry",
            "",
            f"The snapshot pushed once ({human_bytes(registry_rows[0]['pushed'])} uploaded) to a loopback "
            f"`docker-registry` (TLS, htpasswd); the manifest's donor is `{{snapshot: oci://...}}`.",
            "",
            "| targets | controller: file bytes relayed to targets | controller: file bytes pulled | controller: "
            "bytes from the registry (manifest, index, ELF facts) | registry bytes per target | targets that pulled "
            "directly | registry bytes in all (the snapshot's layers) | seconds (x 1 target) | machine CPU busy "
            "(iowait) | CPU s: controller / registry / targets | disk written | load |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        one = registry_rows[0]["seconds"]
        for r in registry_rows:
            lines.append(f"| {r['targets']} | {human_bytes(r['relayed_bytes'])} | {human_bytes(r['controller_files'])} | "
                         f"{human_bytes(r['controller_pulled'])} | "
                         f"{human_bytes(r['registry_bytes_per_target'])} | {r['direct']} | "
                         f"{human_bytes(r['registry_bytes_all'])} ({human_bytes(r['layers_bytes'])}) | "
                         f"{r['seconds']} ({r['seconds'] / one:.2f}x) | {r['cpu_busy']:.0%} ({r['iowait']:.0%}) | "
                         f"{r['controller_cpu']} / {r['registry_cpu']} / {r['targets_cpu']} | {human_bytes(r['disk_written'])} | {r['load']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
