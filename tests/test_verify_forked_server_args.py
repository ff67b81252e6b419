"""The server-args stage's parser run in a child the imports process forks once it has imported the
parser's package, in a real venv on this machine: its report is the document the script gives as a
process of its own, and a child that dies or hangs ends only its own stage."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from transplant.core.manifest import ServerArgsCheck, VerifySettings
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import run_script
from transplant.lab.wheels import build_wheel, make_venv
from transplant.verify.early import server_args_fork
from transplant.verify.runner import run_stages

from counting_host import Counting

#: The parsers: argparse naming its program from ``sys.argv[0]`` (as sglang's does), one that dies
#: of a signal, one that never returns, one that prints on the standard output while parsing.
CLI = textwrap.dedent('''\
    import argparse, os, signal, sys, time

    def parse(argv):
        parser = argparse.ArgumentParser()
        parser.add_argument("--port", type=int, default=1)
        parser.add_argument("--mode", choices=["a", "b"], default="a")
        print("parsing", argv)
        return parser.parse_args(argv)

    def die(argv):
        os.kill(os.getpid(), signal.SIGSEGV)

    def hang(argv):
        time.sleep(120)
    ''')


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("forked")
    wheel = build_wheel(root / "wheels", "parsers", "1.0", {"parsers/__init__.py": "__version__ = '1.0'\n",
                                                           "parsers/cli.py": CLI,
                                                           "plain/__init__.py": "__version__ = '2.0'\n"})
    return str(make_venv(root / "venv", [wheel]))


def _settings(entry: str, args: tuple[str, ...], imports: tuple[str, ...], **changes) -> VerifySettings:
    check = ServerArgsCheck(entry=entry, args=args, expect={"port": 8000})
    return VerifySettings(imports=imports, server_args=check, timeout=120, **changes)


def _forked(venv: str, names: list[str], settings: VerifySettings, jobs: int = 1) -> dict:
    fork = server_args_fork(settings, names)
    assert fork is not None
    return run_script(LocalHost(), venv, "stage_imports", names, request={"jobs": jobs, "server_args": fork})


@pytest.mark.parametrize("args", [("--port", "8000"), ("--port", "8000", "--mode", "c"), ("--port", "x")])
@pytest.mark.parametrize("names, jobs", [(["parsers"], 1), (["plain", "parsers"], 2)], ids=["main", "worker"])
def test_the_forked_parser_reports_what_its_own_process_reports(venv, args, names, jobs):
    """Accepted and rejected arguments (argparse's message names its program: ``-`` as with
    ``python -``), the parser's package imported by the imports process itself or by a worker."""
    settings = _settings("parsers.cli:parse", args, tuple(names))
    fork = server_args_fork(settings, names)
    assert fork is not None
    alone = run_script(LocalHost(), venv, "stage_server_args", fork["argv"])
    both = _forked(venv, names, settings, jobs)
    assert both["server_args"] == alone
    assert [i["name"] for i in both["imports"]] == names and all(i["ok"] for i in both["imports"])
    if "x" in args:
        assert alone["ok"] is False
        assert "-: error: argument --port: invalid int value: 'x'" in alone["error"]


def test_a_dying_child_is_said_and_the_imports_are_answered(venv):
    both = _forked(venv, ["parsers"], _settings("parsers.cli:die", (), ("parsers",)))
    assert both["server_args"] == {"died": "killed by SIGSEGV (segmentation fault)"}
    assert both["imports"][0]["ok"] and both["imports"][0]["name"] == "parsers"


def test_a_child_past_its_deadline_is_killed_and_the_imports_are_answered(venv):
    settings = _settings("parsers.cli:hang", (), ("parsers",))
    fork = dict(server_args_fork(settings, ["parsers"]) or {}, deadline=2)
    both = run_script(LocalHost(), venv, "stage_imports", ["parsers"], request={"server_args": fork}, timeout=60)
    assert both["server_args"] == {"timed_out": 2.0} and both["imports"][0]["ok"]


def test_no_fork_when_the_parsers_package_is_not_imported_or_fails(venv):
    assert server_args_fork(_settings("parsers.cli:parse", (), ("plain",)), ["plain"]) is None
    assert server_args_fork(VerifySettings(imports=("parsers",)), ["parsers"]) is None
    settings = _settings("missing_pkg.cli:parse", (), ("missing_pkg",))
    both = _forked(venv, ["missing_pkg"], settings)
    assert both["server_args"] is None and not both["imports"][0]["ok"]


def test_the_ladder_asks_the_forked_parser_and_gives_the_same_stage(venv):
    """The same stage result, details and reason, whether the parser ran in the imports process's
    child (its package among the import names: no stage_server_args process) or its own process."""
    forked_host, own_host = Counting(), Counting()
    forked = {r.name: r for r in run_stages(_settings("parsers.cli:parse", ("--port", "8000"), ("parsers",)),
                                            target=forked_host, venv=venv)}
    own = {r.name: r for r in run_stages(_settings("parsers.cli:parse", ("--port", "8000"), ("plain",)),
                                         target=own_host, venv=venv)}
    assert "stage_server_args" not in forked_host.scripts and "stage_server_args" in own_host.scripts
    assert forked["server-args"].status == own["server-args"].status == "pass"
    assert (forked["server-args"].reason, json.dumps(forked["server-args"].details, sort_keys=True)) == \
        (own["server-args"].reason, json.dumps(own["server-args"].details, sort_keys=True))
    assert forked["imports"].status == "pass" and forked["library-provenance"].status in ("pass", "skip")


def test_a_dying_parser_child_fails_only_its_stage(venv):
    """The child dies of SIGSEGV: the stage runs its own process, which dies the same way, so the stage
    fails with the reason it has without the fork; imports and library-provenance keep theirs."""
    host = Counting()
    died = {r.name: r for r in run_stages(_settings("parsers.cli:die", (), ("parsers",)), target=host, venv=venv)}
    own = {r.name: r for r in run_stages(_settings("parsers.cli:die", (), ("plain",)), target=LocalHost(), venv=venv)}
    assert died["server-args"].status == "fail" and "SIGSEGV" in died["server-args"].reason
    assert died["server-args"].reason == own["server-args"].reason
    assert host.scripts.count("stage_server_args") == 1  # the fallback, after the child died
    assert died["imports"].status == "pass" and died["imports"].reason == "1 import: parsers 1.0"
    assert died["requirements"].status == "pass" and died["jit-caches"].status == "pass"


def test_a_forked_parser_past_the_stage_timeout_fails_it_as_a_timed_out_process_does(venv):
    settings = dataclasses.replace(_settings("parsers.cli:hang", (), ("parsers",)), timeout=20)
    by = {r.name: r for r in run_stages(settings, target=LocalHost(), venv=venv)}
    assert by["server-args"].status == "fail"
    assert by["server-args"].reason.startswith("ran past its timeout of 20 s and was stopped")
    assert by["imports"].status == "pass"
