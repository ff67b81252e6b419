"""Console scripts applied to a target venv whose interpreter path cannot be a plain shebang
(a blank in it, or too long): apply writes all three lines of pip's ``#!/bin/sh`` form, the
script runs, and a second plan sees nothing to change. Local venvs from real wheels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv


@pytest.mark.parametrize("name", ["tar get", "t" * 130])
def test_console_script_runs_after_apply_to_a_venv_needing_the_sh_form(tmp_path, monkeypatch, capsys, name):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    tool = build_wheel(tmp_path / "w", "tool", "1.0", {"tool.py": "def main():\n    print('tool ran')\n"},
                       entry_points="[console_scripts]\ntool = tool:main\n")
    donor = make_venv(tmp_path / "donor")
    subprocess.run([sys.executable, "-m", "pip", "--python", f"{donor}/bin/python", "install", "-q", "--no-index",
                    "--no-deps", "--disable-pip-version-check", str(tool)], check=True)  # bin/tool, as pip writes it
    assert (donor / "bin" / "tool").read_text().startswith(f"#!{donor}/bin/python")
    target = make_venv(tmp_path / name)
    assert len(f"{target}/bin/python") > 127 or " " in str(target)
    m = tmp_path / "m.yaml"
    m.write_text(f'version: 1\ndonor: {{host: local, venv: "{donor}"}}\ntarget: {{host: local, venv: "{target}"}}\n'
                 f"overlay: [tool]\n")
    assert main(["apply", str(m), "--yes"]) == 0
    script = (target / "bin" / "tool").read_text()
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and lines[1].startswith("'" * 3 + "exec' ") and lines[2] == "' " + "'" * 3, lines[:3]
    assert f"{donor}" not in script
    ran = subprocess.run([str(target / "bin" / "tool")], capture_output=True, text=True,
                         env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent"})
    assert (ran.returncode, ran.stdout.strip()) == (0, "tool ran"), ran.stderr
    capsys.readouterr()
    assert main(["plan", str(m)]) == 0, capsys.readouterr().out  # 0: nothing left to change
