"""The built-in demo runs end to end (real sglang, real flashinfer, real sshd hosts, real rsync).

It builds its two venvs from the package registries on the first run (cached after),
so it is the slowest test; it is the README's first command, minus the setup.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.demo

ROOT = Path(__file__).resolve().parent.parent


def test_demo_replays_the_story(lab):
    # the `lab` fixture only makes sure this machine can run loopback hosts (else it skips)
    env = dict(os.environ, COLUMNS="3000", TERM="dumb")  # no table wrapping
    done = subprocess.run([sys.executable, "-m", "transplant", "demo"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, out[-6000:]
    # act 1: the target's sglang 0.5.9 rejects DFLASH in its own parser
    assert "invalid choice: 'DFLASH'" in out
    # act 2: the requirement finding, before anything is copied
    assert "sglang 0.5.23 requires flashinfer_python[cu13]==0.7.2, found 0.6.3" in out
    assert "manifest-without-flashinfer.yaml, add: remove: [torchvision] overlay: [flashinfer-python]" in out
    assert "sglang family: the overlay moves sglang, sglang-kernel but not flashinfer-python" in out
    # act 3: the target's CUDA 12 runtime goes (remove:), the CPU-demo artifacts are accepted with
    # their reason, and a binary fact: torchvision 0.16.2's ops need libtorch symbols torch 2.13 lacks
    assert "named in remove:" in out and "error (accepted)" in out
    assert "accepted in the manifest: the demo runs the CPU wheel of torch 2.13.0" in out
    assert "torchvision 0.16.2: 2 shared objects need" in out
    # act 3 (apply shows its plan): the CUDA-variant change is named as such
    assert "same version, other CUDA build: CUDA 12.8 -> CUDA 13.0" in out
    # act 4: the story's checkpoint line, and the smoke run said it used the CPU
    assert "parsed; DFLASH 16 /dev/shm/Qwen3.6-27B 15 (speculative_algorithm, speculative_dflash_block_size, model_path, speculative_ddtree_budget)" in out
    assert "ran on the CPU" in out
    # the verify ladder, every rung shown; the GPU-only sub-checks and the serve stage as skips with why
    for stage in ("interpreter", "imports", "native-load", "library-provenance", "requirements", "server-args",
                  "smoke", "serve", "jit-caches"):
        assert f" {stage} PASS " in out or f" {stage} SKIP " in out, stage  # a table row (no box in a pipe)
    assert "shared objects load (RTLD_NOW)" in out and "none shadowing a library the venv ships" in out
    assert "skipped transformers (verify.skip_imports: the CPU demo carries transformers without its dependencies" in out
    assert "triton kernel: skip (no GPU: a triton kernel needs one)" in out
    assert " serve SKIP 0.0 no verify.serve in the manifest" in out
    # acts 5-8: a snapshot, the donor stopped, a fresh host rebuilt from the snapshot alone and verified
    assert "stopped the donor's sshd" in out
    assert out.count("donor source: snapshot ") == 2 and out.count("verify passed") == 2
    assert "no drift: all" in out and "match what was applied" in out
    assert "demo passed" in out


def test_smoke_with_device_cuda_fails_without_a_gpu(lab):
    """The smoke script itself, in the demo's real torch venv: cuda asked for, no GPU here -> fail, with why."""
    from transplant import remote
    from transplant.cli.commands import demo

    srv = demo.build_demo_venv("target", demo._cache_root())
    script = 'mount --bind "$1" /srv && shift && exec "$@"'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(srv),
                           f"{demo.VENV}/bin/python", "-", "cuda"], input=remote.source("stage_smoke"),
                          capture_output=True, timeout=300)
    report = __import__("json").loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["ok"] is False and report["checks"] == []
    assert report["reason"].startswith("device cuda asked for, but torch.cuda.is_available() is False")
    auto = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(srv),
                           f"{demo.VENV}/bin/python", "-", "auto"], input=remote.source("stage_smoke"),
                          capture_output=True, timeout=300)
    report = __import__("json").loads(auto.stdout.decode().strip().splitlines()[-1])
    assert report["ok"] is True and report["device"] == "cpu" and "ran on the CPU" in report["reason"]
    assert {c["dtype"] for c in report["checks"]} == {"float32", "bfloat16"}
    [bridge] = [c for c in report["subchecks"] if c["name"] == "numpy bridge"]  # the demo's torch meets its numpy
    assert bridge["status"] == "pass" and "round trip, exact" in bridge["reason"], bridge
