"""The ``real`` tier: plan, apply, verify and rollback on the two real seed stacks.

The venvs come from ``scripts/real-stacks`` (about 22 GB under ``~/.cache/transplant/real``;
``TRANSPLANT_REAL`` names another folder). These tests are left out of the default run
(``pyproject.toml`` adds ``-m 'not real'``) and of CI: ``pytest -m real`` runs them, and
each says why it skipped when the venvs are absent. The cached venvs are never changed:
the target is cloned first (``transplant clone``) into a temporary folder on the same
filesystem, and that clone is what apply changes and rollback restores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from transplant.lab.realstacks import CALIBRATED_OVERLAY, CALIBRATED_REMOVE, manifest_data

pytestmark = pytest.mark.real

ROOT = Path(os.environ.get("TRANSPLANT_REAL") or Path.home() / ".cache" / "transplant" / "real")
DONOR, TARGET = ROOT / "donor", ROOT / "target"
TRANSPLANT = [sys.executable, "-m", "transplant"]


def _missing() -> str | None:
    for venv in (DONOR, TARGET):
        if not (venv / ".transplant-real-complete").exists():
            return f"{venv} is absent or incomplete: build it with scripts/real-stacks (about 22 GB, 10-25 minutes)"
    return None


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """One transplant command, its output kept for the assertion messages."""
    done = subprocess.run([*TRANSPLANT, *args], capture_output=True, text=True, timeout=1800)
    if check and done.returncode != 0:
        pytest.fail(f"transplant {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="module")
def stacks():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return DONOR, TARGET


@pytest.fixture(scope="module")
def work(stacks, tmp_path_factory):
    """A clone of the target stack on the cache's filesystem, removed afterwards (only that folder)."""
    folder = Path(str(ROOT) + "-work")
    folder.mkdir(exist_ok=True)
    clone = folder / f"target-{os.getpid()}"
    run("clone", f"local:{TARGET}", f"local:{clone}")
    yield clone
    if clone.parent == folder and (clone / "pyvenv.cfg").exists():
        shutil.rmtree(clone)


def installed(venv: Path) -> list[tuple[str, str, str]]:
    """(name, version, dist-info folder) of every distribution, from ``transplant inventory``."""
    doc = json.loads(run("inventory", f"local:{venv}", "--json").stdout)
    return sorted((d["name"], d.get("version") or "", d["dist_info"]) for d in doc["distributions"])


def manifest(tmp_path: Path, target: Path) -> Path:
    data = manifest_data(str(DONOR), str(target), overlay=CALIBRATED_OVERLAY, remove=CALIBRATED_REMOVE)
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("which", ["donor", "target"])
def test_verify_passes_a_freshly_installed_stack(stacks, which):
    """A healthy venv on a machine without a driver has no failing stage (skips say why)."""
    venv = DONOR if which == "donor" else TARGET
    done = run("verify", f"local:{venv}", "--imports", "torch,sglang,flashinfer,sgl_kernel", "--json", check=False)
    report = json.loads(done.stdout)
    failed = [s for s in report["stages"] if s["status"] == "fail"]
    assert not failed, json.dumps(failed, indent=1)


def test_apply_with_the_plans_own_hints_then_verify_replan_and_rollback(stacks, work, tmp_path):
    m = manifest(tmp_path, work)
    before = installed(work)
    planned = run("plan", str(m), "--json", check=False)
    assert planned.returncode in (0, 2), planned.stdout[-3000:] + planned.stderr[-3000:]
    assert not [f for f in json.loads(planned.stdout)["findings"] if f["severity"] == "error"]
    run("apply", str(m), "--yes")
    verified = run("verify", str(m), "--json", check=False)
    report = json.loads(verified.stdout)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["server-args"]["status"] == "pass", stages["server-args"]
    assert "DFLASH" in stages["server-args"]["reason"]
    assert not [s for s in report["stages"] if s["status"] == "fail"], json.dumps(report["stages"], indent=1)
    again = json.loads(run("plan", str(m), "--json", check=False).stdout)
    assert not [f for f in again["findings"] if f["severity"] == "error" or f["code"] == "record-drift"]
    assert not any(c["copy"] or c["remove"] for c in again["changes"])
    run("rollback", str(m), "--yes")  # checks the target hash for hash against the state before
    assert installed(work) == before


def test_inits_own_manifest_ends_green_and_strict_names_the_gpu_bound_stages(stacks, work, tmp_path):
    """The operator's first path on the real pair, on this driverless machine: init, plan, apply,
    verify with init's own manifest has no failing stage (what needs a GPU is said, with its
    cause); ``--strict`` fails exactly the stages that hold GPU-bound checks."""
    m = tmp_path / "init.yaml"
    before = installed(work)
    run("init", "--donor", f"local:{DONOR}", "--target", f"local:{work}", "--out", str(m))
    imports = yaml.safe_load(m.read_text())["verify"]["imports"]
    assert {"name": "deep_ep", "needs": ["gpu"]} in imports and "sglang" in imports and "torch" in imports
    planned = run("plan", str(m), "--json", check=False)
    assert not [f for f in json.loads(planned.stdout)["findings"] if f["severity"] == "error"]
    run("apply", str(m), "--yes")
    try:
        report = json.loads(run("verify", str(m), "--json", check=False).stdout)
        assert report["ok"] is True, json.dumps([s for s in report["stages"] if s["status"] == "fail"], indent=1)
        assert set(report["causes"]) <= {"not-requested", "no-driver"}, report["causes"]
        assert "imports:deep_ep" in report["causes"]["no-driver"]
        strict = json.loads(run("verify", str(m), "--json", "--strict", check=False).stdout)
        failed = sorted(s["name"] for s in strict["stages"] if s["status"] == "fail")
        assert failed == ["imports", "smoke"], strict["verdict"]
    finally:
        run("rollback", str(m), "--yes")
    assert installed(work) == before
