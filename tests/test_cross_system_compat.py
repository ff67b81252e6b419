"""Which libcuda a venv's processes load, judged between lab hosts whose systems differ.

bookworm's target has a forward-compatibility library (the cuda-compat package's layout:
``/usr/local/cuda-12.8/compat/libcuda.so.570.124.06``, its ``libcuda.so.1`` link and an
ld.so.conf.d entry) ahead of its older kernel module (535); trixie's twin has the same driver
and GPU without it. The same overlay gets another verdict only where the loader finds the compat
library: on a GeForce (which NVIDIA's guide leaves out of forward compatibility) it is an error
and its cuInit answers 804; on a data center GPU it is a warning naming what to verify."""

from __future__ import annotations

import json
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.standins import Driver, Gpu, install_compat, install_driver, remove_compat, remove_driver
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python

pytestmark = pytest.mark.hosts

VENV = "/srv/compat"
RTX4090 = Gpu("NVIDIA GeForce RTX 4090", "8.9", 24564)
H100 = Gpu("NVIDIA H100 80GB HBM3", "9.0", 81559)
#: The kernel module both targets run (CUDA 12.2), and the release the compat package comes from.
MODULE = Driver("535.104.05", "12.2", (RTX4090,))
COMPAT = Driver("570.124.06", "12.8", (RTX4090,))
FOLDER = "/usr/local/cuda-12.8/compat"


@pytest.fixture(scope="module")
def compat(systems, tmp_path_factory):
    """The donor (trixie, driver 580, an H100) with ``nvidia-cuda-runtime`` 12.8 in its venv; empty
    venvs of the same Python on bookworm and trixie's twin, both on driver 535 with an RTX 4090;
    bookworm's with the compat library of 570 (its cuInit refuses the GeForce). Removed afterwards."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    hosts = systems.hosts
    trixie = hosts["trixie"]
    wheels = tmp_path_factory.mktemp("compat-wheels")
    runtime = build_wheel(wheels, "nvidia-cuda-runtime-cu12", "12.8.90",
                          {"nvidia/cuda_runtime/lib/libcudart.so.12": b"\x7fELF stand-in"},
                          tag="cp311-cp311-linux_x86_64")
    python = f"{build}/bin/python3"
    for name in ("trixie", "bookworm", "trixie-twin"):
        hosts[name].run(["rm", "-rf", VENV, "/srv/compat-wheels"])
        hosts[name].run([python, "-m", "venv", "--without-pip", VENV])
    trixie.install(f"/srv/compat-wheels/{runtime.name}", runtime.read_bytes())
    trixie.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                "--prefix", VENV, f"/srv/compat-wheels/{runtime.name}"])
    install_driver(trixie, Driver("580.95.05", "13.0", (H100,)))
    install_driver(hosts["bookworm"], MODULE)
    install_driver(hosts["trixie-twin"], MODULE)
    install_compat(hosts["bookworm"], COMPAT, supported=False)
    yield systems
    remove_compat(hosts["bookworm"], COMPAT.cuda)
    for name in ("trixie", "bookworm", "trixie-twin"):
        remove_driver(hosts[name])
        hosts[name].run(["rm", "-rf", VENV, "/srv/compat-wheels"])


def plan_json(systems, tmp_path, target: str, capsys) -> tuple[int, dict]:
    """``transplant plan --json`` of the CUDA 12.8 runtime from the trixie donor to ``target``."""
    manifest = tmp_path / f"compat-{target}.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: [nvidia-cuda-runtime-cu12]
        """))
    code = main(["plan", str(manifest), "--json"])
    return code, json.loads(capsys.readouterr().out)


def compat_findings(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == "libcuda-compat-mismatch"]


#: What the target's own loader does: the libcuda.so.1 a process of the venv maps, and its cuInit's answer.
LOADED = ("import ctypes; c = ctypes.CDLL('libcuda.so.1'); r = c.cuInit(0); "
          "print([l.split()[-1] for l in open('/proc/self/maps') if 'libcuda' in l][0], r)")


def test_a_compat_libcuda_on_a_geforce_blocks_and_the_twin_without_it_is_clean(compat, tmp_path, capsys):
    bookworm, twin = compat.hosts["bookworm"], compat.hosts["trixie-twin"]
    # the loader's own answer on each host: the compat library first on bookworm, refusing the GeForce
    assert bookworm.run([f"{VENV}/bin/python", "-c", LOADED]).stdout.split() == [
        f"{FOLDER}/libcuda.so.570.124.06".encode(), b"804"]
    assert twin.run([f"{VENV}/bin/python", "-c", LOADED]).stdout.split() == [
        b"/usr/lib/x86_64-linux-gnu/libcuda.so.1", b"0"]
    code, doc = plan_json(compat, tmp_path, "bookworm", capsys)
    [found] = compat_findings(doc)
    assert found["severity"] == "error" and found["dists"] == ["nvidia-cuda-runtime-cu12"] and code == 3
    assert (f"forward-compatibility library 570.124.06 from {FOLDER}/libcuda.so.1 (-> libcuda.so.570.124.06), "
            "found through ld.so.cache, and the kernel module is 535.104.05") in found["message"]
    assert "NVIDIA GeForce RTX 4090 is none of them" in found["message"]
    assert "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804" in found["message"]
    assert found["hint"].startswith(f"on the target: remove the ld.so.conf.d entry naming {FOLDER}")
    _, clean = plan_json(compat, tmp_path, "trixie-twin", capsys)
    assert not compat_findings(clean), clean["findings"]


def test_a_compat_libcuda_on_a_data_center_gpu_is_a_warning_naming_what_to_verify(compat, tmp_path, capsys):
    bookworm = compat.hosts["bookworm"]
    install_driver(bookworm, Driver(MODULE.version, MODULE.cuda, (H100,)))
    try:
        _, doc = plan_json(compat, tmp_path, "bookworm", capsys)
        [found] = compat_findings(doc)
        assert found["severity"] == "warning"
        assert "verify that the target's GPUs (NVIDIA H100 80GB HBM3)" in found["message"]
        assert "kernel driver branch 535 is one the compat package 570.124.06 supports" in found["message"]
    finally:
        install_driver(bookworm, MODULE)
