"""The plan memo: a plan with nothing changed on either venv since the last one reads
nothing again and prints the same plan; any change the plan would see makes it a full plan again.

Real local venvs built from real wheels, the donor and the target ``local`` hosts; which host
scripts ran is told by the scripts' own log (``TRANSPLANT_TEST_SCRIPT_LOG``), not by timing.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv

SITE = "lib/python3.11/site-packages"


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A donor (foo 2.0, bar 1.0), a target (foo 1.0, bar 1.0), a manifest overlaying foo with a
    patch file; the state folder and the scripts' log inside tmp_path. Waits until the files
    are older than the probe's racy window (2 s), as a venv is between two plans."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TRANSPLANT_TEST_SCRIPT_LOG", str(tmp_path / "scripts.log"))
    monkeypatch.delenv("TRANSPLANT_PLAN_MEMO", raising=False)
    wheels = tmp_path / "wheels"
    bar = build_wheel(wheels / "bar", "bar", "1.0", {"bar/__init__.py": "B = 1\n"})
    make_venv(tmp_path / "donor", [build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"}), bar])
    make_venv(tmp_path / "target", [build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n"}), bar])
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "extra.py").write_text("X = 1\n")
    (tmp_path / "m.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {tmp_path / 'donor'}}}
        target: {{host: local, venv: {tmp_path / 'target'}}}
        overlay: [foo]
        patches:
          - {{source: patches/extra.py, dest: foo/extra.py}}
        """))
    time.sleep(2.1)
    return tmp_path


def plan(root: Path, capsys) -> tuple[dict, str, list[str]]:
    """``transplant plan --json``: (its JSON, its stderr, the host scripts it ran: ``probe`` / ``fingerprint``)."""
    log = root / "scripts.log"
    log.unlink(missing_ok=True)
    code = main(["plan", str(root / "m.yaml"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    ran = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
    return out, err, [r for r in ran if r in ("probe", "fingerprint")]


def memo_hit(ran: list[str]) -> bool:
    return "probe" not in ran and ran.count("fingerprint") == 2


def test_nothing_changed_the_second_plan_reads_nothing_and_prints_the_same_json(pair, capsys):
    first, err, ran = plan(pair, capsys)
    assert ran.count("probe") == 2 and "nothing changed" not in err
    second, err, ran = plan(pair, capsys)
    assert memo_hit(ran), ran
    assert "nothing changed on either venv since the plan of" in err
    assert second == first, "the memo's --json output is byte-identical to the full plan's"
    assert json.loads(second)["changes"], "the plan has foo's change"


def test_without_the_memo_every_plan_is_full(pair, capsys, monkeypatch):
    plan(pair, capsys)
    monkeypatch.setenv("TRANSPLANT_PLAN_MEMO", "0")
    _, err, ran = plan(pair, capsys)
    assert ran.count("probe") == 2 and "fingerprint" not in ran and "nothing changed" not in err


@pytest.mark.parametrize("value", ["off", "false", ""])
def test_a_memo_setting_that_is_not_0_or_1_is_refused_before_anything_is_read(pair, capsys, monkeypatch, value):
    monkeypatch.setenv("TRANSPLANT_PLAN_MEMO", value)
    assert main(["plan", str(pair / "m.yaml"), "--json"]) == 1
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    assert f"TRANSPLANT_PLAN_MEMO={value!r}: not 0 or 1" in out and "TRANSPLANT_PLAN_MEMO=0 plans afresh" in out
    assert "donor source" not in captured.out + captured.err, "refused before any host is opened or named"
    # apply plans with the memo too: the same refusal, before the donor is named
    assert main(["apply", str(pair / "m.yaml"), "--yes"]) == 1
    captured = capsys.readouterr()
    assert f"TRANSPLANT_PLAN_MEMO={value!r}: not 0 or 1" in " ".join(captured.out.split())
    assert "donor source" not in captured.out + captured.err


def test_a_plan_right_after_a_write_is_not_kept(pair, capsys):
    (pair / "target" / SITE / "foo" / "__init__.py").write_text("V = 'new'\n")
    plan(pair, capsys)  # racy: a file written within the clock window of the probe
    _, _, ran = plan(pair, capsys)
    assert ran.count("probe") == 2, "the racily clean plan was not kept"


def _record(venv: Path, name: str) -> Path:
    return next((venv / SITE).glob(f"{name}-*.dist-info")) / "RECORD"


def _same_size_mtime_edit(path: Path) -> None:
    st = path.stat()
    data = path.read_bytes()
    changed = data.replace(b"foo/__init__.py", b"foo/__init__.pz", 1)
    assert changed != data and len(changed) == len(data)
    path.write_bytes(changed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def _add_to_site(root: Path) -> None:
    (root / "target" / SITE / "stray.pth").write_text("import os\n")


def _remove_dist_info(root: Path) -> None:
    import shutil

    shutil.rmtree(_record(root / "target", "bar").parent)


def _patch_changed(root: Path) -> None:
    (root / "patches" / "extra.py").write_text("X = 2\n")


def _manifest_changed(root: Path) -> None:
    m = root / "m.yaml"
    m.write_text(m.read_text().replace("overlay: [foo]", "overlay: [foo, bar]"))


def _mode_changed(root: Path) -> None:
    (root / "target" / SITE / "bar" / "__init__.py").chmod(0o600)


CHANGES = {
    "record-edited-same-size-and-mtime": lambda root: _same_size_mtime_edit(_record(root / "target", "foo")),
    "donor-record-edited-same-size-and-mtime": lambda root: _same_size_mtime_edit(_record(root / "donor", "foo")),
    "file-added-to-site-packages": _add_to_site,
    "dist-info-removed": _remove_dist_info,
    "patch-file-changed": _patch_changed,
    "manifest-changed": _manifest_changed,
    "target-file-mode-changed": _mode_changed,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_makes_the_next_plan_a_full_one_that_sees_it(pair, capsys, change):
    first, _, _ = plan(pair, capsys)
    assert memo_hit(plan(pair, capsys)[2]), "the memo is kept and used while nothing changes"
    CHANGES[change](pair)
    after, err, ran = plan(pair, capsys)
    assert not memo_hit(ran) and "nothing changed" not in err
    if change in ("patch-file-changed", "manifest-changed"):
        assert ran[:2] == ["probe", "probe"], "another key: no memo to check, a full plan at once"
    else:
        assert ran[:4] == ["fingerprint", "fingerprint", "probe", "probe"], "asked, then a full plan"
    assert after != first, "the full plan sees the change"


def test_a_snapshot_donor_is_keyed_by_its_id_and_only_the_target_is_asked(pair, capsys):
    assert main(["snapshot", str(pair / "m.yaml"), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)["id"]
    m = pair / "m.yaml"
    m.write_text(m.read_text().replace(f"{{host: local, venv: {pair / 'donor'}}}", f"{{snapshot: {snap}}}"))
    first, _, ran = plan(pair, capsys)
    assert ran.count("probe") == 1, ran  # the target's: the snapshot is read, not probed
    second, err, ran = plan(pair, capsys)
    assert ran == ["fingerprint"] and "nothing changed on either venv" in err
    assert second == first


def test_a_plan_of_thousands_of_files_is_kept_compressed_and_recalled(tmp_path, capsys, monkeypatch):
    """A plan copying 6,000 files (over the 5,000 the memo once refused to keep) is kept, as zlib'd
    JSON written in one walk, and the next plan reuses it: the same --json, no plan probes."""
    import zlib

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TRANSPLANT_TEST_SCRIPT_LOG", str(tmp_path / "scripts.log"))
    monkeypatch.delenv("TRANSPLANT_PLAN_MEMO", raising=False)
    wheels = tmp_path / "wheels"
    files = {f"big/m{i:04}.py": f"N = {i}\n" for i in range(6000)}
    make_venv(tmp_path / "donor", [build_wheel(wheels, "big", "2.0", {"big/__init__.py": "", **files})])
    make_venv(tmp_path / "target", [build_wheel(wheels / "1", "big", "1.0", {"big/__init__.py": "V = 1\n"})])
    (tmp_path / "m.yaml").write_text(f"version: 1\ndonor: {{host: local, venv: {tmp_path / 'donor'}}}\n"
                                     f"target: {{host: local, venv: {tmp_path / 'target'}}}\noverlay: [big]\n")
    time.sleep(2.1)
    first, _, ran = plan(tmp_path, capsys)
    assert ran.count("probe") == 2 and len(json.loads(first)["changes"][0]["copy"]) > 6000
    kept = list((tmp_path / "state" / "plan-memo").iterdir())
    assert [k.suffix for k in kept] == [".memo"], kept
    memo = json.loads(zlib.decompress(kept[0].read_bytes()))
    assert memo["schema"] == "transplant.plan-memo/3" and len(memo["plan"]["changes"][0]["copy"]) > 6000
    second, err, ran = plan(tmp_path, capsys)
    assert memo_hit(ran), ran
    assert "nothing changed on either venv since the plan of" in err and second == first


def test_an_unreadable_memo_means_a_full_plan(pair, capsys):
    plan(pair, capsys)
    (kept,) = (pair / "state" / "plan-memo").iterdir()
    kept.write_bytes(b"{not zlib}")
    _, err, ran = plan(pair, capsys)
    assert ran.count("probe") == 2 and "nothing changed" not in err
    assert memo_hit(plan(pair, capsys)[2]), "the full plan kept a readable memo again"


def test_old_memos_are_pruned_and_nothing_else(pair, capsys):
    import transplant.pipeline.memo as memo

    folder = pair / "state" / "plan-memo"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{i:032x}.{'json' if i % 2 else 'memo'}" for i in range(memo.MAX_MEMOS + 3)]  # the first form too
    for i, name in enumerate(names):
        (folder / name).write_text("{}")
        os.utime(folder / name, (1000 + i, 1000 + i))
    for other in ("notes.json", "saved-plan.json", f"{'a' * 32}.memo.77.tmp"):  # a user's files; a fresh leftover
        (folder / other).write_text("mine")
        os.utime(folder / other, (900, 900) if other.endswith(".tmp") else (500, 500))
    (folder / f"{'b' * 32}.memo.78.tmp").write_text("left by a killed plan")  # written just now: kept
    plan(pair, capsys)
    left = {p.name for p in folder.iterdir()}
    assert {"notes.json", "saved-plan.json", f"{'b' * 32}.memo.78.tmp"} <= left, "no other name is pruned"
    assert f"{'a' * 32}.memo.77.tmp" not in left, "an old leftover of a killed plan goes"
    kept = {n for n in left if memo._MEMO_NAME.match(n) and not n.endswith(".tmp")}
    assert len(kept) == memo.MAX_MEMOS and names[0] not in kept and names[1] not in kept and names[-1] in kept
    assert memo_hit(plan(pair, capsys)[2]), "the newest (this plan's) was kept"


@pytest.mark.parametrize("how", ["folder-is-a-file", "memo-is-a-fifo", "inflates-too-far", "time-out-of-range",
                                 "folder-is-a-symlink"])
def test_a_memo_that_cannot_be_used_or_kept_leaves_a_full_plan(pair, capsys, how, tmp_path):
    """Whatever lies where the memos go, plan prints the full plan: no traceback, no hang, nothing
    written or removed outside the state folder."""
    import zlib

    import transplant.pipeline.memo as memo

    fresh, _, _ = plan(pair, capsys)
    folder = pair / "state" / "plan-memo"
    (kept,) = folder.iterdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.json").write_text("mine")
    if how == "folder-is-a-file":
        kept.unlink()
        folder.rmdir()
        folder.write_text("not a folder")
    elif how == "memo-is-a-fifo":
        kept.unlink()
        os.mkfifo(kept)
    elif how == "inflates-too-far":
        kept.write_bytes(zlib.compress(b" " * (memo.MAX_MEMO_TEXT + 1), 9))
    elif how == "time-out-of-range":
        document = json.loads(zlib.decompress(kept.read_bytes()))
        document["planned_at"] = 1e300
        kept.write_bytes(zlib.compress(json.dumps(document).encode()))
    else:
        for old in folder.iterdir():
            old.unlink()
        folder.rmdir()
        folder.symlink_to(outside)
        for i in range(memo.MAX_MEMOS + 2):
            (outside / f"{i:032x}.json").write_text("{}")
    again, err, ran = plan(pair, capsys)
    assert again == fresh and ran.count("probe") == 2 and "Traceback" not in err
    assert (outside / "keep.json").read_text() == "mine"
    if how == "folder-is-a-symlink":
        assert len(list(outside.iterdir())) == memo.MAX_MEMOS + 3, "nothing pruned or written through the link"


def test_over_ssh_the_memo_is_used_until_the_target_changes(lab, tmp_path, capsys, monkeypatch):
    """Both hosts over loopback SSH: the fingerprints travel as the probe's requests do."""
    import sys

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("TRANSPLANT_PLAN_MEMO", raising=False)
    venv, python = "/srv/memo-venv", getattr(sys, "_base_executable", sys.executable)
    wheels = tmp_path / "wheels"
    sets = {"donor": [build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"})],
            "target": [build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n"})]}
    for name, wheel_set in sets.items():
        host = lab.hosts[name]
        host.run(["rm", "-rf", venv])
        host.run([python, "-m", "venv", "--without-pip", venv])
        host.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                  "--target", f"{venv}/{SITE}", *map(str, wheel_set)])
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{lab.hosts['donor'].spec}", venv: {venv}}}
        target: {{host: "{lab.hosts['target'].spec}", venv: {venv}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}
        overlay: [foo]
        """))
    time.sleep(2.1)  # older than the probe's racy window

    def run() -> tuple[str, str]:
        assert main(["plan", str(m), "--json"]) == 0
        return capsys.readouterr()

    first, err = run()
    assert "nothing changed" not in err
    second, err = run()
    assert "nothing changed on either venv since the plan of" in err and second == first
    lab.hosts["target"].path(f"{venv}/{SITE}/foo/__init__.py").chmod(0o600)
    third, err = run()
    assert "nothing changed" not in err and third != first


def _apply(root: Path, capsys) -> tuple[str, list[str]]:
    """``transplant apply --yes``: (its output, the host scripts it ran: ``probe`` / ``fingerprint``)."""
    log = root / "scripts.log"
    log.unlink(missing_ok=True)
    code = main(["apply", str(root / "m.yaml"), "--yes"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    ran = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
    return out + err, [r for r in ran if r in ("probe", "fingerprint")]


def test_apply_after_a_plan_reuses_it_when_nothing_changed_and_keeps_none(pair, capsys):
    plan(pair, capsys)
    out, ran = _apply(pair, capsys)
    # both fingerprints, then the stale-plan check under the lock asks the target's fingerprint
    # again: no probe reads either venv
    assert ran.count("fingerprint") == 3 and ran.count("probe") == 0, ran
    assert "nothing changed on either venv since the plan of" in " ".join(out.split())
    assert "planning afresh" not in out
    site = pair / "target" / SITE
    assert (site / "foo" / "__init__.py").read_text() == "V = 2\n" and (site / "foo" / "extra.py").exists()
    # the kept plan was of the target before this apply: removed, so the next plan asks no fingerprint first
    assert not list((pair / "state" / "plan-memo").glob("*.memo")), "the stale memo was removed"
    _, err, ran = plan(pair, capsys)
    assert ran == ["probe", "probe"] and "nothing changed" not in err, (ran, err)


def _changed_after_recall(monkeypatch, change) -> None:
    """Run ``change`` once apply has taken the kept plan, before it locks the target."""
    from transplant.cli.session import Session

    real = Session.plan

    def then_changed(self, **kwargs):
        plan = real(self, **kwargs)
        change()
        return plan

    monkeypatch.setattr(Session, "plan", then_changed)


def test_a_kept_plan_whose_target_changed_before_the_lock_is_refused_as_stale(pair, capsys, monkeypatch):
    plan(pair, capsys)
    edited = pair / "target" / SITE / "bar" / "__init__.py"
    _changed_after_recall(monkeypatch, lambda: edited.write_text("B = 'edited'\n"))
    log = pair / "scripts.log"
    log.unlink(missing_ok=True)
    assert main(["apply", str(pair / "m.yaml"), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing changed on either venv since the plan of" in out, "the kept plan was taken"
    assert "refusing a stale plan: the target changed since the plan was made" in out, out
    ran = [line.split()[0] for line in log.read_text().splitlines()]
    assert ran.count("fingerprint") == 3 and ran.count("probe") == 1, "the fingerprint differed: the full check"
    assert edited.read_text() == "B = 'edited'\n"
    assert (pair / "target" / SITE / "foo" / "__init__.py").read_text() == "V = 1\n", "nothing was applied"


def test_a_kept_plan_whose_target_only_had_a_file_touched_is_applied_after_the_full_check(pair, capsys, monkeypatch):
    plan(pair, capsys)
    touched = pair / "target" / SITE / "bar" / "__init__.py"
    _changed_after_recall(monkeypatch, lambda: os.utime(touched, (1_000_000_000, 1_000_000_000)))
    out, ran = _apply(pair, capsys)
    assert ran.count("fingerprint") == 3 and ran.count("probe") == 1, ran  # differed; the full probe agreed
    assert (pair / "target" / SITE / "foo" / "__init__.py").read_text() == "V = 2\n"


def test_apply_after_a_plan_plans_afresh_when_the_donor_changed(pair, capsys):
    plan(pair, capsys)
    (pair / "donor" / SITE / "foo" / "__init__.py").write_text("V = 3\n")
    out, ran = _apply(pair, capsys)
    # both fingerprints (the donor's differs), then both plan probes and the stale-plan probe
    assert ran.count("fingerprint") == 2 and ran.count("probe") == 3, ran
    assert "nothing changed on either venv" not in " ".join(out.split())
    assert "planning afresh: the donor changed since the last plan" in " ".join(out.split())
    assert (pair / "target" / SITE / "foo" / "__init__.py").read_text() == "V = 3\n"


def test_apply_says_in_one_line_why_it_plans_afresh(pair, capsys, monkeypatch):
    out, _ = _apply(pair, capsys)  # no plan before it
    said = " ".join(out.split())
    assert said.count("planning afresh: ") == 1 and "planning afresh: no plan kept for this manifest" in said, said
    time.sleep(2.1)  # past the probe's racy window since apply wrote the target: this plan is kept
    plan(pair, capsys)
    (pair / "target" / SITE / "bar" / "__init__.py").write_text("B = 2\n")  # then the target changes
    out, _ = _apply(pair, capsys)
    assert "planning afresh: the target changed since the last plan" in " ".join(out.split()), out
    monkeypatch.setenv("TRANSPLANT_PLAN_MEMO", "0")
    out, _ = _apply(pair, capsys)
    assert "planning afresh: TRANSPLANT_PLAN_MEMO=0" in " ".join(out.split()), out
def _started_ahead(monkeypatch) -> list:
    """Spy on :func:`transplant.hosts.probing.prestart` (it still runs): the processes a command
    started ahead, as ``(venv, Popen)``."""
    from transplant.hosts import probing

    started: list = []
    real = probing.prestart

    def spy(host, venv, script, args=(), **kw):
        waiting = real(host, venv, script, args, **kw)
        if waiting is not None:
            started.append((venv, waiting._proc))
        return waiting

    monkeypatch.setattr(probing, "prestart", spy)
    return started


def test_a_local_plan_starts_both_probes_ahead_and_the_fingerprints_ask_them(pair, capsys, monkeypatch):
    """Issue 16: each side's probe starts while the plan's modules import; the memo's fingerprints
    (and, on a miss, the plan's probes) ask those processes instead of starting their own."""
    first, _, ran = plan(pair, capsys)
    started = _started_ahead(monkeypatch)
    second, err, ran = plan(pair, capsys)
    assert memo_hit(ran) and second == first, (ran, err)
    assert sorted(venv for venv, _ in started) == sorted([str(pair / "donor"), str(pair / "target")])
    assert all(proc.returncode == 0 for _, proc in started), "each answered a fingerprint (not ended unasked)"
    assert len(ran) == 2, "no process besides those two"
    started.clear()
    (pair / "target" / SITE / "bar" / "__init__.py").write_text("B = 2\n")  # a miss: a full plan follows
    _, err, ran = plan(pair, capsys)
    assert ran.count("fingerprint") == 2 and ran.count("probe") == 2, ran
    assert len(started) == 2 and all(proc.returncode == 0 for _, proc in started)


def test_a_plan_that_ends_before_asking_ends_the_probes_started_ahead(pair, capsys, monkeypatch):
    """The twin: a plan refused before it asks (``--out`` inside the target venv) leaves no
    process behind, and those started ahead read nothing of the venvs."""
    started = _started_ahead(monkeypatch)
    (pair / "scripts.log").unlink(missing_ok=True)
    code = main(["plan", str(pair / "m.yaml"), "--out", str(pair / "target" / "plan.json")])
    said = "".join(capsys.readouterr())
    assert code != 0 and "plan.json" in said, said
    assert not (pair / "target" / "plan.json").exists()
    assert len(started) == 2
    assert all(proc.returncode not in (None, 0) for _, proc in started), [p.returncode for _, p in started]
    assert not (pair / "scripts.log").exists(), "none of them read a venv"


def test_a_saved_plan_of_a_manifest_named_relatively_applies_with_findings_that_name_it(pair, capsys, monkeypatch):
    """A finding's hint names the manifest; the saved plan names it by its absolute path, and apply
    plans again from there: planned from ``m.yaml`` in the current folder, the hints said
    ``m.yaml`` and apply refused every such plan as "not what the manifest gives now"."""
    monkeypatch.chdir(pair)
    text = (pair / "m.yaml").read_text().replace("overlay: [foo]", "overlay: [foo, ghost-of-a-name]")
    (pair / "m.yaml").write_text(text)  # an overlay entry that matches nothing: a finding naming the manifest
    assert main(["plan", "m.yaml", "--out", "p.json"]) == 3
    capsys.readouterr()
    saved = json.loads((pair / "p.json").read_text())
    assert any(str(pair / "m.yaml") in f["hint"] for f in saved["findings"]), saved["findings"]
    code = main(["apply", "p.json", "--yes"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3 and "apply refused" in out and "not what the manifest gives now" not in out, out


def test_the_plan_command_starts_its_probes_before_loading_rich_or_the_planner():
    """What ``transplant plan MANIFEST`` loads before each side's probe starts
    (:func:`transplant.cli.warm.connect_early`): not rich (a noticeable part of a no-op plan's
    start), the pipeline or the planner; each loads after the probes run."""
    from loading import loaded_after

    early = ["transplant.cli.app", "transplant.cli.warm", "transplant.controller.manifest_file", "transplant.hosts.early",
             "transplant.hosts.probing", "transplant.errors"]
    heavy = ["rich", "rich.console", "transplant.pipeline", "transplant.core.planner", "transplant.cli.render"]
    assert loaded_after(early, heavy) == [], "loaded before the plan's probes start"
