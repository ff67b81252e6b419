"""The imports process's import workers and smoke's child forked from it, in real venvs.

Every name is imported exactly once, in one process, and a name that fails still fails (the
import of each package noted in a folder by the process that imported it).

Smoke's child is forked by the imports process only once it has imported torch and only while
CUDA is not initialized there; else (and when torch's import failed) smoke runs its own process,
as before. Its report equals the one of its own process: on the real seed stack (tier ``real``),
and in the ladder with a torch whose import fails.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from transplant import remote
from transplant.core.manifest import VerifySettings
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import run_script
from transplant.lab.wheels import build_wheel, make_venv
from transplant.remote.stage_imports import _groups
from transplant.verify import early
from transplant.verify.runner import run_stages

from counting_host import Counting

#: A package whose import notes the importing process in ``IMPORTED_DIR``.
NOTES = textwrap.dedent('''\
    import os
    _dir = os.environ.get("IMPORTED_DIR")
    if _dir:
        open(os.path.join(_dir, __name__ + "-%d" % os.getpid()), "w").close()
    __version__ = "1.0"
    ''')

PACKAGES = ("pa", "pb", "pc", "pd")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    """pa..pd (each notes its importing process), ``pa.sub`` (a second name of pa's package),
    ``broken`` (its import raises), ``dies`` (its import ends the process with status 9)."""
    root = tmp_path_factory.mktemp("dealing")
    files = {f"{name}/__init__.py": NOTES for name in PACKAGES}
    files["pa/sub.py"] = NOTES
    files["broken/__init__.py"] = "raise ImportError('broken on purpose')\n"
    files["dies/__init__.py"] = "import os\nos._exit(9)\n"
    wheel = build_wheel(root / "wheels", "dealt", "1.0", files)
    return str(make_venv(root / "venv", [wheel]))


def _imports(venv: str, names: list[str], tmp_path: Path, jobs: int = 2) -> tuple[dict, dict]:
    """The imports document and, per package noted, the pids that imported it."""
    notes = tmp_path / "notes"
    notes.mkdir()
    request: dict = {"jobs": jobs}
    document = run_script(LocalHost(), venv, "stage_imports", names, request=request,
                          env={"IMPORTED_DIR": str(notes)}, timeout=60)
    pids: dict[str, list[str]] = {}
    for note in notes.iterdir():
        name, _, pid = note.name.rpartition("-")
        pids.setdefault(name, []).append(pid)
    return document, pids


def test_every_name_is_imported_once_and_a_failing_name_still_fails(venv, tmp_path):
    """Two processes, the packages dealt round-robin (pa with pa.sub, broken, pb to the imports
    process; pc, pd to its worker): each name answered once, in the names' order, by one process."""
    names = ["pa", "pc", "pa.sub", "broken", "pd", "pb"]
    document, pids = _imports(venv, names, tmp_path)
    assert [i["name"] for i in document["imports"]] == names
    by = {i["name"]: i for i in document["imports"]}
    assert by["broken"]["ok"] is False and by["broken"]["error"] == "ImportError: broken on purpose"
    assert all(by[n]["ok"] for n in names if n != "broken")
    assert sorted(pids) == ["pa", "pa.sub", "pb", "pc", "pd"] and all(len(p) == 1 for p in pids.values()), pids
    assert pids["pa"] == pids["pa.sub"] == pids["pb"] != pids["pc"] == pids["pd"]
    assert _groups(["pa", "pc", "pa.sub", "broken", "pd", "pb"], 2) == [["pa", "pa.sub", "broken", "pb"], ["pc", "pd"]]


def test_a_name_ending_its_worker_fails_its_group_and_the_imports_process_answers(venv, tmp_path):
    document, pids = _imports(venv, ["pa", "dies", "pb", "pc"], tmp_path)
    by = {i["name"]: i for i in document["imports"]}
    assert by["pa"]["ok"] and by["pb"]["ok"] and list(by) == ["pa", "dies", "pb", "pc"]
    for name in ("dies", "pc"):
        assert by[name]["error"] == "SystemError: the import worker ended (exited with code 9) without answering"
    assert sorted(pids) == ["pa", "pb"]


def test_no_smoke_child_without_torch_and_smoke_runs_its_own_process(venv, tmp_path):
    """A torch whose import fails: no child is forked (the document's smoke is null), and the
    ladder's smoke stage is its own process's: the same reason as without the fork."""
    root = tmp_path
    wheel = build_wheel(root / "wheels", "torch", "2.9.1", {"torch/__init__.py": "raise ImportError('no torch here')\n"})
    with_torch = str(make_venv(root / "venv", [wheel]))
    settings = VerifySettings(imports=("torch",), smoke_device="cpu")
    request = {"smoke": early.smoke_fork(settings),
               "native": {"preload": ["torch"], "optional": [], "source": remote.source("stage_native").decode()}}
    document = run_script(LocalHost(), with_torch, "stage_imports", ["torch"], request=request, timeout=60)
    assert document["smoke"] is None and document["imports"][0]["ok"] is False
    by = {r.name: r for r in run_stages(settings, target=LocalHost(), venv=with_torch)}
    own = run_script(LocalHost(), with_torch, "stage_smoke", ["cpu"], timeout=60)
    assert by["smoke"].status == "fail" and by["smoke"].details == own
    assert by["smoke"].reason.startswith("import torch failed: ImportError: no torch here")


REAL = Path(os.environ.get("TRANSPLANT_REAL") or Path.home() / ".cache" / "transplant" / "real") / "donor"


@pytest.mark.real
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_the_forked_smoke_reports_what_its_own_process_reports(device, monkeypatch):
    """On the real seed stack's torch (read only: no bytecode written): the report of smoke's child
    forked after torch equals that of ``stage_smoke`` as its own process; numpy is imported too."""
    if not (REAL / ".transplant-real-complete").exists():
        pytest.skip(f"{REAL} is absent or incomplete: build it with scripts/real-stacks")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    settings = VerifySettings(imports=("torch", "numpy"), smoke_device=device)
    fork = early.smoke_fork(settings)
    assert fork is not None and fork["argv"] == [device]
    alone = run_script(LocalHost(), str(REAL), "stage_smoke", fork["argv"], timeout=300)
    request = early.first_line(["torch", "numpy"], [], ["torch"], False, None, fork) + early.second_line([])
    both = run_script(LocalHost(), str(REAL), "stage_imports", ["torch", "numpy"], request=request, timeout=300)
    assert both["smoke"] == alone, json.dumps([both["smoke"], alone])[:3000]
    assert alone["ok"] is True and [i["ok"] for i in both["imports"]] == [True, True]


@pytest.mark.real
def test_the_ladder_asks_the_forked_smoke_and_gives_the_same_stage(monkeypatch):
    """The smoke stage of a ladder whose imports process forked it (no stage_smoke process) is the
    one of a ladder that runs it as its own process (no import names: no imports process)."""
    if not (REAL / ".transplant-real-complete").exists():
        pytest.skip(f"{REAL} is absent or incomplete: build it with scripts/real-stacks")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    forked_host, own_host = Counting(), Counting()
    forked = {r.name: r for r in run_stages(VerifySettings(imports=("numpy",), smoke_device="auto"),
                                            target=forked_host, venv=str(REAL))}
    own = {r.name: r for r in run_stages(VerifySettings(smoke_device="auto"), target=own_host, venv=str(REAL))}
    assert "stage_smoke" not in forked_host.scripts and "stage_smoke" in own_host.scripts
    assert forked["smoke"].status == own["smoke"].status == "pass"
    assert (forked["smoke"].reason, json.dumps(forked["smoke"].details, sort_keys=True), forked["smoke"].unchecked) \
        == (own["smoke"].reason, json.dumps(own["smoke"].details, sort_keys=True), own["smoke"].unchecked)
