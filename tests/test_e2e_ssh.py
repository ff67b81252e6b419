"""plan / apply / verify end to end over real sshd hosts, with real venvs, wheels and rsync."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel

VENV = "/srv/e2e-venv"
SITE = "lib/python3.11/site-packages"


def _python() -> str:
    return getattr(sys, "_base_executable", sys.executable)


@pytest.fixture(scope="module")
def hosts(lab, tmp_path_factory):
    """Donor with alpha 1.1+cu130 and beta 2.0 (needs alpha>=1.1); target with alpha 1.0 and a hardlinked file."""
    wheels = tmp_path_factory.mktemp("wheels")
    a1 = build_wheel(wheels, "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n", "alpha/old.py": "OLD = 1\n",
                                             "alpha/same.py": "SAME = 1\n"})
    a2 = build_wheel(wheels, "alpha", "1.1+cu130", {"alpha/__init__.py": "__version__ = '1.1'\n",
                                                    "alpha/new.py": "NEW = 1\n", "alpha/same.py": "SAME = 1\n"})
    b = build_wheel(wheels, "beta", "2.0", {"beta/__init__.py": "import alpha\n__version__ = '2.0'\n"},
                    requires=("alpha>=1.1",))
    for name, wheel_set in (("donor", [a2, b]), ("target", [a1])):
        host = lab.hosts[name]
        host.run(["rm", "-rf", VENV])
        host.run([_python(), "-m", "venv", "--without-pip", VENV])
        host.run([_python(), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                  "--target", f"{VENV}/{SITE}", *map(str, wheel_set)])
    # a file of the target hardlinked from elsewhere: after apply the other link keeps its bytes
    target_init = lab.hosts["target"].path(f"{VENV}/{SITE}/alpha/__init__.py")
    outside = lab.hosts["target"].root / "cache-link.py"
    if outside.exists():
        outside.unlink()
    os.link(target_init, outside)
    return lab, outside


def manifest(tmp_path, lab, overlay, *, known_hosts=None, extra=""):
    (tmp_path / "patches").mkdir(exist_ok=True)
    (tmp_path / "patches" / "ddtree_utils.py").write_text("BUDGET = 15\n")
    text = textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{lab.hosts['donor'].spec}", venv: {VENV}}}
        target: {{host: "{lab.hosts['target'].spec}", venv: {VENV}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {known_hosts or lab.known_hosts}}}
        overlay: {json.dumps(overlay)}
        patches:
          - {{source: patches/ddtree_utils.py, dest: alpha/ddtree_utils.py}}
        verify:
          imports: [alpha, beta, alpha.ddtree_utils]
        """) + extra
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return str(path)


def test_plan_apply_verify_over_ssh(hosts, tmp_path, capsys):
    lab, outside = hosts
    target_site = lab.hosts["target"].path(f"{VENV}/{SITE}")
    before = {p.name for p in target_site.iterdir()}

    # beta alone: plan finds alpha too old before anything moves, and blocks
    m = manifest(tmp_path, lab, ["beta"])
    assert main(["plan", m, "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    unmet = [f for f in doc["findings"] if f["code"] == "requirement-unmet"]
    assert unmet[0]["severity"] == "error" and unmet[0]["message"] == "beta 2.0 requires alpha>=1.1, found 1.0"
    assert main(["apply", m, "--yes"]) == 3
    assert {p.name for p in target_site.iterdir()} == before, "a blocked apply changes nothing"

    # alpha and beta: changes, saved plan, apply, state checked hash for hash
    m = manifest(tmp_path, lab, ["alpha", "beta"])
    plan_file = tmp_path / "plan.json"
    assert main(["plan", "--detailed-exitcode", m, "--out", str(plan_file)]) == 2
    saved = json.loads(plan_file.read_text())
    by = {c["name"]: c for c in saved["changes"]}
    assert by["alpha"]["action"] == "upgrade" and by["beta"]["action"] == "add"
    copied = {c["path"].rsplit("/", 1)[-1] for c in by["alpha"]["copy"]}
    assert "same.py" not in copied and "new.py" in copied, "only differing files move"
    assert f"{SITE}/alpha/old.py" in by["alpha"]["remove"]
    capsys.readouterr()
    assert main(["apply", str(plan_file), "--yes"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    donor_label, target_label = lab.hosts["donor"].spec, lab.hosts["target"].spec
    assert f"files: streamed {donor_label} -> {target_label} through the controller, both legs at once, no " \
           f"controller disk" in said and "hashed as written" in said
    assert f"patches: streamed from the controller to {target_label}" in said
    assert not (target_site / "alpha" / "old.py").exists()
    assert (target_site / "alpha" / "new.py").read_text() == "NEW = 1\n"
    assert (target_site / "alpha" / "ddtree_utils.py").read_text() == "BUDGET = 15\n"
    assert {p.name for p in target_site.iterdir() if p.name.endswith(".dist-info")} == {
        "alpha-1.1+cu130.dist-info", "beta-2.0.dist-info"}
    assert outside.read_text() == "__version__ = '1.0'\n", "the other hardlink keeps its old bytes"
    history = lab.hosts["target"].path(f"{VENV}/.transplant/history.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in history][-2:] == ["started", "applied"]

    # a second apply changes nothing; the saved plan is now stale and refused
    capsys.readouterr()
    assert main(["apply", m, "--yes"]) == 0
    assert "nothing to change" in capsys.readouterr().out
    assert main(["plan", m]) == 0
    assert main(["apply", str(plan_file), "--yes"]) == 1
    stale = " ".join(capsys.readouterr().out.split())
    assert "refusing a stale plan: the target" in stale
    assert "alpha: planned upgrade 1.0 -> 1.1+cu130, now keep 1.1+cu130 -> 1.1+cu130" in stale

    # verify in the target venv over SSH
    assert main(["verify", m, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["imports"]["status"] == "pass"
    files = {i["name"]: i["file"] for i in stages["imports"]["details"]["imports"]}
    assert files["alpha.ddtree_utils"] == f"{VENV}/{SITE}/alpha/ddtree_utils.py"
    assert stages["requirements"]["status"] == "pass"
    assert stages["server-args"]["status"] == "skip" and stages["smoke"]["status"] == "skip"


def test_verify_fails_a_broken_import(hosts, tmp_path, capsys):
    lab, _ = hosts
    m = manifest(tmp_path, lab, ["alpha"], extra="")
    text = Path(m).read_text().replace("imports: [alpha, beta, alpha.ddtree_utils]", "imports: [alpha, no_such_module]")
    Path(m).write_text(text)
    assert main(["verify", m, "--json"]) == 3
    stages = {s["name"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
    assert stages["imports"]["status"] == "fail"
    assert "no_such_module: ModuleNotFoundError" in stages["imports"]["reason"]
    # the donor lacks it too, but a name missing from both venvs is a wrong name, not "what the donor runs"
    assert not stages["imports"]["unchecked"]


def test_verify_without_manifest_over_ssh(hosts, tmp_path, capsys):
    lab, _ = hosts
    spec = lab.hosts["target"].spec
    junit = tmp_path / "v.xml"
    assert main(["verify", f"{spec}:{VENV}", "--imports", "alpha", "--identity-file", str(lab.identity_file),
                 "--known-hosts", str(lab.known_hosts), "--json", "--junit", str(junit)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == f"{spec}:{VENV}" and doc["ok"] is True
    stages = {s["name"]: s for s in doc["stages"]}
    assert stages["imports"]["details"]["imports"][0]["file"].startswith(f"{VENV}/{SITE}/alpha/")
    assert stages["native-load"]["status"] == "skip" and "ship no shared objects (alpha)" in stages["native-load"]["reason"]
    assert stages["interpreter"]["status"] == "pass"
    assert junit.read_text().startswith("<?xml")


def test_unknown_host_key_is_refused_and_nothing_runs(hosts, tmp_path, capsys):
    lab, _ = hosts
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    m = manifest(tmp_path, lab, ["alpha"], known_hosts=empty)
    assert main(["plan", m]) == 1
    out = capsys.readouterr().out
    assert "host key" in out and "ssh-keyscan" in out


def test_missing_venv_is_one_clear_error(hosts, tmp_path, capsys):
    lab, _ = hosts
    m = manifest(tmp_path, lab, ["alpha"])
    Path(m).write_text(Path(m).read_text().replace(f"venv: {VENV}}}\nssh", "venv: /srv/nope}\nssh"))
    assert main(["plan", m]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "/srv/nope/bin/python does not exist" in out and "is /srv/nope a venv" in out


def test_inventory_command_prints_probe_json(hosts, capsys):
    lab, _ = hosts
    spec = lab.hosts["donor"].spec
    assert main(["inventory", f"{spec}:{VENV}", "--json", "--identity-file", str(lab.identity_file),
                 "--known-hosts", str(lab.known_hosts), "--hash", "alpha"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "transplant.inventory/1"
    assert doc["host"]["hostname"] == "donor"
    assert doc["host"]["nvidia"] == {"available": False, "reason": "no nvidia-smi on PATH"}
    alpha = [d for d in doc["distributions"] if d["name"] == "alpha"][0]
    assert alpha["version"] == "1.1+cu130" and alpha["hashed"] is True
    assert all("hash" in e for e in alpha["record"] if e["path"].endswith(".py"))
