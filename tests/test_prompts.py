"""The [y/N] questions: shown whole (rich must not take ``[y/N]`` for markup), and end of input
(Ctrl-D at a terminal) is a "no" that changes nothing, without a traceback."""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path


from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv


class _Terminal(io.StringIO):
    """Standard input of a terminal where the person pressed Ctrl-D (end of input)."""

    def isatty(self) -> bool:
        return True


def test_apply_question_shows_y_n_and_end_of_input_is_a_no(tmp_path: Path, capsys, monkeypatch) -> None:
    wheels = tmp_path / "wheels"
    donor = make_venv(tmp_path / "donor", [build_wheel(wheels / "2", "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})])
    target = make_venv(tmp_path / "target", [build_wheel(wheels / "1", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})])
    manifest = tmp_path / "m.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {donor}}}
        target: {{host: local, venv: {target}}}
        overlay: [alpha]
        """))
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr(sys, "stdin", _Terminal(""))
    code = main(["apply", str(manifest)])
    screen = " ".join(capsys.readouterr().out.split())
    assert "apply these changes to local:" in screen and "? [y/N]" in screen
    assert "no answer (end of input): nothing was changed" in screen and code == 1
    assert next(target.glob("lib/python*/site-packages/alpha/__init__.py")).read_text() == "V = 1\n"
