"""The JIT compilers against the target's GPU, between lab hosts whose GPUs differ.

The donor (trixie) has a venv with a triton wheel carrying its ptxas (a stand-in of CUDA 12.8's)
and flashinfer 0.6.8.post1; the target (bookworm) and trixie's twin both have CUDA 12.8 under
``/usr/local/cuda-12.8`` with the ``/usr/local/cuda`` link, as NVIDIA's packages install it, and
no ``CUDA_HOME``: the probe finds it where flashinfer's JIT does. They differ in their GPU only: a
Blackwell card (12.0, or 12.1) on the target, an H100 (9.0) on the twin. The compilers are the
same on both, so the verdict differs by the GPU alone; the donor's own H100 excuses nothing."""

from __future__ import annotations

import json
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.standins import (TOOLKITS, Driver, Gpu, compiler_script, install_driver, install_toolkit,
                                     remove_driver, remove_toolkit)
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python, ssh

pytestmark = pytest.mark.hosts

VENV = "/srv/xj"
PTXAS = "triton/backends/nvidia/bin/ptxas"
H100 = Gpu("NVIDIA H100 80GB HBM3", "9.0", 81559)
RTX_PRO = Gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", 97887)
GB10 = Gpu("NVIDIA GB10", "12.1", 122570)
OVERLAY = ("triton", "flashinfer-python")


@pytest.fixture(scope="module")
def jit(systems, tmp_path_factory):
    """The donor venv (trixie, an H100) with triton 3.5.0 (ptxas of CUDA 12.8 in the wheel) and
    flashinfer-python 0.6.8.post1; empty venvs on bookworm (a 12.0 Blackwell GPU) and trixie's twin
    (an H100), both with CUDA 12.8 installed."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    kit = TOOLKITS["12.8"]
    wheels = tmp_path_factory.mktemp("jit-wheels")
    made = [
        build_wheel(wheels, "triton", "3.5.0", {"triton/__init__.py": "", PTXAS: compiler_script(kit, "ptxas")},
                    executable=(PTXAS,)),
        build_wheel(wheels, "flashinfer-python", "0.6.8.post1", {"flashinfer/__init__.py": ""}),
    ]
    python = f"{build}/bin/python3"
    hosts = systems.hosts
    for name in ("trixie", "bookworm", "trixie-twin"):
        hosts[name].run(["rm", "-rf", VENV, "/srv/jit-wheels"])
        hosts[name].run([python, "-m", "venv", "--without-pip", VENV])
    for wheel in made:
        hosts["trixie"].install(f"/srv/jit-wheels/{wheel.name}", wheel.read_bytes())
    hosts["trixie"].run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                         "--prefix", VENV, *[f"/srv/jit-wheels/{w.name}" for w in made]])
    install_driver(hosts["trixie"], Driver("580.95.05", "13.0", (H100,)))
    install_driver(hosts["bookworm"], Driver("580.95.05", "13.0", (RTX_PRO,)))
    install_driver(hosts["trixie-twin"], Driver("580.95.05", "13.0", (H100,)))
    for name in ("bookworm", "trixie-twin"):
        install_toolkit(hosts[name], kit)
    yield systems
    for name in ("trixie", "bookworm", "trixie-twin"):
        remove_driver(hosts[name])
        remove_toolkit(hosts[name], kit)
        hosts[name].run(["rm", "-rf", VENV, "/srv/jit-wheels"])


def plan_json(systems, tmp_path, target: str, capsys) -> tuple[int, dict]:
    """``transplant plan --json`` from the trixie donor to ``target``: (exit code, plan document)."""
    manifest = tmp_path / f"jit-to-{target}.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: {json.dumps(list(OVERLAY))}
        """))
    code = main(["plan", str(manifest), "--json"])
    return code, json.loads(capsys.readouterr().out)


def too_old(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == "jit-compiler-too-old"]


def test_the_toolkit_stand_in_answers_as_the_real_nvcc(jit):
    assert ssh(jit, "bookworm", "/usr/local/cuda/bin/nvcc --version").splitlines()[3] == \
        "Cuda compilation tools, release 12.8, V12.8.93"


def test_flashinfer_on_a_blackwell_target_with_cuda_12_8_blocks_and_the_twins_h100_is_clean(jit, tmp_path, capsys):
    code, doc = plan_json(jit, tmp_path, "bookworm", capsys)
    [found] = too_old(doc)
    assert found["severity"] == "error" and found["dists"] == ["flashinfer-python"]
    message = found["message"]
    assert "/usr/local/cuda/bin/nvcc (CUDA 12.8, V12.8.93)" in message and "sm_120" in message
    assert "SM 12.x requires CUDA >= 12.9" in message
    # ptxas 12.8 targets sm_120 (12.8 is not listed as too old for it): triton is not blamed
    assert code == 3
    code, twin = plan_json(jit, tmp_path, "trixie-twin", capsys)
    assert not too_old(twin)
    assert not [f for f in twin["findings"] if f["severity"] == "error"], twin["findings"]
    assert code == 0


def test_tritons_bundled_ptxas_is_too_old_for_a_gb10_and_the_twins_h100_is_clean(jit, tmp_path, capsys):
    bookworm = jit.hosts["bookworm"]
    install_driver(bookworm, Driver("580.95.05", "13.0", (GB10,)))
    try:
        _, doc = plan_json(jit, tmp_path, "bookworm", capsys)
    finally:
        install_driver(bookworm, Driver("580.95.05", "13.0", (RTX_PRO,)))
    [ptxas] = [f for f in too_old(doc) if f["dists"] == ["triton"]]
    assert ptxas["severity"] == "error"
    assert f"{PTXAS} (CUDA 12.8, V12.8.93)" in ptxas["message"] and "sm_121" in ptxas["message"]
    assert "arriving with it from the donor" in ptxas["message"]
    _, twin = plan_json(jit, tmp_path, "trixie-twin", capsys)
    assert not too_old(twin)
