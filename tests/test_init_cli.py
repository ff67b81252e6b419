"""``transplant init`` and closures end to end on two real local venvs built from wheels: the
probe reads real METADATA, the plan hashes exactly the closure, apply brings it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv


def wheel(out: Path, name: str, version: str = "1.0", requires: tuple[str, ...] = ()) -> Path:
    module = name.replace("-", "_")
    return build_wheel(out, name, version, {f"{module}/__init__.py": f"VERSION = {version!r}\n"}, requires=requires)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("init")
    w = base / "wheels"
    donor = [
        # a diamond (left, right -> base), a cycle (right -> app), a marker for another Python,
        # an extra (lib[fast] -> speed), a requirement the donor lacks (gone)
        wheel(w / "d", "app", "2.0", ("left", "right", 'old; python_version < "3.8"', "lib[fast]", "gone>=1")),
        wheel(w / "d", "left", "1.0", ("base>=2",)),
        wheel(w / "d", "right", "1.0", ("base", "app")),
        wheel(w / "d", "base", "2.0"),
        wheel(w / "d", "old", "1.0"),
        wheel(w / "d", "lib", "1.0", ('speed; extra == "fast"', 'slow; extra == "slow"')),
        wheel(w / "d", "speed", "1.0"),
        wheel(w / "d", "slow", "1.0"),
        wheel(w / "d", "unrelated", "1.0"),
    ]
    target = [wheel(w / "t", "app", "1.0"), wheel(w / "t", "base", "1.0"),
              wheel(w / "t", "lib", "1.0", ('speed; extra == "fast"',))]
    return make_venv(base / "donor", donor), make_venv(base / "target", target), base


def test_init_writes_a_closure_manifest_and_refuses_to_overwrite(pair, capsys):
    donor, target, base = pair
    out = base / "init.yaml"
    argv = ["init", "--donor", f"local:{donor}", "--target", f"local:{target}", "--overlay", "app", "--out", str(out)]
    assert main(argv) == 0
    text = out.read_text()
    data = yaml.safe_load(text)
    assert text.startswith("# written by transplant init")
    assert data["overlay"] == [{"closure": "app"}]
    assert data["donor"] == {"host": "local", "venv": str(donor)}
    assert "remove" not in data and "server_args" not in data["verify"]
    assert data["verify"]["imports"][:1] == ["app"] and "left" in data["verify"]["imports"]
    # never overwritten
    out.write_text(text + "# mine\n")
    assert main(argv) == 1
    assert out.read_text().endswith("# mine\n")
    assert "already exists" in capsys.readouterr().out

    assert main(["plan", "--detailed-exitcode", str(out), "--json"]) == 2
    plan = json.loads(capsys.readouterr().out)
    changes = {c["name"]: c for c in plan["changes"]}
    # lib is on the target at a version lib[fast] accepts: it stays; speed (its extra) comes
    assert set(changes) == {"app", "left", "right", "base", "speed"}
    assert changes["base"]["reason"].endswith("needed by app 2.0 -> left -> base>=2")
    assert sorted(plan["hash_patterns"]) == sorted(changes)
    codes = {(f["code"], f["severity"], tuple(f["dists"])) for f in plan["findings"]}
    assert ("closure-unmet", "warning", ("app", "gone")) in codes
    assert not [f for f in plan["findings"] if f["severity"] == "error"]


def test_exclude_keeps_a_pulled_name_out_and_apply_brings_the_rest(pair, capsys, tmp_path):
    donor, target, base = pair
    # a copy of the target, so the module's pair stays as built
    work = make_venv(tmp_path / "work", [wheel(tmp_path / "w", "app", "1.0"), wheel(tmp_path / "w", "base", "1.0"),
                                         wheel(tmp_path / "w", "lib", "1.0", ('speed; extra == "fast"',))])
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "donor": {"host": "local", "venv": str(donor)},
                                        "target": {"host": "local", "venv": str(work)},
                                        "overlay": [{"closure": "app"}], "exclude": ["speed"]}))
    assert main(["apply", str(manifest), "--yes"]) == 0
    site = next((work / "lib").glob("python3.*/site-packages"))
    have = {p.name.split("-")[0] for p in site.glob("*.dist-info")}
    assert have == {"app", "left", "right", "base", "lib"}
    assert (site / "base" / "__init__.py").read_text() == "VERSION = '2.0'\n"
    capsys.readouterr()
    assert main(["plan", str(manifest), "--json"]) == 0  # nothing left to change
    plan = json.loads(capsys.readouterr().out)
    assert ("closure-excluded", ("speed",)) in {(f["code"], tuple(f["dists"])) for f in plan["findings"]}


def test_init_proposes_only_the_imports_that_pass_in_the_donor_and_verify_passes(tmp_path, capsys):
    """Run in the donor, each candidate import sorts itself: one that imports is proposed; one that
    fails for want of a GPU on this driverless host is written ``needs: [gpu]``; one broken in the
    donor itself is left out and named. The first init -> plan -> apply -> verify then ends green,
    each name that could not be checked said with its cause."""
    w = tmp_path / "wheels"
    donor = make_venv(tmp_path / "donor", [
        build_wheel(w, "okpkg", "1.0", {"okpkg/__init__.py": "VERSION = '1.0'\n"}),
        build_wheel(w, "gpuonly", "1.0", {"gpuonly/__init__.py": "raise RuntimeError('The NVIDIA driver does not "
                                                                 "expose a usable CUDA device')\n"}),
        build_wheel(w, "brokenpkg", "1.0", {"brokenpkg/__init__.py": "import missing_dependency_xyz\n"}),
    ])
    target = make_venv(tmp_path / "target", [])
    out = tmp_path / "init.yaml"
    assert main(["init", "--donor", f"local:{donor}", "--target", f"local:{target}", "--overlay", "okpkg",
                 "--overlay", "gpuonly", "--overlay", "brokenpkg", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    text = out.read_text()
    assert yaml.safe_load(text)["verify"]["imports"] == [{"name": "gpuonly", "needs": ["gpu"]}, "okpkg"]
    assert "# gpuonly: needs a GPU: in the donor, on a host without a driver: RuntimeError: The NVIDIA driver" in text
    assert "# left out, failing in the donor itself: brokenpkg (ModuleNotFoundError: No module named " \
           "'missing_dependency_xyz')" in text
    assert "left out of verify.imports: brokenpkg fails in the donor itself" in said
    assert main(["apply", str(out), "--yes"]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    imports = {s["name"]: s for s in doc["stages"]}["imports"]
    assert imports["status"] == "pass" and not [s for s in doc["stages"] if s["status"] == "fail"]
    assert {(u["item"], u["cause"]) for u in imports["unchecked"]} == {("gpuonly", "no-driver"),
                                                                      ("brokenpkg", "donor-identical")}
    assert main(["verify", str(out), "--strict"]) == 3
