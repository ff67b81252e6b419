"""Usage mistakes a new user made (found trying the tool from its README): each is refused with a
clear message and the usage exit code, and nothing runs."""

from __future__ import annotations

import json

import pytest

from transplant.cli.app import main


@pytest.mark.parametrize("jobs", ["0", "-3", "two"])
def test_jobs_must_be_a_whole_number_of_at_least_one(jobs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", str(tmp_path / "m.yaml"), "--jobs", jobs])
    assert exited.value.code == 64
    assert "--jobs: expected a whole number of at least 1" in capsys.readouterr().err


def test_jobs_of_one_or_more_is_taken(tmp_path, capsys):
    # parsing passes; the missing manifest is the next (and only) complaint
    assert main(["plan", str(tmp_path / "m.yaml"), "--jobs", "2"]) == 1
    assert "not found; fix: give the path of an existing manifest" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["history", "rollback"])
def test_history_and_rollback_given_a_venv_that_is_not_there_say_so(command, capsys):
    """They take HOST:VENV (the transactions are recorded in the venv): one that does not exist
    is a clear error naming it, never a manifest complaint or a traceback."""
    assert main([command, "local:/no/such/venv-for-this-test", *(["--yes"] if command == "rollback" else [])]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "local:/no/such/venv-for-this-test: /no/such/venv-for-this-test/bin/python does not exist" in out, out
    assert "manifest" not in out and "Traceback" not in out


def test_a_missing_manifest_path_is_not_taken_for_host_venv(tmp_path, capsys):
    assert main(["history", str(tmp_path / "gone.yaml")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "not found; fix: give the path of an existing manifest" in out and "HOST:VENV" not in out


def test_an_apply_stopped_by_ctrl_c_says_how_to_finish_or_undo(tmp_path, capsys, monkeypatch):
    import transplant.cli.app as app
    import transplant.cli.commands.apply as apply_command

    def interrupted(args, console):  # Ctrl-C while the command runs
        raise KeyboardInterrupt

    monkeypatch.setattr(apply_command, "handle", interrupted)  # what the parser dispatches to, read as it is built
    m = str(tmp_path / "my manifest.yaml")
    assert app.main(["apply", m, "--yes"]) == 130
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("interrupted")
    assert f"transplant apply '{m}' --resume finishes it, --rollback undoes it" in out
    # the same stop during --resume names nothing more to do
    assert app.main(["apply", m, "--resume"]) == 130
    assert capsys.readouterr().out.strip() == "interrupted"


def test_apply_json_with_one_target_is_a_usage_error_before_anything_runs(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {tmp_path / 'donor'}}}\n"
                 f"target: {{host: local, venv: {tmp_path / 'target'}}}\noverlay: [foo]\n")
    assert main(["apply", str(m), "--yes", "--json"]) == 64
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    assert "apply --json prints a fleet's report" in text and f"transplant plan {m} --json" in text
    # standard output carries the error as JSON (as for every --json command), never an empty success
    assert json.loads(captured.out)["schema"] == "transplant.error/1"
    assert not (tmp_path / "target").exists()


def test_a_target_venv_that_is_a_file_is_named_so(tmp_path, capsys):
    (tmp_path / "target").write_text("not a venv\n")
    assert main(["inventory", f"local:{tmp_path / 'target'}"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path / 'target'} (or a folder on the way to" in out and "is a file, not a venv folder" in out
    assert (tmp_path / "target").read_text() == "not a venv\n"
