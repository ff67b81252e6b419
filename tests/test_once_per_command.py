"""Host facts asked once per command: the donor-is-not-the-target identity check runs
its host script once per venv in an apply, although the command checks it before the plan and the
plan's gathering checks it again. Counted for real by the identity script's own log
(``TRANSPLANT_TEST_SCRIPT_LOG``), on local venvs built from real wheels."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from transplant.hosts.host import LocalHost
from transplant.lab.wheels import build_wheel, make_venv
from transplant.pipeline.gather import venv_identity

ROOT = Path(__file__).resolve().parent.parent


def _venvs(base: Path) -> tuple[Path, Path]:
    new = build_wheel(base / "wheels", "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})
    old = build_wheel(base / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    return make_venv(base / "donor", [new]), make_venv(base / "target", [old])


def test_an_apply_asks_each_venv_identity_once(tmp_path, monkeypatch):
    donor, target = _venvs(tmp_path)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {donor}}}
        target: {{host: local, venv: {target}}}
        overlay: [alpha]
        """))
    log = tmp_path / "script.log"
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(tmp_path / "state"), "TRANSPLANT_TEST_SCRIPT_LOG": str(log),
           "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "transplant", "apply", str(manifest), "--yes"], cwd=ROOT, env=env,
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    asked = sorted(line for line in log.read_text().splitlines() if line.startswith("identity "))
    assert asked == sorted([f"identity {donor}", f"identity {target}"]), asked
    assert (target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "alpha"
            / "__init__.py").read_text() == "V = 2\n"


def test_a_host_remembers_the_identity_for_its_connection_only(tmp_path, monkeypatch):
    donor, target = _venvs(tmp_path)
    log = tmp_path / "script.log"
    monkeypatch.setenv("TRANSPLANT_TEST_SCRIPT_LOG", str(log))
    host = LocalHost()
    first = venv_identity(host, str(donor))
    assert first is not None and first == venv_identity(host, str(donor))
    assert venv_identity(host, str(target)) not in (None, first)  # another venv is asked, and differs
    assert log.read_text().splitlines() == [f"identity {donor}", f"identity {target}"]
    assert venv_identity(LocalHost(), str(donor)) == first  # a new connection asks again: the same answer
    assert len(log.read_text().splitlines()) == 3
