"""The kept plan's check (pure core): every plan the planner makes passes it (no false refusal of
an honest memo), and each edit of the kind a tampered memo holds is named."""

from __future__ import annotations

import dataclasses

from inventory_docs import SITE, digest
from test_planner import manifest, seed_inventories
from transplant.core.kept_plan import kept_plan_problems
from transplant.core.planner import PatchFile, plan


def _patches() -> list[PatchFile]:
    return [PatchFile(local="patches/server_args.py", dest="sglang/srt/server_args.py", hash=digest("p1"), size=2),
            PatchFile(local="patches/x.py", dest="server_args.py", hash=digest("p2"), size=2)]  # a suffix of the other


def test_the_planners_own_plans_pass():
    donor, target = seed_inventories()
    for overlay, extra in ((["sglang"], {}), (["sglang", "flashinfer-python", "nvidia-*"],
                                              {"remove": ["nvidia-cuda-runtime-cu12"]}),
                           ([{"closure": "sglang"}], {}), (["nvidia-*"], {"remove": ["nvidia-*"]})):
        m = manifest(overlay, **extra)
        made = plan(m, donor, target, _patches())
        assert kept_plan_problems(made, m, _patches()) == [], (overlay, extra)
    m = manifest(["sglang", "nvidia-*"], remove=["nvidia-cuda-runtime-cu12"])
    made = plan(m, donor, target, _patches())
    assert any(c.action == "remove" for c in made.changes), "a glob overlay and a removal of what the donor lacks"
    assert kept_plan_problems(made, m, _patches()) == []


def test_each_edit_is_named():
    donor, target = seed_inventories()
    m = manifest(["sglang"], remove=["nvidia-cuda-runtime-cu12"])
    made = plan(m, donor, target, _patches())
    by = {c.name: c for c in made.changes}

    def problems(**changes) -> str:
        return " ".join(kept_plan_problems(dataclasses.replace(made, **changes), m, _patches()))

    assert "its target is root@ct200:/elsewhere" in problems(target=dataclasses.replace(made.target, venv="/elsewhere"))
    numpy = dataclasses.replace(by["sglang"], name="numpy", dist_info=f"{SITE}/numpy-2.3.0.dist-info")
    assert "distribution numpy: the manifest's overlay does not select it" in problems(changes=made.changes + (numpy,))
    gone = dataclasses.replace(by["nvidia-cuda-runtime-cu12"], name="numpy")
    assert "distribution numpy: uninstalled, but the manifest's remove: does not name it" in \
        problems(changes=made.changes + (gone,))
    grabby = dataclasses.replace(by["sglang"], remove=by["sglang"].remove + (f"{SITE}/numpy-2.3.0.dist-info/RECORD",))
    assert "lies in another distribution's metadata (numpy)" in \
        problems(changes=tuple(grabby if c is by["sglang"] else c for c in made.changes))
    assert "is not the manifest's" in problems(hash_patterns=("*",))
    patch = next(c for c in made.changes if c.kind == "patch")
    copy = dataclasses.replace(patch.copy[0], local="m.yaml")
    assert "does not copy exactly the manifest's" in \
        problems(changes=tuple(dataclasses.replace(c, copy=(copy,)) if c is patch else c for c in made.changes))
    error = next(f for f in made.findings if f.severity == "error" and f.accepted is None)
    waved = dataclasses.replace(error, accepted="edited in")
    assert f"its error {error.code}" in problems(findings=tuple(waved if f is error else f for f in made.findings))
    assert "marked accepted, but the manifest's accept: does not name it" in \
        problems(findings=tuple(waved if f is error else f for f in made.findings))
    accepting = manifest(["sglang"], remove=["nvidia-cuda-runtime-cu12"],
                         accept=[{"code": error.code, "dists": list(error.dists), "reason": "known"}])
    kept = plan(accepting, donor, target, _patches())
    assert any(f.accepted == "known" for f in kept.findings)
    assert kept_plan_problems(kept, accepting, _patches()) == [], "an accept: of the manifest's own passes"
    assert problems() == "", "the twin: the plan as made"


def test_a_metadata_folder_a_package_vendors_is_its_own():
    """setuptools ships ``setuptools/_vendor/autocommand-2.2.2.dist-info/`` among its own files: an
    honest plan copies it; the same folder directly in site-packages is another distribution's."""
    donor, target = seed_inventories()
    m = manifest(["sglang"])
    made = plan(m, donor, target, _patches())
    sglang = next(c for c in made.changes if c.name == "sglang")
    vendored = dataclasses.replace(sglang.copy[0], path=f"{SITE}/sglang/_vendor/autocommand-2.2.2.dist-info/INSTALLER")
    installed = dataclasses.replace(sglang.copy[0], path=f"{SITE}/autocommand-2.2.2.dist-info/INSTALLER")

    def with_copy(copy) -> list[str]:
        changed = dataclasses.replace(sglang, copy=(*sglang.copy, copy))
        return kept_plan_problems(dataclasses.replace(
            made, changes=tuple(changed if c is sglang else c for c in made.changes)), m, _patches())

    assert with_copy(vendored) == []
    assert any("lies in another distribution's metadata (autocommand)" in p for p in with_copy(installed))
