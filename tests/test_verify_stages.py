"""The verify stage table (:mod:`transplant.core.verify_stages`): consistent with the host scripts
and the judges, and the one place a stage is declared: a toy row added to it runs in the ladder
(a real bare venv on this machine, its host script answered in the test), and is named in the
results, the JSON and JUnit reports, the progress count and ``verify.required``."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from transplant import remote
from transplant.cli.render import verify_json, verify_junit
from transplant.core import verify_stages
from transplant.core.manifest import REQUIRABLE_STAGES, VerifySettings, parse_manifest
from transplant.core.verify_stages import GROUPS, STAGES, Request, Stage
from transplant.errors import ManifestError
from transplant.hosts.host import LocalHost
from transplant.lab.wheels import make_venv
from transplant.reporting import RecordingReporter
from transplant.verify import judges, runner
from transplant.verify.runner import judge_of, run_stages

TOY = Stage("toy", "stage_toy", "judge_toy", "parallel", request=lambda s: Request(("--answer", "42"), {"n": 1}),
            requirable=True)


def test_names_are_unique_and_in_known_groups():
    names = [row.name for row in STAGES]
    assert len(names) == len(set(names)) == 10
    assert all(row.group in GROUPS for row in STAGES)
    assert [row.group for row in STAGES][0] == "first"


def test_every_row_names_an_existing_script_and_a_judge_function():
    for row in STAGES:
        assert row.script is None or row.script in remote.STAGE_SCRIPTS, row
        assert callable(judge_of(row)), row
    scripts = {row.script for row in STAGES if row.script}
    assert scripts == set(remote.STAGE_SCRIPTS)  # no stage script without its row


def test_needs_name_earlier_stages():
    seen: set[str] = set()
    for row in STAGES:
        assert set(row.needs) <= seen, row
        seen.add(row.name)


def test_the_runner_and_the_manifest_read_the_table():
    assert runner.STAGES == verify_stages.names() == tuple(row.name for row in STAGES)
    assert REQUIRABLE_STAGES == ("imports", "native-load", "server-args", "smoke") == verify_stages.requirable()
    assert set(runner.GROUP) < {row.name for row in STAGES if row.group == "parallel"}


def test_a_judge_named_but_absent_is_an_error():
    with pytest.raises(AttributeError):
        judge_of(TOY)


def test_stage_scripts_are_found_in_the_package(tmp_path, monkeypatch):
    package = Path(remote.__file__).parent
    on_disk = sorted(p.stem for p in package.glob("stage_*.py"))
    assert list(remote.STAGE_SCRIPTS) == on_disk and set(on_disk) <= set(remote.SCRIPTS)
    assert set(remote.WATCHED) == {"probe", *on_disk} - set(remote.OWN_WATCH)
    assert "stage_toy" not in remote.STAGE_SCRIPTS
    for name in [*on_disk, "_common.py"]:
        (tmp_path / (name if name.endswith(".py") else f"{name}.py")).write_text("")
    (tmp_path / "stage_toy.py").write_text("print('{}')\n")
    monkeypatch.setattr(remote.resources, "files", lambda _package: tmp_path)
    assert "stage_toy" in remote._stage_scripts()


def _manifest(required: list[str]) -> dict:
    return {"version": 1, "donor": {"host": "local", "venv": "/d"}, "target": {"host": "local", "venv": "/t"},
            "overlay": ["torch"], "verify": {"required": required}}


def test_verify_required_refuses_a_stage_not_in_the_table():
    with pytest.raises(ManifestError) as info:
        parse_manifest(_manifest(["toy"]), path="m.yaml")
    assert "imports, native-load, server-args, smoke" in str(info.value.problems)


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> str:
    return str(make_venv(tmp_path_factory.mktemp("stages") / "venv"))


def _run(bare: str, tmp_path: Path, reporter: RecordingReporter) -> list:
    env = {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    return run_stages(VerifySettings(env=env, timeout=120), target=LocalHost(), venv=bare, reporter=reporter)


def test_without_the_toy_row_no_toy_stage_runs(bare, tmp_path):
    recorded = RecordingReporter()
    results = _run(bare, tmp_path, recorded)
    assert [r.name for r in results] == [n for n in runner.STAGES if n != "server-args-resolve"]
    assert "toy" not in recorded.steps() and recorded.events[-1] == ("progress", 9, 9)
    assert "toy" not in [s["name"] for s in json.loads(verify_json(results, "local"))["stages"]]


def test_a_toy_row_runs_and_is_named_everywhere(bare, tmp_path, monkeypatch):
    monkeypatch.setattr(verify_stages, "STAGES", (*STAGES, TOY))
    monkeypatch.setattr(judges, "judge_toy", lambda report: ("pass", f"the answer is {report['answer']}"),
                        raising=False)
    asked = []
    real = runner.run_script

    def run_script(host, venv, script, args=(), **kwargs):
        if script != "stage_toy":
            return real(host, venv, script, args, **kwargs)
        asked.append((list(args), kwargs["request"], kwargs["timeout"]))
        return {"answer": args[-1]}

    monkeypatch.setattr(runner, "run_script", run_script)
    recorded = RecordingReporter()
    results = _run(bare, tmp_path, recorded)

    assert [r.name for r in results] == [*[n for n in runner.STAGES if n != "server-args-resolve"], "toy"]
    toy = results[-1]
    assert (toy.status, toy.reason, dict(toy.details)) == ("pass", "the answer is 42", {"answer": "42"})
    assert asked == [(["--answer", "42"], {"n": 1}, 120)]
    assert "toy" in recorded.steps() and recorded.events[-1] == ("progress", 10, 10)
    assert [s["name"] for s in json.loads(verify_json(results, "local"))["stages"]][-1] == "toy"
    cases = ElementTree.fromstring(verify_junit(results, "local")).iter("testcase")
    assert [c.get("name") for c in cases][-1] == "toy"
    # the manifest's verify.required accepts it, as it accepts the ladder's own requirable stages
    assert parse_manifest(_manifest(["toy", "imports"]), path="m.yaml").verify.required == ("toy", "imports")


def test_a_toy_row_not_asked_for_by_the_settings_is_a_not_requested_skip(bare, tmp_path, monkeypatch):
    row = Stage("toy", "stage_toy", "judge_toy", "serial", request=lambda s: None, setting="toy", what="toy check")
    monkeypatch.setattr(verify_stages, "STAGES", (*STAGES, row))
    results = _run(bare, tmp_path, RecordingReporter())
    toy = results[-1]
    assert (toy.name, toy.status, toy.cause, toy.reason) == ("toy", "skip", "not-requested",
                                                             "no verify.toy in the manifest")
