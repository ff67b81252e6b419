"""The plan's narrow view (one line per change): file counts agree with their noun."""

from __future__ import annotations

from transplant.cli.planview import change_lines
from transplant.core.plan import Change, FileCopy, Plan, Side


def _plan(*changes: Change) -> Plan:
    side = Side(label="d:/v", host="root@d", venv="/v", fingerprint="f" * 64, hostname="d")
    return Plan(manifest="m.yaml", donor=side, target=side, changes=changes, findings=(), hash_patterns=(),
                patch_files=())


def _copies(n: int) -> tuple[FileCopy, ...]:
    return tuple(FileCopy(path=f"p/{i}.py", size=1, hash="sha256=x") for i in range(n))


def test_one_copied_file_is_one_file_and_more_are_files():
    lines = [line.plain for line in change_lines(_plan(
        Change(kind="distribution", name="one", action="upgrade", reason="", from_version="1", to_version="2",
               copy=_copies(1)),
        Change(kind="distribution", name="three", action="add", reason="", to_version="2", copy=_copies(3)),
        Change(kind="distribution", name="gone", action="upgrade", reason="", from_version="1", to_version="2",
               copy=_copies(2), remove=("p/old.py",))))]
    assert any(line.startswith("~ one 1 -> 2 (upgrade)  1 file,") for line in lines), lines
    assert any(line.startswith("+ three==2  3 files,") for line in lines), lines
    assert any("  2 / -1 files," in line for line in lines), lines
    assert not any(" 1 files" in line for line in lines), lines
