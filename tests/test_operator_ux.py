"""Operator-facing defects: the gate's exit code with nothing to copy, usage exit codes, wording of
errors and messages (local venvs from real wheels; state folders inside tmp_path)."""

from __future__ import annotations

import textwrap

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A local donor (foo 2.0) and target (foo 1.0), a manifest maker; the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    new = build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n", "foo/extra.py": "E = 1\n"})
    old = build_wheel(wheels, "foo", "1.0", {"foo/__init__.py": "V = 1\n", "foo/gone.py": "G = 1\n"})
    make_venv(tmp_path / "donor", [new])
    make_venv(tmp_path / "target", [old])

    def manifest(name: str = "m.yaml", overlay: str = "[foo]", extra: str = ""):
        m = tmp_path / name
        m.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {tmp_path / 'donor'}}}
            target: {{host: local, venv: {tmp_path / 'target'}}}
            overlay: {overlay}
            """) + extra)
        return m

    return tmp_path, manifest


def flat(text: str) -> str:
    return " ".join(text.split())


def test_apply_with_an_error_finding_and_nothing_to_copy_is_blocked(pair, capsys):
    tmp_path, manifest = pair
    assert main(["apply", str(manifest()), "--yes"]) == 0  # the target now holds foo 2.0
    capsys.readouterr()
    # an exact overlay name the donor lacks is an error finding; nothing is left to copy
    bad = manifest("bad.yaml", overlay="[foo, nosuchpkg]")
    assert main(["plan", str(bad)]) == 3
    capsys.readouterr()
    assert main(["apply", str(bad), "--yes"]) == 3
    out = flat(capsys.readouterr().out)
    assert "overlay-no-match" in out and "apply refused" in out and "nothing would be copied" in out
    assert "nothing to change" not in out
    # forced, or accepted in the manifest: nothing to change, exit 0
    assert main(["apply", str(bad), "--yes", "--force"]) == 0
    assert "nothing to change" in capsys.readouterr().out
    accepted = manifest("accepted.yaml", overlay="[foo, nosuchpkg]",
                        extra="accept: [{code: overlay-no-match, reason: not on this donor}]\n")
    assert main(["apply", str(accepted), "--yes"]) == 0
    # the fault-free twin: nothing to change and no finding
    assert main(["apply", str(manifest()), "--yes"]) == 0
    assert "nothing to change" in capsys.readouterr().out
