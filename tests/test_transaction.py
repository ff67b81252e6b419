"""apply is a transaction: crashes at random points (SIGKILL of the real processes), locks,
resume, rollback, history. Local venvs built from real wheels; the venv state folder is
``<venv>/.transplant``."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from transplant.apply import txn
from transplant.cli.app import main
from transplant.hosts.host import LocalHost
from transplant.lab.wheels import build_wheel, make_venv

SITE = "lib/python3.11/site-packages"
SEED = 20261130
ROOT = Path(__file__).resolve().parent.parent


def snapshot(venv: Path) -> dict[str, tuple]:
    """Every file and symlink of a venv but transplant's state and bytecode: path -> (bytes, mode) or link."""
    out = {}
    for path in sorted(venv.rglob("*")):
        rel = str(path.relative_to(venv))
        if rel.startswith(".transplant") or "__pycache__" in rel:
            continue
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_file():
            out[rel] = (path.read_bytes(), path.stat().st_mode & 0o7777)
        elif path.is_dir():
            out[rel] = ("dir",)  # an empty folder left behind is an importable namespace package
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Pristine donor and target venvs, the manifest maker, and the target's state before and after."""
    base = tmp_path_factory.mktemp("txn")
    wheels = base / "wheels"
    sub_new = {f"alpha/sub/m{i}.py": f"N = {i}\n" for i in range(20)}
    sub_old = {f"alpha/sub/m{i}.py": f"O = {i}\n" for i in range(20)}
    alpha2 = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", "alpha/new.py": "NEW = 1\n",
                                                  **sub_new})
    alpha1 = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n", "alpha/old.py": "OLD = 1\n",
                                                          **sub_old})
    beta = build_wheel(wheels, "beta", "1.0", {"beta/__init__.py": "import alpha\nB = alpha.V\n"},
                       requires=("alpha>=2",))
    gamma = build_wheel(wheels, "gamma", "1.0", {"gamma/__init__.py": "G = 1\n"})
    donor = make_venv(base / "donor", [alpha2, beta])
    pristine = make_venv(base / "pristine", [alpha1, gamma])
    patches = base / "patches"
    patches.mkdir()
    (patches / "patched.py").write_text("PATCHED = True\n")

    def target(name: str) -> tuple[Path, str]:
        venv = base / name
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["cp", "-a", str(pristine), str(venv)], check=True)
        m = base / f"{name}.yaml"
        m.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {donor}}}
            target: {{host: local, venv: {venv}}}
            overlay: [alpha, beta]
            remove: [gamma]
            patches:
              - {{source: patches/patched.py, dest: alpha/patched.py}}
            """))
        return venv, str(m)

    before = snapshot(pristine)
    reference, m = target("reference")
    os.environ["TRANSPLANT_STATE_DIR"] = str(base / "state")
    started = time.monotonic()  # as a process, as the kill test runs it
    subprocess.run([sys.executable, "-m", "transplant", "apply", m, "--yes"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    after = snapshot(reference)
    assert after != before and f"{SITE}/gamma/__init__.py" not in after
    steps = txn.history(LocalHost(), str(reference))["transactions"][-1]["steps"]
    return {"target": target, "before": before, "after": after, "steps": steps, "seconds": seconds, "base": base}


def imports(venv: Path) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import alpha; print(alpha.V)"],
                          capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent"})
    return done.stdout.strip()


def _wait_for_orphans(venv: Path, timeout: float = 300) -> None:
    """Wait until no process runs the venv's interpreter (the killed controller's host script
    goes on alone for a while, and on a loaded machine may only now start its transaction)."""
    needle = f"{venv}/bin/python".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if needle in (entry / "cmdline").read_bytes():
                        running.append(entry.name)
                except OSError:
                    continue
        if not running:
            return
        time.sleep(0.05)
    raise AssertionError(f"host scripts of {venv} still run after {timeout} s")


def settle(world, venv: Path, how: str, capsys) -> str:
    """After a crash: an interrupted transaction must be finished or undone before anything
    else runs; returns which end state the target must now be in ('after' or 'before')."""
    m = str(venv) + ".yaml"
    pending = txn.interrupted(LocalHost(), str(venv))
    if not pending:
        return "after" if snapshot(venv) == world["after"] else "before"
    assert main(["apply", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "was interrupted" in out and "--resume" in out and "--rollback" in out
    assert main(["apply", m, "--yes", f"--{how}"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    return "after" if how == "resume" else "before"  # a staging one is discarded, and resume applies afresh


def points(count: int, steps: int) -> list[tuple[int, str]]:
    rng = random.Random(SEED)
    return [(rng.randrange(0, steps + 1), rng.choice(["resume", "rollback"])) for _ in range(count)]


@pytest.mark.parametrize("index", range(20))
def test_commit_killed_at_a_random_step_then_resumed_or_rolled_back(world, capsys, monkeypatch, index):
    crash, how = points(20, world["steps"])[index]
    venv, m = world["target"](f"crash{index}")
    monkeypatch.setenv("TRANSPLANT_TEST_CRASH_AFTER", str(crash))
    code = main(["apply", m, "--yes"])
    monkeypatch.delenv("TRANSPLANT_TEST_CRASH_AFTER")
    out = capsys.readouterr().out
    assert code == (1 if crash < world["steps"] else 0), out
    end = settle(world, venv, how, capsys)
    assert snapshot(venv) == world[end]
    assert imports(venv) == ("2" if end == "after" else "1")
    assert not txn.interrupted(LocalHost(), str(venv))


@pytest.mark.parametrize("index", range(4))
def test_a_crashed_resume_or_rollback_is_finished_by_running_it_again(world, capsys, monkeypatch, index):
    rng = random.Random(SEED + index)
    venv, m = world["target"](f"twice{index}")
    monkeypatch.setenv("TRANSPLANT_TEST_CRASH_AFTER", str(rng.randrange(1, world["steps"])))
    assert main(["apply", m, "--yes"]) == 1
    how = "resume" if index % 2 else "rollback"
    monkeypatch.setenv("TRANSPLANT_TEST_CRASH_AFTER", str(rng.randrange(0, world["steps"])))
    assert main(["apply", m, "--yes", f"--{how}"]) == 1
    monkeypatch.delenv("TRANSPLANT_TEST_CRASH_AFTER")
    capsys.readouterr()
    assert main(["apply", m, "--yes", f"--{how}"]) == 0, capsys.readouterr().out
    assert snapshot(venv) == world["after" if how == "resume" else "before"]


@pytest.mark.parametrize("index", range(10))
def test_controller_killed_at_a_random_moment(world, capsys, index):
    """SIGKILL of the whole controller process at a random time (transfer, renames, dist-info
    swap): its lock is left behind with a dead pid, an orphaned commit may still run."""
    rng = random.Random(SEED * 7 + index)
    venv, m = world["target"](f"kill{index}")
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "transplant", "apply", m, "--yes"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.4, 1.0) * world["seconds"])  # the first 40 % is start-up and planning
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _wait_for_orphans(venv)
    end = settle(world, venv, "resume" if index % 2 else "rollback", capsys)
    assert snapshot(venv) == world[end]
    # a lock left by the dead controller is broken, and said so, by the next command
    assert main(["apply", m, "--yes"]) == 0
    assert snapshot(venv) == world["after"]


def test_a_live_lock_is_refused_with_who_holds_it(world, capsys):
    venv, m = world["target"]("locked")
    txn.acquire(LocalHost(), str(venv), "20260101T000000Z-feedbeef", "transplant apply other.yaml")
    try:
        assert main(["apply", m, "--yes"]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "is locked by another apply: transaction 20260101T000000Z-feedbeef (transplant apply other.yaml)" in out
        assert f"pid {os.getpid()}" in out and "still running" in out
        assert snapshot(venv) == world["before"]
    finally:
        txn.release(LocalHost(), str(venv), "20260101T000000Z-feedbeef")


def test_a_stale_lock_is_detected_said_and_broken(world, capsys):
    venv, m = world["target"]("stale")
    gone = subprocess.Popen(["true"])
    gone.wait()
    (venv / ".transplant").mkdir(mode=0o700)
    (venv / ".transplant" / "lock").write_text(
        f'{{"id": "20260101T000000Z-deadbeef", "controller": "{os.uname().nodename}", "pid": {gone.pid}, '
        f'"since": 0, "command": "transplant apply"}}')
    assert main(["apply", m, "--yes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "breaking the lock" in out and "its holder is gone" in out and f"pid {gone.pid}" in out
    assert snapshot(venv) == world["after"]


def test_two_applies_at_once_never_commit_twice(world):
    venv, m = world["target"]("race")
    env = {**os.environ, "COLUMNS": "300"}
    procs = [subprocess.Popen([sys.executable, "-m", "transplant", "apply", m, "--yes"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    assert sorted(code for code, _ in results) in ([0, 0], [0, 1])
    for code, out in results:
        if code == 1:
            assert "is locked by another apply" in out, out
    committed = [t for t in txn.history(LocalHost(), str(venv))["transactions"] if t["state"] == "committed"]
    assert len(committed) == 1
    assert snapshot(venv) == world["after"]


def _apply_with_patch(m: str, text: str) -> None:
    patch = Path(m).parent / "patches" / "patched.py"
    original = patch.read_text()
    patch.write_text(text)
    try:
        assert main(["apply", m, "--yes"]) == 0
    finally:
        patch.write_text(original)


def test_two_transactions_in_one_second_roll_back_newest_first(world, capsys, monkeypatch):
    # ids hold their second and a random suffix: B's suffix sorts before A's, yet B is the newest
    import json

    from txids import script_transaction_ids

    script_transaction_ids(monkeypatch, ["20260101T000000Z-ffffffff", "20260101T000000Z-00000000"])
    venv, m = world["target"]("same-second")
    assert main(["apply", m, "--yes"]) == 0                      # A
    _apply_with_patch(m, "PATCHED = 2\n")                       # B
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["history", m, "--json"]) == 0
    assert [t["id"] for t in json.loads(capsys.readouterr().out)["transactions"]] == \
        ["20260101T000000Z-ffffffff", "20260101T000000Z-00000000"]
    assert main(["rollback", m, "--yes"]) == 0                   # undoes B, the newest
    assert snapshot(venv) == world["after"]


def test_history_and_rollback_to_an_earlier_state(world, capsys):
    import json

    venv, m = world["target"]("undo")
    assert main(["apply", m, "--yes"]) == 0                      # A: the planned state
    _apply_with_patch(m, "PATCHED = 2\n")                       # B: another patch on top
    second = snapshot(venv)
    assert second != world["after"]
    capsys.readouterr()
    assert main(["history", m, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    first, b = [t["id"] for t in record["transactions"]]
    assert [t["state"] for t in record["transactions"]] == ["committed", "committed"]
    assert [e["event"] for e in record["events"] if e["id"] == b] == ["started", "applied"]
    assert main(["rollback", m, "--yes"]) == 0                   # undo the newest: B
    assert snapshot(venv) == world["after"]
    _apply_with_patch(m, "PATCHED = 3\n")                       # C
    assert snapshot(venv) != world["after"]
    capsys.readouterr()
    assert main(["rollback", m, "--yes", "--to", "19700101T000000Z-00000000"]) == 1
    refused = " ".join(capsys.readouterr().out.split())
    assert "no transaction '19700101T000000Z-00000000'" in refused
    assert f"list them: transplant history {m}" in refused
    assert main(["rollback", m, "--yes", "--to", first]) == 0    # undo all after A: C
    assert snapshot(venv) == world["after"]
    assert main(["rollback", m, "--yes"]) == 0                   # and A itself
    assert snapshot(venv) == world["before"] and imports(venv) == "1"
    states = {t["id"]: t["state"] for t in txn.history(LocalHost(), str(venv))["transactions"]}
    assert states[first] == states[b] == "rolled-back"
    assert main(["history", m]) == 0
    assert "rolled-back" in capsys.readouterr().out


def test_rollback_to_refuses_whole_when_an_older_one_changed_even_under_a_newer_one(world, capsys):
    import json

    venv, m = world["target"]("midway")
    assert main(["apply", m, "--yes"]) == 0                      # A
    _apply_with_patch(m, "PATCHED = 2\n")                       # B
    (venv / SITE / "alpha" / "patched.py").write_text("EDITED = 9\n")  # a hand edit after B
    _apply_with_patch(m, "PATCHED = 3\n")                       # C (its before is the hand edit)
    capsys.readouterr()
    assert main(["history", m, "--json"]) == 0
    first, b, c = [t["id"] for t in json.loads(capsys.readouterr().out)["transactions"]]
    before = snapshot(venv)
    # all or nothing: C's record shows the hand edit it replaced, so B is refused before C is undone
    assert main(["rollback", m, "--yes", "--to", first]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"the files of transaction {b} changed since it was applied" in out
    assert f"nothing was rolled back (all of {c}, {b} or none)" in out
    assert f"alpha/patched.py: changed between {b} and {c}" in out
    assert snapshot(venv) == before
    states = {t["id"]: t["state"] for t in txn.history(LocalHost(), str(venv))["transactions"]}
    assert states == {first: "committed", b: "committed", c: "committed"}


def test_rollback_refuses_when_files_changed_since(world, capsys):
    venv, m = world["target"]("drifted")
    assert main(["apply", m, "--yes"]) == 0
    (venv / SITE / "alpha" / "new.py").write_text("EDITED = 1\n")
    capsys.readouterr()
    assert main(["rollback", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "files changed since it was applied" in out and "alpha/new.py" in out
    assert "nothing was rolled back" in out


def test_symlinks_stay_symlinks_and_absolute_ones_into_the_donor_are_repointed(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheel = build_wheel(tmp_path / "w", "linky", "1.0", {"linky/__init__.py": "", "linky/data.txt": "data\n"})
    donor = make_venv(tmp_path / "donor", [wheel])
    target = make_venv(tmp_path / "target")
    site = donor / SITE
    os.symlink(f"{donor}/{SITE}/linky/data.txt", site / "linky" / "absolute.txt")
    os.symlink("data.txt", site / "linky" / "relative.txt")
    record = next(site.glob("linky-1.0.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "linky/absolute.txt,,\nlinky/relative.txt,,\n")
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                 f"overlay: [linky]\n")
    assert main(["apply", str(m), "--yes"]) == 0
    linky = target / SITE / "linky"
    assert os.readlink(linky / "absolute.txt") == f"{target}/{SITE}/linky/data.txt"
    assert os.readlink(linky / "relative.txt") == "data.txt"
    assert (linky / "absolute.txt").read_text() == "data\n"
    assert main(["plan", str(m)]) == 0  # nothing left to change: the repointed link is what the plan wants


def test_a_state_folder_that_is_a_symlink_is_refused(world, tmp_path, capsys):
    venv, m = world["target"]("redirected")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (venv / ".transplant").symlink_to(elsewhere)
    assert main(["apply", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "is a symlink or not a folder" in out
    assert list(elsewhere.iterdir()) == [] and snapshot(venv) == world["before"]


def _crashed(world, name: str, monkeypatch, step: int = 30) -> tuple[Path, str, Path]:
    venv, m = world["target"](name)
    monkeypatch.setenv("TRANSPLANT_TEST_CRASH_AFTER", str(step))
    assert main(["apply", m, "--yes"]) == 1
    monkeypatch.delenv("TRANSPLANT_TEST_CRASH_AFTER")
    [pending] = txn.interrupted(LocalHost(), str(venv))
    return venv, m, venv / ".transplant" / "txn" / pending["id"]


def test_a_damaged_record_is_never_acted_on(world, monkeypatch, capsys):
    venv, m, folder = _crashed(world, "damaged", monkeypatch)
    (folder / "before.json").write_text("{not json")
    middle = snapshot(venv)
    assert main(["apply", m, "--yes", "--rollback"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "before.json of transaction" in out and "missing or damaged" in out
    assert snapshot(venv) == middle, "nothing deleted on a damaged record"


def test_state_folders_that_lead_outside_are_refused(world, monkeypatch, capsys, tmp_path):
    venv, m, folder = _crashed(world, "backup-link", monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(folder / "backup")
    (folder / "backup").symlink_to(outside)
    assert main(["apply", m, "--yes", "--rollback"]) == 1
    assert "is a symlink or not a folder" in " ".join(capsys.readouterr().out.split())
    assert list(outside.iterdir()) == []


def test_a_rollback_that_cannot_restore_everything_stays_open(world, monkeypatch, capsys):
    venv, m, folder = _crashed(world, "emptied", monkeypatch)
    shutil.rmtree(folder / "backup")
    (folder / "backup").mkdir()
    assert main(["apply", m, "--yes", "--rollback"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "files differ from the recorded state of transaction" in out and "it stays open" in out
    assert [t["state"] for t in txn.interrupted(LocalHost(), str(venv))] == ["rolling-back"]


def test_a_damaged_state_counts_as_interrupted(world, capsys):
    venv, m = world["target"]("garbled")
    assert main(["apply", m, "--yes"]) == 0
    [done] = txn.history(LocalHost(), str(venv))["transactions"]
    (venv / ".transplant" / "txn" / done["id"] / "state").write_text("garbage")
    capsys.readouterr()
    assert main(["apply", m, "--yes"]) == 1
    assert "was interrupted (damaged" in " ".join(capsys.readouterr().out.split())
    assert main(["apply", m, "--yes", "--rollback"]) == 0
    assert snapshot(venv) == world["before"]


def test_a_begin_stopped_part_way_leaves_no_transaction_and_the_next_apply_goes_on(world, capsys):
    """A begin killed between making its folders and writing plan.json (seen once by Ctrl-C) left a
    transaction no command could finish or undo; begin now builds the folder under a '.begin-' name
    and renames it whole, and the next begin removes what a stopped one left."""
    venv, m = world["target"]("stopped-begin")
    txn_root = venv / ".transplant" / "txn"
    left = txn_root / ".begin-20261201T000000Z-deadbeef"  # what a begin killed before its rename leaves
    (left / "staged").mkdir(parents=True)
    (left / "backup").mkdir()
    (left / "before.json").write_text("{}")
    outside = world["base"] / "stopped-begin-outside"
    outside.mkdir(exist_ok=True)
    (outside / "keep").write_text("keep")
    (txn_root / ".begin-20261201T000000Z-symlink").symlink_to(outside)  # never followed nor removed
    assert txn.interrupted(LocalHost(), str(venv)) == []  # not a transaction: nothing to finish
    capsys.readouterr()
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr().out
    assert snapshot(venv) == world["after"]
    assert not left.exists() and (outside / "keep").read_text() == "keep"
    names = sorted(p.name for p in txn_root.iterdir())
    [done] = txn.history(LocalHost(), str(venv))["transactions"]
    assert names == sorted([done["id"], ".begin-20261201T000000Z-symlink"])  # no '.begin-' of its own left
    assert (txn_root / done["id"] / "plan.json").is_file()


@pytest.mark.parametrize("content", ["[1, 2, 3]", "not json", '{"id": "x", "since": 1e300, "pid": 1180591620717411303424}'])
def test_a_garbled_lock_is_reported_not_a_traceback(world, capsys, content):
    venv, m = world["target"]("garbled-lock")
    (venv / ".transplant").mkdir(mode=0o700)
    (venv / ".transplant" / "lock").write_text(content)
    assert main(["apply", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "is locked by another apply" in out and "Traceback" not in out


def test_a_donor_file_that_changes_between_plan_and_copy_is_caught_before_the_commit(world, monkeypatch, capsys):
    import transplant.apply.execute as apply_module

    venv, m = world["target"]("raced")
    donor_file = Path(m).parent / "donor" / SITE / "alpha" / "new.py"
    original, stage = donor_file.read_text(), apply_module._stage

    def edited_meanwhile(*args, **kwargs):
        donor_file.write_text("CHANGED = 1\n")
        return stage(*args, **kwargs)

    monkeypatch.setattr(apply_module, "_stage", edited_meanwhile)
    try:
        assert main(["apply", m, "--yes"]) == 1
    finally:
        donor_file.write_text(original)
    out = " ".join(capsys.readouterr().out.split())
    assert "1 staged file differs from the plan: the donor (or a patch) changed between plan and copy" in out
    assert f"{SITE}/alpha/new.py" in out
    assert snapshot(venv) == world["before"] and not txn.interrupted(LocalHost(), str(venv))


def _pip_install(venv: Path, wheel: Path) -> None:
    """Install a wheel into a venv with pip, as a user would: console scripts are generated
    with this venv's interpreter in their shebang, and RECORD lists them with their hash."""
    subprocess.run([sys.executable, "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--no-index",
                    "--no-deps", "--disable-pip-version-check", str(wheel)], check=True)


def _rows(record: Path) -> list[tuple[bytes, list[str]]]:
    """Each line of a RECORD with its parsed fields."""
    import csv
    import io

    return [(line, next(csv.reader(io.StringIO(line.decode(), newline=""))))
            for line in record.read_bytes().splitlines(keepends=True)]


def _file_row(path: Path) -> list[str]:
    from inventory_docs import digest

    data = path.read_bytes()
    return [digest(data.decode()), str(len(data))]


def test_relocated_console_scripts_get_their_record_rows_and_a_second_plan_is_a_noop(tmp_path, monkeypatch, capsys):
    """Issue 13: apply rewrites the shebang of console scripts naming the donor's prefix; their
    RECORD rows must then hold the hash and size of the files as written, as pip writes them,
    while every other row stays the donor's, byte for byte."""
    import json

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    module = {"tool.py": "def main():\n    print('tool ran')\n\ndef extra():\n    print('extra ran')\n"}
    new = build_wheel(tmp_path / "w", "tool", "1.0", module,
                      entry_points="[console_scripts]\ntool = tool:main\ntool-extra = tool:extra\n")
    old = build_wheel(tmp_path / "w-old", "tool", "1.0", {"tool.py": "def main():\n    print('old')\n"},
                      entry_points="[console_scripts]\ntool = tool:main\n")
    donor, target = make_venv(tmp_path / "donor"), make_venv(tmp_path / "target")
    _pip_install(donor, new)
    _pip_install(target, old)  # same version, another build: bin/tool is already right, tool-extra is new
    record = f"{SITE}/tool-1.0.dist-info/RECORD"
    before, old_record = snapshot(target), (target / record).read_bytes()
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                 f"overlay: [tool]\n")
    assert main(["apply", str(m), "--yes"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    for name in ("tool", "tool-extra"):
        assert (target / "bin" / name).read_text().startswith(f"#!{target}/bin/python\n")
    donor_rows, target_rows = _rows(donor / record), _rows(target / record)
    assert [r[0] for _, r in target_rows] == [r[0] for _, r in donor_rows]
    scripts = 0
    for (donor_line, _), (line, row) in zip(donor_rows, target_rows, strict=False):
        if row[0].startswith("../../../bin/"):
            scripts += 1
            assert row[1:] == _file_row(target / "bin" / row[0].rsplit("/", 1)[1]), row
            assert line.endswith(b"\r\n") and line != donor_line
        else:
            assert line == donor_line
    assert scripts == 2

    assert main(["plan", str(m), "--json"]) == 0   # 0: nothing to change
    again = json.loads(capsys.readouterr().out)
    assert [c["copy"] for c in again["changes"]] == [[]] and [c["action"] for c in again["changes"]] == ["keep"]
    assert not [f for f in again["findings"] if f["code"] == "record-drift"]
    assert main(["status", f"local:{target}", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["drift"] == [] and status["checked"] > 0

    assert main(["rollback", str(m), "--yes"]) == 0
    assert (target / record).read_bytes() == old_record and snapshot(target) == before

    assert main(["apply", str(m), "--yes"]) == 0
    with (target / "bin" / "tool").open("a") as handle:   # a real hand edit
        handle.write("# local change\n")
    capsys.readouterr()
    assert main(["plan", "--detailed-exitcode", str(m), "--json"]) == 2
    drifted = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["code"] == "record-drift"]
    assert [f["files"] for f in drifted] == [["bin/tool"]] and "on the target" in drifted[0]["message"]


# -- a commit the host script completed after its controller died ----------------------------------

def _orphaned_commit(world, name: str, at: int = 3) -> tuple[Path, str, str]:
    """Start ``apply`` as a process, SIGKILL it while its commit runs (the host script waits at
    step ``at`` until its controller is gone, then goes on alone), wait until that host script
    has completed the commit; returns the venv, the manifest and the transaction id."""
    venv, m = world["target"](name)
    env = {**os.environ, "COLUMNS": "200", "TRANSPLANT_TEST_ORPHAN_AT": str(at)}
    proc = subprocess.Popen([sys.executable, "-m", "transplant", "apply", m, "--yes"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    states = venv / ".transplant" / "txn"
    deadline = time.monotonic() + 300  # a hang guard: a loaded 2-core machine took over 120 s here
    while not [p for p in states.glob("*/state") if p.read_text() == "committing"]:
        assert proc.poll() is None, "the apply ended before its commit began"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    [state] = states.glob("*/state")
    while state.read_text() != "committed":  # the orphaned host script finishes alone
        assert time.monotonic() < deadline, state.read_text()
        time.sleep(0.05)
    txn.interrupted(LocalHost(), str(venv))  # waits until it has exited
    return venv, m, state.parent.name


def _events(venv: Path, txid: str) -> list[dict]:
    return [e for e in txn.history(LocalHost(), str(venv))["events"] if e.get("id") == txid]


@pytest.mark.parametrize("how", ["resume", "rollback", "plain"])
def test_a_commit_the_host_completed_after_the_controller_died_is_recorded_and_said(world, capsys, monkeypatch,
                                                                                     how):
    import json

    monkeypatch.setenv("COLUMNS", "300")
    venv, m, txid = _orphaned_commit(world, f"orphan-{how}")
    assert snapshot(venv) == world["after"]
    assert [e["event"] for e in _events(venv, txid)] == ["started"], "the controller died before recording"
    capsys.readouterr()
    code = main(["apply", m, "--yes", *([f"--{how}"] if how != "plain" else [])])
    out = " ".join(capsys.readouterr().out.split())
    assert code == {"resume": 0, "rollback": 1, "plain": 0}[how], out
    assert f"transaction {txid} was completed on the target by its host script after the controller died" in out
    assert "recorded as applied: the target matches its planned state hash for hash" in out
    if how == "rollback":
        assert "nothing was rolled back" in out and f"undo it: transplant rollback {m}" in out
    if how == "plain":
        assert "nothing to change" in out
    assert snapshot(venv) == world["after"]
    events = _events(venv, txid)
    assert [e["event"] for e in events] == ["started", "applied"]
    assert events[-1]["completed_by"] == "host" and events[-1]["time"] <= events[-1]["recorded"]
    assert main(["status", f"local:{venv}", "--json"]) == 0
    [applied] = json.loads(capsys.readouterr().out)["transactions"]
    assert applied["id"] == txid and applied["applied"] == events[-1]["time"]
    assert main(["history", m]) == 0
    assert "applied by the host" in " ".join(capsys.readouterr().out.split())
    assert main(["rollback", m, "--yes"]) == 0  # the command the message named undoes it
    assert snapshot(venv) == world["before"]


def test_status_records_a_commit_the_host_completed(world, capsys, monkeypatch):
    import json

    monkeypatch.setenv("COLUMNS", "300")
    venv, m, txid = _orphaned_commit(world, "orphan-status")
    capsys.readouterr()
    assert main(["status", f"local:{venv}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [applied] = doc["transactions"]
    assert applied["applied"] is not None and doc["unrecorded"] == [] and doc["interrupted"] == []
    assert [e["event"] for e in _events(venv, txid)] == ["started", "applied"]
    assert main(["status", f"local:{venv}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "?" not in out.split(txid)[1].split()[0:2], out  # a time, not "applied ?"


@pytest.mark.parametrize("how", ["resume", "rollback"])
def test_resume_or_rollback_with_nothing_interrupted_is_not_a_usage_error(world, capsys, how):
    venv, m = world["target"](f"nothing-{how}")
    code = main(["apply", m, "--yes", f"--{how}"])
    out = " ".join(capsys.readouterr().out.split())
    if how == "resume":
        assert code == 0 and f"nothing to resume: {venv}" in out.replace("local:", "")
    else:
        assert code == 1 and "no interrupted transaction to roll back; nothing was changed" in out
        assert f"transplant rollback {m}" in out
    assert not (venv / ".transplant").exists(), "a venv transplant never touched gets no state folder"
    assert snapshot(venv) == world["before"]


@pytest.mark.parametrize("fault,words", [
    ("refused-before-it-began", "stopped before its commit began: the live venv did not change"),
    ("killed-after-it-began", "is interrupted part-way through its commit"),
])
def test_a_failed_commit_says_what_the_targets_record_shows(world, capsys, monkeypatch, fault, words):
    # the commit request fails: before the applier marked it committing (its after.json is
    # gone, so the commit is refused), or killed after its first step began (the crash hook)
    import transplant.apply.execute as execute

    venv, m = world["target"](f"failed-commit-{fault}")
    real = txn.call

    def failing(host, where, op, request, **kw):
        if op == "commit":
            if fault.startswith("refused"):
                (Path(where) / ".transplant" / "txn" / request["id"] / "after.json").unlink()
            else:
                request = {**request, "crash_after": 0}
        return real(host, where, op, request, **kw)

    monkeypatch.setattr(execute.txn, "call", failing)
    before = snapshot(venv)
    assert main(["apply", m, "--yes"]) != 0
    out = " ".join(capsys.readouterr().out.split())
    assert words in out, out
    assert "--rollback" in out and "--resume" in out
    if fault.startswith("refused"):
        assert snapshot(venv) == before, "nothing of the live venv changed"


# -- a rollback reads no file whose stat identity is the one its transaction recorded ---------------

def _aged(world, name: str) -> tuple[Path, str]:
    """A fresh target, a copy of the donor and of the patch, every file of them last modified an
    hour ago (as the files of a real venv are: a file modified within the applier's racily-clean
    window is never recorded by its stat identity), and a manifest for them: (target, manifest)."""
    venv, _ = world["target"](name)
    home = world["base"] / f"{name}-aged"
    shutil.rmtree(home, ignore_errors=True)
    (home / "patches").mkdir(parents=True)
    subprocess.run(["cp", "-a", str(world["base"] / "donor"), str(home / "donor")], check=True)
    (home / "patches" / "patched.py").write_text("PATCHED = True\n")
    past = time.time() - 3600
    for tree in (venv, home / "donor", home / "patches"):
        for path in tree.rglob("*"):
            if path.is_file() and not path.is_symlink():
                os.utime(path, (past, past))
    m = home / "m.yaml"
    m.write_text(Path(str(venv) + ".yaml").read_text().replace(f"venv: {world['base'] / 'donor'}}}",
                                                               f"venv: {home / 'donor'}}}"))
    assert str(home / "donor") in m.read_text()
    return venv, str(m)


def _counting(monkeypatch) -> list[dict]:
    """The replies of every applier ``state`` request from now on, in order."""
    replies: list[dict] = []
    real = txn.call

    def call(host, venv, op, request, **kw):
        reply = real(host, venv, op, request, **kw)
        if op == "state":
            replies.append(reply)
        return reply

    monkeypatch.setattr(txn, "call", call)
    return replies


def _files(state: dict) -> int:
    """How many regular files a recorded state (path -> identity) names."""
    return len([v for v in state.values() if v is not None and not v.startswith("symlink:")])


def _record(venv: Path) -> dict:
    [done] = [t for t in txn.history(LocalHost(), str(venv))["transactions"] if t["state"] == "committed"]
    return txn.call(LocalHost(), str(venv), "txn", {"id": done["id"]}) | {"id": done["id"]}


def test_a_rollback_after_an_apply_reads_no_unchanged_file(world, capsys, monkeypatch):
    """Every check of ``transplant rollback`` (nothing changed since the commit, before asking and
    again under the lock; the target is as before) takes every file at the stat identity its
    transaction recorded: none is read."""
    venv, m = _aged(world, "unread")
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr().out
    record = _record(venv)
    replies = _counting(monkeypatch)
    assert main(["rollback", m, "--yes"]) == 0, capsys.readouterr().out
    assert snapshot(venv) == world["before"] and imports(venv) == "1"
    asked, drift, restored = replies
    for check in (asked, drift):
        assert check["differ"] == [] and check["hashed"] == 0 and check["trusted"] == _files(record["after"]) > 20
    assert restored["differ"] == [] and restored["hashed"] == 0 and restored["trusted"] == _files(record["before"]) > 20


@pytest.mark.parametrize("how", ["rollback", "resume"])
def test_an_interrupted_commit_finished_or_undone_reads_no_unchanged_file(world, capsys, monkeypatch, how):
    """``apply --rollback`` (the files renamed back from their backups) and ``--resume`` (the files
    committed as the staged check verified them) are checked without reading one."""
    venv, m = _aged(world, f"unread-{how}")
    monkeypatch.setenv("TRANSPLANT_TEST_CRASH_AFTER", "30")
    assert main(["apply", m, "--yes"]) == 1
    monkeypatch.delenv("TRANSPLANT_TEST_CRASH_AFTER")
    [pending] = txn.interrupted(LocalHost(), str(venv))
    record = txn.call(LocalHost(), str(venv), "txn", {"id": pending["id"]})
    replies = _counting(monkeypatch)
    capsys.readouterr()
    assert main(["apply", m, "--yes", f"--{how}"]) == 0, capsys.readouterr().out
    side = "before" if how == "rollback" else "after"
    assert snapshot(venv) == world[side]
    [checked] = replies
    assert checked["differ"] == [] and checked["hashed"] == 0 and checked["trusted"] == _files(record[side]) > 20


def _same_size_edit(path: Path, how: str) -> None:
    """Change a file's bytes keeping its size: in place with the mtime then set to another value
    (``mtime``), in place (``rewrite``: the mtime the write gives), or by a new file renamed over
    it whose mtime is set to the old one's (``replaced``: only the inode tells)."""
    old = path.stat()
    data = bytes(b ^ 1 for b in path.read_bytes())
    if how == "replaced":
        fresh = path.with_name(path.name + ".new")
        fresh.write_bytes(data)
        os.utime(fresh, ns=(old.st_atime_ns, old.st_mtime_ns))
        os.rename(fresh, path)
    else:
        with path.open("r+b") as handle:
            handle.write(data)
        if how == "mtime":
            os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns + 1_000_000))
    new = path.stat()
    assert new.st_size == old.st_size and path.read_bytes() == data
    assert (new.st_ino, new.st_mtime_ns) != (old.st_ino, old.st_mtime_ns)


@pytest.mark.parametrize("how", ["mtime", "rewrite", "replaced"])
def test_a_file_changed_after_the_commit_keeping_its_size_is_still_drift(world, capsys, how):
    venv, m = _aged(world, f"same-size-{how}")
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr().out
    _same_size_edit(venv / SITE / "alpha" / "sub" / "m7.py", how)
    changed = snapshot(venv)
    capsys.readouterr()
    assert main(["rollback", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "files changed since it was applied" in out and "alpha/sub/m7.py" in out, out
    assert "nothing was rolled back" in out
    assert snapshot(venv) == changed
    assert [t["state"] for t in txn.history(LocalHost(), str(venv))["transactions"]] == ["committed"]


def test_a_backup_changed_before_the_rollback_is_caught_by_the_check_after_it(world, capsys):
    """The file renamed back from a backup that changed (same size) is not the one ``begin`` read:
    the check after the rollback reads it and the transaction stays open."""
    venv, m = _aged(world, "backup-edited")
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr().out
    record = _record(venv)
    _same_size_edit(venv / ".transplant" / "txn" / record["id"] / "backup" / SITE / "alpha" / "sub" / "m4.py",
                    "rewrite")
    capsys.readouterr()
    assert main(["rollback", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "1 files differ from the recorded state of transaction" in out and "alpha/sub/m4.py" in out, out
    assert [t["state"] for t in txn.interrupted(LocalHost(), str(venv))] == ["rolling-back"]


@pytest.mark.parametrize("how", ["missing", "damaged", "symlink"])
def test_a_transaction_without_usable_stat_records_rolls_back_reading_every_file(world, capsys, monkeypatch, how):
    """A transaction recorded before ``before-known.json`` and ``after-known.json`` existed (or
    whose records are damaged, or symlinks: never followed) rolls back as before: every file read."""
    venv, m = _aged(world, f"old-record-{how}")
    assert main(["apply", m, "--yes"]) == 0, capsys.readouterr().out
    record = _record(venv)
    folder = venv / ".transplant" / "txn" / record["id"]
    for name in ("before-known.json", "after-known.json"):
        assert json_object(folder / name), "the apply recorded its stat identities"
        if how == "missing":
            (folder / name).unlink()
        elif how == "damaged":
            (folder / name).write_text("{not json")
        else:  # the same entries, but read through a symlink: not taken
            aside = world["base"] / f"old-record-{how}-{name}"
            os.replace(folder / name, aside)
            (folder / name).symlink_to(aside)
    replies = _counting(monkeypatch)
    assert main(["rollback", m, "--yes"]) == 0, capsys.readouterr().out
    assert snapshot(venv) == world["before"]
    asked, drift, restored = replies  # the check before the question, again under the lock, then the result
    for check in (asked, drift):
        assert check["trusted"] == 0 and check["hashed"] == _files(record["after"])
    assert restored["trusted"] == 0 and restored["hashed"] == _files(record["before"])


def json_object(path: Path) -> dict:
    import json

    value = json.loads(path.read_text())
    assert isinstance(value, dict)
    return value


def test_status_checks_the_files_apply_did_not_need_to_copy_by_their_record_rows(tmp_path, capsys):
    """``alpha/same.py`` is the same in alpha 1.0 and 2.0, so apply leaves it; a hand edit of it after
    apply is drift all the same, found by its RECORD row, and said apart from the applied paths."""
    wheels = tmp_path / "wheels"
    same = {"alpha/same.py": "SAME = 1\n"}
    donor = make_venv(tmp_path / "donor", [build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", **same})])
    target = make_venv(tmp_path / "target", [build_wheel(wheels / "old", "alpha", "1.0",
                                                         {"alpha/__init__.py": "V = 1\n", **same})])
    m = tmp_path / "m.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {target}}}\n"
                 f"overlay: [alpha]\n")
    assert main(["apply", str(m), "--yes"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert main(["status", f"local:{target}", "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)
    assert clean["drift"] == [] and clean["record_checked"] >= 1
    assert f"{SITE}/alpha/same.py" not in txn.call(LocalHost(), str(target), "txn", {
        "id": txn.history(LocalHost(), str(target))["transactions"][-1]["id"]})["after"], "apply did not copy it"
    (target / SITE / "alpha" / "same.py").write_text("SAME = 2  # edited by hand\n")
    assert main(["status", f"local:{target}"]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "alpha/same.py" in out and "(not written by apply: its RECORD row)" in out, out
    assert "other files of the applied distributions (by their RECORD rows) no longer match" in out \
        or "other file of the applied distributions (by their RECORD rows) no longer match" in out, out
