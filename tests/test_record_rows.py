"""RECORD rows of console scripts apply relocates: the normalised RECORD identity
the probe and the applier compute (the same function in both host scripts), and the
applier's edit of a staged RECORD. Pure: bytes in, identity out; the edit runs on files in
a temporary folder."""

from __future__ import annotations

import ast
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inventory_docs import digest
from transplant import remote
from transplant.remote import _common, applier, probe

SITE = "lib/python3.11/site-packages"
REMOTE = Path(applier.__file__).parent
DONOR_ROWS = (b"../../../bin/tool,sha256=donorhash,229\r\n"
              b"tool.py,sha256=module,34\r\n"
              b"tool-1.0.dist-info/RECORD,,\r\n")


def test_probe_and_applier_carry_the_same_normalisation():
    """One function, in the module every host script is sent with (two copies would drift apart)."""
    assert probe.record_identity is applier.record_identity is _common.record_identity
    for script in ("probe", "applier"):
        tree = ast.parse((REMOTE / f"{script}.py").read_text())
        assert not [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "record_identity"]


@pytest.mark.parametrize("data", [
    DONOR_ROWS,
    b"../../../bin/tool,sha256=x,1\nweird path,with \"quote\",\n\n\"a,b\",sha256=y,2\n",
    b"\xff\xfe not utf-8",
    b"",
])
def test_probe_and_applier_give_the_same_identity(data):
    assert probe.record_identity(data, SITE, "bin") == applier.record_identity(data, SITE, "bin")


@pytest.mark.parametrize("data", [
    DONOR_ROWS,
    b"../../../bin/tool,sha256=x,1\nweird path,with \"quote\",\n\n\"a,b\",sha256=y,2\n",
    b"a,b\r\n\"x\r\ny\",1\r\n",  # a quoted field across lines: read again, as before
    b"a\rb,c\r\n",  # a lone carriage return
    b"a,b\n\n\r\nc,d",
    "\u00e9,1\r\n".encode(),
    b"\xff\xfe,1\n",
])
def test_the_probe_reads_a_record_once_for_its_rows_and_identity(tmp_path, data):
    """The probe's RECORD read (once, not again for the identity): the text the
    metadata read gives, and where it says its rows are the identity's, the same identity."""
    path = tmp_path / "RECORD"
    path.write_bytes(data)
    with open(path, encoding="utf-8", errors="replace") as handle:
        wanted = handle.read()
    text, plain = probe._read_record(str(path))
    assert text == wanted
    assert plain == (b'"' not in data and data != b"\xff\xfe,1\n")
    rows = list(csv.reader(io.StringIO(text)))
    own = f"{SITE}/tool-1.0.dist-info/RECORD"
    assert probe._identity_of_rows(rows, plain, str(path), own, len(data)) == \
        probe.record_identity(data, SITE, "bin")


def _run_remote(script: str, source: str) -> str:
    """Run a host script's record_identity in a fresh interpreter with ``-I -S``, as on a host."""
    code = (remote.source(script.removesuffix(".py")).decode().replace('if __name__ == "__main__":', "if False:")
            + f"\nprint(record_identity({source}, {SITE!r}, 'bin'))\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_host_scripts_agree_when_run_alone():
    wanted = probe.record_identity(DONOR_ROWS, SITE, "bin")
    assert wanted is not None and wanted.startswith("record:sha256=")
    assert _run_remote("probe.py", repr(DONOR_ROWS)) == _run_remote("applier.py", repr(DONOR_ROWS)) == wanted


def test_only_the_hash_and_size_of_script_rows_are_ignored():
    same = probe.record_identity(DONOR_ROWS, SITE, "bin")
    relocated = DONOR_ROWS.replace(b"sha256=donorhash,229", b"sha256=targethash,230")
    assert probe.record_identity(relocated, SITE, "bin") == same
    assert probe.record_identity(relocated.replace(b"\r\n", b"\n"), SITE, "bin") == same  # rows, not line endings
    for other in (DONOR_ROWS.replace(b"sha256=module,34", b"sha256=edited,34"),   # a module's row
                  DONOR_ROWS.replace(b"module,34", b"module,35"),
                  DONOR_ROWS.replace(b"../../../bin/tool", b"../../../bin/tool2"),  # another script
                  DONOR_ROWS + b"extra.py,sha256=e,1\r\n",                          # a row more
                  DONOR_ROWS.replace(b"tool.py,", b"../../../bin/tool.py,").replace(b"../../../bin/tool,", b"tool,")):
        assert probe.record_identity(other, SITE, "bin") != same, other
    # a row is placed by joining it to site-packages: one outside the scripts folder keeps its hash
    share = b"../../../share/tool/data,sha256=a,1\n"
    assert probe.record_identity(share, SITE, "bin") != probe.record_identity(share.replace(b"=a,", b"=b,"), SITE, "bin")


def test_not_utf8_gives_none():
    assert probe.record_identity(b"\xff,\xfe\n", SITE, "bin") is None


def test_the_identity_is_the_sha256_of_the_canonical_rows():
    rows = [["../../../bin/tool", "", ""], ["tool.py", "sha256=module", "34"], ["tool-1.0.dist-info/RECORD", "", ""]]
    text = json.dumps(rows, separators=(",", ":"))
    assert probe.record_identity(DONOR_ROWS, SITE, "bin") == "record:" + digest(text)


@pytest.fixture
def transaction(tmp_path, monkeypatch):
    """A venv-like folder with one staged transaction: ``(prefix, staged folder)``."""
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    staged = prefix / ".transplant" / "txn" / "t1" / "staged"
    staged.mkdir(parents=True)
    return prefix, staged


def _put(root: Path, rel: str, data: bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_records_sets_the_rows_of_the_scripts_and_keeps_every_other_line(transaction):
    prefix, staged = transaction
    record = f"{SITE}/tool-1.0.dist-info/RECORD"
    donor = (b"../../../bin/tool,sha256=donorhash,229\r\n"
             b"../../../bin/other,sha256=untouched,5\r\n"
             b"../../../bin/live,sha256=donorlive,7\r\n"
             b"\"odd,name.py\",sha256=q,3\r\n"
             b"tool-1.0.dist-info/RECORD,,")  # no line ending on the last line
    _put(staged, record, donor)
    script = b"#!/target/bin/python\nprint('tool')\n"
    _put(staged, "bin/tool", script)
    live = b"#!/target/bin/python\nprint('live')\n"
    _put(prefix, "bin/live", live)  # not replaced by this transaction: its live file is measured
    reply = applier.records(str(prefix), {"id": "t1", "records": [{"path": record, "scripts": ["bin/tool", "bin/live"]}]})
    assert reply == {"ok": True, "error": None, "rows": 2}
    lines = (staged / record).read_bytes().splitlines(keepends=True)
    assert lines[0] == f"../../../bin/tool,{digest(script.decode())},{len(script)}\r\n".encode()
    assert lines[2] == f"../../../bin/live,{digest(live.decode())},{len(live)}\r\n".encode()
    wanted = donor.splitlines(keepends=True)
    assert [lines[1], lines[3], lines[4]] == [wanted[1], wanted[3], wanted[4]]
    have = applier._identity(str(staged / record), "record:x", record)
    assert have == probe.record_identity(donor, SITE, "bin")
    rows = list(csv.reader(io.StringIO((staged / record).read_text(), newline="")))
    assert rows[3][0] == "odd,name.py"


def test_records_refuses_a_record_that_is_not_staged(transaction):
    prefix, staged = transaction
    with pytest.raises(applier.Refused, match="not a staged RECORD"):
        applier.records(str(prefix), {"id": "t1", "records": [{"path": f"{SITE}/x-1.dist-info/RECORD",
                                                                "scripts": ["bin/x"]}]})
    with pytest.raises(applier.Refused, match="leaves the venv"):
        applier.records(str(prefix), {"id": "t1", "records": [{"path": "../elsewhere/RECORD", "scripts": []}]})
    assert not os.listdir(staged)


@pytest.mark.parametrize("site", ["lib/python3.11/site-packages", "bin", "bin/x", "", "b", "lib/../lib/site", "x/./y", "bi"])
@pytest.mark.parametrize("scripts", ["bin", "lib", "b", "bin/x"])
def test_the_identity_blanks_exactly_the_rows_placed_under_the_scripts_folder(site, scripts):
    """The identity's shortcut for plain paths against the rule written out: each row's
    path joined to ``site`` and normalised; the rows under ``scripts`` lose their hash and size."""
    paths = ["a", "../../../bin/tool", "./bin/x", "bin/x", "bin", "/abs/bin/x", "a//b", "a/.hidden", "a/", "..",
             "x/../bin/t", "", "b/in", "bin/", ".", "a\0b", "lib/x"]
    rows = [[p, "sha256=h", "1"] for p in paths] + [[]]
    canonical = []
    for row in rows:
        if row:
            where = os.path.normpath(os.path.join(site, row[0])) if row[0] else ""
            canonical.append([row[0], "", ""] if where.startswith(scripts + "/") else row)
    wanted = "record:" + _common.record_hash(json.dumps(canonical, separators=(",", ":")).encode("ascii"))
    assert _common.record_identity_of_rows(rows, site, scripts) == wanted
