"""One reporting protocol: every long step reports through :class:`transplant.reporting.Reporter`.

- An :mod:`ast` scan: no function of ``transplant/`` outside the face (``cli/``) takes a
  callback named ``say``, ``step``, ``announce`` or ``progress``; its twin adds one to a copy
  of the package and expects the scan to name it.
- Real small runs with a recording reporter (local venvs built from real wheels, real rsync, a
  loopback registry): plan, apply (``files``, ``patches``, ``commit``, ``check``, bytes
  monotone up to the total), rollback, snapshot, clone, copy_tree, registry push and blob
  pull, verify's stages, a fleet's per-target prefix; and a quiet run (the default) reports
  nothing and still works.
- The face: apply's bar drawn through the protocol prints exactly what its ``report`` prints.
"""

from __future__ import annotations

import ast
import io
import shutil
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest
from rich.console import Console

import transplant
from transplant.apply import txn
from transplant.apply.execute import new_transaction_id
from transplant.clone.cloning import clone
from transplant.controller.manifest_file import load_manifest
from transplant.controller.patch_files import read_patch_files
from transplant.donor.snapshot import capture
from transplant.donor.sources import open_donor
from transplant.fleet.run import run_fleet
from transplant.hosts.host import LocalHost, SSHOptions
from transplant.hosts.transfer import copy_tree
from transplant.lab.wheels import build_wheel, make_venv
from transplant.pipeline import apply_plan, plan_target
from transplant.reporting import QUIET, NullReporter, Prefixed, RecordingReporter, Reporter

PACKAGE = Path(transplant.__file__).parent
SITE = "lib/python3.11/site-packages"
#: The callback names the protocol replaced.
CALLBACKS = ("say", "step", "announce", "progress")


def callback_parameters(root: Path) -> list[str]:
    """``module:line function(parameter)`` for every function outside ``cli/`` with a parameter
    named like one of :data:`CALLBACKS` (empty: the protocol is the only one)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                    if arg is not None and arg.arg in CALLBACKS:
                        name = getattr(node, "name", "<lambda>")
                        found.append(f"{rel}:{node.lineno} {name}({arg.arg})")
    return found


def test_no_edge_takes_a_callback_of_its_own():
    assert callback_parameters(PACKAGE) == []


def test_the_scan_names_a_callback_added_to_an_edge(tmp_path):
    copy = tmp_path / "transplant"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "donor" / "snapshot.py"
    target.write_text(target.read_text() + "\n\ndef fetch(path, *, progress=None):\n    return path\n")
    found = callback_parameters(copy)
    assert len(found) == 1 and found[0].startswith("donor/snapshot.py:") and found[0].endswith("fetch(progress)")


def test_every_reporter_of_the_package_keeps_the_protocol():
    from transplant.cli.progress import ByteProgress, Shown

    console = Console(file=io.StringIO())
    for reporter in (NullReporter(), QUIET, RecordingReporter(), Prefixed(QUIET, "h: "), Shown(),
                     ByteProgress(console, 1, {})):
        assert isinstance(reporter, Reporter), type(reporter)
    assert not isinstance(object(), Reporter)


def test_prefixed_names_the_host_on_notes_and_steps_and_passes_progress_as_is():
    inner = RecordingReporter()
    one = Prefixed(inner, "gpu-b: ")
    one.step("files")
    one.progress(3, 9)
    one.note("lock broken")
    assert inner.events == [("step", "gpu-b: files"), ("progress", 3, 9), ("note", "gpu-b: lock broken")]


def monotone(pairs: list[tuple[int, int]]) -> bool:
    """Whether ``done`` never goes down and never passes a known total."""
    dones = [d for d, _ in pairs]
    return dones == sorted(dones) and all(total == 0 or d <= total for d, total in pairs)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A local donor (alpha 2.0 with 30 modules, beta), a target (alpha 1.0, gamma), a patch, a
    manifest; the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    mods = {f"alpha/sub/m{i}.py": f"N = {i}\n" + "#" * 4000 + "\n" for i in range(30)}
    make_venv(tmp_path / "donor", [build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", **mods}),
                                   build_wheel(wheels, "beta", "1.0", {"beta/__init__.py": "B = 1\n"})])
    make_venv(tmp_path / "target", [build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"}),
                                    build_wheel(wheels, "gamma", "1.0", {"gamma/__init__.py": "G = 1\n"})])
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "patched.py").write_text("PATCHED = True\n")
    (tmp_path / "m.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {tmp_path / 'donor'}}}
        target: {{host: local, venv: {tmp_path / 'target'}}}
        overlay: [alpha, beta]
        remove: [gamma]
        patches:
          - {{source: patches/patched.py, dest: alpha/patched.py}}
        """))
    return tmp_path


def test_plan_apply_and_rollback_report_their_steps_and_monotone_bytes(world):
    manifest = load_manifest(world / "m.yaml")
    target, venv = LocalHost(), str(world / "target")
    planned, applied, rolled = RecordingReporter(), RecordingReporter(), RecordingReporter()
    with ExitStack() as stack:
        opened = open_donor(manifest, SSHOptions(), stack)
        plan = plan_target(manifest, opened.source, target, patches=read_patch_files(manifest), reporter=planned)
        result = apply_plan(plan, manifest, opened, target, reporter=applied)
    assert any(s.startswith("probing the donor") and "probing the target" in s for s in planned.steps())
    assert "reading the shared objects on both hosts (pyelftools)" in planned.steps()
    assert applied.steps() == ["files", "patches", "commit", "check"]
    files = applied.progress_of("files")
    assert files and monotone(files) and files[-1][0] == files[-1][1] > 30 * 4000, files
    patches = applied.progress_of("patches")
    assert patches and monotone(patches) and patches[-1] == (len("PATCHED = True\n"),) * 2
    assert applied.progress_of("commit") == []
    assert [note.split(": ")[0] for note in applied.notes()] == ["files", "patches"]  # how each copy went
    assert applied.notes()[0].startswith("files: streamed on this machine")
    assert (world / "target" / SITE / "alpha" / "patched.py").exists() and result.files_copied > 30

    txid = new_transaction_id()
    txn.acquire(target, venv, txid, "transplant rollback", reporter=rolled)
    try:
        done = txn.undo(target, venv, to=None, lock=txid, reporter=rolled)
    finally:
        txn.release(target, venv, txid)
    assert rolled.steps() == [f"rolling back {done[0]}"] and rolled.progress_of(rolled.steps()[0]) == [(1, 1)]
    assert not (world / "target" / SITE / "alpha" / "patched.py").exists()


def test_a_broken_lock_is_a_note(world):
    """The twin of the quiet runs above: a lock whose holder is gone is broken, and said so."""
    venv = str(world / "target")
    txn.acquire(LocalHost(), venv, "20260101T000000Z-deadbeef", "transplant apply other.yaml")
    lock = Path(venv) / ".transplant" / "lock"
    text = lock.read_text()
    import json
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    held = json.loads(text)
    held["pid"] = gone.pid  # a process of this controller that has ended: the holder is gone
    lock.write_text(json.dumps(held))
    noted = RecordingReporter()
    txn.acquire(LocalHost(), venv, "20260101T000000Z-feedbeef", "transplant status", reporter=noted)
    txn.release(LocalHost(), venv, "20260101T000000Z-feedbeef")
    assert len(noted.notes()) == 1 and noted.notes()[0].startswith(f"breaking the lock of local:{venv}")
    assert noted.steps() == []


def test_a_quiet_apply_works_and_reports_nothing(world):
    manifest = load_manifest(world / "m.yaml")
    with ExitStack() as stack:
        opened = open_donor(manifest, SSHOptions(), stack)
        plan = plan_target(manifest, opened.source, LocalHost())
        result = apply_plan(plan, manifest, opened, LocalHost())
    assert result.files_copied > 30 and (world / "target" / SITE / "alpha" / "patched.py").exists()


def test_snapshot_reports_its_steps_and_the_bytes_read(world):
    manifest = load_manifest(world / "m.yaml")
    recorded = RecordingReporter()
    result = capture(manifest, LocalHost(), world / "store", reporter=recorded)
    steps = recorded.steps()
    reading = f"reading {result.fetched} file{'' if result.fetched == 1 else 's'} from the donor"
    assert steps[0].startswith("probing the donor") and reading in steps
    assert steps[-1] == "running the donor's verify stages in its venv, to stand in for it when it is gone"
    read = recorded.progress_of(reading)
    assert read and monotone(read) and read[-1][0] == read[-1][1] > 30 * 4000


def test_clone_reports_each_step_and_copy_tree_its_bytes(world):
    recorded = RecordingReporter()
    result = clone(LocalHost(), str(world / "donor"), LocalHost(), str(world / "copy"),
                   state_dir=world / "state", reporter=recorded)
    steps = recorded.steps()
    assert steps[0] == f"reading the source local:{world / 'donor'}" and steps[1].startswith("checking the destination")
    assert any(s.startswith("copying ") and "cp --reflink=auto" in s for s in steps)
    assert steps[-1].startswith("relocating ") and result.files > 30
    tree = RecordingReporter()
    copy_tree(LocalHost(), str(world / "donor"), LocalHost(), str(world / "tree"), staging=world / "relay",
              reporter=tree)
    moved = [e[1:] for e in tree.events if e[0] == "progress"]
    assert moved and monotone(moved) and moved[-1][0] == moved[-1][1] > 30 * 4000


def test_a_fleet_reports_each_target_under_its_name(world):
    manifest = load_manifest(world / "m.yaml")
    recorded = RecordingReporter()
    with ExitStack() as stack:
        opened = open_donor(manifest, SSHOptions(), stack)
        [result] = run_fleet("apply", manifest, [manifest.target], opened, SSHOptions(), jobs=1, reporter=recorded)
    assert result.code == 0, result.error
    prefix = f"{manifest.target}: "
    steps = recorded.steps()
    assert steps and all(s.startswith(prefix) for s in steps)
    assert [s[len(prefix):] for s in steps][-4:] == ["files", "patches", "commit", "check"]


def test_registry_push_reports_each_layer_and_a_blob_pull_its_bytes(world, monkeypatch):
    from transplant.donor.oci import Client, Credentials, Reference
    from transplant.donor.registry_snapshot import push
    from transplant.lab.registry import LabRegistry, registry_skip_reason

    reason = registry_skip_reason()
    if reason:
        pytest.skip(reason)
    snap = capture(load_manifest(world / "m.yaml"), LocalHost(), world / "store").snapshot
    with LabRegistry(world / "registry") as registry:
        ref = Reference.parse(f"oci://{registry.host}/lab/snaps:v1")
        client = Client(ref, ca=registry.ca, credentials=Credentials(registry.user, registry.password, "test"))
        pushed = RecordingReporter()
        push(snap, ref, client, reporter=pushed)
        steps = pushed.steps()
        layers = [s for s in steps if ": uploaded (" in s]
        assert {s.split(":")[0] for s in layers} == {"alpha", "beta", "patches"}
        assert steps[-1] == "reading the ELF facts of the shared objects once, for plans from the registry"
        counted = [e[1:] for e in pushed.events if e[0] == "progress"]
        assert counted == [(i, len(layers)) for i in range(1, len(layers) + 1)]
        doc, _digest = client.get_manifest("v1")
        blob = max(doc["layers"], key=lambda layer: int(layer["size"]))["digest"]  # alpha's, the largest
        pulled = RecordingReporter()
        got = client.fetch_blob(blob, world / "blob", reporter=pulled)
        read = [e[1:] for e in pulled.events if e[0] == "progress"]
        assert read and monotone(read) and read[-1] == (got, got) == ((world / "blob").stat().st_size,) * 2


def test_apply_bar_through_the_protocol_prints_what_its_report_prints(monkeypatch):
    from transplant.cli import progress

    class Clock:  # a clock that moves one EVERY and a bit per reading: every byte line shows
        now = 0.0

        @classmethod
        def monotonic(cls) -> float:
            cls.now += progress.EVERY + 1
            return cls.now

    monkeypatch.setattr(progress, "time", Clock)

    def run(drive) -> str:
        Clock.now = 0.0
        out = io.StringIO()
        with progress.ByteProgress(Console(file=out, width=80), 1000, {"files": 900, "patches": 100}) as bar:
            drive(bar)
        return out.getvalue()

    def old(bar):
        bar.report("files", 50, 100)
        bar.report("files", 100, 200)
        bar.report("patches", 10, 10)
        bar.report("commit", 0, 0)
        bar.report("check", 0, 0)

    def new(bar):
        bar.step("files")
        bar.progress(50, 100)
        bar.progress(100, 200)
        bar.step("patches")
        bar.progress(10, 10)
        bar.step("commit")
        bar.step("check")

    assert run(new) == run(old)
    assert "copying: 45% (450 B of 1000 B)" in run(new) and "copying: 100% (1000 B of 1000 B)" in run(new)
    assert "committing: renaming the staged files into place ..." in run(new)
