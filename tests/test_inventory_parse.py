"""The inventory parser's fast path and the fingerprint agree with their plain definitions."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from transplant.errors import ProbeError
from transplant.core.inventory import _fingerprint, parse_inventory

from inventory_docs import dist, document


def plain_fingerprint(doc: dict) -> str:
    """The fingerprint's definition: sorted compact JSON of the document, every ``mtime`` key dropped."""
    def scrub(value):
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items() if k != "mtime"}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return value
    stable = {k: v for k, v in doc.items() if k not in ("probe_seconds", "elsewhere", "hash_cache")}
    return hashlib.sha256(json.dumps(scrub(stable), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sample() -> dict:
    doc = document("/srv/venv", [dist("demo", "1.0", {"demo/__init__.py": 'x = ",\\"mtime\\":1"\n', "demo/a.py": ""})])
    record = doc["distributions"][0]["record"]
    record[0]["mtime"] = 1701234567.125
    record[1]["mtime"] = -1e-05
    doc["files"] = {"bin/tool": {"mtime": 3, "exists": True}, "x": {"mtime": None}}
    doc["texts"] = {"note": 'a "mtime": 5 inside a string, and ,"mtime":6}'}
    return doc


@pytest.mark.parametrize("edit", ["none", "mtimes", "string"])
def test_fingerprint_drops_only_mtime_members(edit: str) -> None:
    doc = sample()
    if edit == "mtimes":
        doc["distributions"][0]["record"][0]["mtime"] = 2.5e9
        doc["files"]["x"]["mtime"] = 7
    elif edit == "string":
        doc["texts"]["note"] = 'a "mtime": 5 inside a string, and ,"mtime":7}'
    assert _fingerprint(doc) == plain_fingerprint(doc)
    assert (_fingerprint(doc) == _fingerprint(sample())) == (edit != "string")


def test_fast_and_checked_paths_read_the_same_entries() -> None:
    doc = sample()
    fast = parse_inventory(doc, label="donor")
    # A subclass of dict takes the checked path for every entry.
    class Tree(dict):
        pass
    slow_doc = copy.deepcopy(doc)
    slow_doc["distributions"][0]["record"] = [Tree(e) for e in slow_doc["distributions"][0]["record"]]
    slow = parse_inventory(slow_doc, label="donor")
    assert fast.distributions == slow.distributions
    entry = fast.distributions[0].record[0]
    assert entry.path == "lib/python3.11/site-packages/demo/__init__.py" and entry.exists is True


@pytest.mark.parametrize("key, value, expected", [("size", "12", "int"), ("exists", 1, "bool"),
                                                  ("size", True, "int"), ("hash", 5, "str")])
def test_a_wrong_type_is_still_named_by_its_key_path(key: str, value, expected: str) -> None:
    doc = sample()
    doc["distributions"][0]["record"][1][key] = value
    with pytest.raises(ProbeError, match=rf"distributions\[0\]\.record\[1\]\.{key}': expected {expected}"):
        parse_inventory(doc, label="donor")


def test_entries_built_without_init_equal_the_dataclass_and_refuse_a_missing_field():
    import dataclasses

    from transplant.core.inventory import FileEntry, _entry_maker, _new_entry

    names = [f.name for f in dataclasses.fields(FileEntry)]
    values = {"record_path": "a/b.so", "path": "lib/a/b.so", "record_hash": "sha256=x", "record_size": 3,
              "exists": True, "hash": "sha256=y", "size": 4, "mode": 0o755, "symlink": None, "error": None,
              "head": "#!x", "body_hash": "sha256=z", "record_identity": [1, 2]}
    assert sorted(values) == sorted(names)
    order = ("record_path", "path", "record_hash", "record_size", "exists", "hash", "size", "mode", "symlink",
             "error", "head", "body_hash", "record_identity")
    assert _new_entry(*(values[n] for n in order)) == FileEntry(**values)
    with pytest.raises(TypeError):
        _entry_maker(order[:-1])
