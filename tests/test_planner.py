"""Pure-core tests of the planner: plain data in, plan out (golden JSON for the seed story)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inventory_docs import SITE, digest, dist, document
from transplant.core.inventory import parse_inventory
from transplant.core.manifest import parse_manifest
from transplant.core.plan import plan_from_dict
from transplant.core.planner import PatchFile, plan

GOLDEN = Path(__file__).parent / "golden"
DONOR, TARGET = "/root/venv_sglang", "/root/venv_sglang"


def manifest(overlay, **extra):
    data = {"version": 1, "donor": {"host": "root@ct129", "venv": DONOR},
            "target": {"host": "root@ct200", "venv": TARGET}, "overlay": overlay, **extra}
    return parse_manifest(data, path="seed.yaml")


def inv(dists, label, **kw):
    return parse_inventory(document(kw.pop("prefix", DONOR), dists, **kw), label=label)


def torch(version, marker):
    return dist("torch", version, {"torch/__init__.py": f"torch {marker}", "torch/lib/libtorch.so": f"lib {marker}",
                                   "torch/version.py": f"__version__ = '{version}'"})


def seed_inventories():
    """The story: the donor (ct129) has the DFLASH sglang on CUDA 13; the target (ct200) the registry's on 12.8."""
    donor = inv([
        torch("2.11.0+cu130", "cu130"),
        dist("sglang", "0.5.23", {"sglang/__init__.py": "v23", "sglang/srt/server_args.py": "dflash",
                                  "sglang/srt/speculative/dflash_worker.py": "worker"},
             requires=["flashinfer_python==0.7.2", "torch==2.11.0", "sglang-kernel==0.4.10"]),
        dist("sglang-kernel", "0.4.10+cu130", {"sgl_kernel/__init__.py": "k", "sgl_kernel/common_ops.so": "cu130"}),
        dist("flashinfer-python", "0.7.2", {"flashinfer/__init__.py": "fi 0.7.2", "flashinfer/mm_mxfp8.py": "mx"}),
        dist("nvidia-cuda-runtime", "13.0.96", {"nvidia/__init__.py": "", "nvidia/cu13/lib/libcudart.so.13": "rt13"}),
        dist("numpy", "2.3.0", {"numpy/__init__.py": "np"}),
    ], "root@ct129:/root/venv_sglang", hostname="ct129")
    target = inv([
        torch("2.11.0+cu128", "cu128"),
        dist("sglang", "0.5.9", {"sglang/__init__.py": "v9", "sglang/srt/server_args.py": "no dflash",
                                 "sglang/srt/old_module.py": "old"},
             requires=["flashinfer_python==0.6.3", "torch==2.11.0"]),
        dist("flashinfer-python", "0.6.3", {"flashinfer/__init__.py": "fi 0.6.3"}),
        dist("nvidia-cuda-runtime-cu12", "12.8.90", {"nvidia/__init__.py": "", "nvidia/cuda_runtime/lib/libcudart.so.12": "rt12"}),
        dist("numpy", "2.3.0", {"numpy/__init__.py": "np"}, hashed=False),
    ], "root@ct200:/root/venv_sglang", prefix=TARGET, hostname="ct200",
       files={f"{SITE}/sglang/srt/speculative/ddtree_utils.py": {"venv_path": f"{SITE}/sglang/srt/speculative/ddtree_utils.py", "exists": False}})
    return donor, target


PATCH = PatchFile(local="patches/ddtree/ddtree_utils.py", dest="sglang/srt/speculative/ddtree_utils.py",
                  hash=digest("tree"), size=4)


def test_seed_plan_matches_golden():
    donor, target = seed_inventories()
    result = plan(manifest(["torch", "nvidia-*", "sglang-kernel", "sglang"]), donor, target, [PATCH])
    got = json.loads(json.dumps(result.to_dict(), sort_keys=True))
    path = GOLDEN / "seed-plan.json"
    if os.environ.get("TRANSPLANT_REGOLD"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())
    assert plan_from_dict(got, source="golden") == result


def test_seed_plan_finds_flashinfer_before_anything_moves():
    donor, target = seed_inventories()
    result = plan(manifest(["torch", "nvidia-*", "sglang-kernel", "sglang"]), donor, target, [PATCH])
    errors = [f for f in result.findings if f.severity == "error"]
    # the flashinfer pin, the split sglang family, and the target's leftover CUDA 12 runtime
    assert [f.code for f in errors] == ["cuda-major-mismatch", "lockstep-mismatch", "requirement-unmet"]
    unmet = errors[2]
    assert unmet.dists == ("sglang", "flashinfer-python")
    assert unmet.message == "sglang 0.5.23 requires flashinfer_python==0.7.2, found 0.6.3"
    assert unmet.hint == "add 'flashinfer-python' to overlay (the donor has 0.7.2)"
    assert errors[1].hint == "add flashinfer-python to overlay in seed.yaml"
    assert errors[0].hint == ("add to remove: in seed.yaml: [nvidia-cuda-runtime-cu12] "
                              "(a CUDA 13 environment does not load it, and the donor runs without it)")
    assert result.blocking == tuple(errors)


def test_seed_plan_actions_and_files():
    donor, target = seed_inventories()
    result = plan(manifest(["torch", "nvidia-*", "sglang-kernel", "sglang", "flashinfer-python"],
                           remove=["nvidia-cuda-runtime-cu12"]), donor, target, [PATCH])
    by = {c.name: c for c in result.changes}
    assert by["torch"].action == "rebuild"
    assert by["torch"].reason == "same version, other CUDA build: CUDA 12.8 -> CUDA 13.0"
    assert by["sglang"].action == "upgrade" and by["flashinfer-python"].action == "upgrade"
    assert by["sglang-kernel"].action == "add" and by["nvidia-cuda-runtime"].action == "add"
    # only differing files move: nvidia/__init__.py is identical on both sides
    nvidia_copies = {c.path for c in by["nvidia-cuda-runtime"].copy}
    assert f"{SITE}/nvidia/__init__.py" not in nvidia_copies
    assert f"{SITE}/nvidia/cu13/lib/libcudart.so.13" in nvidia_copies
    # the old version's files the new one lacks are removed, with its dist-info
    assert f"{SITE}/sglang/srt/old_module.py" in by["sglang"].remove
    assert f"{SITE}/sglang-0.5.9.dist-info/RECORD" in by["sglang"].remove
    assert f"{SITE}/torch-2.11.0+cu128.dist-info/RECORD" in by["torch"].remove
    assert by[f"{SITE}/{PATCH.dest}"].action == "add" and by[f"{SITE}/{PATCH.dest}"].copy[0].source == "patch"
    assert not result.blocking
    # the target's CUDA 12 runtime goes, whole (its files and dist-info), keeping what numpy... shares nothing
    gone = by["nvidia-cuda-runtime-cu12"]
    assert gone.action == "remove" and gone.from_version == "12.8.90"
    assert f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12" in gone.remove
    assert f"{SITE}/nvidia_cuda_runtime_cu12-12.8.90.dist-info/RECORD" in gone.remove
    assert f"{SITE}/nvidia/__init__.py" not in gone.remove  # the donor's nvidia-cuda-runtime has it too
    assert not [f for f in result.findings if f.code in ("overlay-target-only", "cuda-major-mismatch")]


def test_file_owned_by_a_staying_distribution_is_not_removed():
    shared = {"nvidia/__init__.py": ""}
    donor = inv([dist("nvidia-a", "13.0", {"nvidia/a.so": "new"})], "d")
    target = inv([dist("nvidia-a", "12.0", {"nvidia/a.so": "old", **shared}),
                  dist("nvidia-b-cu12", "12.0", {"nvidia/b.so": "b", **shared})], "t", prefix=TARGET)
    change = plan(manifest(["nvidia-a"]), donor, target).changes[0]
    assert f"{SITE}/nvidia/__init__.py" not in change.remove


def test_second_plan_is_a_noop_with_reasons():
    donor, _ = seed_inventories()
    same = inv([d for d in donor.document["distributions"]], "t", prefix=TARGET)
    result = plan(manifest(["torch", "sglang"]), donor, same)
    assert not result.has_changes
    assert [(c.name, c.action) for c in result.changes] == [("sglang", "keep"), ("torch", "keep")]
    assert result.changes[1].reason == "same version, all 4 files identical"


def test_patch_keep_and_replace():
    donor, target = seed_inventories()
    dest = f"{SITE}/sglang/srt/server_args.py"
    patch = PatchFile(local="patches/server_args.py", dest="sglang/srt/server_args.py", hash=digest("patched"), size=7)
    t_doc = dict(target.document, files={dest: {"venv_path": dest, "exists": True, "hash": digest("no dflash"), "size": 9}})
    replace = plan(manifest(["sglang"]), donor, parse_inventory(t_doc, label="t"), [patch])
    change = {c.name: c for c in replace.changes}[dest]
    assert change.action == "replace"
    sglang = {c.name: c for c in replace.changes}["sglang"]
    assert dest not in {c.path for c in sglang.copy}, "the patch wins over the donor's copy"
    t_doc["files"][dest]["hash"] = digest("patched")
    keep = plan(manifest(["sglang"]), donor, parse_inventory(t_doc, label="t"), [patch])
    assert {c.name: c for c in keep.changes}[dest].action == "keep"


def test_overlay_no_match_exact_is_error_glob_is_warning():
    donor, target = seed_inventories()
    result = plan(manifest(["torch", "sgl-kernel", "triton-*"]), donor, target)
    found = {(f.code, f.severity, f.message.split(" matches")[0]) for f in result.findings if f.code == "overlay-no-match"}
    assert found == {("overlay-no-match", "error", "overlay entry 'sgl-kernel'"),
                     ("overlay-no-match", "warning", "overlay entry 'triton-*'")}


def test_python_version_mismatch():
    donor, _ = seed_inventories()
    target = inv([], "t", prefix=TARGET, python="3.12.3")
    result = plan(manifest(["torch"]), donor, target)
    assert not [f for f in result.findings if f.code == "interpreter-missing"]
    found = [f for f in result.findings if f.code == "python-version-mismatch"]
    assert len(found) == 1 and found[0].severity == "error" and found[0].message.startswith("Python 3.11 vs 3.12: ")
    assert "cp311" in found[0].message and "cp312" in found[0].message
    assert found[0].hint.endswith(", or recreate the target venv with Python 3.11: python3.11 -m venv /root/venv_sglang")


def test_duplicate_dist_info_on_target():
    donor, _ = seed_inventories()
    target = inv([torch("2.9.0+cu128", "a"), dist("torch", "2.8.0+cu128", {}, metadata=False)], "t", prefix=TARGET)
    found = [f for f in plan(manifest(["torch"]), donor, target).findings if f.code == "duplicate-dist-info"]
    assert [(f.severity, f.dists) for f in found] == [("warning", ("torch",))]
    assert found[0].hint == "apply replaces them with the donor's one"


def test_requirement_unmet_on_donor_too_is_a_warning():
    donor = inv([dist("sglang", "0.5.23", {"s.py": "x"}, requires=["torch==2.14.1", "anthropic>=0.20"]),
                 dist("torch", "2.13.0+cpu", {"t.py": "t"})], "d")
    target = inv([dist("torch", "2.13.0+cpu", {"t.py": "t"})], "t", prefix=TARGET)
    found = [f for f in plan(manifest(["sglang"]), donor, target).findings if f.code == "requirement-unmet"]
    assert [(f.severity, f.dists) for f in found] == [("warning", ("anthropic", "sglang", "torch"))]
    assert found[0].message.startswith("2 requirements of 1 distribution are unmet here and on the donor")
    assert "sglang 0.5.23 (2)" in found[0].message


@pytest.mark.parametrize("spec,version,ok", [
    ("sgl-kernel==0.3.16.post4", "0.3.16.post4+cu130", True),
    ("sgl-kernel==0.3.16.post4", "0.3.16.post5+cu130", False),
    ("sgl-kernel==0.3.16.post4+cu128", "0.3.16.post4+cu130", False),
    ("sgl-kernel>=0.3", "0.4.0rc1", True),
])
def test_local_label_semantics(spec, version, ok):
    donor = inv([dist("sglang", "1", {"s.py": "x"}, requires=[spec]), dist("sgl-kernel", version, {"k": "k"})], "d")
    target = inv([], "t", prefix=TARGET)
    unmet = [f for f in plan(manifest(["sglang", "sgl-kernel"]), donor, target).findings if f.code == "requirement-unmet"]
    assert (not unmet) == ok


def test_overlay_that_breaks_a_target_distribution_is_an_error():
    """The target's own vision 1.0 needs torch<2.12; it had 2.11, the overlay brings 2.13: the plan says so."""
    donor = inv([dist("torch", "2.13.0", {"t.py": "new"})], "d")
    target = inv([dist("torch", "2.11.0", {"t.py": "old"}), dist("vision", "1.0", {"v.py": "v"}, requires=["torch<2.12"])],
                 "t", prefix=TARGET)
    found = [f for f in plan(manifest(["torch"]), donor, target).findings if f.code == "requirement-unmet"]
    assert [(f.severity, f.message) for f in found] == [("error", "vision 1.0 requires torch<2.12, found 2.13.0")]


def test_without_a_reference_every_unmet_requirement_is_an_error():
    from transplant.core.findings import requirement_findings

    env = inv([dist("a", "1", {"a.py": "a"}, requires=["b>=2", "c"])], "t", prefix=TARGET).by_name()
    after = {n: ds[0] for n, ds in env.items()}
    markers = inv([], "x").interpreter.markers
    assert [f.severity for f in requirement_findings(after, markers, reference=[], venv="/v")] == ["error"]
    assert [f.severity for f in requirement_findings(after, markers, reference=[after], venv="/v")] == ["warning"]


def test_a_file_another_distribution_wrote_last_on_both_sides_is_not_carried():
    """A top-level file two distributions' RECORDs list, which the other one (staying, in
    another version on each side) wrote last on both sides: an overlay of the first one,
    identical on both sides, leaves it (the real pair's torch-c-dlpack-ext and flashinfer-python
    ``build_backend.py``); the twin, where the donor's bytes are the overlaid one's own, copies it."""
    ext = {"build_backend.py": "ext backend", "ext/__init__.py": "ext"}

    def pair(donor_backend):
        donor = inv([dist("ext", "1.0", ext, on_disk={"build_backend.py": donor_backend}),
                     dist("fi", "0.7", {"build_backend.py": "fi 0.7 backend", "fi/__init__.py": "fi7"})],
                    "d:/v", hostname="d")
        target = inv([dist("ext", "1.0", ext, on_disk={"build_backend.py": "fi 0.6 backend"}),
                      dist("fi", "0.6", {"build_backend.py": "fi 0.6 backend", "fi/__init__.py": "fi6"})],
                     "t:/v", prefix=TARGET, hostname="t")
        return plan(manifest(["ext"]), donor, target)

    left = pair("fi 0.7 backend")
    assert not left.has_changes, [c.copy for c in left.changes]
    assert not [f for f in left.findings if f.code == "record-drift"], "the other distribution's file is no drift"
    carried = pair("ext backend")  # the donor holds ext's own bytes: they move
    (change,) = [c for c in carried.changes if c.name == "ext"]
    assert [c.path for c in change.copy] == [f"{SITE}/build_backend.py"]
    assert [f for f in carried.findings if f.code == "record-drift"], "the target's bytes are fi's: reported"


def test_to_dict_is_what_asdict_gives_in_the_same_key_order():
    """The direct encoder replaces dataclasses.asdict: the same values, types and key order."""
    from dataclasses import asdict

    donor, target = seed_inventories()
    result = plan(manifest(["torch", "nvidia-*", "sglang-kernel", "sglang"]), donor, target, [PATCH])
    assert result.findings and any(c.copy for c in result.changes)
    assert result.to_dict() == asdict(result)
    assert json.dumps(result.to_dict()) == json.dumps(asdict(result))
