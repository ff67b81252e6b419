"""How verify judges each stage's report (pure core)."""

from __future__ import annotations

import pytest

from transplant.model import Finding
from transplant.verdicts import (StageResult, expect_matches, judge_imports, judge_requirements, judge_server_args,
                                 judge_smoke, overall_ok)


def test_imports():
    ok = {"imports": [{"name": "torch", "ok": True, "version": "2.13.0+cpu", "file": "/v/torch/__init__.py"}]}
    assert judge_imports(ok) == ("pass", "1 imports: torch 2.13.0+cpu")
    bad = {"imports": ok["imports"] + [{"name": "flashinfer", "ok": False, "error": "ModuleNotFoundError: x"}]}
    assert judge_imports(bad) == ("fail", "1 of 2 imports failed; flashinfer: ModuleNotFoundError: x")
    assert judge_imports({"imports": []})[0] == "skip"


@pytest.mark.parametrize("want,got,ok", [
    ("DFLASH", {"name": "DFLASH", "value": 7}, True),
    ("DFLASH", {"name": None, "value": "DFLASH"}, True),
    ("EAGLE", {"name": "DFLASH", "value": "DFLASH"}, False),
    (16, {"name": None, "value": 16}, True),
    (16, {"name": None, "value": 16.0}, True),
    (16, {"name": None, "value": "16"}, True),
    (16, {"name": None, "value": 15}, False),
    (True, {"name": None, "value": 1}, False),
    (None, {"name": None, "value": None}, True),
    ("x", None, False),
])
def test_expect_matches(want, got, ok):
    assert expect_matches(want, got) is ok


def test_server_args():
    expect = {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16}
    report = {"ok": True, "values": {"speculative_algorithm": {"name": None, "value": "DFLASH", "repr": "'DFLASH'"},
                                     "speculative_num_draft_tokens": {"name": None, "value": 16, "repr": "16"}}}
    assert judge_server_args(expect, report) == ("pass", "parsed; DFLASH 16 (speculative_algorithm, speculative_num_draft_tokens)")
    report["values"]["speculative_num_draft_tokens"]["value"] = 8
    assert judge_server_args(expect, report) == ("fail", "parsed, but speculative_num_draft_tokens=8 (expected 16)")
    rejected = {"ok": False, "error": "sglang serve: error: argument --speculative-algorithm: invalid choice: 'DFLASH'"}
    status, reason = judge_server_args(expect, rejected)
    assert status == "fail" and reason.endswith("invalid choice: 'DFLASH'")


def test_smoke():
    checks = [{"name": "matmul 256x256", "dtype": "float32", "rel_error": 1e-7, "bound": 1e-4, "ok": True}]
    ok = {"ok": True, "device": "cpu", "reason": "ran on cpu", "torch": "2.13.0+cpu", "checks": checks}
    assert judge_smoke(ok) == ("pass", "ran on cpu; torch 2.13.0+cpu; matmul 256x256 float32 1.0e-07 <= 1e-04")
    bad = dict(ok, ok=False, checks=[dict(checks[0], rel_error=0.5, ok=False)])
    assert judge_smoke(bad) == ("fail", "matmul 256x256 float32 on cpu: relative error 5.00e-01 above the bound 1e-04")
    nogpu = {"ok": False, "device": None, "reason": "device cuda asked for, but torch.cuda.is_available() is False", "checks": []}
    assert judge_smoke(nogpu) == ("fail", nogpu["reason"])
    assert judge_smoke(dict(ok, checks=[]))[0] == "fail"


def test_requirements_and_overall():
    err = Finding(code="requirement-unmet", severity="error", dists=("a", "b"), message="a 1 requires b>2, found 1", hint="h")
    warn = Finding(code="requirement-unmet", severity="warning", dists=("c",), message="m", hint="h")
    assert judge_requirements([warn])[0] == "pass"
    assert judge_requirements([err, warn]) == ("fail", "1 distribution(s) with unmet requirements the donor satisfies: a 1 requires b>2, found 1")
    stages = [StageResult(name="x", status="skip", reason="r", seconds=0.0)]
    assert overall_ok(stages)
    assert not overall_ok(stages + [StageResult(name="y", status="fail", reason="r", seconds=1.0)])
    with pytest.raises(ValueError):
        StageResult(name="z", status="passed", reason="r", seconds=0)
