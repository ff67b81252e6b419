"""The small apply's overlaps: SSH connections opened early and side by side, the
applier started while the plan gathers, the stale-plan probe started early and asked under the
lock. Real local venvs built from real wheels, the real loopback SSH lab, processes counted by
the applier's own start log (``TRANSPLANT_TEST_APPLIER_LOG``) and by the waiting probe's own exit."""

from __future__ import annotations

import dataclasses
import importlib
from contextlib import ExitStack
from pathlib import Path

import pytest

from transplant.controller.manifest_file import load_manifest
from transplant.core.hostspec import HostSpec
from transplant.donor.sources import open_donor
from transplant.errors import ApplyError, HostError
from transplant.hosts import early
from transplant.hosts.host import LocalHost, SSHOptions, kill_group
from transplant.hosts.connecting import connect
from transplant.hosts.probing import ScriptSession, WaitingScript, take_inventory
from transplant.hosts.ssh import SSHHost
from transplant.lab.wheels import build_wheel, make_venv
from transplant.pipeline import apply_plan, plan_target

SITE = "lib/python3.11/site-packages"


@pytest.fixture
def pair(foo_pair: Path) -> Path:
    return foo_pair


def _apply_with_waiting_probe(root: Path, between) -> tuple[object, int | None]:
    """Start the stale-plan probe, plan, run ``between``, apply with that probe; returns apply's
    result (or the ApplyError) and the waiting probe process's exit status (0: it answered)."""
    manifest = load_manifest(root / "m.yaml")
    target = LocalHost()
    with ExitStack() as stack:
        waiting = stack.enter_context(WaitingScript(target, str(root / "target"), "probe", ["--stdin"]))
        assert waiting.started
        proc = waiting._proc
        opened = open_donor(manifest, SSHOptions(), stack)
        plan = plan_target(opened.manifest, opened.source, target)
        between()
        try:
            result: object = apply_plan(plan, opened.manifest, opened, target, stale_probe=waiting)
        except ApplyError as exc:
            result = exc
        assert waiting.ask(b"{}", 5) is None, "asked once: nothing left waiting"
    return result, proc.returncode


def test_the_stale_plan_check_asks_the_probe_started_before_the_target_changed(pair):
    edited = pair / "target" / SITE / "foo" / "__init__.py"
    result, status = _apply_with_waiting_probe(pair, lambda: edited.write_text("V = 'edited'\n"))
    assert isinstance(result, ApplyError), result
    assert "refusing a stale plan: the target changed since the plan was made" in result.message
    assert status == 0, "the waiting probe answered (it read the venv when asked, not when started)"
    assert edited.read_text() == "V = 'edited'\n", "nothing was written"


def test_the_stale_plan_check_passes_through_the_waiting_probe_when_nothing_changed(pair):
    result, status = _apply_with_waiting_probe(pair, lambda: None)
    assert not isinstance(result, ApplyError), result
    assert status == 0
    assert (pair / "target" / SITE / "foo" / "__init__.py").read_text() == "V = 2\n"


def test_a_waiting_probe_gone_before_it_is_asked_is_replaced_by_a_fresh_one(pair):
    venv = str(pair / "target")
    fresh = take_inventory(LocalHost(), venv, hash_patterns=["foo"])
    with WaitingScript(LocalHost(), venv, "probe", ["--stdin"]) as waiting:
        kill_group(waiting._proc)
        again = take_inventory(LocalHost(), venv, hash_patterns=["foo"], waiting=waiting)
    assert again.fingerprint == fresh.fingerprint


def test_an_unasked_waiting_probe_is_ended_by_closing_it(pair):
    waiting = WaitingScript(LocalHost(), str(pair / "target"), "probe", ["--stdin"])
    proc = waiting._proc
    waiting.close()
    assert proc.returncode is not None and proc.returncode != 0  # an empty request: it read nothing
    assert waiting.ask(b"{}", 5) is None


def test_a_started_applier_session_serves_its_requests_with_the_process_it_started(pair, monkeypatch):
    log = pair / "applier.log"
    monkeypatch.setenv("TRANSPLANT_TEST_APPLIER_LOG", str(log))
    session = ScriptSession(LocalHost(), str(pair / "target"))
    try:
        session.start()
        session.start()  # already running: not a second process
        assert session.request("pending", {})["ok"]
        assert session.request("pending", {})["served"] == 2
        assert session.started == 1
    finally:
        session.close()
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["--session"]


def test_an_applier_that_cannot_start_early_says_why_at_its_first_request(tmp_path):
    session = ScriptSession(LocalHost(), str(tmp_path / "nothing"))
    session.start()  # no error here
    with pytest.raises(HostError, match="does not exist"):
        session.request("pending", {})


def _spec(lab, name: str) -> HostSpec:
    return HostSpec.parse(lab.hosts[name].spec)


def test_connections_started_early_are_the_ones_connect_returns(lab, ssh_options):
    donor, target = _spec(lab, "donor"), _spec(lab, "target")
    early.start(donor, ssh_options)
    early.start(target, ssh_options)
    opened = [connect(donor, ssh_options), connect(target, ssh_options)]
    try:
        assert all(isinstance(h, SSHHost) and h.run(["true"]).ok for h in opened)
        assert early.take(donor, ssh_options) is None and early.take(target, ssh_options) is None
        assert opened[0].label != opened[1].label
    finally:
        for host in opened:
            host.close()


def test_an_early_connection_refused_for_its_host_key_raises_in_connect(lab, ssh_options, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    strict = dataclasses.replace(ssh_options, known_hosts=empty)
    with pytest.raises(HostError) as direct:
        SSHHost(_spec(lab, "target"), strict)
    early.start(_spec(lab, "target"), strict)
    with pytest.raises(HostError) as taken:
        connect(_spec(lab, "target"), strict)
    assert taken.value.message == direct.value.message
    assert "host key" in taken.value.message.lower()


def test_an_early_connection_nobody_took_is_closed(lab, ssh_options):
    spec = _spec(lab, "donor")
    early.start(spec, ssh_options)
    future = early._WAITING[(spec, ssh_options)]
    early.close_unused()
    host = future.result()
    assert host._master is False and host._folder is None
    assert early.take(spec, ssh_options) is None


# -- the libstdc++ versions a plan asks the target for, read without pyelftools ------------------

def _pyelftools_versions(path: str) -> list[str]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        sections = [s for s in ELFFile(handle).iter_sections() if s["sh_type"] == "SHT_GNU_verdef"]
        return [] if not sections else [[aux.name for aux in auxes][0] for v, auxes in sections[0].iter_versions()
                                        if not v["vd_flags"] & 1]


def _system_library(name: str) -> str:
    import ctypes

    import transplant.remote.elf_facts as script

    ctypes.CDLL(name)
    path = script.loaded_path(name)
    assert path is not None
    return path


@pytest.mark.parametrize("library", ["libstdc++.so.6", "libc.so.6", "libm.so.6", "libgcc_s.so.1"])
def test_version_definitions_read_by_struct_are_those_pyelftools_reads(library):
    import transplant.remote.elf_facts as script

    path = _system_library(library)
    quick = script.verdef_versions(path)
    assert quick and quick == _pyelftools_versions(path)


def test_version_definitions_of_a_gcc_built_object_with_a_version_script(tmp_path):
    import subprocess

    import transplant.remote.elf_facts as script

    (tmp_path / "v.c").write_text("int one(void) { return 1; }\nint two(void) { return 2; }\n")
    (tmp_path / "v.map").write_text("ALPHA_1.0 { global: one; local: *; };\nALPHA_2.0 { global: two; } ALPHA_1.0;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libv.so"), str(tmp_path / "v.c"),
                    f"-Wl,--version-script={tmp_path / 'v.map'}", "-Wl,-soname,libv.so"], check=True)
    assert script.verdef_versions(str(tmp_path / "libv.so")) == ["ALPHA_1.0", "ALPHA_2.0"] == \
        _pyelftools_versions(str(tmp_path / "libv.so"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "plain.so"), str(tmp_path / "v.c")], check=True)
    assert script.verdef_versions(str(tmp_path / "plain.so")) == [] == _pyelftools_versions(str(tmp_path / "plain.so"))


def test_a_file_the_struct_reader_cannot_read_is_left_to_pyelftools(tmp_path):
    import transplant.remote.elf_facts as script

    (tmp_path / "text.so").write_text("not an ELF file\n")
    whole = Path(_system_library("libstdc++.so.6")).read_bytes()
    (tmp_path / "cut.so").write_bytes(whole[:4096])  # its section headers are past the end
    assert script.verdef_versions(str(tmp_path / "text.so")) is None
    assert script.verdef_versions(str(tmp_path / "cut.so")) is None
    assert script.verdef_versions(str(tmp_path / "absent.so")) is None


def test_a_plan_s_libstdcxx_question_imports_no_pyelftools(pair):
    from transplant.hosts.elf_facts import _cache_options
    from transplant.hosts.probing import run_script

    venv = str(pair / "target")
    broken = {"elftools/__init__.py": "raise ImportError('pyelftools was imported')\n"}
    request = {"modules": broken, "files": [], "libstdcxx": True, "cache": _cache_options(LocalHost(), venv, "venv")}
    reply = run_script(LocalHost(), venv, "elf_facts", request=request)
    assert reply["libstdcxx"]["versions"] == _pyelftools_versions(reply["libstdcxx"]["path"])
    with pytest.raises(HostError, match="pyelftools was imported"):  # without a cache it imports at once
        run_script(LocalHost(), venv, "elf_facts", request={**request, "cache": None})


# -- the venvs' identities asked as soon as the connections open -------------------------------

def test_two_threads_asking_a_venv_identity_at_once_run_its_script_once(pair, monkeypatch):
    import threading

    from transplant.hosts import identity
    gather = importlib.import_module("transplant.pipeline.gather")  # the module (the package's `gather` is its function)

    log = pair / "script.log"
    monkeypatch.setenv("TRANSPLANT_TEST_SCRIPT_LOG", str(log))
    host, venv = LocalHost(), str(pair / "target")
    answers = []
    threads = [threading.Thread(target=lambda ask=ask: answers.append(ask(host, venv)))
               for ask in (identity.venv_identity, gather.venv_identity, identity.venv_identity)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 3 and answers[0] is not None and len(set(answers)) == 1
    assert log.read_text().splitlines() == [f"identity {venv}"]
    other = str(pair / "donor")  # the fault-free twin: another venv is asked, and differs
    assert gather.venv_identity(host, other) not in (None, answers[0])
    assert log.read_text().splitlines() == [f"identity {venv}", f"identity {other}"]


def test_a_failed_remembered_fact_is_asked_again(pair):
    host, calls = LocalHost(), []

    def failing():
        calls.append(1)
        raise HostError("unreachable")

    with pytest.raises(HostError):
        host.remembered(("fact",), failing)
    assert host.remembered(("fact",), lambda: 7) == 7 and calls == [1]


def test_a_ctrl_c_while_waiting_for_a_remembered_fact_is_raised_not_swallowed():
    """The main thread waiting for a fact another thread computes (apply's venv identity, asked in
    the background while the command imports) takes Ctrl-C as an interrupt: it was caught as the
    other caller's failure and the fact asked again, so the apply ran on and exited 0. The twin:
    the other caller's failure is still asked again here."""
    import os
    import signal
    import threading
    import time

    host, started = LocalHost(), threading.Event()

    def slow():
        started.set()
        time.sleep(1.5)
        return 1

    worker = threading.Thread(target=host.remembered, args=(("slow",), slow))
    worker.start()
    started.wait(5)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    again = []
    try:
        with pytest.raises(KeyboardInterrupt):
            host.remembered(("slow",), lambda: again.append(1) or 2)
    finally:
        timer.cancel()
        worker.join()
    assert again == []  # not asked again after the interrupt
    failing = threading.Thread(target=lambda: pytest.raises(HostError, host.remembered, ("other",),
                                                            lambda: (time.sleep(0.3), _fail())))
    failing.start()
    time.sleep(0.1)
    assert host.remembered(("other",), lambda: 3) == 3  # the other caller failed: asked here
    failing.join()


def _fail():
    raise HostError("unreachable")


def test_an_early_connection_asks_its_venv_identity_for_the_check(lab, ssh_options, tmp_path):
    gather = importlib.import_module("transplant.pipeline.gather")  # the module (the package's `gather` is its function)

    spec = _spec(lab, "target")
    make_venv(lab.hosts["target"].path("/srv/early"), [build_wheel(tmp_path, "foo", "1.0", {"foo/__init__.py": ""})])
    early.start(spec, ssh_options, "/srv/early")
    host = connect(spec, ssh_options)
    fresh = connect(spec, ssh_options)
    try:
        asked = host._remembered[("venv-identity", "/srv/early")]  # asked before the connection was handed over
        assert asked.done()
        assert gather.venv_identity(host, "/srv/early") == asked.result() is not None
        assert gather.venv_identity(fresh, "/srv/early") == asked.result()  # a new connection: the same answer
    finally:
        host.close()
        fresh.close()
