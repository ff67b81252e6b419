"""The compatibility gate end to end: real shared objects built with gcc (and the committed
nvcc fatbin), real wheels installed by pip into venvs on two loopback sshd hosts, a stand-in
nvidia-smi first on the target's PATH, and ``transplant plan --json`` reading it all over SSH
(pyelftools sent to the hosts). Then ``apply`` rewrites a console script's shebang and clears a
stale dist-info folder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel

DONOR, TARGET = "/srv/gate-donor", "/srv/gate-target"
SITE = "lib/python3.11/site-packages"
FATBIN = Path(__file__).parent / "data" / "fatbin" / "libdevice-sm80.so"
NVIDIA_SMI = """\
#!/bin/sh
# stand-in for nvidia-smi: one H100 on driver 535 (CUDA 12.2)
case "$1" in
  --query-gpu=*) echo "NVIDIA H100 80GB HBM3, 9.0, 81559, 535.104.05" ;;
  *) echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |" ;;
esac
"""


def _gcc(out: Path, source: str, *args: str, lang: str = "c") -> bytes:
    src = out.with_suffix(".cpp" if lang == "c++" else ".c")
    src.write_text(source)
    compiler = "g++" if lang == "c++" else "gcc"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    return out.read_bytes()


def _objects(tmp: Path) -> dict[str, bytes]:
    """libc10 for torch 2.6 (foo, bar) and 2.7 (foo only), a kernel needing c10::bar, and an
    object needing GLIBC_2.99 from a stub libc.so.6."""
    out = {}
    for version, body in (("2.6", "int foo() { return 1; } int bar() { return 2; }"), ("2.7", "int foo() { return 1; }")):
        d = tmp / version
        d.mkdir()
        out[f"c10-{version}"] = _gcc(d / "libc10.so", f"namespace c10 {{ {body} }}", "-Wl,-soname,libc10.so",
                                     lang="c++")
    out["kernel"] = _gcc(tmp / "common_ops.so", "namespace c10 { int bar(); }\nint use() { return c10::bar(); }",
                         f"-L{tmp / '2.6'}", "-lc10", lang="c++")
    stub = tmp / "stub"
    stub.mkdir()
    (stub / "v.map").write_text("GLIBC_2.99 { global: transplant_fake; local: *; };\n")
    _gcc(stub / "libc.so.6", "int transplant_fake(void) { return 0; }", "-Wl,-soname,libc.so.6",
         f"-Wl,--version-script={stub / 'v.map'}", "-nostdlib")
    out["newglibc"] = _gcc(tmp / "x.so", "int transplant_fake(void);\nint g(void) { return transplant_fake(); }",
                           f"{stub / 'libc.so.6'}", "-nostdlib")
    return out


@pytest.fixture(scope="module")
def gate(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    so = _objects(tmp)
    wheels = tmp / "wheels"
    torch26 = build_wheel(wheels, "torch", "2.6.0", {"torch/__init__.py": "", "torch/lib/libc10.so": so["c10-2.6"]},
                          tag="cp311-cp311-linux_x86_64")
    torch27 = build_wheel(wheels / "t", "torch", "2.7.0", {"torch/__init__.py": "",
                                                            "torch/lib/libc10.so": so["c10-2.7"]},
                          tag="cp311-cp311-linux_x86_64")
    kernel = build_wheel(wheels, "sgl-kernel", "0.1.0+cu130", {"sgl_kernel/__init__.py": "",
                                                                "sgl_kernel/common_ops.so": so["kernel"],
                                                                "sgl_kernel/device.so": FATBIN.read_bytes()},
                         tag="cp311-cp311-linux_x86_64")
    newglibc = build_wheel(wheels, "newglibc", "1.0", {"newglibc/__init__.py": "", "newglibc/x.so": so["newglibc"]},
                           tag="cp311-cp311-linux_x86_64")
    tool = build_wheel(wheels, "tool", "1.0", {"tool.py": "def main():\n    print('tool ran')\n"},
                       entry_points="[console_scripts]\ntool = tool:main\n")
    python = getattr(sys, "_base_executable", sys.executable)
    for host, venv, wheel_set in ((lab.hosts["donor"], DONOR, [torch26, kernel, newglibc, tool]),
                                  (lab.hosts["target"], TARGET, [torch27])):
        host.run(["rm", "-rf", venv])
        host.run([python, "-m", "venv", "--without-pip", venv])
        host.run([python, "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--no-index", "--no-deps",
                  "--disable-pip-version-check", *map(str, wheel_set)])
    target = lab.hosts["target"]
    stale = target.path(f"{TARGET}/{SITE}/torch-2.5.0.dist-info")
    stale.mkdir()
    (stale / "REQUESTED").write_text("")
    smi = target.path("/srv/bin/nvidia-smi")
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    yield lab
    smi.unlink()


def _manifest(tmp_path: Path, lab, overlay: list[str]) -> str:
    path = tmp_path / "gate.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{lab.hosts['donor'].spec}", venv: {DONOR}}}
        target: {{host: "{lab.hosts['target'].spec}", venv: {TARGET}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}
        overlay: {json.dumps(overlay)}
        """))
    return str(path)


def test_plan_reads_binaries_and_the_driver_over_ssh(gate, tmp_path, capsys):
    m = _manifest(tmp_path, gate, ["sgl-kernel", "newglibc", "tool"])
    assert main(["plan", m, "--json"]) == 3
    findings = json.loads(capsys.readouterr().out)["findings"]
    by = {}
    for f in findings:
        by.setdefault(f["code"], []).append(f)
    [abi] = by["libtorch-abi"]
    assert abi["severity"] == "error" and "_ZN3c103barEv" in abi["message"]
    assert abi["hint"] == f"add 'torch' to overlay in {m} (the donor has torch 2.6.0)"
    [plat] = by["platform-mismatch"]
    assert plat["dists"] == ["newglibc"] and f"{SITE}/newglibc/x.so needs GLIBC_2.99" in plat["message"]
    [arch] = by["gpu-arch-unsupported"]
    assert arch["dists"] == ["sgl-kernel"] and "sm_100f, sm_80" in arch["message"]
    assert arch["files"] == [f"{SITE}/sgl_kernel/device.so"]
    [driver] = by["driver-too-old"]
    assert driver["severity"] == "error" and "driver 535.104.05 supports CUDA 12.2" in driver["message"]
    assert "580.65.06" in driver["hint"]
    [script] = by["script-prefix"]
    assert script["files"] == ["bin/tool"] and script["severity"] == "info"
    [dup] = by["duplicate-dist-info"]
    assert dup["severity"] == "warning" and dup["dists"] == ["torch"]


def test_apply_rewrites_scripts_and_leaves_one_dist_info(gate, tmp_path, capsys):
    target = gate.hosts["target"]
    m = _manifest(tmp_path, gate, ["tool", "torch"])
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    script = target.path(f"{TARGET}/bin/tool").read_text()
    assert script.startswith(f"#!{TARGET}/bin/python\n") and DONOR not in script
    ran = target.run([f"{TARGET}/bin/tool"])
    assert ran.stdout.strip() == b"tool ran"
    from inventory_docs import digest  # its RECORD row names the file as written

    row = f"../../../bin/tool,{digest(script)},{len(script.encode())}"
    assert row in target.path(f"{TARGET}/{SITE}/tool-1.0.dist-info/RECORD").read_text().splitlines()
    infos = sorted(p.name for p in target.path(f"{TARGET}/{SITE}").iterdir() if p.name.startswith("torch-"))
    assert infos == ["torch-2.6.0.dist-info"]
    # idempotent: the second plan changes nothing
    assert main(["plan", m]) == 0


def test_case1_target_home_missing_over_ssh(gate, tmp_path, capsys):
    cfg = gate.hosts["target"].path(f"{TARGET}/pyvenv.cfg")
    original = cfg.read_text()
    cfg.write_text("".join("home = /nonexistent/bin\n" if line.startswith("home") else line
                           for line in original.splitlines(keepends=True)))
    try:
        assert main(["plan", _manifest(tmp_path, gate, ["tool"]), "--json"]) == 3
        [f] = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["code"] == "interpreter-missing"]
        assert f["severity"] == "error" and "home = /nonexistent/bin, which does not exist" in f["message"]
    finally:
        cfg.write_text(original)


def test_target_python_pointing_to_nothing_is_interpreter_missing(gate, tmp_path, capsys):
    target = gate.hosts["target"]
    broken = "/srv/gate-broken"
    target.run(["rm", "-rf", broken])
    target.run(["mkdir", "-p", f"{broken}/bin"])
    target.run(["ln", "-s", "/nonexistent/python3.11", f"{broken}/bin/python"])
    path = tmp_path / "broken.yaml"
    path.write_text(Path(_manifest(tmp_path, gate, ["tool"])).read_text().replace(TARGET, broken))
    assert main(["plan", str(path), "--json"]) == 1
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert error["code"] == "interpreter-missing" and "points to nothing" in error["error"]
    assert "venv --upgrade /srv/gate-broken" in error["hint"]


def test_no_code_of_the_venvs_runs_during_plan(gate, tmp_path, capsys):
    """A .pth file is code Python's site runs at startup; the probe, the ELF reader and the applier
    run with -I -S, so a donor's (or target's) .pth never runs and nothing is written there."""
    donor = gate.hosts["donor"]
    pth = donor.path(f"{DONOR}/{SITE}/zz-evil.pth")
    pth.write_text("import os; open('/srv/pwned', 'w').write('ran')\n")
    try:
        assert main(["plan", _manifest(tmp_path, gate, ["tool"]), "--json"]) in (0, 2)
        capsys.readouterr()
        assert not donor.path("/srv/pwned").exists()
    finally:
        pth.unlink()
