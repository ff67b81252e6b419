"""``apply --verify`` whose verify fails offers the way back: ``--rollback-on-failure`` takes it
unattended (one target and a fleet), and without it the rollback command is named. Real local
venvs built from wheels; the failure is a requirement the donor satisfies and the target,
forced past the plan's error, does not."""

from __future__ import annotations

import json
import textwrap

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv


@pytest.fixture()
def pair(tmp_path):
    """The donor: alpha 1.1 and beta 2.0 (needs alpha>=1.1); two targets holding alpha 1.0."""
    w = tmp_path / "wheels"
    alpha11 = build_wheel(w / "new", "alpha", "1.1", {"alpha/__init__.py": ""})
    alpha10 = build_wheel(w / "old", "alpha", "1.0", {"alpha/__init__.py": ""})
    beta = build_wheel(w / "new", "beta", "2.0", {"beta/__init__.py": "import alpha\n"}, requires=("alpha>=1.1",))
    donor = make_venv(tmp_path / "donor", [alpha11, beta])
    targets = [make_venv(tmp_path / f"target{i}", [alpha10]) for i in (1, 2)]
    return donor, targets, tmp_path


def write_manifest(tmp_path, donor, targets) -> str:
    listed = ", ".join(f"{{host: local, venv: {t}}}" for t in targets)
    key = f"target: {{host: local, venv: {targets[0]}}}" if len(targets) == 1 else f"targets: [{listed}]"
    path = tmp_path / f"m{len(targets)}.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {donor}}}
        {key}
        overlay: [beta]
        verify: {{imports: [beta]}}
        """))
    return str(path)


def names(venv) -> set[str]:
    return {p.name.split("-")[0] for p in venv.glob("lib/python*/site-packages/*.dist-info")}


def test_a_failed_verify_rolls_the_transaction_back_when_asked(pair, capsys):
    donor, targets, tmp = pair
    m = write_manifest(tmp, donor, targets[:1])
    assert main(["apply", m, "--yes", "--force", "--verify", "--rollback-on-failure"]) == 3
    out = capsys.readouterr().out
    assert "verify failed: " in out and "unmet requirements the donor satisfies" in out
    assert "rolling it back (--rollback-on-failure)" in out and "rolled back " in out
    assert names(targets[0]) == {"alpha"}  # beta gone again: the state before the transaction


def test_without_the_option_the_rollback_command_is_named_and_nothing_is_undone(pair, capsys):
    donor, targets, tmp = pair
    m = write_manifest(tmp, donor, targets[:1])
    assert main(["apply", m, "--yes", "--force", "--verify"]) == 3
    out = capsys.readouterr().out
    assert f"; to undo it: transplant rollback {m} --yes" in " ".join(out.split())
    assert names(targets[0]) == {"alpha", "beta"}


def test_a_fleet_rolls_back_each_target_whose_verify_failed(pair, capsys):
    donor, targets, tmp = pair
    m = write_manifest(tmp, donor, targets)
    assert main(["apply", m, "--yes", "--force", "--verify", "--rollback-on-failure", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    notes = [t.get("note", "") for t in report["targets"]]
    assert all(n.startswith("verify failed: rolled back ") for n in notes), report["targets"]
    assert [names(t) for t in targets] == [{"alpha"}, {"alpha"}]
