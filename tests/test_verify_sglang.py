"""The ladder in the demo's real venvs (torch 2.13 CPU, real sglang, flashinfer, triton): sglang's
own parser and its deeper resolution step, the smoke sub-checks' honest skips on a CPU, the
native-load and library-provenance stages over real torch and CUDA-runtime wheels."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from transplant.cli.commands import demo
from transplant.hosts.host import HostSpec
from transplant.hosts.connecting import connect
from transplant.lab.wheels import make_venv
from transplant.core.manifest import ServerArgsCheck, VerifySettings
from transplant.verify.runner import run_stages

EXTRAS = Path(__file__).resolve().parent / "data" / "resolve-extras.txt"

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
    assert subs["triton kernel"] == {"name": "triton kernel", "status": "skip", "reason": "no GPU: a triton kernel needs one",
                                     "needs": "gpu"}
    # what did not run for want of a GPU is said as not checked here (--strict fails it)
    assert {u["item"] for u in smoke.unchecked} >= {"cuda", "triton kernel", "flashinfer rmsnorm", "sgl_kernel rmsnorm"}
    assert subs["flashinfer rmsnorm"]["reason"] == "no GPU: flashinfer's kernels run on CUDA only"
    assert subs["sgl_kernel rmsnorm"]["status"] == "skip"
    assert "triton kernel: skip (no GPU: a triton kernel needs one)" in smoke.reason
    # real torch and CUDA-runtime wheels: every shared object loads, none shadowed from outside
    assert by["native-load"].status == "pass" and by["library-provenance"].status == "pass"
    assert "torch" in by["library-provenance"].reason
    mapped = {lib["library"]: lib["from"] for lib in by["library-provenance"].details["cuda_torch_libraries"]}
    assert mapped["libtorch_cpu.so"] == "venv" and mapped["libc10.so"] == "venv"
    names = [i["name"] for i in by["imports"].details["imports"]]
    assert {"torch", "nvidia", "sgl_kernel", "flashinfer"} <= set(names)


def test_sglang_059_has_no_separate_resolution_step(venvs, tmp_path):
    check = ServerArgsCheck(entry=ENTRY, args=("--model-path", "dummy"), expect={"model_path": "dummy"}, resolve=True)
    by = _run(venvs["target"], tmp_path, server_args=check)
    assert by["server-args"].status == "pass"
    assert by["server-args-resolve"].status == "skip"
    assert by["server-args-resolve"].reason == ("ServerArgs has no separate resolution step (resolve_once); its parser "
                                                "already resolved")


@pytest.fixture(scope="module")
def resolving_venv(venvs, tmp_path_factory):
    """A venv whose own site-packages is empty and whose .pth adds the pinned extras of
    tests/data/resolve-extras.txt (installed once into the demo cache, keyed by that file and
    the donor venv) and then the demo donor's site-packages: real sglang 0.5.23 whose
    resolution step can import everything it needs."""
    donor_site = Path(venvs["donor"]) / "lib" / "python3.11" / "site-packages"
    key = hashlib.sha256((EXTRAS.read_text() + str(donor_site)).encode()).hexdigest()[:12]
    cache = demo._cache_root()
    extras = cache / f"resolve-extras-{key}"
    with open(cache / "resolve-extras.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (extras / "complete").exists():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--no-compile", "--target", str(extras / "site"), "-r", str(EXTRAS)], check=True)
            (extras / "complete").write_text("ok\n")
    venv = make_venv(tmp_path_factory.mktemp("resolve") / "venv")
    (venv / "lib" / "python3.11" / "site-packages" / "layers.pth").write_text(f"{extras / 'site'}\n{donor_site}\n")
    return str(venv)


def _tiny_model(folder: Path) -> Path:
    spec = importlib.util.spec_from_file_location("stage_serve", Path(demo.__file__).parents[2] / "remote" / "stage_serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_model(str(folder), module.TINY)
    return folder


def test_sglang_resolution_step_reports_what_it_needs(resolving_venv, tmp_path):
    """Real sglang 0.5.23, its dependencies present: without the model's folder the step needs its
    config.json; with a (tiny) model folder it gets to the platform and needs a GPU."""
    absent = ServerArgsCheck(entry=ENTRY, args=("--model-path", "/dev/shm/Qwen3.6-27B", "--speculative-algorithm",
                                                "DFLASH"), expect={"speculative_algorithm": "DFLASH"}, resolve=True)
    by = _run(resolving_venv, tmp_path, server_args=absent)
    assert by["server-args"].status == "pass"
    resolve = by["server-args-resolve"]
    assert resolve.status == "skip", resolve.reason
    assert resolve.reason.startswith("ServerArgs.resolve_once() needs the model's config.json, and "
                                     "/dev/shm/Qwen3.6-27B/config.json is absent on the target; put the model there")
    model = _tiny_model(tmp_path / "tiny")
    present = ServerArgsCheck(entry=ENTRY, args=("--model-path", str(model)), expect={"model_path": str(model)},
                              resolve=True)
    resolve = _run(resolving_venv, tmp_path, server_args=present)["server-args-resolve"]
    assert resolve.status == "skip", resolve.reason
    assert resolve.reason.startswith("ServerArgs.resolve_once() needs a GPU, and none is visible here (RuntimeError: "
                                     "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS)")
    assert resolve.details["config_json"] is True and resolve.details["gpu"] is False
