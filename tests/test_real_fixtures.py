"""The gate on the real seed stacks, from the facts recorded from them (``scripts/real-stacks
--record``; see :mod:`transplant.lab.realstacks`): the pure planner runs on the real
inventories and ELF reports of sglang 0.5.23 (torch 2.14.1, CUDA 13) and sglang 0.5.9
(torch 2.9.1+cu128) in seconds. Each plan is held against a golden summary, and
``tests/golden/REAL-REVIEW.md`` says, error by error, why each one is true.

Regenerate the goldens after a deliberate change with ``TRANSPLANT_REGOLD=1``."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from transplant.lab.realstacks import load
from transplant.core.planner import plan

DATA = Path(__file__).parent / "data" / "real"
GOLDEN = Path(__file__).parent / "golden"


def summary(result) -> dict:
    """What a reviewer reads of a plan: each change's action and counts, every finding whole."""
    return {
        "changes": [{"name": c.name, "action": c.action, "from": c.from_version, "to": c.to_version,
                     "copy": len(c.copy), "remove": len(c.remove), "bytes": c.bytes} for c in result.changes],
        "findings": [{"code": f.code, "severity": f.severity, "dists": list(f.dists), "message": f.message,
                      "hint": f.hint, "files": list(f.files)} for f in result.findings],
    }


@functools.cache
def planned(name: str):
    """The plan of one recorded scenario (made once per test session)."""
    recorded = load(DATA / f"{name}.json.gz")
    return plan(recorded.manifest, recorded.donor, recorded.target, donor_elf=recorded.donor_elf,
                target_elf=recorded.target_elf)


@pytest.fixture(params=["forward", "reverse", "after-apply"])
def scenario(request):
    return request.param, planned(request.param)


def test_plan_matches_the_reviewed_golden(scenario):
    name, result = scenario
    got = json.loads(json.dumps(summary(result)))
    path = GOLDEN / f"real-{name}.json"
    if os.environ.get("TRANSPLANT_REGOLD"):
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def _codes(result, severity):
    return sorted({f.code for f in result.findings if f.severity == severity})


def test_no_error_of_the_false_kinds(scenario):
    """The first round's false errors on this pair: the donor's own mixed CUDA library, the
    invented torchaudio pairs, byte-identical libtorch add-ons, AArch64 stubs, the cpython-310
    module the donor itself carries."""
    name, result = scenario
    errors = [f for f in result.findings if f.severity == "error"]
    assert not [f for f in errors if f.code in ("platform-mismatch", "python-abi-mismatch")]
    # torch 2.14.1 with torchaudio 2.11.0 is the pair sglang 0.5.23 pins and the donor runs; the reverse
    # plan's torch 2.9.1 with torchaudio 2.11.0 stays an error (PyTorch's release matrix pairs 2.9 with 2.9)
    assert not [f for f in errors if f.code == "cuda-variant-mismatch" and "torch 2.14.1" in f.message]
    assert not [f for f in errors if f.code == "libtorch-abi" and "torch-c-dlpack-ext" in f.dists]
    if name != "reverse":  # there the 0.5.23 stack is the target, and CUDA 12 the anchor major
        assert not [f for f in errors if f.code == "cuda-major-mismatch" and "nvidia-cutlass-dsl-libs-cu12 4.8.0 (" in
                    f.message]
    assert not [f for f in result.findings if "torchaudio==2.1" in f.hint]


def test_forward_names_the_renamed_kernel_package():
    result = planned("forward")
    [f] = [f for f in result.findings if f.code == "file-owner-conflict" and f.severity == "error"]
    assert f.dists == ("sgl-kernel", "sglang-kernel") and result.refused == (f,)
    assert "sgl_kernel" in f.message and f.hint.startswith("add 'sgl-kernel' to remove:")


def test_after_apply_no_error_and_no_drift():
    """Applied with the plan's own hints, the re-plan has nothing left to change, no error and
    no record-drift (apply writes the RECORD rows of the scripts it relocates)."""
    result = planned("after-apply")
    assert _codes(result, "error") == []
    assert not [f for f in result.findings if f.code == "record-drift"]
    assert not result.has_changes


def test_closure_of_sglang_reproduces_the_calibrated_overlay():
    """The overlay a person reached by following the forward plan's hints for five rounds is the
    story's names plus sglang 0.5.23's closure: computed, it is exactly that set."""
    from transplant.core.closure import closure
    from transplant.lab.realstacks import CALIBRATED_OVERLAY, OVERLAY
    from transplant.core.planner import selected_names

    recorded = load(DATA / "forward.json.gz")
    donor, target = recorded.donor, recorded.target
    found = closure(["sglang"], donor.latest(), target.latest(), target.interpreter.markers,
                    overlay=[n for n in OVERLAY if n != "sglang"])
    got = set(found.names) | set(selected_names(OVERLAY, donor))
    assert got == set(selected_names(CALIBRATED_OVERLAY, donor))
    assert found.unmet == ()
    pulled = {p.name: p for p in found.pulled}
    assert pulled["transformers"].needed_by == "sglang 0.5.23 -> transformers==5.19.0"
    # the closure alone (no story names) brings the same set, but nvidia-ml-py and torchvision, which
    # the target has at versions sglang accepts: the story's nvidia-* glob brings the first, and
    # init adds torchvision from the plan's cuda-variant-mismatch hint (its pair with the new torch)
    alone = closure(["sglang"], donor.latest(), target.latest(), target.interpreter.markers)
    assert set(selected_names(CALIBRATED_OVERLAY, donor)) - set(alone.names) == {"nvidia-ml-py", "torchvision"}


def test_init_draft_on_the_real_pair_is_the_calibrated_manifest():
    """init's draft from the recorded facts: sglang's closure, torchvision (its pair with the new
    torch), and the calibrated remove: list, with no error left that the donor satisfies."""
    from transplant.core.starting_manifest import draft
    from transplant.lab.realstacks import CALIBRATED_REMOVE
    from transplant.core.manifest import parse_manifest
    from transplant.core.planner import selected_names

    recorded = load(DATA / "forward.json.gz")
    d = draft(recorded.donor, recorded.target, ["sglang"], donor_at={"host": "local", "venv": "/d"},
              target_at={"host": "local", "venv": "/t"}, path="init.yaml", donor_elf=recorded.donor_elf,
              target_elf=recorded.target_elf)
    assert d.data["overlay"] == [{"closure": "sglang"}, {"closure": "torchvision"}]
    m = parse_manifest(d.data, path="init.yaml")
    assert set(selected_names(m.remove, recorded.target)) == set(selected_names(CALIBRATED_REMOVE, recorded.target))
    assert [f for f in d.findings if f.severity == "error"] == []
    assert d.data["verify"]["server_args"]["args"][3] == "DFLASH"
    assert {"sglang", "torch", "flashinfer", "sgl_kernel", "transformers"} <= set(d.data["verify"]["imports"])
    assert d.data["verify"]["smoke"] == {"device": "auto"}  # torch arrives: its smoke pass is proposed


def test_the_seed_manifest_with_closures_plans_clean_on_the_real_pair():
    """manifests/seed-migration.yaml (a closure and torchvision) on the recorded forward facts:
    the calibrated overlay (but nvidia-ml-py, which the target has at a version sglang accepts)
    and no error finding, the requirement errors of the story's first plan included."""
    import dataclasses

    import yaml

    from transplant.lab.realstacks import CALIBRATED_OVERLAY
    from transplant.core.manifest import parse_manifest
    from transplant.core.planner import selected_names

    path = Path(__file__).parent.parent / "manifests" / "seed-migration.yaml"
    recorded = load(DATA / "forward.json.gz")
    manifest = dataclasses.replace(parse_manifest(yaml.safe_load(path.read_text()), path=str(path)), patches=())
    assert manifest.closures == ("sglang",)
    result = plan(manifest, recorded.donor, recorded.target, donor_elf=recorded.donor_elf,
                  target_elf=recorded.target_elf)
    moved = {c.name for c in result.changes if c.kind == "distribution" and c.action != "remove"}
    assert moved == set(selected_names(CALIBRATED_OVERLAY, recorded.donor)) - {"nvidia-ml-py"}
    assert [(f.code, f.dists) for f in result.findings if f.severity == "error"] == []


@pytest.mark.parametrize("name", ["forward", "reverse", "after-apply"])
def test_an_older_glibc_on_the_target_adds_no_error_to_faults_inside_the_venv(name):
    """The donor on trixie (glibc 2.41), the target on bookworm (2.36), the same Python build on
    both: the donor's own cu12 leftovers, libtorch add-ons and cpython-310 module do not depend on
    glibc, so the verdicts are those of the pair on one system (every object of these stacks needs
    glibc 2.35 at most, so the platform rule finds nothing new either)."""
    import dataclasses

    recorded = load(DATA / f"{name}.json.gz")

    def on(inventory, glibc):
        return dataclasses.replace(inventory, interpreter=dataclasses.replace(inventory.interpreter, glibc=glibc))

    apart = plan(recorded.manifest, on(recorded.donor, "2.41"), on(recorded.target, "2.36"),
                 donor_elf=recorded.donor_elf, target_elf=recorded.target_elf)
    verdicts = sorted((f.code, f.severity, f.dists) for f in apart.findings)
    assert verdicts == sorted((f.code, f.severity, f.dists) for f in planned(name).findings)
    assert any(f.severity == "info" and "does not change with the host's system" in f.message for f in apart.findings)
    # and on a target whose glibc lacks what the donor's objects need, the platform rule does see it
    older = plan(recorded.manifest, on(recorded.donor, "2.41"), on(recorded.target, "2.17"),
                 donor_elf=recorded.donor_elf, target_elf=recorded.target_elf)
    assert [f for f in older.findings if f.code == "platform-mismatch" and f.severity in ("error", "warning")]
