"""The test hooks (``TRANSPLANT_TEST_*``) and the reference's table of environment variables.

A hook set is seen and an unset one is not, on the controller (:mod:`transplant.testhooks`) and
in the host scripts' shared module (``transplant/remote/_common.py``); the hooks are read in those
two modules alone; every ``TRANSPLANT_*`` name in the code is in manifests/REFERENCE.md's table.
Each "nothing reported" check has its twin that plants a fault and expects it named.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from transplant import testhooks
from transplant.remote import _common

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "manifests" / "REFERENCE.md"
NAME = re.compile(r"TRANSPLANT_[A-Z0-9_]+")
#: The two modules allowed to read a test hook.
READERS = {"transplant/testhooks.py", "transplant/remote/_common.py"}


def code_files(root: Path) -> list[Path]:
    """The files whose variables the table must hold: transplant's, the benchmarks' and the
    tests' Python files, and the scripts."""
    files = [p for folder in ("transplant", "bench", "tests") for p in sorted((root / folder).rglob("*.py"))]
    return files + sorted(p for p in (root / "scripts").iterdir() if p.is_file())


def names_in(files: list[Path]) -> dict[str, Path]:
    """Every ``TRANSPLANT_*`` name in ``files`` -> the first file naming it (a name ending in ``_``,
    such as ``TRANSPLANT_REGISTRY_*`` in prose, is a family, not a variable)."""
    found: dict[str, Path] = {}
    for path in files:
        for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            if not name.endswith("_"):
                found.setdefault(name, path)
    return found


def table_names(text: str) -> set[str]:
    """The variables of the reference's "Environment variables" table (first column)."""
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `TRANSPLANT_")]
    return {name for row in rows for name in NAME.findall(row)}


def undocumented(files: list[Path], text: str) -> list[str]:
    """``NAME (FILE)`` for each name in ``files`` missing from the table in ``text``; empty: none."""
    table = table_names(text)
    return sorted(f"{name} ({path.name})" for name, path in names_in(files).items() if name not in table)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes in ``tree`` (prose may name a hook; code may not)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def stray_hook_readers(root: Path) -> list[str]:
    """The files under ``root/transplant`` other than :data:`READERS` whose code (docstrings aside)
    holds a string naming a test hook; empty: none."""
    stray = []
    for path in sorted((root / "transplant").rglob("*.py")):
        relative = str(path.relative_to(root))
        if relative in READERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        prose = _docstrings(tree)
        if any(isinstance(node, ast.Constant) and isinstance(node.value, str) and "TRANSPLANT_TEST_" in node.value
               and id(node) not in prose for node in ast.walk(tree)):
            stray.append(relative)
    return stray


def test_a_count_hook_set_is_seen(monkeypatch):
    monkeypatch.setenv(testhooks.CRASH_AFTER, "3")
    monkeypatch.setenv(testhooks.ORPHAN_AT, "5")
    monkeypatch.setenv(testhooks.PULL_STOP_AFTER, "4096")
    assert (testhooks.crash_after(), testhooks.orphan_at(), testhooks.pull_stop_after()) == (3, 5, 4096)


def test_a_count_hook_unset_or_not_a_number_is_not_seen(monkeypatch):
    for hook in (testhooks.CRASH_AFTER, testhooks.ORPHAN_AT, testhooks.PULL_STOP_AFTER):
        monkeypatch.delenv(hook, raising=False)
    assert (testhooks.crash_after(), testhooks.orphan_at(), testhooks.pull_stop_after()) == (None, None, None)
    monkeypatch.setenv(testhooks.CRASH_AFTER, "-1")
    monkeypatch.setenv(testhooks.ORPHAN_AT, "")
    assert (testhooks.crash_after(), testhooks.orphan_at()) == (None, None)


def test_a_host_log_hook_set_is_written(monkeypatch, tmp_path):
    log = tmp_path / "scripts.log"
    monkeypatch.setenv(_common.SCRIPT_LOG, str(log))
    _common.hook_log(_common.SCRIPT_LOG, "probe /venv")
    _common.hook_log(_common.SCRIPT_LOG, "identity /venv")
    assert log.read_text() == "probe /venv\nidentity /venv\n"


def test_a_host_log_hook_unset_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(_common.APPLIER_LOG, raising=False)
    monkeypatch.chdir(tmp_path)
    _common.hook_log(_common.APPLIER_LOG, "1 commit")
    assert list(tmp_path.iterdir()) == []


def test_a_host_log_hook_that_cannot_be_written_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv(_common.APPLIER_LOG, str(tmp_path / "missing" / "applier.log"))
    _common.hook_log(_common.APPLIER_LOG, "1 commit")
    assert not (tmp_path / "missing").exists()


def test_every_hook_is_named_transplant_test():
    assert len(set(testhooks.HOOKS)) == 5
    assert all(hook.startswith("TRANSPLANT_TEST_") for hook in testhooks.HOOKS)


def test_hooks_are_read_in_the_two_hook_modules_alone():
    assert stray_hook_readers(ROOT) == []


def test_a_hook_read_elsewhere_is_reported(tmp_path):
    for reader in READERS:
        (tmp_path / reader).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / reader).write_text(f'HOOK = "{testhooks.CRASH_AFTER}"\n')
    (tmp_path / "transplant" / "prose.py").write_text(f'"""Reads {testhooks.CRASH_AFTER} through testhooks."""\n')
    (tmp_path / "transplant" / "stray.py").write_text(f'import os\nos.environ.get("{testhooks.CRASH_AFTER}")\n')
    assert stray_hook_readers(tmp_path) == ["transplant/stray.py"]


def test_every_variable_in_the_code_is_in_the_reference_table():
    assert undocumented(code_files(ROOT), REFERENCE.read_text(encoding="utf-8")) == []
    assert set(testhooks.HOOKS) <= table_names(REFERENCE.read_text(encoding="utf-8"))


def test_a_variable_missing_from_the_reference_table_is_reported(tmp_path):
    fake = "TRANSPLANT_" + "NOT_IN_THE_TABLE"
    code = tmp_path / "code.py"
    code.write_text(f'os.environ.get("{fake}")\nos.environ.get("TRANSPLANT_STATE_DIR")\n')
    assert undocumented([code], REFERENCE.read_text(encoding="utf-8")) == [f"{fake} (code.py)"]
