"""Overlay closures (pure core): the donor's installed set is the only source; markers for the
target's interpreter, extras, exclude:, cycles and what the donor itself lacks."""

from __future__ import annotations

import pytest

from inventory_docs import dist, document
from transplant.core.closure import closure, expand
from transplant.errors import ManifestError
from transplant.core.inventory import parse_inventory
from transplant.core.manifest import parse_manifest
from transplant.core.planner import plan


def inv(prefix, dists, python="3.11.7"):
    return parse_inventory(document(prefix, dists, python=python), label=prefix)


def d(name, version="1.0", requires=()):
    return dist(name, version, {f"{name.replace('-', '_')}/__init__.py": f"# {name} {version}"},
                requires=list(requires))


def manifest(overlay, **extra):
    return parse_manifest({"version": 1, "donor": {"host": "local", "venv": "/d"},
                           "target": {"host": "local", "venv": "/t"}, "overlay": overlay, **extra}, path="m.yaml")


def names(found):
    return {p.name: p for p in found.pulled}


def run(donor, target, roots=("app",), **kw):
    return closure(list(roots), inv("/d", donor).latest(), inv("/t", target).latest(),
                   inv("/t", target).interpreter.markers, **kw)


def test_diamond_pulls_each_once_with_a_shortest_chain():
    donor = [d("app", requires=["left", "right"]), d("left", requires=["base>=2"]), d("right", requires=["base"]),
             d("base", "2.0")]
    found = run(donor, [d("base", "1.0")])
    assert set(names(found)) == {"left", "right", "base"}
    assert names(found)["base"].needed_by == "app 1.0 -> left -> base>=2"
    assert names(found)["base"].reason == "the target has 1.0"


def test_target_build_the_requirement_accepts_stays():
    donor = [d("app", requires=["lib>=1", "other==2.0"]), d("lib", "3.0"), d("other", "2.0")]
    found = run(donor, [d("lib", "1.5"), d("other", "1.0")])
    assert set(names(found)) == {"other"}


def test_cycle_ends():
    donor = [d("app", requires=["a"]), d("a", requires=["b"]), d("b", requires=["a", "app", "c"]), d("c")]
    found = run(donor, [])
    assert set(names(found)) == {"a", "b", "c"} and found.roots == ("app",)


def test_markers_are_the_targets_interpreter():
    donor = [d("app", requires=['old; python_version < "3.10"', 'new; python_version >= "3.11"',
                                'arm; platform_machine == "aarch64"']), d("old"), d("new"), d("arm")]
    assert set(names(run(donor, []))) == {"new"}
    target310 = closure(["app"], inv("/d", donor).latest(), {}, inv("/t", [], python="3.9.18").interpreter.markers)
    assert set(names(target310)) == {"old"}


def test_an_extra_named_by_a_requirement_is_followed():
    donor = [d("app", requires=["lib[fast]"]), d("lib", requires=['speed; extra == "fast"', 'slow; extra == "slow"']),
             d("speed"), d("slow")]
    assert set(names(run(donor, []))) == {"lib", "speed"}
    # a root's own extras: {closure: "app[extra]"}
    donor2 = [d("app", requires=['plug; extra == "plugins"']), d("plug")]
    assert set(names(run(donor2, [], roots=("app[plugins]",)))) == {"plug"}
    assert set(names(run(donor2, []))) == set()


def test_exclude_keeps_a_name_and_what_only_it_needs_out():
    donor = [d("app", requires=["big", "small"]), d("big", requires=["huge"]), d("huge"), d("small")]
    found = run(donor, [], exclude=["big"])
    assert set(names(found)) == {"small"}
    assert found.excluded == (("big", ("app 1.0", "big")),)
    result = plan(manifest([{"closure": "app"}], exclude=["big"]), inv("/d", donor), inv("/t", []))
    assert [f.dists for f in result.findings if f.code == "closure-excluded"] == [("big",)]
    assert {c.name for c in result.changes} == {"app", "small"}


def test_a_requirement_the_donor_lacks_stays_a_finding():
    donor = [d("app", requires=["gone", "lib>=2"]), d("lib", "1.0")]
    found = run(donor, [])
    assert {(m.requirer, str(m.requirement), m.donor_version) for m in found.unmet} == {
        ("app", "gone", None), ("app", "lib>=2", "1.0")}
    result = plan(manifest([{"closure": "app"}]), inv("/d", donor), inv("/t", []))
    unmet = [f for f in result.findings if f.code == "closure-unmet"]
    assert {f.dists for f in unmet} == {("app", "gone"), ("app", "lib")}
    assert all(f.severity == "warning" for f in unmet)
    # and the environment after apply still reports it (never a silent skip)
    assert any(f.code == "requirement-unmet" and "gone" in f.dists for f in result.findings)


def test_plan_shows_the_chain_and_hashes_what_it_brings():
    donor = [d("app", "2.0", requires=["lib==5.19.0"]), d("lib", "5.19.0", requires=["leaf"]), d("leaf")]
    target = [d("app", "1.0"), d("lib", "4.57.1")]
    result = plan(manifest([{"closure": "app"}]), inv("/d", donor), inv("/t", target))
    by = {c.name: c for c in result.changes}
    assert set(by) == {"app", "lib", "leaf"}
    assert by["lib"].reason.endswith("needed by app 2.0 -> lib==5.19.0")
    assert by["leaf"].reason.endswith("needed by app 2.0 -> lib==5.19.0 -> leaf")
    assert set(result.hash_patterns) == {"app", "lib", "leaf"}
    assert not [f for f in result.findings if f.code == "requirement-unmet"]
    # an expanded manifest is an ordinary one: expanding again changes nothing
    once, _ = expand(manifest([{"closure": "app"}]), inv("/d", donor), inv("/t", target))
    assert expand(once, inv("/d", donor), inv("/t", target)) == (once, None)


def test_the_planner_takes_the_closure_handed_on_rather_than_computing_it_again():
    donor = [d("app", "2.0", requires=["lib==5.19.0"]), d("lib", "5.19.0", requires=["leaf"]), d("leaf")]
    target = [d("app", "1.0"), d("lib", "4.57.1")]
    m = manifest([{"closure": "app"}])
    _, found = expand(m, inv("/d", donor), inv("/t", target))
    assert plan(m, inv("/d", donor), inv("/t", target), closure=found) == plan(m, inv("/d", donor), inv("/t", target))
    # what is handed on is what the plan shows: a closure gathered before leaf was needed brings no leaf
    _, earlier = expand(m, inv("/d", [d("app", "2.0", requires=["lib==5.19.0"]), d("lib", "5.19.0"), d("leaf")]),
                        inv("/t", target))
    handed = plan(m, inv("/d", donor), inv("/t", target), closure=earlier)
    assert {c.name for c in handed.changes} == {"app", "lib"}


def test_without_a_target_the_closure_is_everything_the_roots_reach_on_the_donor():
    """A snapshot knows no target: every donor distribution the roots reach, with the donor's markers."""
    donor = [d("app", "2.0", requires=["lib", 'win; sys_platform == "win32"']), d("lib", requires=["leaf"]),
             d("leaf"), d("win"), d("other")]
    m, found = expand(manifest(["torch", {"closure": "app"}]), inv("/d", donor), None)
    assert m.overlay == ("torch", "app", "leaf", "lib") and m.closures == ()
    assert found is not None and found.roots == ("app",)


def test_an_absent_root_is_overlay_no_match():
    result = plan(manifest([{"closure": "nothere"}]), inv("/d", [d("app")]), inv("/t", []))
    assert [(f.code, f.severity) for f in result.findings if f.code == "overlay-no-match"] == [
        ("overlay-no-match", "error")]


@pytest.mark.parametrize("overlay, extra, where, words", [
    ([{"closure": 5}], {}, "overlay[0].closure", "expected a non-empty string"),
    ([{"closure": "app", "with": "x"}], {}, "overlay[0].with", "unknown key"),
    ([{"closure": "app>=2"}], {}, "overlay[0].closure", "has a version"),
    ([{"closure": "sgl*"}], {}, "overlay[0].closure", "not a distribution name"),
    ([{"closure": "app"}, {"closure": "App"}], {}, "overlay[1].closure", "listed twice"),
    (["torch"], {"exclude": ["big"]}, "exclude", "has no {closure: NAME} entry"),
    ([{"closure": "app"}], {"exclude": "big"}, "exclude", "expected a list"),
    ([{"closure": "app"}], {"exclude": ["b@d"]}, "exclude[0]", "not a distribution name"),
])
def test_bad_closure_and_exclude_entries_name_file_key_and_fix(overlay, extra, where, words):
    with pytest.raises(ManifestError) as err:
        manifest(overlay, **extra)
    text = str(err.value)
    assert text.startswith("m.yaml:")
    [line] = [p for p in err.value.problems if p.startswith(where + ":")]
    assert words in line and "; fix: " in line


def test_closure_roots_are_what_verify_imports():
    m = manifest(["torch", {"closure": "sglang[http2]"}], exclude=["flash-attn-4"])
    assert m.overlay == ("torch",) and m.closures == ("sglang[http2]",) and m.exclude == ("flash-attn-4",)
    assert m.verify.overlay == ("torch", "sglang")


def test_an_extra_on_a_target_build_that_stays_is_followed_too():
    donor = [d("app", requires=["lib[fast]"]), d("lib", "2.0", requires=['speed; extra == "fast"']), d("speed")]
    target = [d("lib", "1.0", requires=['speed; extra == "fast"', "own-dep"])]
    found = run(donor, target)
    assert set(names(found)) == {"speed"}
    assert names(found)["speed"].needed_by == "app 1.0 -> lib[fast] -> speed"


def test_the_closure_is_the_same_after_apply_when_remove_globs_a_pulled_name():
    """A target distribution remove: matches counts as absent, and a staying build's own
    requirements are followed: after apply, the remove: glob does not take back what the
    closure brought (nvidia-cutlass-dsl -> nvidia-cutlass-dsl-libs-cu12 beside nvidia-*-cu12)."""
    donor = [d("app", requires=["dsl==4.8"]), d("dsl", "4.8", requires=["dsl-libs-cu12==4.8"]),
             d("dsl-libs-cu12", "4.8")]
    before = [d("old-cu12", "1.0")]
    after = [d("app"), d("dsl", "4.8", requires=["dsl-libs-cu12==4.8"]), d("dsl-libs-cu12", "4.8"), d("old-cu12")]
    m = manifest([{"closure": "app"}], remove=["*-cu12"])
    first = plan(m, inv("/d", donor), inv("/t", before))
    assert {(c.name, c.action) for c in first.changes} == {("app", "add"), ("dsl", "add"), ("dsl-libs-cu12", "add"),
                                                            ("old-cu12", "remove")}
    again = plan(m, inv("/d", donor), inv("/t", after))
    assert {(c.name, c.action) for c in again.changes} == {("app", "keep"), ("dsl-libs-cu12", "keep"),
                                                            ("old-cu12", "remove")}
    assert not [f for f in again.findings if f.severity == "error"]


def test_a_drafted_manifest_keeps_its_ssh_settings():
    """``init --identity-file/--known-hosts`` puts them in the manifest it writes (render dropped
    them, so the manifest's own next step, ``plan``, could not log in)."""
    import yaml

    from transplant.core.starting_manifest import Draft, render

    data = {"donor": {"host": "root@127.0.0.10:2222", "venv": "/srv/a"},
            "target": {"host": "root@127.0.0.11:2222", "venv": "/srv/b"},
            "ssh": {"identity_file": "/keys/id", "known_hosts": "/keys/known"},
            "overlay": ["sglang"], "verify": {"imports": ["sglang"]}}
    assert yaml.safe_load(render(Draft(data=data)))["ssh"] == data["ssh"]


def test_gather_computes_the_closure_once_and_hands_it_to_the_planner(tmp_path, monkeypatch):
    """Two real venvs: gather's metadata probe computes the closure, its facts carry it, and the
    plan made with it is the plan the planner makes computing it itself."""
    import importlib

    from transplant.hosts.host import LocalHost
    from transplant.lab.wheels import build_wheel, make_venv

    def wheel(name, version, requires=()):
        return build_wheel(tmp_path / "w" / name / version, name, version,
                           {f"{name}/__init__.py": f"V = {version!r}\n"}, requires=requires)

    donor = make_venv(tmp_path / "donor", [wheel("app", "2.0", ("lib==2.0",)), wheel("lib", "2.0", ("leaf",)),
                                            wheel("leaf", "1.0")])
    target = make_venv(tmp_path / "target", [wheel("app", "1.0"), wheel("lib", "1.0")])
    m = parse_manifest({"version": 1, "donor": {"host": "local", "venv": str(donor)},
                        "target": {"host": "local", "venv": str(target)}, "overlay": [{"closure": "app"}]},
                       path="m.yaml")
    gathering = importlib.import_module("transplant.pipeline.gather")  # the package's name ``gather`` is the function
    computed = []
    real_expand = gathering.expand
    monkeypatch.setattr(gathering, "expand", lambda *a: computed.append(a) or real_expand(*a))
    facts = gathering.gather(m, LocalHost(), LocalHost())
    assert len(computed) == 1 and facts.closure is not None
    assert facts.closure.roots == ("app",) and [p.name for p in facts.closure.pulled] == ["leaf", "lib"]
    handed = plan(m, facts.donor, facts.target, donor_elf=facts.donor_elf, target_elf=facts.target_elf,
                  closure=facts.closure)
    assert handed == plan(m, facts.donor, facts.target, donor_elf=facts.donor_elf, target_elf=facts.target_elf)
    assert {c.name for c in handed.changes} == {"app", "leaf", "lib"}
