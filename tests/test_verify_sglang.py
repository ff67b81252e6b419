"""The ladder in the demo's real venvs (torch 2.13 CPU, real sglang, flashinfer, triton): sglang's
own parser and its deeper resolution step, the smoke sub-checks' honest skips on a CPU, the
native-load and library-provenance stages over real torch and CUDA-runtime wheels."""

from __future__ import annotations

import pytest

from transplant import demo
from transplant.hosts import HostSpec, connect
from transplant.manifest import ServerArgsCheck, VerifySettings
from transplant.verify import run_stages

pytestmark = pytest.mark.demo

ENTRY = "sglang.srt.server_args:prepare_server_args"


@pytest.fixture(scope="module")
def venvs():
    """The demo's cached venvs (built on first use), used in place: their python runs from any path."""
    cache = demo._cache_root()
    return {role: str(demo.build_demo_venv(role, cache) / "venv_sglang") for role in ("donor", "target")}


def _run(venv, tmp_path, **settings):
    env = {"LD_LIBRARY_PATH": str(tmp_path), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    with connect(HostSpec.parse("local")) as host:
        return {r.name: r for r in run_stages(VerifySettings(env=env, timeout=600, **settings), target=host, venv=venv)}


def test_sglang_0523_parses_dflash_and_its_resolution_step_says_what_it_lacks(venvs, tmp_path):
    check = ServerArgsCheck(entry=ENTRY, args=("--model-path", "/dev/shm/Qwen3.6-27B", "--speculative-algorithm", "DFLASH",
                                               "--speculative-dflash-block-size", "16"),
                            expect={"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 16}, resolve=True)
    by = _run(venvs["donor"], tmp_path, server_args=check, smoke_device="auto",
              overlay=("torch", "nvidia-*", "sglang-kernel", "flashinfer-python"))
    assert by["server-args"].status == "pass"
    assert by["server-args"].reason == "parsed; DFLASH 16 (speculative_algorithm, speculative_dflash_block_size)"
    # sglang 0.5.23 resolves in ServerArgs.resolve_once(); the demo venv was installed without
    # dependencies, so the step's import of transformers fails on its missing 'regex'
    resolve = by["server-args-resolve"]
    assert resolve.status == "fail"
    assert resolve.reason.startswith("ServerArgs.resolve_once() needs a module the venv lacks: ModuleNotFoundError: "
                                     "No module named 'regex'")
    assert resolve.details["model_path"] == "/dev/shm/Qwen3.6-27B" and resolve.details["config_json"] is False
    smoke = by["smoke"]
    assert smoke.status == "pass"
    subs = {s["name"]: s for s in smoke.details["subchecks"]}
    assert subs["triton kernel"] == {"name": "triton kernel", "status": "skip", "reason": "no GPU: a triton kernel needs one"}
    assert subs["flashinfer rmsnorm"]["reason"] == "no GPU: flashinfer's kernels run on CUDA only"
    assert subs["sgl_kernel rmsnorm"]["status"] == "skip"
    assert "triton kernel: skip (no GPU: a triton kernel needs one)" in smoke.reason
    # real torch and CUDA-runtime wheels: every shared object loads, none shadowed from outside
    assert by["native-load"].status == "pass" and by["library-provenance"].status == "pass"
    assert "torch" in by["library-provenance"].reason
    names = [i["name"] for i in by["imports"].details["imports"]]
    assert {"torch", "nvidia", "sgl_kernel", "flashinfer"} <= set(names)


def test_sglang_059_has_no_separate_resolution_step(venvs, tmp_path):
    check = ServerArgsCheck(entry=ENTRY, args=("--model-path", "dummy"), expect={"model_path": "dummy"}, resolve=True)
    by = _run(venvs["target"], tmp_path, server_args=check)
    assert by["server-args"].status == "pass"
    assert by["server-args-resolve"].status == "skip"
    assert by["server-args-resolve"].reason == ("ServerArgs has no separate resolution step (resolve_once); its parser "
                                                "already resolved")
