"""The ``real`` tier between hosts whose systems differ: the two real seed stacks, bound
read-only into a trixie host (glibc 2.41) and a bookworm host (glibc 2.36) that run the same
CPython build, planned in both directions from the manifest ``init`` writes.

On one system this pair plans with 0 errors; between these two, the donor-runs-it rule must not
turn the faults inside the venv the donor runs (its own ``-cu12`` leftovers, libtorch add-ons,
a ``cpython-310`` module) into errors because the target's glibc is older. Left out of the default
run and of CI, like the rest of the ``real`` tier (``pytest -m real``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from transplant.cli import main
from transplant.lab.systems import SystemLab
from transplant.lab.up import shareable_python

pytestmark = [pytest.mark.real, pytest.mark.hosts]

ROOT = Path(os.environ.get("TRANSPLANT_REAL") or Path.home() / ".cache" / "transplant" / "real")
NEW, OLD = ROOT / "donor", ROOT / "target"  # sglang 0.5.23 (CUDA 13) and 0.5.9 (CUDA 12)


@pytest.fixture(scope="module")
def apart():
    for venv in (NEW, OLD):
        if not (venv / ".transplant-real-complete").exists():
            pytest.skip(f"{venv} is absent or incomplete: build it with scripts/real-stacks")
    build = shareable_python()
    if build is None:
        pytest.skip("the real stacks' venvs need this machine's own Python build bound into the hosts")
    directory = Path(tempfile.mkdtemp(prefix="transplant-real-systems-", dir="/tmp"))
    try:
        with SystemLab(directory, {"trixie": "trixie", "bookworm": "bookworm"},
                       binds={build: build, str(ROOT): str(ROOT)}) as lab:
            yield lab
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("donor_host, target_host", [("trixie", "bookworm"), ("bookworm", "trixie")])
def test_inits_manifest_plans_without_error_between_releases(apart, tmp_path, capsys, donor_host, target_host):
    d, t = apart.hosts[donor_host], apart.hosts[target_host]
    manifest = tmp_path / "m.yaml"
    flags = ["--identity-file", str(apart.identity_file), "--known-hosts", str(apart.known_hosts)]
    assert main(["init", "--donor", f"{d.spec}:{NEW}", "--target", f"{t.spec}:{OLD}", "--out", str(manifest),
                 *flags]) == 0
    capsys.readouterr()
    code = main(["plan", str(manifest), "--json"])
    doc = json.loads(capsys.readouterr().out)
    errors = [(f["code"], f["dists"], f["message"][:300]) for f in doc["findings"] if f["severity"] == "error"]
    assert errors == [] and code == 0
    # the donor's own faults inside the venv are info, whichever glibc the target has
    infos = {f["code"] for f in doc["findings"] if f["severity"] == "info"}
    assert {"libtorch-abi", "python-abi-mismatch"} <= infos
