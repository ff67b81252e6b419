"""Bad input changes nothing: tampered plans, escaping paths, bad --out, hostile YAML (local venvs)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from inventory_docs import SITE as DOC_SITE, dist, document
from transplant import remote
from transplant.cli.app import main
from transplant.errors import ManifestError
from transplant.controller.manifest_file import load_manifest
from transplant.core.inventory import parse_inventory
from transplant.lab.wheels import build_wheel, make_venv
from transplant.core.manifest import parse_manifest
from transplant.core.planner import plan, pyc_source

SITE = "lib/python3.11/site-packages"


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A local donor (foo 2.0) and target (foo 1.0) and a manifest; the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    new = build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n", "foo/extra.py": "E = 1\n"})
    old = build_wheel(wheels, "foo", "1.0", {"foo/__init__.py": "V = 1\n", "foo/gone.py": "G = 1\n"})
    make_venv(tmp_path / "donor", [new])
    make_venv(tmp_path / "target", [old])
    make_venv(tmp_path / "other", [old])
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {tmp_path / 'donor'}}}
        target: {{host: local, venv: {tmp_path / 'target'}}}
        overlay: [foo]
        """))
    return tmp_path, m


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tamper(tmp_path, m, edit):
    plan_file = tmp_path / "p.json"
    assert main(["plan", "--detailed-exitcode", str(m), "--out", str(plan_file)]) == 2
    data = json.loads(plan_file.read_text())
    edit(data)
    plan_file.write_text(json.dumps(data))
    return plan_file


@pytest.mark.parametrize("path", ["../../x", "/etc/x", f"{SITE}/../../../../x", f"{SITE}/./foo/__init__.py"])
def test_tampered_copy_path_is_refused_before_any_write(pair, capsys, path):
    tmp_path, m = pair
    plan_file = tamper(tmp_path, m, lambda d: d["changes"][0]["copy"][0].__setitem__("path", path))
    before = snapshot(tmp_path / "target")
    assert main(["apply", str(plan_file), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"path {path!r} is not a normalised path inside the venv" in out
    assert snapshot(tmp_path / "target") == before, "nothing written, not even the history"


def test_plan_naming_another_venv_is_refused(pair, capsys):
    tmp_path, m = pair
    plan_file = tamper(tmp_path, m, lambda d: d["target"].__setitem__("venv", str(tmp_path / "other")))
    before = snapshot(tmp_path / "other")
    assert main(["apply", str(plan_file), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"the plan's target is local:{tmp_path / 'other'}, but its manifest" in out
    assert snapshot(tmp_path / "other") == before


def test_mistyped_plan_is_a_clear_error(pair, capsys):
    tmp_path, m = pair
    plan_file = tamper(tmp_path, m, lambda d: d["changes"][0].__setitem__("remove", "abc"))
    assert main(["apply", str(plan_file), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "plan key 'plan.changes[0].remove': expected a list, got a string" in out
    assert "hint: make a new one with: transplant plan MANIFEST --out plan.json" in out


def test_apply_then_noop_and_hardlink_kept(pair, capsys):
    tmp_path, m = pair
    init = tmp_path / "target" / SITE / "foo" / "__init__.py"
    os.link(init, tmp_path / "elsewhere.py")
    assert main(["apply", str(m), "--yes"]) == 0
    assert init.read_text() == "V = 2\n" and not (tmp_path / "target" / SITE / "foo" / "gone.py").exists()
    assert (tmp_path / "elsewhere.py").read_text() == "V = 1\n"
    capsys.readouterr()
    assert main(["apply", str(m), "--yes"]) == 0
    assert "nothing to change" in capsys.readouterr().out


@pytest.mark.parametrize("out,message", [
    ("missing-dir/p.json", "does not exist"),
    (".", "exists and is not a regular file"),
    ("m.yaml", "that is the manifest itself"),
])
def test_bad_out_is_refused_before_probing(pair, capsys, out, message, monkeypatch):
    tmp_path, m = pair
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main(["plan", str(m), "--out", out]) == 1
    assert message in " ".join(capsys.readouterr().out.split())
    assert snapshot(tmp_path) == before


def test_out_to_a_device_is_refused(pair, capsys):
    _, m = pair
    assert main(["plan", str(m), "--out", "/dev/null"]) == 1
    assert "exists and is not a regular file" in capsys.readouterr().out
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize("text,problem", [
    ("version: 1\nversion: 1\n", "(yaml): the key 'version' is given twice (line 2); fix: keep one of them"),
    ("overlay: " + "[" * 3000 + "]" * 3000 + "\n", "(yaml): nested too deeply; fix: a manifest needs at most a few levels"),
])
def test_hostile_yaml(tmp_path, text, problem):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.problems == [problem]


@pytest.mark.parametrize("verify,problem", [
    ({"env": {"A": "a\0b"}}, "verify.env.A: expected a string without NUL"),
    ({"timeout": float("inf")}, "verify.timeout: expected a number of seconds from 1 to 86400, got a number (inf)"),
    ({"server_args": {"entry": "m:f", "args": ["a\0b"]}}, "verify.server_args.args[0]: expected a string without NUL"),
])
def test_values_that_would_crash_later_are_refused(verify, problem):
    data = {"version": 1, "donor": {"host": "local", "venv": "/a"}, "target": {"host": "local", "venv": "/b"},
            "overlay": ["x"], "verify": verify}
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, path="m.yaml")
    assert info.value.problems[0].startswith(problem)


def test_unsafe_paths_from_the_donor_become_an_error_and_are_not_copied():
    evil = dist("evil", "1.0", {"evil/__init__.py": "x"})
    evil["record"].append({"path": "../../../../etc/passwd", "venv_path": None, "record_hash": None, "record_size": None})
    evil["record"].append({"path": "evil/shadow", "venv_path": f"{DOC_SITE}/evil/shadow", "exists": True,
                           "symlink": "/etc/shadow", "mode": 0o777})
    evil["record"].append({"path": "evil/up", "venv_path": f"{DOC_SITE}/evil/up", "exists": True,
                           "symlink": "../../../../../../x", "mode": 0o777})
    evil["record"].append({"path": "evil/sneaky", "venv_path": f"{DOC_SITE}/evil/../../../../../../x", "exists": True,
                           "hash": "sha256=x", "size": 1})
    donor = parse_inventory(document("/d", [evil]), label="d")
    target = parse_inventory(document("/t", []), label="t")
    m = parse_manifest({"version": 1, "donor": {"host": "local", "venv": "/d"}, "target": {"host": "local", "venv": "/t"},
                        "overlay": ["evil"]}, path="m.yaml")
    result = plan(m, donor, target)
    unsafe = [f for f in result.findings if f.code == "unsafe-path"]
    assert len(unsafe) == 1 and unsafe[0].severity == "error"
    assert set(unsafe[0].files) == {"../../../../etc/passwd", "evil/sneaky", f"{DOC_SITE}/evil/shadow -> /etc/shadow",
                                    f"{DOC_SITE}/evil/up -> ../../../../../../x"}
    copied = {c.path for c in result.changes[0].copy}
    assert all(p.startswith(f"{DOC_SITE}/evil") for p in copied)
    assert not any(p.endswith(("shadow", "up", "sneaky")) for p in copied)


def test_probe_does_not_follow_symlinks_out_of_the_venv(tmp_path):
    venv = make_venv(tmp_path / "v")
    site = venv / SITE
    (tmp_path / "secret").write_text("root:x:0:0\n")
    info = site / "evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    os.symlink(tmp_path / "secret", info / "RECORD")
    (site / "evil2-1.0.dist-info").mkdir()
    (site / "evil2-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: evil2\nVersion: 1.0\n")
    (site / "evil2-1.0.dist-info" / "RECORD").write_text("linked/secret,,\n")
    os.symlink(tmp_path, site / "linked")
    out = subprocess.run([str(venv / "bin" / "python"), "-", "--hash", "*"], input=remote.source("probe"),
                         capture_output=True, check=True).stdout
    assert b"root:x" not in out
    docs = {d["name"]: d for d in json.loads(out)["distributions"]}
    assert docs["evil"]["record"] is None
    assert docs["evil2"]["record"][0]["venv_path"] is None


@pytest.mark.parametrize("path,source", [
    ("lib/python3.11/site-packages/torch/__pycache__/version.cpython-311.pyc", "lib/python3.11/site-packages/torch/version.py"),
    ("a/__pycache__/b.cpython-311.opt-1.pyc", "a/b.py"),
    ("a/b.py", None),
    ("a/__pycache__/notes.txt", None),
])
def test_pyc_source(path, source):
    assert pyc_source(path) == source


def test_bytecode_moves_only_with_its_source():
    files = {"m/a.py": "A", "m/__pycache__/a.cpython-311.pyc": "pyc-donor-a", "m/b.py": "B2",
             "m/__pycache__/b.cpython-311.pyc": "pyc-donor-b"}
    old = {"m/a.py": "A", "m/__pycache__/a.cpython-311.pyc": "pyc-target-a", "m/b.py": "B1",
           "m/__pycache__/b.cpython-311.pyc": "pyc-target-b"}
    donor = parse_inventory(document("/d", [dist("m", "1.0", files)]), label="d")
    target = parse_inventory(document("/t", [dist("m", "1.0", old)]), label="t")
    m = parse_manifest({"version": 1, "donor": {"host": "local", "venv": "/d"}, "target": {"host": "local", "venv": "/t"},
                        "overlay": ["m"]}, path="m.yaml")
    copied = {c.path.split("site-packages/")[1] for c in plan(m, donor, target).changes[0].copy}
    assert copied == {"m/b.py", "m/__pycache__/b.cpython-311.pyc"}


def test_force_applies_despite_an_error_finding(pair, capsys):
    tmp_path, m = pair
    m.write_text(m.read_text().replace("overlay: [foo]", "overlay: [foo, no-such-dist]"))
    assert main(["plan", str(m)]) == 3
    assert main(["apply", str(m), "--yes"]) == 3
    assert (tmp_path / "target" / SITE / "foo" / "gone.py").exists(), "blocked: nothing changed"
    assert main(["apply", str(m), "--yes", "--force"]) == 0
    assert not (tmp_path / "target" / SITE / "foo" / "gone.py").exists()


def test_probe_reads_nvidia_smi(tmp_path):
    """A stand-in nvidia-smi first on PATH answers like the real one (query CSV, then the banner)."""
    venv = make_venv(tmp_path / "v")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(textwrap.dedent("""\
        #!/bin/sh
        if [ "$1" = "--query-gpu=name,compute_cap,memory.total,driver_version" ]; then
          echo "NVIDIA RTX PRO 6000 Blackwell, 12.0, 97887, 535.54.03"
          echo "NVIDIA RTX PRO 6000 Blackwell, 12.0, 97887, 535.54.03"
        else
          echo "| NVIDIA-SMI 535.54.03   Driver Version: 535.54.03   CUDA Version: 12.2 |"
        fi
        """))
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    out = subprocess.run([str(venv / "bin" / "python"), "-"], input=remote.source("probe"), capture_output=True,
                         check=True, env=env).stdout
    nvidia = parse_inventory(json.loads(out), label="v").nvidia
    assert nvidia.available and nvidia.driver_version == "535.54.03" and nvidia.cuda_version == "12.2"
    assert [(g.name, g.compute_capability, g.memory_mib) for g in nvidia.gpus] == [
        ("NVIDIA RTX PRO 6000 Blackwell", "12.0", 97887)] * 2
    env["PATH"] = "/nonexistent"
    out = subprocess.run([str(venv / "bin" / "python"), "-"], input=remote.source("probe"), capture_output=True,
                         check=True, env=env).stdout
    assert json.loads(out)["host"]["nvidia"] == {"available": False, "reason": "no nvidia-smi on PATH"}


@pytest.mark.parametrize("path, message", [
    ("bin/python", "path 'bin/python' is part of the venv itself"),
    ("lib/python3.11/site-packages/other/__init__.py", "its changes or findings are not what the manifest gives now"),
])
def test_a_hand_edited_plan_is_refused_even_with_paths_inside_the_venv(pair, capsys, path, message):
    tmp_path, m = pair
    plan_file = tamper(tmp_path, m, lambda d: d["changes"][0]["remove"].append(path))
    before = snapshot(tmp_path / "target")
    assert main(["apply", str(plan_file), "--yes"]) == 1
    assert message in " ".join(capsys.readouterr().out.split())
    assert snapshot(tmp_path / "target") == before and (tmp_path / "target" / "bin" / "python").exists()


def test_out_inside_a_local_venv_is_refused(pair, capsys):
    tmp_path, m = pair
    cfg = tmp_path / "target" / "pyvenv.cfg"
    before = cfg.read_bytes()
    assert main(["plan", str(m), "--out", str(cfg)]) == 1
    assert "inside the target venv" in " ".join(capsys.readouterr().out.split())
    assert cfg.read_bytes() == before


def test_donor_without_a_readable_record_is_not_moved(pair, capsys):
    tmp_path, m = pair
    record = next((tmp_path / "donor" / SITE).glob("foo-2.0.dist-info")) / "RECORD"
    outside = tmp_path / "outside.csv"
    outside.write_text(record.read_text())
    record.unlink()
    record.symlink_to(outside)
    assert main(["plan", str(m), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["record-missing"]
    assert main(["apply", str(m), "--yes", "--force"]) == 0
    assert (tmp_path / "target" / SITE / "foo" / "gone.py").exists(), "the target's foo stays as it was"


def test_a_venv_whose_python_does_not_start_is_one_clear_error(pair, capsys):
    tmp_path, m = pair
    python = tmp_path / "target" / "bin" / "python"
    python.unlink()
    python.write_text("#!/bin/sh\necho 'error while loading shared libraries: libpython3.11.so.1.0' >&2\nexit 127\n")
    python.chmod(0o755)
    assert main(["plan", str(m)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"local:{tmp_path / 'target'}:" in out
    assert "error while loading shared libraries: libpython3.11.so.1.0" in out and "does not exist" not in out
    assert "Traceback" not in out


def test_a_binary_manifest_is_named_not_a_text_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe" + bytes(range(256)))
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.problems == ["(file): not a text file (byte 8 is not UTF-8); fix: give the manifest, a YAML "
                                   "text file (UTF-8), not a binary or another encoding"]
    path.write_text("version: 1\n")  # the text twin reads, and fails on what it lacks, not on its bytes
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert not any("not a text file" in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("document,words", [([], "the JSON document is a list"), ("plan", "the JSON document is a string"),
                                            (None, "the JSON document is null"),
                                            ({"schema": "other/1"}, "schema 'other/1', expected")])
def test_a_saved_plan_that_is_not_an_object_says_what_it_is(tmp_path, capsys, document, words):
    import json

    (tmp_path / "p.json").write_text(json.dumps(document))
    assert main(["apply", str(tmp_path / "p.json"), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path / 'p.json'}: not a transplant plan ({words}" in out, out
    assert "schema 'list'" not in out and "Traceback" not in out


def test_a_binary_saved_plan_is_named_not_a_text_file(tmp_path, capsys):
    (tmp_path / "p.json").write_bytes(b'{"schema": "transplant.plan/1", \xd0\xff}')
    assert main(["apply", str(tmp_path / "p.json"), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path / 'p.json'}: refusing the plan: not a text file (byte 32 is not UTF-8)" in out, out
    assert "codec" not in out


def test_a_saved_plan_given_to_plan_says_apply_takes_it(pair, capsys):
    tmp_path, m = pair
    assert main(["plan", str(m), "--out", str(tmp_path / "saved.json")]) == 0
    capsys.readouterr()
    assert main(["plan", str(tmp_path / "saved.json")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"(file): this is a saved plan (transplant.plan/1), not a manifest; fix: apply takes it (transplant apply " \
           f"{tmp_path / 'saved.json'}); plan and verify take the manifest it was planned from ({m})" in out, out
    assert "unknown key" not in out


def test_an_empty_overlay_says_empty(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\ndonor: {host: local, venv: /srv/d}\ntarget: {host: local, venv: /srv/t}\noverlay: []\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert any(p.startswith("overlay: expected a non-empty list of distribution names, globs or {closure: NAME}, "
                            "got an empty list;") for p in info.value.problems), info.value.problems


def test_ctrl_c_while_the_command_starts_is_one_line_not_a_traceback(monkeypatch, capsys):
    import transplant.cli.app as app

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "build_parser", interrupted)
    assert app.main(["plan", "m.yaml"]) == 130
    assert capsys.readouterr().err == "interrupted before the command began: nothing was changed\n"
