"""The built-in demo: the seed story replayed on loopback sshd hosts, then the donor lost (face + lab).

Acts: verify fails on the target (its sglang has no DFLASH); plan with an overlay that
leaves out flashinfer-python finds sglang's pin unmet and blocks; apply of the full
manifest (which shows its plan first); verify passes (``DFLASH 16 /dev/shm/Qwen3.6-27B``,
smoke on the CPU). Then the donor is gone: a snapshot of its overlay set is taken, its
host is stopped, and a third host (``fresh``, as the target was) is rebuilt from the
snapshot alone: apply, verify, status. (That a second apply changes nothing is shown by the tests, not here,
to keep the demo short.) The hosts are stopped at the end whatever happens.

The two venvs are built once into ``~/.cache/transplant/demo`` (``$TRANSPLANT_DEMO_CACHE``)
inside a private mount namespace where ``/srv`` is the cache folder, so their prefix is
``/srv/venv_sglang`` as on the demo hosts; each run hardlink-copies them into the hosts'
folders (apply never writes a file in place, so the cache keeps its bytes).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from transplant.errors import TransplantError

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.lab import Lab

__all__ = ["HELP", "add_arguments", "handle", "run_demo", "remove_work", "EXAMPLE", "VENV", "STAND_INS",
           "build_demo_venv"]

HELP = "replay the seed story on loopback test hosts, then rebuild a host with the donor gone"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workdir`` and ``--keep``."""
    parser.add_argument("--workdir", help="where the demo keeps its hosts (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true",
                        help="leave the work folder with its manifests and venvs (the hosts are stopped either way)")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``transplant demo``: :func:`run_demo` in ``--workdir`` (default: a temporary folder)."""
    return run_demo(console, workdir=Path(args.workdir) if args.workdir else None, keep=args.keep)


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "seed-migration"
VENV = "/srv/venv_sglang"
PYTHON = "python3.11"
#: role -> (name, version, import package) of the stand-in wheels: real names and CUDA
#: labels where no registry offers such a build for this machine.
STAND_INS = {
    "donor": [("sglang-kernel", "0.4.10+cu130", "sgl_kernel"), ("flashinfer-jit-cache", "0.7.2+cu130", "flashinfer_jit_cache")],
    "target": [("sglang-kernel", "0.4.10+cu128", "sgl_kernel"), ("flashinfer-jit-cache", "0.6.3+cu128", "flashinfer_jit_cache")],
}
#: What flashinfer asks of flashinfer_jit_cache when it is installed (flashinfer/jit/env.py):
#: its version (which must start with flashinfer's own), the folder of prebuilt kernels,
#: and the AOT providers. The stand-in has no kernels: an empty folder and no providers.
_JIT_CACHE_API = '''
import pathlib


def get_jit_cache_dir():
    """The prebuilt-kernel folder: empty in this stand-in."""
    return str(pathlib.Path(__file__).parent / "jit_cache")


def get_jit_cache_providers():
    """AOT kernel providers: none in this stand-in."""
    return []
'''


def _cache_root() -> Path:
    explicit = os.environ.get("TRANSPLANT_DEMO_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transplant" / "demo"


def _in_srv(srv: Path, argv: list[str], log: Path, *, check: bool = True) -> None:
    """Run argv in a private mount namespace where ``/srv`` is ``srv``; output goes to ``log``.

    :param check: raise on a non-zero exit (compileall exits 1 when any file, such as a
        Python 2 test fixture inside a package, does not compile: that is not a failure).
    """
    import subprocess

    script = 'mount --bind "$1" /srv && shift && exec "$@"'
    with open(log, "ab") as out:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
                               str(srv), *argv], stdout=out, stderr=subprocess.STDOUT)
    if check and done.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise TransplantError(f"building the demo venv failed: {' '.join(argv[:6])} ... exited {done.returncode}\n{tail}",
                              hint=f"see {log}; the registries must be reachable for the first run")


def _stand_in_wheels(role: str, out: Path) -> list[Path]:
    from transplant.lab.wheels import build_wheel

    wheels = []
    for name, version, package in STAND_INS[role]:
        label = version.split("+", 1)[1]
        summary = f"STAND-IN for the {label} build of {name} (no registry offers it here); holds no kernels"
        body = f'"""STAND-IN {name} {version}: demo wheel, no kernels."""\n__version__ = "{version}"\n'
        if package == "flashinfer_jit_cache":
            body += _JIT_CACHE_API
        wheels.append(build_wheel(out, name, version, {f"{package}/__init__.py": body}, summary=summary,
                                  tag="cp311-cp311-linux_x86_64"))
    return wheels


def build_demo_venv(role: str, cache: Path) -> Path:
    """Return the cached venv folder for ``role`` (``donor`` or ``target``), building it if needed.

    The key is a hash of the requirements file, the stand-in list and this module's
    build steps, so a change to either builds afresh; older builds of the role are removed.

    :returns: the folder that is ``/srv`` for the built venv (it holds ``venv_sglang``).
    :raises TransplantError: python3.11, unshare or pip failed; the message names the log.
    """
    import fcntl

    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{role}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (a demo and a test run may start together)
        return _build_locked(role, cache)


def _build_locked(role: str, cache: Path) -> Path:
    import hashlib
    import shutil

    requirements = EXAMPLE / f"{role}-requirements.txt"
    key_text = requirements.read_text() + repr(STAND_INS[role]) + _JIT_CACHE_API + PYTHON + "v3-checked-hash"
    key = hashlib.sha256(key_text.encode()).hexdigest()[:12]
    home = cache / f"{role}-{key}"
    srv = home / "srv"
    if (home / "complete").exists():
        return srv
    if home.exists():
        shutil.rmtree(home)
    srv.mkdir(parents=True)
    log = home / "build.log"
    python = shutil.which(PYTHON) or sys.executable
    wheels = _stand_in_wheels(role, home / "wheels")
    # --no-compile: pip's .pyc carry install-time mtimes, so two hosts' copies of one file
    # would differ; compileall below writes reproducible ones instead
    pip = [f"{VENV}/bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    _in_srv(srv, [python, "-m", "venv", VENV], log)
    _in_srv(srv, [*pip, "torch==2.13.0"], log)
    _in_srv(srv, [*pip, "--no-deps", "-r", str(requirements)], log)
    _in_srv(srv, [*pip, "--no-deps", *map(str, wheels)], log)
    # bytecode once, hash-checked (PEP 552): the same source gives the same .pyc on both
    # hosts, a changed source is noticed by its hash, and no run pays for compiling again
    _in_srv(srv, [f"{VENV}/bin/python", "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "checked-hash",
                  f"{VENV}/lib"], log, check=False)
    (home / "complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    for stale in cache.glob(f"{role}-*"):
        if stale != home and stale.is_dir() and not stale.name.endswith(".lock"):
            shutil.rmtree(stale, ignore_errors=True)
    return srv


def _build_all(console: Console, cache: Path) -> dict[str, Path]:
    results: dict[str, Path] = {}
    errors: list[BaseException] = []

    def work(role: str) -> None:
        try:
            results[role] = build_demo_venv(role, cache)
        except BaseException as exc:  # noqa: BLE001 - reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(role,)) for role in ("donor", "target")]
    from transplant.cli.progress import step

    with step(console, "building the demo venvs (torch 2.13.0 CPU, sglang, flashinfer; cached after the first run)",
              count=lambda: f"{len(results)} of 2 built"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results


def _make_patches(donor_site: Path, out: Path) -> None:
    spec = importlib.util.spec_from_file_location("demo_make_patches", EXAMPLE / "make_patches.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(donor_site, out)


def _write_manifests(lab: Lab, workdir: Path) -> tuple[Path, Path]:
    import yaml

    text = (EXAMPLE / "manifest.yaml").read_text()
    for key, value in (("@DONOR@", lab.hosts["donor"].spec), ("@TARGET@", lab.hosts["target"].spec),
                       ("@IDENTITY@", str(lab.identity_file)), ("@KNOWN_HOSTS@", str(lab.known_hosts))):
        text = text.replace(key, value)
    full = workdir / "manifest.yaml"
    full.write_text(text)
    data = yaml.safe_load(text)
    data["overlay"] = [name for name in data["overlay"] if name != "flashinfer-python"]
    partial = workdir / "manifest-without-flashinfer.yaml"
    partial.write_text("# the demo's manifest with flashinfer-python left out of the overlay\n"
                       + yaml.safe_dump(data, sort_keys=False))
    return full, partial


def _act(console: Console, title: str, argv: list[str], want: int) -> bool:
    from transplant.cli import main
    from transplant.cli.render import rule

    rule(console, title)
    console.print(f"$ transplant {' '.join(argv)}", style="bold", highlight=False)
    started = time.monotonic()
    code = main(argv)
    ok = code == want
    console.print(f"exit {code} ({'as expected' if ok else f'expected {want}'}) in {time.monotonic() - started:.1f} s",
                  style="green" if ok else "bold red")
    return ok


def _donor_gone(console: Console, lab: Lab, work: Path, full: Path) -> list[bool]:
    """The acts after the story: snapshot the donor, lose it, rebuild a fresh host from the snapshot."""
    import yaml

    from transplant.cli.render import rule

    store = work / "snapshots"
    results = [_act(console, "5. keep the donor's overlay set on the controller, while the donor is up",
                    ["snapshot", str(full), "--out", str(store)], 0)]
    index = sorted((store / "index").glob("*.json"))
    if not index:
        return results + [False]
    rule(console, "the donor host goes down")
    lab.hosts["donor"].stop_sshd()
    console.print(f"stopped the donor's sshd ({lab.hosts['donor'].spec})", highlight=False)
    data = yaml.safe_load(full.read_text())
    data["donor"] = {"snapshot": str(index[-1])}
    data["target"] = {"host": lab.hosts["fresh"].spec, "venv": VENV}
    rebuilt = work / "manifest-from-snapshot.yaml"
    rebuilt.write_text("# the demo's manifest with the snapshot as the donor and the fresh host as the target\n"
                       + yaml.safe_dump(data, sort_keys=False))
    ssh = ["--identity-file", str(lab.identity_file), "--known-hosts", str(lab.known_hosts)]
    return results + [
        _act(console, "6. the donor is gone: apply to a fresh host from the snapshot", ["apply", str(rebuilt), "--yes"], 0),
        _act(console, "7. verify the fresh host", ["verify", str(rebuilt)], 0),
        _act(console, "8. what the fresh host holds, from where, and whether it drifted",
             ["status", f"{lab.hosts['fresh'].spec}:{VENV}", *ssh], 0),
    ]


def remove_work(console: Console, work: Path) -> None:
    """Remove the demo's own work folder ``work``, said before it starts: it holds the three hosts'
    venvs (hardlinked copies, so every file is unlinked: 66.7 s measured by a new user on a busy
    2-core machine), which would otherwise look like a hang at the end. Off a terminal the
    step's own start line says it; on one, a line stays above the spinner."""
    import shutil

    from transplant.cli.progress import step

    label = f"removing the demo's work folder {work} (the three hosts' venvs: can take about a minute)"
    if console.is_terminal:
        console.print(f"{label} ...", markup=False, highlight=False)
    with step(console, label):
        shutil.rmtree(work, ignore_errors=True)


def run_demo(console: Console, *, workdir: Path | None = None, keep: bool = False) -> int:
    """Run the demo; returns 0 when every act behaved as the story says, else 1."""
    import shutil
    import subprocess
    import tempfile

    from transplant.cli.render import rule
    from transplant.core.units import count
    from transplant.lab import Lab

    if not (EXAMPLE / "manifest.yaml").exists():
        raise TransplantError(f"the demo's files are not at {EXAMPLE}",
                              hint="run the demo from a source checkout: ./scripts/demo")
    started = time.monotonic()
    venvs = _build_all(console, _cache_root())
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="transplant-demo-")) if workdir is None else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    # the demo's relay staging, snapshot store and log of verified states stay in its work folder
    state_before = os.environ.get("TRANSPLANT_STATE_DIR")
    os.environ["TRANSPLANT_STATE_DIR"] = str(work / "state")
    try:
        with console.status("starting the loopback hosts donor, target and fresh"):
            lab = Lab(work / "lab", ("donor", "target", "fresh"))
        with lab:
            for role, venv in (("donor", "donor"), ("target", "target"), ("fresh", "target")):
                dest = lab.hosts[role].path(VENV)
                if dest.exists():
                    shutil.rmtree(dest)
                subprocess.run(["cp", "-al", str(venvs[venv] / "venv_sglang"), str(dest)], check=True)
            console.print(f"hosts: donor {lab.hosts['donor'].spec}, target {lab.hosts['target'].spec}; "
                          f"venv {VENV} on both")
            site = lab.hosts["donor"].path(f"{VENV}/lib/python3.11/site-packages")
            _make_patches(site, work / "patches")
            full, partial = _write_manifests(lab, work)
            results.append(_act(console, "1. the target as it is: DFLASH is not a valid choice", ["verify", str(full)], 3))
            results.append(_act(console, "2. plan with flashinfer-python left out of the overlay", ["plan", str(partial)], 3))
            results.append(_act(console, "3. apply the full manifest (it shows the plan it carries out)",
                                ["apply", str(full), "--yes"], 0))
            results.append(_act(console, "4. verify after apply", ["verify", str(full)], 0))
            results += _donor_gone(console, lab, work, full)
    finally:
        if state_before is None:
            os.environ.pop("TRANSPLANT_STATE_DIR", None)
        else:
            os.environ["TRANSPLANT_STATE_DIR"] = state_before
        if own and not keep:
            remove_work(console, work)
    rule(console, "demo")
    if keep or not own:
        console.print(f"work folder kept: {work} (manifests, patches, venvs); its hosts are stopped, so its manifests "
                      f"reach nothing until a lab runs there again", highlight=False)
    seconds = time.monotonic() - started
    if all(results):
        console.print(f"[bold green]demo passed[/]: every act behaved as the story says ({seconds:.0f} s); hosts stopped")
        return 0
    console.print(f"[bold red]demo failed[/]: {count(results.count(False), 'act')} did not behave as expected ({seconds:.0f} s)")
    return 1
