"""The verify ladder's independent stages run at once, in real venvs on this machine.

Overlap is proven without timing: the ``imports`` stage imports a module that waits for a
file the ``server-args`` stage's parser writes, and that parser waits for the file the import
writes (a rendezvous with a bounded wait): run one after the other, the first to run gives up
and fails. Each host process's start and end are recorded by a :class:`LocalHost` that notes
them around the real command (the commands themselves run unchanged), to show that ``smoke``
and ``serve`` still run alone, one after the other.
"""

from __future__ import annotations

import dataclasses
import threading
import textwrap
import time
from pathlib import Path

import pytest

from transplant import remote
from transplant.cli.progress import StagesShown
from transplant.core.manifest import ServeCheck, ServerArgsCheck, VerifySettings
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import run_script
from transplant.lab.wheels import build_wheel, make_venv
from transplant.reporting import RecordingReporter
from transplant.verify.runner import GROUP, STAGES, run_stages

#: Imported by the ``imports`` (and ``library-provenance``) stage: says it is there, then waits
#: for a ``server-args`` process to say the same.
MEET_A = textwrap.dedent('''\
    import os, time
    _dir = os.environ["MEET_DIR"]
    open(os.path.join(_dir, "a-%d" % os.getpid()), "w").close()
    _deadline = time.monotonic() + float(os.environ["MEET_WAIT"])
    while not any(n.startswith("b-") for n in os.listdir(_dir)):
        if time.monotonic() > _deadline:
            raise ImportError("no server-args process ran at the same time")
        time.sleep(0.02)
    __version__ = "1.0"
    ''')

#: The ``server-args`` stage's parser: says it is there, waits for an importing process.
MEET_B = textwrap.dedent('''\
    import os, time, types

    def parse(argv):
        folder = os.environ["MEET_DIR"]
        open(os.path.join(folder, "b-%d" % os.getpid()), "w").close()
        deadline = time.monotonic() + float(os.environ["MEET_WAIT"])
        while not any(n.startswith("a-") for n in os.listdir(folder)):
            if time.monotonic() > deadline:
                raise RuntimeError("no imports process ran at the same time")
            time.sleep(0.02)
        return types.SimpleNamespace(port=int(argv[argv.index("--port") + 1]))

    def crash(argv):
        os._exit(9)
    ''')


class Timed(LocalHost):
    """This machine, noting which host script each command ran and when it started and ended
    (a process started to be talked to, as the imports process is, ends when the controller has
    its reply: its ``communicate`` returned)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def run(self, argv, *, stdin=None, env=None, timeout=None):
        started = time.monotonic()
        try:
            return super().run(argv, stdin=stdin, env=env, timeout=timeout)
        finally:
            with self._lock:
                self.runs.append((_script(argv, stdin), started, time.monotonic()))

    def spawn(self, argv, *, env=None, stdin=None, stdout=None):
        started = time.monotonic()
        proc = super().spawn(argv, env=env, stdin=stdin, stdout=stdout)
        communicate, noted = proc.communicate, []

        def noting(*args, **kwargs):
            try:
                return communicate(*args, **kwargs)
            finally:
                if not noted:
                    noted.append(True)
                    with self._lock:
                        self.runs.append((_script(argv, None), started, time.monotonic()))

        proc.communicate = noting
        return proc

    def span(self, script: str) -> tuple[float, float]:
        found = [(s, e) for name, s, e in self.runs if name == script]
        assert len(found) == 1, (script, self.runs)
        return found[0]


def _script(argv, stdin) -> str:
    for name in remote.SCRIPTS:
        code = remote.source(name)
        if stdin == code or code.decode() in argv:
            return name
    return "?"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("parallel")
    wheel = build_wheel(root / "wheels", "meet", "1.0", {"meet_a/__init__.py": MEET_A, "meet_b.py": MEET_B,
                                                        "plain/__init__.py": "__version__ = '2.0'\n",
                                                        "crash_now.py": "import os\nos._exit(7)\n"})
    return str(make_venv(root / "venv", [wheel]))


def _settings(tmp_path: Path, wait: float, **changes) -> VerifySettings:
    meet = tmp_path / "meet"
    meet.mkdir(parents=True)
    env = {"MEET_DIR": str(meet), "MEET_WAIT": str(wait), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    check = ServerArgsCheck(entry="meet_b:parse", args=("--port", "30000"), expect={"port": 30000})
    return VerifySettings(imports=("meet_a",), server_args=check, env=env, timeout=120, **changes)


def test_independent_stages_run_at_once(venv, tmp_path):
    host = Timed()
    recorded = RecordingReporter()
    results = run_stages(_settings(tmp_path, wait=60), target=host, venv=venv, reporter=recorded)
    by = {r.name: r for r in results}
    assert by["imports"].status == "pass", by["imports"].reason
    assert by["server-args"].status == "pass" and by["server-args"].reason == "parsed; 30000 (port)"
    assert by["library-provenance"].details["imported"] == [{"name": "meet_a", "ok": True, "error": None}]
    assert [r.name for r in results] == [n for n in STAGES if n != "server-args-resolve"]  # the ladder's order
    assert "stage_provenance" not in [name for name, _, _ in host.runs], "one process imported for both stages"
    imports, parser = host.span("stage_imports"), host.span("stage_server_args")
    assert imports[0] < parser[1] and parser[0] < imports[1], "the two processes overlapped"
    done = [e[1:] for e in recorded.events if e[0] == "progress"]
    counts = [d for d, _ in done]  # one report per stage ended, of the stages that run (the table's rows)
    assert counts == sorted(set(counts)) and len(counts) == len(results) and done[-1] == (len(results), len(results))


def test_one_at_a_time_the_rendezvous_fails(venv, tmp_path):
    """The twin, run as the ladder ran before (parallel=1): the import waits for a parser that
    has not started, and fails; the parser then finds the import's file and passes."""
    by = {r.name: r for r in run_stages(_settings(tmp_path, wait=1), target=LocalHost(), venv=venv, parallel=1)}
    assert by["imports"].status == "fail" and "no server-args process ran at the same time" in by["imports"].reason
    assert by["server-args"].status == "pass"


def test_a_failing_stage_stops_none_and_smoke_and_serve_run_alone_after_the_rest(venv, tmp_path):
    serve = ServeCheck(command=("{python}", "-c", "import sys; sys.exit(3)", "{port}"), timeout=30)
    settings = _settings(tmp_path, wait=0, smoke_device="cpu", serve=serve)
    settings = dataclasses.replace(settings, imports=("plain",),
                                   server_args=ServerArgsCheck(entry="meet_b:crash", args=(), expect={}))
    host = Timed()
    lines: list[str] = []
    results = run_stages(settings, target=host, venv=venv, reporter=StagesShown(lines.append, "verify"))
    by = {r.name: r for r in results}
    assert [r.name for r in results] == [n for n in STAGES if n != "server-args-resolve"]
    # the command's spinner names the stages running now, and how many of the 9 that run have ended
    # (it said "5 of 10 done" right after interpreter, named stages already ended, ended on 10 of 10)
    assert lines[:2] == ["verify: interpreter", "verify: 1 of 9 done"]
    assert lines[-4:] == ["verify: smoke (7 of 9 done)", "verify: 8 of 9 done", "verify: serve (8 of 9 done)",
                          "verify: 9 of 9 done"]
    # between them, the group's stages, each named while it runs; a stage is named from its start
    # to its end, never after: at most the group's 4 at once, and the count goes up one by one
    running = [line[len("verify: "):].split(" (")[0].split(", ") for line in lines[2:-4] if " (" in line]
    assert {name for names in running for name in names} == set(GROUP) and lines[-5] == "verify: 7 of 9 done"
    assert all(len(names) <= 4 for names in running)
    assert any("imports, library-provenance" in line for line in lines)
    ends = [int(line.split(" of ")[0].rsplit(" ", 1)[-1].lstrip("(")) for line in lines if " of 9 done" in line]
    assert ends == sorted(ends) and set(ends) == set(range(1, 10))
    assert by["server-args"].status == "fail" and "script failed in the venv's python (exit 9)" in by["server-args"].reason
    assert by["imports"].status == "pass" and by["imports"].reason == "1 import: plain 2.0"
    assert by["requirements"].status == "pass" and by["jit-caches"].status == "pass"
    # smoke (device cpu, named) has no torch to run and the server exits at once: both ran, and failed,
    # after the others
    assert by["smoke"].status == "fail" and by["smoke"].reason.startswith("torch is not installed in this venv")
    assert "smoke: {device: cpu} asks for it" in by["smoke"].reason
    assert by["serve"].status == "fail" and "exited with code 3" in by["serve"].reason
    smoke, served = host.span("stage_smoke"), host.span("stage_serve")
    others = [(s, e) for name, s, e in host.runs if name not in ("stage_smoke", "stage_serve")]
    assert len(others) == 4  # the probe, imports with provenance, server-args, jit-caches (no shared objects to load)
    assert all(e <= smoke[0] for _, e in others) and smoke[1] <= served[0]


def test_clearing_jit_caches_runs_that_stage_last_and_alone(venv, tmp_path):
    settings = _settings(tmp_path, wait=60)
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "kernel.json").write_text("{}")
    host = Timed()
    recorded = RecordingReporter()
    results = run_stages(settings, target=host, venv=venv, clear_jit_caches=True, reporter=recorded)
    assert [r.name for r in results][-1] == "jit-caches" and recorded.steps()[-1] == "jit-caches"
    assert sorted(recorded.steps()[1:-3]) == sorted(set(GROUP) - {"jit-caches"})
    jit = host.span("stage_jit")
    assert all(e <= jit[0] for name, _, e in host.runs if name != "stage_jit")
    assert not (tmp_path / "triton").exists(), results[-1].reason
    assert (tmp_path / "meet").is_dir(), "nothing but the cache folder was removed"


def test_parallel_below_one_is_refused(venv, tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        run_stages(_settings(tmp_path, wait=0), target=LocalHost(), venv=venv, parallel=0)


def test_the_shared_process_reports_what_the_provenance_script_alone_reports(venv):
    alone = run_script(LocalHost(), venv, "stage_provenance", request={"modules": ["plain", "json"]})
    request = {"provenance": {"modules": ["plain", "json"], "source": remote.source("stage_provenance").decode()}}
    both = run_script(LocalHost(), venv, "stage_imports", ["plain"], request=request)
    assert [i["name"] for i in both["imports"]] == ["plain"] and both["imports"][0]["ok"]
    shared = both["provenance"]
    assert shared["imported"] == alone["imported"] == [{"name": "plain", "ok": True, "error": None},
                                                       {"name": "json", "ok": True, "error": None}]
    assert sorted(shared) == sorted(alone)
    for key in ("prefix", "ld_library_path", "ld_preload", "ld_so_conf"):
        assert shared[key] == alone[key], key
    assert set(alone["mapped"]) <= set(shared["mapped"]) and set(alone["extension_modules"]) <= set(shared["extension_modules"])


def test_when_the_shared_process_dies_both_stages_fail_with_its_reason_and_the_rest_run(venv, tmp_path):
    settings = dataclasses.replace(_settings(tmp_path, wait=0), imports=("crash_now",), server_args=None)
    by = {r.name: r for r in run_stages(settings, target=LocalHost(), venv=venv)}
    assert by["imports"].status == "fail" and "(exit 7)" in by["imports"].reason
    assert by["library-provenance"].status == "fail" and by["library-provenance"].reason == by["imports"].reason
    assert by["requirements"].status == "pass" and by["jit-caches"].status == "pass"


def test_a_venv_verified_alone_names_no_manifest_and_no_donor_in_its_reasons(venv, tmp_path):
    settings = dataclasses.replace(_settings(tmp_path, wait=0), imports=("plain",), server_args=None)
    alone = {r.name: r for r in run_stages(settings, target=LocalHost(), venv=venv, manifest=False)}
    assert alone["server-args"].reason == ("no server arguments given: verify with a manifest that sets "
                                           "verify.server_args to run this stage")
    assert alone["smoke"].reason.startswith("no smoke check given: ") and "verify.smoke" in alone["smoke"].reason
    assert alone["serve"].reason.startswith("no serve check given: ") and "verify.serve" in alone["serve"].reason
    assert alone["requirements"].status == "pass"
    assert alone["requirements"].reason == "every requirement of the venv's distributions is satisfied"
    for result in alone.values():
        assert "in the manifest" not in result.reason, result
    assert "donor" not in alone["requirements"].reason
    # the manifest's twin: the same settings from a manifest say which key is missing there
    from_manifest = {r.name: r for r in run_stages(settings, target=LocalHost(), venv=venv)}
    assert from_manifest["server-args"].reason == "no verify.server_args in the manifest"
    assert from_manifest["serve"].reason == "no verify.serve in the manifest"


class ProbeWaits(Timed):
    """:class:`Timed`, whose inventory probe starts only once an imports process has started
    (or ``wait`` seconds have passed): ``saw`` says which."""

    def __init__(self, wait: float) -> None:
        super().__init__()
        self.wait, self.saw, self.imports = wait, None, threading.Event()

    def run(self, argv, *, stdin=None, env=None, timeout=None):
        script = _script(argv, stdin)
        if script == "stage_imports":
            self.imports.set()
        elif script == "probe" and self.saw is None:
            self.saw = self.imports.wait(self.wait)
        return super().run(argv, stdin=stdin, env=env, timeout=timeout)

    def spawn(self, argv, *, env=None, stdin=None, stdout=None):
        if _script(argv, None) == "stage_imports":
            self.imports.set()
        return super().spawn(argv, env=env, stdin=stdin, stdout=stdout)


def test_without_an_overlay_the_imports_process_starts_beside_the_inventory(venv, tmp_path):
    host = ProbeWaits(wait=60)
    by = {r.name: r for r in run_stages(_settings(tmp_path, wait=60), target=host, venv=venv)}
    assert host.saw is True, "the imports process started while the inventory was still to be taken"
    assert by["interpreter"].status == by["imports"].status == by["server-args"].status == "pass"
    assert by["library-provenance"].details["imported"] == [{"name": "meet_a", "ok": True, "error": None}]
    assert [name for name, _, _ in host.runs].count("stage_imports") == 1
    assert "stage_provenance" not in [name for name, _, _ in host.runs]
    # one at a time, nothing starts early (the twin)
    one = ProbeWaits(wait=0.5)
    run_stages(_settings(tmp_path / "one", wait=0), target=one, venv=venv, parallel=1)
    assert one.saw is False


def test_a_wrong_guess_about_torch_runs_the_provenance_script_on_its_own(venv, tmp_path):
    """torch named but not installed: the early process imports it (and fails); the inventory has
    no torch, so library-provenance's modules are other than those it imported: it runs again alone."""
    host = Timed()
    settings = dataclasses.replace(_settings(tmp_path, wait=0), imports=("plain", "torch"), server_args=None)
    by = {r.name: r for r in run_stages(settings, target=host, venv=venv)}
    assert by["imports"].status == "fail" and "No module named 'torch'" in by["imports"].reason
    assert [name for name, _, _ in host.runs].count("stage_provenance") == 1
    assert by["library-provenance"].details["imported"] == [{"name": "plain", "ok": True, "error": None}]


@pytest.mark.parametrize("overlay", [(), ("meet",)], ids=["early", "after-the-inventory"])
def test_a_stage_past_its_timeout_is_stopped_and_the_others_keep_their_results(venv, tmp_path, overlay):
    """The imports process waits (for a server-args process that never comes) past verify.timeout
    while the other stages run: imports and library-provenance (its process) fail naming the
    timeout, the process is stopped at it (not left to its own 60 s), and the stages beside it
    keep their own results. The twin: the same wait with a timeout it fits in passes."""
    # the overlay's import names are meet's packages: crash_now exits at import, it is not the point here
    skip = {"crash_now": "exits at import"} if overlay else {}
    settings = dataclasses.replace(_settings(tmp_path, wait=60), server_args=None, timeout=6, overlay=overlay,
                                   skip_imports=skip)
    started = time.monotonic()
    by = {r.name: r for r in run_stages(settings, target=LocalHost(), venv=venv)}
    took = time.monotonic() - started
    assert by["imports"].status == "fail" and "ran past its timeout of 6 s" in by["imports"].reason
    assert by["library-provenance"].status == "fail" and by["library-provenance"].reason == by["imports"].reason
    assert by["interpreter"].status == "pass" and by["requirements"].status == "pass"
    assert by["jit-caches"].status == "pass" and by["native-load"].status == "skip"
    assert took < 45, f"the stage was stopped at its timeout, not after the import's own wait ({took:.1f} s)"
    # the twin: the import gives up after 1 s on its own, well within the timeout, and says why
    twin = dataclasses.replace(_settings(tmp_path / "twin", wait=1), server_args=None, timeout=60, overlay=overlay,
                               skip_imports=skip)
    by = {r.name: r for r in run_stages(twin, target=LocalHost(), venv=venv)}
    assert by["imports"].status == "fail" and "no server-args process ran at the same time" in by["imports"].reason
    assert "timeout" not in by["imports"].reason and by["library-provenance"].status == "skip"


class Spawns(LocalHost):
    """This machine, counting the imports processes spawned."""

    def __init__(self) -> None:
        super().__init__()
        self.imports = 0

    def spawn(self, argv, *, env=None, stdin=None, stdout=None):
        if _script(argv, None) == "stage_imports":
            self.imports += 1
        return super().spawn(argv, env=env, stdin=stdin, stdout=stdout)


def test_an_imports_process_started_ahead_is_the_one_the_ladder_asks(venv, tmp_path):
    """``verify HOST:VENV`` starts the imports process before loading the ladder
    (:func:`transplant.verify.early.start_imports`); the ladder asks that one, and its stages'
    seconds count from its start. The twin: one started for other names is ended, and the
    ladder starts its own."""
    from transplant.verify.early import start_imports

    settings = dataclasses.replace(_settings(tmp_path, wait=0), imports=("plain",), server_args=None)
    host = Spawns()
    started = start_imports(settings, host, venv)
    assert started is not None and started.script.started and host.imports == 1
    time.sleep(1.0)  # the imports process has a second's head start on the ladder
    by = {r.name: r for r in run_stages(settings, target=host, venv=venv, started=started)}
    assert host.imports == 1, "no second imports process"
    assert by["imports"].status == "pass" and by["imports"].reason == "1 import: plain 2.0"
    assert by["imports"].seconds >= 1.0, "counted from the process's start"
    assert by["library-provenance"].details["imported"][-1] == {"name": "plain", "ok": True, "error": None}
    other = Spawns()
    stale = start_imports(dataclasses.replace(settings, imports=("json",)), other, venv)
    by = {r.name: r for r in run_stages(settings, target=other, venv=venv, started=stale)}
    assert other.imports == 2 and by["imports"].reason == "1 import: plain 2.0"
    assert stale.script.ask(b"", 1) is None, "the one started for other names was ended"


def test_the_verify_command_loads_light_before_its_imports_process_starts(tmp_path):
    """What ``transplant verify HOST:VENV`` loads before it starts the imports process: not the
    pipeline, the planner, the ladder's runner or the renderers (half a second of CPU loading
    that now overlaps the imports process)."""
    from loading import loaded_after

    early = ["transplant.cli.app", "transplant.cli.commands.verify", "transplant.cli.locations"]
    heavy = ["transplant.pipeline", "transplant.core.planner", "transplant.verify.runner", "transplant.cli.render",
             "transplant.cli.session", "transplant.donor.sources"]
    assert loaded_after(early, heavy) == [], "loaded before the imports process starts"
