"""The operator's terminal: exit codes a script can use, a closed pipe, messages for the
usual mistakes. Local venvs built from real wheels; the CLI run as a real process where the
terminal's plumbing (pipes) matters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A donor with alpha 2.0 and a target with alpha 1.0 (a change to plan), and manifests."""
    base = tmp_path_factory.mktemp("terminal")
    wheels = base / "wheels"
    files = {f"alpha/m{i}.py": f"N = {i}\n" for i in range(40)}
    alpha2 = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", **files})
    alpha1 = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    donor = make_venv(base / "donor", [alpha2])
    target = make_venv(base / "target", [alpha1])
    same = make_venv(base / "same", [alpha2])

    def manifest(name: str, target_venv: Path, donor_host: str = "local") -> Path:
        m = base / f"{name}.yaml"
        m.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: {donor_host!r}, venv: {donor}}}
            target: {{host: local, venv: {target_venv}}}
            overlay: [alpha]
            """))
        return m

    return {"base": base, "donor": donor, "target": target, "same": same, "manifest": manifest}


def _run(*argv: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "transplant", *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, **kw)


def test_plan_with_changes_exits_0_and_2_only_when_asked(world, capsys):
    m = str(world["manifest"]("changes", world["target"]))
    assert main(["plan", m]) == 0, "changes are a successful plan: plan && apply must work"
    assert main(["plan", m, "--detailed-exitcode"]) == 2
    nothing = str(world["manifest"]("nothing", world["same"]))
    assert main(["plan", nothing, "--detailed-exitcode"]) == 0  # the twin: no change, 0 either way
    assert main(["plan", nothing]) == 0


def test_plan_into_a_closed_pipe_exits_0_quietly(world):
    m = str(world["manifest"]("pipe", world["target"]))
    # a reader that goes away at once: plan writes its table into a closed pipe
    done = subprocess.run(f"{sys.executable} -m transplant plan {m} | true; echo \"rc=${{PIPESTATUS[0]}}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "80"})
    assert "rc=0" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    whole = _run("plan", m)  # the twin: an open pipe gets the whole plan
    assert whole.returncode == 0 and "alpha" in whole.stdout, whole.stdout + whole.stderr


@pytest.mark.parametrize("host, said", [
    ("LOCAL", "did you mean 'local'"),
    ("local:/srv/venv", "the host is 'local' alone and the path goes in 'venv'"),
])
def test_host_mistakes_are_named(world, capsys, host, said):
    m = world["base"] / "mistake.yaml"
    m.write_text(f"version: 1\ndonor: {{host: {host!r}, venv: {world['donor']}}}\n"
                 f"target: {{host: local, venv: {world['target']}}}\noverlay: [alpha]\n")
    assert main(["plan", str(m)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert said in out and "bad port" not in out and "bad host name" not in out, out


@pytest.mark.parametrize("side", ["donor", "target"])
def test_a_refused_connection_names_the_side_and_what_to_try(world, capsys, side):
    # port 1 on a loopback address: nothing listens, the connection is refused at once
    hosts = {"donor": "local", "target": "local", side: "root@127.0.0.9:1"}
    m = world["base"] / f"refused-{side}.yaml"
    m.write_text(f"version: 1\ndonor: {{host: {hosts['donor']!r}, venv: {world['donor']}}}\n"
                 f"target: {{host: {hosts['target']!r}, venv: {world['target']}}}\noverlay: [alpha]\n")
    assert main(["plan", str(m)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: {side} root@127.0.0.9:1: cannot connect to port 1" in out, out
    assert "ssh -p 1 root@127.0.0.9 true" in out, out
    assert ("donor: {snapshot: ID}" in out) == (side == "donor"), out


def test_status_and_inventory_take_a_manifest(world, capsys):
    m = str(world["manifest"]("status", world["target"]))
    assert main(["status", m]) == 0
    assert f"local:{world['target']}: transplant has applied nothing here" in " ".join(capsys.readouterr().out.split())
    assert main(["inventory", m, "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in doc["distributions"]] == ["alpha"], doc["distributions"]
    assert main(["status", str(world["base"] / "no-such.yaml")]) == 64  # neither a file nor HOST:VENV


def test_verify_of_a_missing_venv_says_the_error_once(world, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    missing = world["base"] / "no-venv-here"
    assert main(["verify", f"local:{missing}", "--imports", "json"]) == 3
    out = capsys.readouterr().out
    assert out.count("does not exist or points to nothing") == 1, out
    assert main(["verify", f"local:{world['target']}", "--imports", "alpha"]) == 0  # the twin passes


def test_accept_with_dists_covers_an_overlay_entry_that_matches_nothing(world, capsys):
    base = world["base"]

    def plan(name: str, accept: str) -> tuple[int, dict]:
        m = base / f"{name}.yaml"
        m.write_text(f"version: 1\ndonor: {{host: local, venv: {world['donor']}}}\n"
                     f"target: {{host: local, venv: {world['target']}}}\noverlay: [alpha, ghost]\n{accept}")
        code = main(["plan", str(m), "--json"])
        import json
        return code, json.loads(capsys.readouterr().out)

    code, doc = plan("ghost", "")  # the twin: no accept, the error blocks
    [finding] = [f for f in doc["findings"] if f["code"] == "overlay-no-match"]
    assert code == 3 and finding["dists"] == ["ghost"], finding
    code, doc = plan("ghost-accepted", "accept: [{code: overlay-no-match, dists: [ghost], reason: dropped upstream}]\n")
    codes = {f["code"] for f in doc["findings"]}
    assert code == 0 and "accept-unused" not in codes, doc["findings"]


def test_history_and_status_count_the_same_paths(world, tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.setenv("COLUMNS", "300")
    venv = tmp_path / "applied"
    shutil.copytree(world["target"], venv, symlinks=True)
    m = str(world["manifest"]("counted", venv))
    assert main(["apply", m, "--yes"]) == 0
    capsys.readouterr()
    from transplant.apply import txn
    from transplant.hosts.host import LocalHost
    [t] = txn.history(LocalHost(), str(venv))["transactions"]
    assert main(["history", m]) == 0
    history = capsys.readouterr().out
    assert main(["status", m]) == 0
    status = capsys.readouterr().out
    row = [line for line in history.splitlines() if t["id"] in line][0]
    assert f" {t['paths']} " in row + " " and "paths" in history, history  # off a terminal: no padding after it
    assert f" {t['paths']} " in [line for line in status.splitlines() if t["id"] in line][0] + " ", status
    said = " ".join(status.split())
    assert f"of the {t['paths']} applied paths are not compared" in said, said  # the bytecode, said in paths too


def test_a_snapshot_donor_may_be_the_store_folder_snapshot_out_wrote(world, tmp_path, capsys):
    m = str(world["manifest"]("snap-src", world["target"]))
    store = tmp_path / "snaps"
    assert main(["snapshot", m, "--out", str(store)]) == 0
    [index] = list((store / "index").glob("*.json"))
    by_store = tmp_path / "by-store.yaml"
    by_store.write_text(f"version: 1\ndonor: {{snapshot: {store}}}\ntarget: {{host: local, venv: {world['target']}}}\n"
                        f"overlay: [alpha]\n")
    capsys.readouterr()
    assert main(["plan", str(by_store)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"donor source: snapshot {index.stem}" in said
    # why this source, without parentheses nested in the line's own
    assert "(the manifest's donor, a snapshot)" in said and "(a snapshot))" not in said, said
    assert main(["snapshot", m, "--out", str(store)]) == 0  # the same content again: the same snapshot
    assert [p.stem for p in (store / "index").glob("*.json")] == [index.stem]
    other = tmp_path / "other.yaml"  # another manifest (another content): a second snapshot
    other.write_text(Path(m).read_text() + "remove: [no-such-dist]\n")
    assert main(["snapshot", str(other), "--out", str(store)]) == 0  # now the folder is ambiguous
    ids = sorted(p.stem for p in (store / "index").glob("*.json"))
    assert len(ids) == 2
    capsys.readouterr()
    assert main(["plan", str(by_store)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"holds 2 snapshots ({', '.join(ids)}); say which" in out and "Is a directory" not in out, out


@pytest.mark.parametrize("columns", ["80", "160"])
def test_plan_output_never_breaks_a_version_name_or_command(world, tmp_path, capsys, monkeypatch, columns):
    import shutil

    from transplant.lab.wheels import build_wheel, make_venv

    monkeypatch.setenv("COLUMNS", columns)
    wheels = tmp_path / "w"
    donor = make_venv(tmp_path / "d", [build_wheel(wheels, "flashinfer-jit-cache", "0.6.3+cu128",
                                                   {"flashinfer_jit_cache/__init__.py": "V = 1\n"})])
    target = make_venv(tmp_path / "t", [build_wheel(wheels / "o", "flashinfer-jit-cache", "0.5.0+cu126",
                                                    {"flashinfer_jit_cache/__init__.py": "V = 0\n"})])
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                 f"overlay: [flashinfer-jit-cache, ghost-distribution-of-a-long-name]\n")
    assert main(["plan", str(m)]) == 3
    out = capsys.readouterr().out
    lines = out.splitlines()
    for token in ("flashinfer-jit-cache", "0.6.3+cu128", "0.5.0+cu126", "ghost-distribution-of-a-long-name"):
        assert any(token in line for line in lines), (token, out)
    fix = f"remove 'ghost-distribution-of-a-long-name' from overlay in {m}, or fix its spelling"
    assert any(fix in line for line in lines), out  # the fix is one whole line, pasteable
    assert ("~ flashinfer-jit-cache 0.5.0+cu126 -> 0.6.3+cu128" in out) == (columns == "80"), out
    shutil.rmtree(tmp_path / "d")


def test_fixes_are_said_once_and_manifest_edits_gathered():
    from transplant.core.plan import Finding
    from transplant.cli.planview import manifest_snippet, once

    same = "a CUDA 13 environment does not load it"
    findings = [
        Finding(code="cuda-major-mismatch", severity="error", dists=("sgl-kernel",), message="; ".join([same] * 20),
                hint="add to remove: in m.yaml: [nvidia-*-cu12, sgl-kernel]"),
        Finding(code="libtorch-abi", severity="error", dists=("sgl-kernel", "torch"), message="needs symbols",
                hint="add 'sgl-kernel' to remove: in m.yaml (the donor runs torch 2.14.1 without it)"),
        Finding(code="requirement-unmet", severity="error", dists=("sglang", "cuda-tile"), message="requires",
                hint="add 'cuda-tile' to overlay (the donor has 1.7.0); add 'nccl4py' to overlay (the donor has 0.6.0)"),
        Finding(code="driver-too-old", severity="error", dists=("torch",), message="old driver",
                hint="upgrade the driver to 580.65.06 or newer"),
        Finding(code="script-prefix", severity="info", dists=("torch",), message="m", hint="nothing to do: apply"),
    ]
    assert once(findings[0].message) == same
    adds, other = manifest_snippet(findings)
    assert adds == {"remove": ["nvidia-*-cu12", "sgl-kernel"], "overlay": ["cuda-tile", "nccl4py"]}
    assert other == [("upgrade the driver to 580.65.06 or newer", ["driver-too-old"])]
    # the hint of the real reverse plan (tests/golden/real-reverse.json): one list, then named additions
    real = Finding(code="cuda-major-mismatch", severity="error", dists=("nvidia-cublas",), message="m",
                   hint="add to remove: in real.yaml: [nvidia-*-cu13, nvidia-cublas, sglang-kernel] (a CUDA 12 "
                        "environment does not load them, and the donor runs without them); add to overlay in "
                        "real.yaml: torchaudio (the donor has 2.9.1), torchcodec (the donor has 0.8.0)")
    gone = [Finding(code="overlay-target-only", severity="info", dists=(name,), message=name,
                    hint=f"if it should go: /v/bin/python -m pip uninstall {name}") for name in ("a-x", "b-y")]
    assert manifest_snippet(gone) == ({}, [("if it should go: /v/bin/python -m pip uninstall a-x b-y",
                                           ["overlay-target-only"])])
    assert manifest_snippet([real]) == ({"remove": ["nvidia-*-cu13", "nvidia-cublas", "sglang-kernel"],
                                         "overlay": ["torchaudio", "torchcodec"]}, [])


@pytest.mark.parametrize("columns", ["80", "120"])
def test_ids_are_never_cut_in_snapshot_list_history_and_status(world, tmp_path, capsys, monkeypatch, columns):
    import shutil

    monkeypatch.setenv("COLUMNS", columns)
    m = str(world["manifest"]("ids-src", world["target"]))
    store = tmp_path / "a-store-folder-with-a-rather-long-name-to-squeeze-the-table"
    assert main(["snapshot", m, "--out", str(store)]) == 0
    capsys.readouterr()
    assert main(["snapshot", "--list", "--out", str(store)]) == 0
    out = capsys.readouterr().out
    [snap_id] = [p.stem for p in (store / "index").glob("*.json")]
    assert any(snap_id in line for line in out.splitlines()) and "…" not in out and "..." not in out, out
    assert f"from local:{world['donor']}: alpha" in " ".join(out.split()), out
    venv = tmp_path / "a-venv-with-a-long-name-so-that-the-source-column-is-squeezed-hard"
    shutil.copytree(world["target"], venv, symlinks=True)
    m2 = str(world["manifest"]("ids", venv))
    assert main(["apply", m2, "--yes"]) == 0
    capsys.readouterr()
    from transplant.apply import txn
    from transplant.hosts.host import LocalHost
    [t] = txn.history(LocalHost(), str(venv))["transactions"]
    for argv in (["history", m2], ["status", m2]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert any(t["id"] in line for line in out.splitlines()) and "…" not in out, (argv, out)


def test_off_a_terminal_long_steps_print_plain_lines(monkeypatch):
    import io
    import time as clock

    from rich.console import Console

    from transplant.cli import progress

    monkeypatch.setattr(progress, "EVERY", 0.05)
    out = io.StringIO()
    console = Console(file=out, width=80)  # a file: not a terminal
    with progress.step(console, "building the venvs", count=lambda: "1 of 2 built") as update:
        update("pip install torch")
        clock.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "building the venvs ..." and lines[-1].startswith("building the venvs: done in ")
    assert any(line.startswith("building the venvs: pip install torch, 1 of 2 built, ") for line in lines), lines
    # the apply bar off a terminal: start, periodic counts on the plan's fixed total, the commit and the check
    out = io.StringIO()
    with progress.ByteProgress(Console(file=out, width=80), 1000, {"files": 900, "patches": 100}) as bar:
        clock.sleep(0.06)
        bar.report("files", 50, 100)   # rsync's own total, still growing while it scans
        clock.sleep(0.06)
        bar.report("files", 100, 200)
        bar.report("commit", 0, 0)
        bar.report("check", 0, 0)
    text = out.getvalue()
    assert "copying 1000 B ..." in text and "copying: 45% (450 B of 1000 B)" in text, text
    assert "committing: renaming the staged files into place ..." in text and "checking every path" in text, text


def test_apply_through_a_pipe_shows_its_steps(world, tmp_path):
    import shutil

    venv = tmp_path / "piped"
    shutil.copytree(world["target"], venv, symlinks=True)
    m = str(world["manifest"]("piped", venv))
    done = _run("apply", m, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("copying ", "committing: renaming the staged files into place ...",
                 "checking every path against the plan ..."):
        assert line in done.stdout, done.stdout


def test_manifest_ssh_config_is_read_relative_to_the_manifest(tmp_path):
    from transplant.cli.warm import ssh_options as _ssh_options
    from transplant.controller.manifest_file import load_manifest

    m = tmp_path / "m.yaml"
    m.write_text("version: 1\ndonor: {host: gpu-a, venv: /v}\ntarget: {host: gpu-b, venv: /v}\noverlay: [x]\n"
                 "ssh: {config: conf/ssh_config}\n")
    assert _ssh_options(load_manifest(str(m))).config == tmp_path / "conf" / "ssh_config"
    m.write_text("version: 1\ndonor: {host: gpu-a, venv: /v}\ntarget: {host: gpu-b, venv: /v}\noverlay: [x]\n")
    assert _ssh_options(load_manifest(str(m))).config is None  # then $TRANSPLANT_SSH_CONFIG, else ~/.ssh/config


def test_an_error_hint_is_one_line_at_80_columns(world, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    missing = world["base"] / "a-missing-venv-with-a-name-long-enough-to-need-wrapping"
    assert main(["status", f"local:{missing}"]) == 1
    out = capsys.readouterr().out
    [hint] = [line for line in out.splitlines() if line.startswith("hint: ")]
    assert f"python3 -m venv --upgrade {missing})" in hint, out  # the command is whole on its line


def test_a_long_patch_name_prints_the_changes_as_lines_rather_than_squeeze_why():
    import io

    from rich.console import Console

    from transplant.cli.planview import print_plan_view, table_fits
    from transplant.core.plan import Change, FileCopy, Plan, Side

    side = Side(label="local:/v", host="local", venv="/v", fingerprint="f", hostname="h")
    why = "the file differs from the donor's; the donor's bytes are copied"
    short = Change(kind="distribution", name="sglang", action="upgrade", reason=why, from_version="0.5.9",
                   to_version="0.5.23", copy=(FileCopy(path="lib/x.py", size=10, hash="sha256=a"),))
    long_name = "lib/python3.11/site-packages/sglang/srt/speculative/dflash_worker_with_ddtree_verification.py"
    patch = Change(kind="patch", name=long_name, action="replace", reason=why,
                   copy=(FileCopy(path=long_name, size=10, hash="sha256=b", source="patch"),))
    for changes, fits in (((short,), True), ((short, patch), False)):
        plan = Plan(manifest="m.yaml", donor=side, target=side, changes=changes, findings=())
        assert table_fits(plan, 120) is fits
        out = io.StringIO()
        print_plan_view(Console(file=out, width=120), plan)
        text = out.getvalue()
        if fits:
            assert "┃ why" in text and "~ sglang 0.5.9 -> 0.5.23" not in text, text
        else:  # as lines, nothing cut: the whole name and versions on their lines
            assert "~ sglang 0.5.9 -> 0.5.23" in text and "┃" not in text, text
            assert any(long_name.rsplit("site-packages/", 1)[-1] in line for line in text.splitlines()), text
        assert all(len(line) <= 120 for line in text.splitlines()), text


@pytest.mark.parametrize("terminal", [True, False])
def test_the_demo_says_it_removes_its_work_folder_before_it_starts(tmp_path, terminal):
    import io

    from rich.console import Console

    from transplant.cli.commands.demo import remove_work

    work = tmp_path / "transplant-demo-x"
    (work / "lab" / "target").mkdir(parents=True)
    (work / "lab" / "target" / "f").write_text("x")
    out = io.StringIO()
    remove_work(Console(file=out, width=300, force_terminal=terminal), work)
    assert not work.exists()
    first = out.getvalue().lstrip().splitlines()[0]
    assert first == (f"removing the demo's work folder {work} (the three hosts' venvs: can take about a minute) ..."), \
        out.getvalue()
    outside = tmp_path / "kept"  # the twin: nothing beside the work folder is touched
    outside.mkdir()
    remove_work(Console(file=io.StringIO(), force_terminal=terminal), tmp_path / "absent")
    assert outside.is_dir()
