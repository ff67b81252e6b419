"""The small apply's host scripts started ahead: the plan's probes, the target's ELF
script and stale-plan probe and both sides of the stream start as the connections open and are
asked later; the donor's ELF script does not run when no shared object moves. Real local venvs
built from real wheels, gcc-built shared objects, the real loopback SSH lab; processes counted
by the scripts' own log (``TRANSPLANT_TEST_SCRIPT_LOG``) or by the real ``spawn``/``run`` of the
connections (each call still goes through), not by timing."""

from __future__ import annotations

import hashlib
import subprocess
import textwrap
import threading
import time
from base64 import urlsafe_b64encode
from contextlib import ExitStack
from pathlib import Path

import pytest

from transplant.controller.manifest_file import load_manifest
from transplant.donor.sources import open_donor
from transplant.hosts.host import LocalHost, SSHOptions
from transplant.hosts.probing import close_prestarted, prestart, take_inventory, take_prestarted
from transplant.hosts.ssh import SSHHost
from transplant.hosts.stream import side_argv, start_sides, stream_files
from transplant.lab.wheels import build_wheel, make_venv
from transplant.pipeline import plan_target

SITE = "lib/python3.11/site-packages"


def _record_hash(data: bytes) -> str:
    return "sha256=" + urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _shared_object(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "native.c").write_text("int answer(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "native.so"), str(folder / "native.c")], check=True)
    return folder / "native.so"


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A local donor (foo 2.0, pure Python), a target (foo 1.0), a manifest, the scripts' log."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TRANSPLANT_TEST_SCRIPT_LOG", str(tmp_path / "scripts.log"))
    wheels = tmp_path / "wheels"
    make_venv(tmp_path / "donor", [build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"})])
    make_venv(tmp_path / "target", [build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n"})])
    _manifest(tmp_path, "foo")
    return tmp_path


def _manifest(root: Path, overlay: str) -> Path:
    path = root / "m.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {root / 'donor'}}}
        target: {{host: local, venv: {root / 'target'}}}
        overlay: [{overlay}]
        """))
    return path


def _scripts(root: Path) -> list[str]:
    log = root / "scripts.log"
    return log.read_text().splitlines() if log.exists() else []


def _plan(root: Path):
    manifest = load_manifest(root / "m.yaml")
    with ExitStack() as stack:
        opened = open_donor(manifest, SSHOptions(), stack)
        return plan_target(opened.manifest, opened.source, LocalHost())


# -- the donor's ELF script runs only when a shared object moves ---------------------------------

def test_no_donor_elf_script_when_no_shared_object_moves(pair):
    plan = _plan(pair)
    assert plan.has_changes
    elf = [line for line in _scripts(pair) if line.startswith("elf_facts ")]
    assert elf == [f"elf_facts {pair / 'target'}"], elf  # the target's still runs (its libstdc++, its objects)


def test_the_donor_elf_script_still_runs_when_a_shared_object_moves(pair):
    so = _shared_object(pair / "gcc").read_bytes()
    wheels = pair / "wheels-native"
    make_venv(pair / "donor", [build_wheel(wheels, "nat", "2.0", {"nat/__init__.py": "", "nat/native.so": so})])
    _manifest(pair, "nat")
    plan = _plan(pair)
    elf = [line for line in _scripts(pair) if line.startswith("elf_facts ")]
    assert sorted(elf) == sorted([f"elf_facts {pair / 'donor'}", f"elf_facts {pair / 'target'}"]), elf
    assert any(cp.path.endswith("nat/native.so") for c in plan.changes for cp in c.copy)


# -- scripts started ahead -----------------------------------------------------------------------

def test_a_probe_started_ahead_answers_the_next_inventory_with_the_venv_as_it_is_then(pair):
    host, venv = LocalHost(), str(pair / "target")
    waiting = prestart(host, venv, "probe", ["--stdin"])
    proc = waiting._proc
    edited = pair / "target" / SITE / "foo" / "__init__.py"
    edited.write_text("V = 'edited after the start'\n")  # after it started: it must still see this
    inventory = take_inventory(host, venv, hash_patterns=["foo"])
    assert proc.returncode == 0, "the process started ahead answered"
    assert take_prestarted(host, venv, "probe", ["--stdin"]) is None, "asked once: none left"
    entry = inventory.latest()["foo"].files[f"{SITE}/foo/__init__.py"]
    assert entry.hash == _record_hash(b"V = 'edited after the start'\n")
    assert _scripts(pair) == [f"probe {venv}"], "one probe process in all"


def test_a_probe_started_ahead_says_the_identity_the_identity_script_says(pair):
    from transplant.hosts.identity import parse_identity, venv_identity

    host, venv = LocalHost(), str(pair / "target")
    waiting = prestart(host, venv, "probe", ["--stdin"], identity=True)
    line = waiting.identity(60)
    assert line is not None and line.startswith("transplant-identity ")
    told = parse_identity(line)
    assert told is not None and told == venv_identity(LocalHost(), venv)
    assert told != venv_identity(LocalHost(), str(pair / "donor")), "another venv: another identity"
    inventory = take_inventory(host, venv, hash_patterns=["foo"])  # then it answers its request as usual
    assert waiting._proc is None and "foo" in inventory.latest()
    assert _scripts(pair).count(f"probe {venv}") == 1


def test_a_probe_that_cannot_start_says_no_identity(tmp_path):
    waiting = prestart(LocalHost(), str(tmp_path / "absent"), "probe", ["--stdin"], identity=True)
    assert waiting is None or waiting.identity(30) is None


def test_without_one_started_ahead_the_inventory_starts_its_own(pair):
    host, venv = LocalHost(), str(pair / "target")
    take_inventory(host, venv, hash_patterns=["foo"])
    assert _scripts(pair) == [f"probe {venv}"]
    assert close_prestarted(host) == 0


def test_scripts_started_ahead_and_never_asked_end_having_read_nothing(pair):
    host, venv = LocalHost(), str(pair / "target")
    started = [prestart(host, venv, name, args) for name, args in (
        ("probe", ["--stdin"]), ("elf_facts", []), ("stream_receive", side_argv("stream_receive", "")))]
    procs = [w._proc for w in started if w is not None]
    assert len(procs) == 3
    host.close()  # ends them
    assert all(p.returncode not in (None, 0) for p in procs), [p.returncode for p in procs]
    assert _scripts(pair) == [], "none of them read the venv"
    assert not (pair / "target" / ".transplant").exists(), "nothing was written"


def test_only_scripts_that_wait_for_their_input_are_started_ahead(pair):
    venv = str(pair / "target")
    for name, args in (("applier", ["pending"]), ("probe", []), ("stream_receive", [venv, "--compress", "none"]),
                       ("stream_receive", ["-", "--compress", "zlib"])):
        with pytest.raises(ValueError, match="not a host script that waits"):
            prestart(LocalHost(), venv, name, args)


# -- the stream's sides started ahead --------------------------------------------------------------

def _files(root: Path) -> list[str]:
    names = []
    for i in range(4):
        path = root / "pkg" / f"m{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"N = {i}\n".encode() * (i + 1) * 1000)
        names.append(f"pkg/m{i}.py")
    return names


def test_a_stream_through_sides_started_ahead_writes_and_hashes_as_a_fresh_one(tmp_path):
    src, host = tmp_path / "src", LocalHost()
    paths = _files(src)
    ahead = start_sides(host, str(src), host)
    sender, receiver = ahead.sender, ahead.receiver
    assert not (tmp_path / "ahead").exists()
    got = stream_files(host, str(src), host, str(tmp_path / "ahead"), paths, ahead=ahead)
    fresh = stream_files(host, str(src), host, str(tmp_path / "fresh"), paths)
    assert sender.returncode == 0 and receiver.returncode == 0, "the sides started ahead did the copy"
    assert ahead.sender is None and ahead.receiver is None
    for rel in paths:
        data = (src / rel).read_bytes()
        assert (tmp_path / "ahead" / rel).read_bytes() == data
        assert got.written[rel][:2] == fresh.written[rel][:2] == (_record_hash(data), len(data))


def test_sides_started_for_another_source_are_ended_and_the_stream_starts_its_own(tmp_path):
    src, host = tmp_path / "src", LocalHost()
    paths = _files(src)
    (tmp_path / "other").mkdir()
    ahead = start_sides(host, str(tmp_path / "other"), host)
    sender, receiver = ahead.sender, ahead.receiver
    got = stream_files(host, str(src), host, str(tmp_path / "dst"), paths, ahead=ahead)
    assert sender.returncode is not None, "ended (it listed nothing: an empty stream)"
    assert receiver.returncode not in (None, 0), "ended: an empty input is no stream"
    assert sorted(got.written) == sorted(paths)
    assert (tmp_path / "dst" / paths[0]).read_bytes() == (src / paths[0]).read_bytes()


def test_a_receiver_started_ahead_refuses_a_folder_line_that_is_not_absolute(tmp_path):
    from transplant import remote

    code = remote.source("stream_receive").decode()
    done = subprocess.run(["python3", "-I", "-S", "-c", code, "-", "--compress", "none"], input=b"relative/x\n",
                          capture_output=True, cwd=tmp_path)
    assert done.returncode == 1 and b"not an absolute path" in done.stderr
    assert list(tmp_path.iterdir()) == []


# -- the SSH apply: every script it asks was started as the connections opened ---------------------

def _ssh_manifest(lab, ssh_options, tmp_path, venv: str, compress: bool = False) -> Path:
    d, t = lab.hosts["donor"], lab.hosts["target"]
    wheels = tmp_path / "wheels"
    make_venv(d.path(venv), [build_wheel(wheels, "small", "2.0", {"small/__init__.py": "V = 2\n"})])
    make_venv(t.path(venv), [build_wheel(wheels / "1", "small", "1.0", {"small/__init__.py": "V = 1\n"})])
    path = tmp_path / "ssh.yaml"
    path.write_text(f"version: 1\ndonor: {{host: \"{d.spec}\", venv: {venv}}}\n"
                    f"target: {{host: \"{t.spec}\", venv: {venv}}}\n"
                    f"ssh: {{identity_file: {ssh_options.identity_file}, known_hosts: {ssh_options.known_hosts}}}\n"
                    f"overlay: [small]\n")
    return path


def _spied_apply(monkeypatch, manifest: Path, *extra: str, argv: list[str] | None = None) -> list[tuple[str, str, str]]:
    """Run ``transplant apply MANIFEST --yes`` (or ``argv``) in this process; returns (host label,
    script, thread name) of each host script process it started (the real calls, recorded on the way)."""
    from transplant import remote
    from transplant.cli import main

    by_code = {remote.source(name).decode(): name for name in remote.SCRIPTS}
    started: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def script(argv) -> str:
        if "-c" not in argv:
            return argv[0]
        # a session's interpreter runs under ``sh -c 'echo pid; exec "$@"'``: its code is the last -c's
        code = argv[len(argv) - 1 - argv[::-1].index("-c") + 1]
        return by_code.get(code, "identity" if "boot_id" in code else "other")

    for method in ("run", "spawn"):
        real = getattr(SSHHost, method)

        def spy(self, argv, *args, _real=real, **kwargs):
            with lock:
                started.append((self.label, script(list(argv)), threading.current_thread().name))
            return _real(self, argv, *args, **kwargs)

        monkeypatch.setattr(SSHHost, method, spy)
    assert main(argv or ["apply", str(manifest), "--yes", *extra]) == 0
    return started


def test_an_ssh_apply_asks_scripts_started_as_its_connections_opened(lab, ssh_options, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    manifest = _ssh_manifest(lab, ssh_options, tmp_path, "/srv/ahead")
    started = _spied_apply(monkeypatch, manifest)
    donor, target = lab.hosts["donor"].spec, lab.hosts["target"].spec
    scripts = sorted((label, name) for label, name, _ in started if name != "ssh")
    # no identity script (each plan probe said its venv's identity as it started), no donor ELF
    # script (no shared object moves): 7 host processes, 10 before
    assert scripts == sorted([
        (donor, "probe"), (donor, "stream_send"),
        (target, "probe"), (target, "probe"), (target, "elf_facts"), (target, "applier"),
        (target, "stream_receive")]), scripts
    early = {name for _, name, thread in started if thread.startswith("connect ")}
    assert early == {"probe", "elf_facts", "stream_send", "stream_receive"}, started
    assert (lab.hosts["target"].path("/srv/ahead") / SITE / "small" / "__init__.py").read_text() == "V = 2\n"


def test_an_ssh_apply_with_compress_starts_its_stream_when_it_copies(lab, ssh_options, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    manifest = _ssh_manifest(lab, ssh_options, tmp_path, "/srv/ahead-z")
    started = _spied_apply(monkeypatch, manifest, "--compress")
    streams = [(name, thread) for _, name, thread in started if name.startswith("stream_")]
    assert sorted(name for name, _ in streams) == ["stream_receive", "stream_send"]
    assert not any(thread.startswith("connect ") for _, thread in streams), streams
    assert (lab.hosts["target"].path("/srv/ahead-z") / SITE / "small" / "__init__.py").read_text() == "V = 2\n"


def test_an_ssh_plan_asks_the_probes_started_as_its_connections_opened(lab, ssh_options, tmp_path, monkeypatch,
                                                                        capsys):
    """Issue 16 (a plan with nothing to change): each side's probe starts as its connection opens
    (saying its venv's identity); the first plan's probes, then the second plan's memo
    fingerprints, ask those processes (the full plan also asks the target once more, after it
    planned, for the paths outside the venv it read: the memo's own check)."""
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("TRANSPLANT_PLAN_MEMO", raising=False)
    manifest = _ssh_manifest(lab, ssh_options, tmp_path, "/srv/ahead-plan")
    donor, target = lab.hosts["donor"].spec, lab.hosts["target"].spec
    time.sleep(2.1)  # older than the probe's racy window, so that the first plan keeps its memo
    for run in ("full", "memo"):
        started = _spied_apply(monkeypatch, manifest, argv=["plan", str(manifest), "--json"])
        said = capsys.readouterr().err
        assert ("nothing changed on either venv" in said) == (run == "memo"), said
        ahead = [label for label, name, thread in started if name == "probe" and thread.startswith("connect ")]
        assert sorted(ahead) == sorted([donor, target]), started
        assert not any(name == "identity" for _, name, _ in started), "each probe said its venv's identity"
        if run == "memo":
            assert sorted((label, name) for label, name, _ in started if name != "ssh") == \
                sorted([(donor, "probe"), (target, "probe")]), started
