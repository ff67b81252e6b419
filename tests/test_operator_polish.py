"""The operator's second round, from the command line: history folds repeated verifies and says
when there is nothing, the inventory's bytes column has one named meaning, mistypes get
suggestions, the apply bar stays readable at 80 columns. Each command runs as a real process
with its output at 80 columns in a pipe and in a file (local venvs from real wheels; state
folders inside tmp_path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A local donor (foo 2.0, bar-utils 1.0) and target (foo 1.0, bar-utils 1.0), a manifest maker;
    the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    new = build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n", "foo/extra.py": "E = 1\n"})
    old = build_wheel(wheels / "old", "foo", "1.0", {"foo/__init__.py": "V = 1\n", "foo/gone.py": "G = 1\n"})
    bar = build_wheel(wheels / "bar", "bar-utils", "1.0", {"bar_utils/__init__.py": "B = 1\n"})
    make_venv(tmp_path / "donor", [new, bar])
    make_venv(tmp_path / "target", [old, bar])

    def manifest(name: str = "m.yaml", overlay: str = "[foo]", extra: str = "", target: str | None = None):
        m = tmp_path / name
        m.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {tmp_path / 'donor'}}}
            target: {{host: local, venv: {target or tmp_path / 'target'}}}
            overlay: {overlay}
            """) + extra)
        return m

    return tmp_path, manifest


def run80(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    """``transplant ARGV`` as a process at 80 columns, once into a pipe and once into a file; its
    exit code (the same both times), the pipe's text and the file's text (stdout and stderr)."""
    env = {**os.environ, "COLUMNS": "80", "TRANSPLANT_STATE_DIR": str(tmp_path / "state")}
    env.pop("NO_COLOR", None)
    piped = subprocess.run([sys.executable, "-m", "transplant", *argv], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        filed = subprocess.run([sys.executable, "-m", "transplant", *argv], cwd=ROOT, env=env,
                               stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, timeout=300)
    assert piped.returncode == filed.returncode
    text = out.read_text()
    for shown in (piped.stdout.decode(), text):
        assert "\x1b[" not in shown and not re.search("[\u2500-\u257f]", shown), shown  # no styles, no boxes
        assert all(line == line.rstrip() for line in shown.splitlines()), shown  # no padding
    return piped.returncode, piped.stdout.decode(), text


def flat(text: str) -> str:
    return " ".join(text.split())


# -- history ---------------------------------------------------------------------------------------

def test_history_folds_repeated_verifies_into_one_entry_with_a_count(pair, capsys):
    tmp_path, manifest = pair
    m = manifest(extra="verify:\n  imports: [foo]\n")
    assert main(["apply", str(m), "--yes"]) == 0
    for _ in range(4):
        assert main(["verify", str(m)]) == 0
    capsys.readouterr()
    code, piped, filed = run80(tmp_path, "history", f"local:{tmp_path / 'target'}")
    assert code == 0
    for text in (piped, filed):
        [row] = [line for line in text.splitlines() if "committed" in line]
        # one entry for the four verifies: the last outcome, its time, and the count
        assert re.search(r"verify passed \d\d:\d\d:\d\d \(4 verifies: 4 passed\)", flat(text)), text
        assert flat(text).count("verify passed") == 1, text


def test_an_empty_history_says_no_transactions(pair):
    tmp_path, _ = pair
    venv = f"local:{tmp_path / 'target'}"
    code, piped, filed = run80(tmp_path, "history", venv)
    assert code == 0
    for text in (piped, filed):
        assert f"no transactions in {venv}" in flat(text), text
        assert "id" not in text.split() and "state" not in text.split(), text  # no empty table


# -- inventory -------------------------------------------------------------------------------------

def test_the_inventory_bytes_column_is_records_sizes_with_or_without_files(pair):
    """A file grown on disk after its install: the bytes column shows RECORD's sizes, says so in
    its header, and shows the same figure with ``--files`` (which looks at the disk) as without."""
    tmp_path, _ = pair
    site = next((tmp_path / "target" / "lib").glob("python3.*")) / "site-packages"
    (site / "foo" / "gone.py").write_text("G = 1\n" + "# grown by hand\n" * 4000)  # 64 KiB on disk
    venv = f"local:{tmp_path / 'target'}"
    rows = {}
    for options in ((), ("--files",)):
        code, piped, filed = run80(tmp_path, "inventory", venv, *options)
        assert code == 0
        for text in (piped, filed):
            [header] = [line for line in text.splitlines() if line.split()[:1] == ["distribution"]]
            assert "bytes (RECORD)" in header, text
            [row] = [line for line in text.splitlines() if line.split()[:2] == ["foo", "1.0"]]
            rows.setdefault(options, set()).add(row)
    assert rows[()] == rows[("--files",)] and len(rows[()]) == 1, rows
    [row] = rows[()]
    assert "KiB" not in row and "MiB" not in row, row  # RECORD's few bytes, not the 64 KiB on disk
