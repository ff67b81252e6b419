"""The probe's fast RECORD path, its compact form and its RECORD summary.

A real venv gets a distribution whose RECORD names every kind of path the probe must judge:
plain rows, rows with ``.``/``..``/empty parts, an absolute path, a row through a symlinked
folder that stays in the venv and one through a symlinked folder that leaves it, a symlink, a
FIFO, a missing file, a hidden folder. The fast route (:func:`_row_path`) must give what the
general one (``normpath`` + ``_inside``) gives for each, the compact document must parse to the
same distributions as the full one, and the summary must count what the full form lists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from transplant.core.inventory import COLUMNS, parse_inventory
from transplant.errors import ProbeError
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import paths_exist, run_script, take_inventory
from transplant.lab.wheels import build_wheel, make_venv
from transplant.remote import probe

FILES = {"alpha/__init__.py": "x = 1\n", "alpha/sub/m.py": "y = 2\n" * 40, "alpha/.hidden/h.py": "h = 3\n"}
TRICKY = [
    "alpha/./dot.py", "alpha//double.py", "alpha/sub/../up.py", "./alpha/lead.py", "/etc/hostname",
    "../../../../../../etc/passwd", "../../../bin/alpha-tool", "alpha/inlink/in.py", "alpha/outlink/secret",
    "alpha/link.py", "alpha/fifo", "alpha/missing.py", "alpha/sub/", "alpha/.hidden/h.py", "alpha",
]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv holding ``alpha`` with the tricky RECORD rows above (and what they name)."""
    tmp = tmp_path_factory.mktemp("forms")
    path = make_venv(tmp / "venv", [build_wheel(tmp / "w", "alpha", "1.0", FILES)])
    site = next(path.glob("lib/python*/site-packages"))
    (tmp / "outside").mkdir()
    (tmp / "outside" / "secret").write_text("not for the probe\n")
    for name in ("dot.py", "double.py", "up.py", "lead.py"):
        (site / "alpha" / name).write_text(f"# {name}\n")
    (site / "alpha" / "real").mkdir()
    (site / "alpha" / "real" / "in.py").write_text("inside = True\n")
    os.symlink("real", site / "alpha" / "inlink")
    os.symlink(tmp / "outside", site / "alpha" / "outlink")
    os.symlink("__init__.py", site / "alpha" / "link.py")
    os.mkfifo(site / "alpha" / "fifo")
    (path / "bin" / "alpha-tool").write_text(f"#!{path}/bin/python\nprint('tool')\n")
    record = next(site.glob("alpha-1.0.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "".join(f"{row},,\n" for row in TRICKY) + "alpha/sub/m.py,,7\n")
    return path


def _full(venv: Path, **request) -> dict:
    return run_script(LocalHost(), str(venv), "probe", ["--stdin"], request={"hash_cache": False, **request})


def test_the_fast_route_gives_what_the_general_route_gives(venv: Path) -> None:
    site = os.path.normpath(next(venv.glob("lib/python*/site-packages")))
    prefix = str(venv)
    site_rel = probe._inside(prefix, site)
    rows = TRICKY + list(FILES) + ["alpha/sub/m.py", "alpha-1.0.dist-info/RECORD", "alpha\0x"]
    for rel in rows:
        general = os.path.normpath(os.path.join(site, rel))
        assert probe._row_path(prefix, site, site_rel, rel) == (general, probe._inside(prefix, general)), rel
    # the symlinked folder leaving the venv is refused on the fast route too, after a plain sibling
    assert probe._row_path(prefix, site, site_rel, "alpha/outlink/secret")[1] is None
    assert probe._row_path(prefix, site, site_rel, "alpha/inlink/in.py")[1] == f"{site_rel}/alpha/inlink/in.py"


def test_the_compact_form_parses_to_the_same_inventory(venv: Path) -> None:
    for request in ({"hash": []}, {"hash": ["alpha"]}):
        full = _full(venv, **request)
        compact = _full(venv, compact=True, **request)
        assert compact["record_columns"] == list(COLUMNS) and "record_columns" not in full
        (row_dist,) = [d for d in compact["distributions"] if d["name"] == "alpha"]
        assert all(isinstance(row, list) for row in row_dist["record"])
        assert len(json.dumps(compact)) < len(json.dumps(full))
        a, b = parse_inventory(full, label="full"), parse_inventory(compact, label="compact")
        assert a.distributions == b.distributions and a.files == b.files
        alpha = {e.record_path: e for e in b.latest()["alpha"].record}
        assert alpha["alpha/outlink/secret"].path is None and alpha["/etc/hostname"].path is None
        assert alpha["alpha/link.py"].symlink == "__init__.py" and alpha["alpha/fifo"].error == "not a regular file"
        assert alpha["alpha/missing.py"].exists is False and alpha["alpha/inlink/in.py"].exists is True
        if request["hash"]:
            assert alpha["alpha/__init__.py"].hash == alpha["alpha/__init__.py"].record_hash is not None
            assert alpha["../../../bin/alpha-tool"].head is not None


def test_the_summary_counts_what_the_full_form_lists(venv: Path) -> None:
    full = parse_inventory(_full(venv), label="full").latest()
    summary_doc = _full(venv, record="summary")
    summary = parse_inventory(summary_doc, label="summary").latest()
    assert set(full) == set(summary)
    for name, dist in full.items():
        got = summary[name]
        assert got.record is None
        # rows inside the venv by name: the symlinked folder that leaves it is counted (no disk look-up)
        leaving = sum(1 for e in dist.record if e.path is None and e.record_path == "alpha/outlink/secret")
        assert got.record_files == sum(1 for e in dist.record if e.path is not None) + leaving, name
        assert got.record_bytes == sum(e.record_size or 0 for e in dist.record if e.path is not None), name
    assert summary["alpha"].record_bytes > 0
    # the venv's part halves (the host's facts, such as its library names, are the same in both)

    def venv_part(doc):
        return json.dumps({k: v for k, v in doc.items() if k != "host"})

    assert len(venv_part(summary_doc)) < len(venv_part(_full(venv))) / 2


def test_inventory_command_summary_and_files(venv: Path, capsys) -> None:
    from transplant.cli.app import main

    assert main(["inventory", f"local:{venv}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (alpha,) = [d for d in doc["distributions"] if d["name"] == "alpha"]
    assert alpha["record"] is None and alpha["record_summary"]["files"] > len(FILES)
    assert main(["inventory", f"local:{venv}", "--json", "--files"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (alpha,) = [d for d in doc["distributions"] if d["name"] == "alpha"]
    assert "record_summary" not in alpha and any("mtime" in e for e in alpha["record"])
    assert main(["inventory", f"local:{venv}"]) == 0
    table = capsys.readouterr().out
    assert "alpha" in table and "1.0" in table


def _compact_doc(venv: Path) -> dict:
    return _full(venv, compact=True)


@pytest.mark.parametrize("column, value, expected", [
    ("record_size", "12", "int or null"), ("exists", 1, "bool or null"), ("size", True, "int or null"),
    ("venv_path", 2, "a string, null or 1"), ("hash", 7, "a string, null or 1"), ("mode", "x", "int or null"),
])
def test_a_bad_compact_value_is_named_by_its_key_path(venv: Path, column: str, value, expected: str) -> None:
    doc = _compact_doc(venv)
    index = next(i for i, d in enumerate(doc["distributions"]) if d["name"] == "alpha")
    row = doc["distributions"][index]["record"][1]
    row.extend([None] * (len(COLUMNS) - len(row)))
    row[COLUMNS.index(column)] = value
    with pytest.raises(ProbeError, match=rf"distributions\[{index}\]\.record\[1\]\.{column}': expected {expected}"):
        parse_inventory(doc, label="t")
    # the fault-free twin parses
    parse_inventory(_compact_doc(venv), label="t")


def test_other_columns_or_a_row_that_is_not_a_list_are_refused(venv: Path) -> None:
    doc = _compact_doc(venv)
    doc["record_columns"] = list(reversed(COLUMNS))
    with pytest.raises(ProbeError, match="record_columns"):
        parse_inventory(doc, label="t")
    doc = _compact_doc(venv)
    doc["distributions"][0]["record"][0] = {"path": "x"}
    with pytest.raises(ProbeError, match=r"distributions\[0\]\.record\[0\]': expected a list"):
        parse_inventory(doc, label="t")
    doc = _compact_doc(venv)
    doc["distributions"][0]["record"][0] = ["x"] + [None] * len(COLUMNS)
    with pytest.raises(ProbeError, match=r"distributions\[0\]\.record\[0\]': expected a list of 1 to"):
        parse_inventory(doc, label="t")


def test_take_inventory_asks_for_the_compact_form(venv: Path) -> None:
    inv = take_inventory(LocalHost(), str(venv), hash_patterns=["alpha"])
    assert inv.document.get("record_columns") == list(COLUMNS)
    full = take_inventory(LocalHost(), str(venv), hash_patterns=["alpha"], compact=False)
    assert "record_columns" not in full.document and full.distributions == inv.distributions


def test_the_compact_form_expands_to_the_full_form_and_trims_for_fixtures(venv: Path) -> None:
    from transplant.core.inventory import expanded
    from transplant.lab.realstacks import trim, untrim

    full = _full(venv, hash=["alpha"])
    compact = _full(venv, hash=["alpha"], compact=True)
    wide = expanded(compact)
    assert "record_columns" not in wide and all(isinstance(e, dict) for d in wide["distributions"]
                                                for e in d["record"] or ())
    reference = parse_inventory(full, label="x")
    assert parse_inventory(wide, label="x").distributions == reference.distributions
    # a fixture recorded from a plan's (compact) document reads back as the full form's does
    assert parse_inventory(untrim(trim(compact)), label="x").distributions == \
        parse_inventory(untrim(trim(full)), label="x").distributions


def test_a_plans_inventory_keeps_its_document_as_text_and_reads_it_back(venv: Path, tmp_path: Path,
                                                                        monkeypatch) -> None:
    from transplant.core.inventory import KeptDocument

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    inv = take_inventory(LocalHost(), str(venv), hash_patterns=["alpha"], hash_cache="controller")
    assert isinstance(inv.document, KeptDocument)
    kept = dict(inv.document)
    assert kept["schema"] == "transplant.inventory/1" and kept["record_columns"] == list(COLUMNS)
    assert "entries" not in kept.get("hash_cache", {})  # the donor's hashes went to the controller's cache
    assert parse_inventory(kept, label="again").distributions == inv.distributions
    assert parse_inventory(kept, label="again").fingerprint == inv.fingerprint
    assert json.loads(json.dumps(kept)) == kept


@pytest.mark.parametrize("out, line", [
    (b"", None), (b"\n \n", None), (b'{"a":1}', '{"a":1}'), (b'warning\n{"a":1}\n\n', '{"a":1}'),
    (b'x\r\n{"b":2}\r\n', '{"b":2}'), (b'one\x0ctwo\n', "two"), ("x\u2028{}\n".encode(), "{}"), (b'\xff{}\n', "\ufffd{}"),
])
def test_the_reply_line_is_the_last_line_that_is_not_blank(out: bytes, line) -> None:
    from transplant.hosts.probing import _last_line

    assert _last_line(out) == line


def test_a_donor_cache_prints_only_the_groups_it_hashed(venv: Path) -> None:
    """The probe prints the groups of the distributions it hashed, not those it was sent for
    lookups only (``known``: a first-schema file), which the controller keeps."""
    from transplant.hosts.probing import _reply_line

    other = {"lib/python3.11/site-packages/beta/x.py": [1, 2, 3, 4, 5, "sha256=beta", None, None]}
    request = {"hash": ["alpha"], "hash_cache": {"store": "reply", "known": other, "racy_ns": 0}}
    printed: list = []
    reply = json.loads(_reply_line(LocalHost(), str(venv), "probe", ["--stdin"], request=json.dumps(request).encode(),
                                   keep=printed.extend))
    assert reply["hash_cache"]["misses"] > 0 and reply["hash_cache"]["groups"] == 1
    ((name, body),) = printed
    line = name + b"\t" + bytes(body)
    entries = json.loads(bytes(body))
    assert name == b"alpha" and "lib/python3.11/site-packages/beta/x.py" not in entries
    assert any(path.endswith("alpha/__init__.py") for path in entries)
    # the fault-free twin: a run sent that group, with nothing new, prints none
    printed = []
    again = json.loads(_reply_line(LocalHost(), str(venv), "probe", ["--stdin"], keep=printed.extend,
                                   request=json.dumps({**request, "hash_cache": {"store": "reply", "racy_ns": 0}})
                                   .encode() + b"\n" + line + b"\n"))
    assert again["hash_cache"]["misses"] == 0 and printed == [] and again["hash_cache"]["groups"] == 0


def test_the_compact_rows_are_the_full_entries_compacted_with_the_same_inputs(venv: Path) -> None:
    """The compact form is built row by row in its own loop: each row must be exactly
    what :func:`probe._compact` makes of the full form's entry (``venv_path`` and ``hash`` 1, the
    trailing nulls left out), hashed or not, and the inputs noted (paths, order, identities) the same."""
    for hashed in ([], ["alpha"]):
        full = _full(venv, hash=hashed, inputs=True)
        compact = _full(venv, hash=hashed, inputs=True, compact=True)
        for a, b in zip(full["distributions"], compact["distributions"], strict=True):
            assert b["record"] == probe._compact(a["record"], a["site_packages"]), (a["name"], hashed)
        (alpha,) = [d for d in compact["distributions"] if d["name"] == "alpha"]
        rows = {row[0]: row for row in alpha["record"]}
        assert rows["alpha/outlink/secret"][1:2] in ([], [None]) and rows["alpha/fifo"][8] is True
        assert rows["alpha/link.py"][7] == "__init__.py" and rows["alpha/missing.py"][4:] == [False]
        if hashed:
            assert rows["alpha/__init__.py"][10] == 1 and rows["alpha-1.0.dist-info/RECORD"][13].startswith("record:")
        assert {k: full["inputs"][k] for k in ("digest", "count", "paths")} == \
            {k: compact["inputs"][k] for k in ("digest", "count", "paths")}


def test_inputs_noted_a_block_at_a_time_are_those_noted_one_by_one(tmp_path: Path) -> None:
    """:meth:`_Inputs.note_block` (a RECORD's rows at once) gives :meth:`_Inputs.note`'s digest,
    packed paths and racy flag, across the 8192-path chunks the paths are packed in."""
    old = tmp_path / "old"
    old.write_text("old\n")
    os.utime(old, ns=(10**18, 10**18))
    new = tmp_path / "new"
    new.write_text("new\n")
    for names in ([str(old), str(tmp_path / "absent")] * 6000, [str(old)] * 100 + [str(new)] + [str(old)] * 9000):
        limit = os.lstat(new).st_mtime_ns - 1
        one, block = probe._Inputs(limit), probe._Inputs(limit)
        stats = []
        for name in names:
            try:
                stats.append(os.lstat(name))
            except OSError:
                stats.append(None)
        for name, st in zip(names, stats, strict=True):
            one.note(name, st)
        block.note("first", None)  # a block after a single note: the chunks start part way
        one_first = probe._Inputs(limit)
        one_first.note("first", None)
        for name, st in zip(names, stats, strict=True):
            one_first.note(name, st)
        ids = block.array("q")
        for st in stats:
            probe._append(ids, st)
        block.note_block(names[:5000], ids[:5000 * 6])
        block.note_block(names[5000:], ids[5000 * 6:])
        assert block.report({}) == one_first.report({}), len(names)
        assert one.racy is (str(new) in names) and block.racy is one.racy


def _identity_by_normpath(data: bytes, site: str, scripts: str) -> str:
    """record_identity's rule with ``normpath(join(site, path))`` for every row (the general route)."""
    import csv
    import io
    import posixpath

    from transplant.remote._common import record_hash

    canonical = []
    for row in csv.reader(io.StringIO(data.decode("utf-8"), newline="")):
        if not row:
            continue
        where = posixpath.normpath(posixpath.join(site, row[0])) if row[0] else ""
        canonical.append([row[0], "", ""] + row[3:] if where.startswith(scripts + "/") else row)
    return "record:" + record_hash(json.dumps(canonical, separators=(",", ":"), ensure_ascii=True).encode("ascii"))


@pytest.mark.parametrize("site", ["lib/python3.11/site-packages", "", "lib/./site", "bin/../lib/site", "bin"])
def test_record_identity_places_plain_rows_as_the_general_route_does(site: str) -> None:
    """The identity places a plain row by concatenation: for every kind of row, and
    sites that are normal or not, the same identity as ``normpath(join())`` for each row."""
    rows = ["alpha/__init__.py,sha256=a,1", "../../../bin/tool,sha256=b,2", "./bin/x,sha256=c,3", "a//b,,",
            "/abs/bin/y,sha256=d,4", "bin/tool2,sha256=e,5", ".hidden/x,sha256=f,6", "sub/,,", ",,", "x/../bin/z,sha256=g,7"]
    data = ("\r\n".join(rows) + "\r\n").encode()
    assert probe.record_identity(data, site, "bin") == _identity_by_normpath(data, site, "bin")


def test_the_exists_mode_answers_only_which_absolute_paths_exist(tmp_path):
    """``paths_exist`` (editable sources, run path folders) asks the probe's ``exists`` mode: the
    same answer a full probe's ``paths_exist`` gives, without the distributions or host facts."""
    venv = make_venv(tmp_path / "venv")
    there, gone = str(tmp_path / "venv" / "pyvenv.cfg"), str(tmp_path / "gone" / "libx.so.1")
    answer = paths_exist(LocalHost(), str(venv), [there, gone, "relative/path"])
    assert answer == {there: True, gone: False}
    assert answer == take_inventory(LocalHost(), str(venv), record=False, paths_exist=[there, gone]).elsewhere
