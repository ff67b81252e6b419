"""The benchmark workload is what the benchmark says it is: the plan between its donor and
target copies exactly the files ``differing_files`` names (the baselines copy that list)."""

from __future__ import annotations

import json
import textwrap

from bench.workload import SITE, build_venv, differing_files, distributions
from transplant.cli.app import main


def test_workload_plan_moves_exactly_the_differing_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    scale = 0.002
    donor = build_venv(tmp_path / "donor", "donor", scale)
    target = build_venv(tmp_path / "target", "target", scale, common=donor)
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {donor}}}
        target: {{host: local, venv: {target}}}
        overlay: [torch, torchvision, triton, sgl-kernel, "nvidia-*"]
        """))
    assert main(["plan", "--detailed-exitcode", str(m), "--json"]) == 2
    plan = json.loads(capsys.readouterr().out)
    copied = sorted(c["path"] for change in plan["changes"] for c in change["copy"])
    paths, total = differing_files(scale)
    assert copied == sorted(f"{SITE}/{p}" for p in paths)
    assert total == sum(c["size"] for change in plan["changes"] for c in change["copy"]
                        if not c["path"].split("/")[-2].endswith(".dist-info"))
    assert len(distributions(1.0)) == 300 and sum(len(d.files) for d in distributions(1.0)) > 55000
