"""The README's quick start, run line by line as a tool user would, against two local venvs (a
donor with sglang 0.5.23, a target with sglang 0.5.9: pure-Python stand-ins for the stack's
names, real wheels and venvs): every line ends green, ``verify --strict`` included."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from transplant.lab.wheels import build_wheel, make_venv

ROOT = Path(__file__).resolve().parent.parent


def quick_start() -> list[str]:
    """The ``transplant`` lines of the README's quick start block, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("transplant ")]


def test_the_readme_quick_start_ends_green(tmp_path):
    lines = quick_start()
    assert [shlex.split(line)[1] for line in lines] == ["init", "plan", "apply", "verify"], lines
    new = build_wheel(tmp_path / "w", "sglang", "0.5.23", {"sglang/__init__.py": "__version__ = '0.5.23'\n"})
    old = build_wheel(tmp_path / "o", "sglang", "0.5.9", {"sglang/__init__.py": "__version__ = '0.5.9'\n"})
    donor, target = make_venv(tmp_path / "donor", [new]), make_venv(tmp_path / "target", [old])
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80"}
    for line in lines:
        argv = shlex.split(line.replace("root@old-gpu:/root/venv", f"local:{donor}")
                           .replace("root@new-gpu:/root/venv", f"local:{target}"))
        argv = [str(tmp_path / a) if a == "m.yaml" else a for a in argv]
        if argv[1] == "apply":
            argv.append("--yes")  # off a terminal apply asks nothing; the README's user answers the prompt
        done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-2000:])
    said = " ".join(done.stdout.split())
    assert re.search(r"verify passed \(--strict\): \d+ passed, 0 failed", said), said
    assert (target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "sglang"
            / "__init__.py").read_text() == "__version__ = '0.5.23'\n"
