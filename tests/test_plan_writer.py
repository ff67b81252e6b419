"""The plan's one-walk writer and the planner's per-file shortcuts give the answers of the code
they replaced (made for plans as large as the real pair's forward plan): built cases at their edges, each
compared with the plain form (``json.dumps`` of ``to_dict``; the split rule of ``protected_path``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from inventory_docs import SITE, dist
from test_planner import PATCH, TARGET, inv, manifest, seed_inventories
from transplant.core import json_text
from transplant.core.inventory import _INTERPRETERS, protected_path
from transplant.core.plan import Change, FileCopy, Finding, Plan, Side, write_plan
from transplant.core.planner import plan


def _every_field_plan() -> Plan:
    """A plan whose copies, findings and sides use every field, with odd text (quotes, non-ASCII)."""
    side = Side(label="d:/v", host="root@d", venv="/v", fingerprint="f" * 64, hostname="d")
    copies = (
        FileCopy(path="a/plain.py", size=3, hash="sha256=x"),
        FileCopy(path="bin/tool", size=40, hash="sha256=y", head="#!/t/bin/python\n", body_hash="sha256=z"),
        FileCopy(path="lib/link.so", size=None, hash="symlink:/t/lib/real.so", link="/t/lib/real.so"),
        FileCopy(path="p-1.dist-info/RECORD", size=9, hash="sha256=r", record_identity="record:sha256=i",
                 record_scripts=("bin/tool",)),
        FileCopy(path="sp/patch \"q\" é.py", size=0, hash="sha256=p", source="patch", local="patches/é.py"),
    )
    return Plan(
        manifest="m.yaml", donor=side, target=Side(label="t", host="local", venv="/t", fingerprint="0", hostname="t"),
        changes=(Change(kind="distribution", name="p", action="upgrade", reason="1 -> 2", from_version="1",
                        to_version="2", copy=copies, remove=("old/x.py",), dist_info="p-2.dist-info", unchanged=7),
                 Change(kind="patch", name="sp/x.py", action="keep", reason="identical")),
        findings=(Finding(code="libtorch-abi", severity="warning", dists=("p", "torch"), message="m\n\"x\"",
                          hint="h", files=("a", "b"), accepted="known"),
                  Finding(code="record-drift", severity="info", dists=(), message="", hint="")),
        hash_patterns=("p", "nvidia-*"), patch_files=(),
    )


@pytest.mark.parametrize("extra", [None, {"donor_source": {"kind": "host", "n": 1.5, "ok": True, "x": None}},
                                   {"manifest": "/abs/m.yaml"}])
@pytest.mark.parametrize("chunk", [7, 8192])
def test_write_plan_is_the_text_of_its_dict(monkeypatch, extra, chunk):
    """Every field kind, an added key and a replaced one; many pieces (the joints) and few."""
    monkeypatch.setattr(json_text, "_CHUNK", chunk)
    donor, target = seed_inventories()
    for built in (_every_field_plan(), plan(manifest(["torch", "nvidia-*", "sglang-kernel", "sglang"]), donor,
                                              target, [PATCH])):
        pieces: list[str] = []
        write_plan(built, pieces.append, extra)
        expected = json.dumps({**built.to_dict(), **(extra or {})}, indent=2, sort_keys=True)
        assert "".join(pieces) == expected
        assert len(pieces) > 1 or chunk == 8192


@dataclass(frozen=True)
class _Thing:
    flag: bool
    ratio: float
    items: list
    inner: object
    none: None = None


@dataclass(frozen=True)
class _Empty:
    pass


def test_dump_indented_writes_a_listed_class_as_its_dict():
    """``fields``: bools, floats, lists, nesting and an empty class as the dict of those attributes;
    the twin without ``fields`` refuses the object as ``json`` does."""
    thing = _Thing(flag=True, ratio=float("nan"), items=[1, "two", [], {}], inner=_Empty())
    as_dict = {"flag": True, "ratio": float("nan"), "items": [1, "two", [], {}], "inner": {}, "none": None}
    fields = {_Thing: ("flag", "ratio", "items", "inner", "none"), _Empty: ()}
    for document, plain in ((thing, as_dict), ([thing, {"k": thing}], [as_dict, {"k": as_dict}])):
        pieces: list[str] = []
        json_text.dump_indented(document, pieces.append, fields=fields)
        assert "".join(pieces) == json.dumps(plain, indent=2, sort_keys=True)
    with pytest.raises(TypeError, match="_Thing"):
        json_text.dump_indented(thing, lambda text: None)


def _protected_by_split(path: str, scripts: str = "bin") -> bool:
    """``protected_path`` before its shortcut: the split, for every path."""
    if path == "pyvenv.cfg" or path == ".transplant" or path.startswith(".transplant/"):
        return True
    folder, _, name = path.rpartition("/")
    return folder == scripts and bool(_INTERPRETERS.match(name))


@pytest.mark.parametrize("scripts", ["bin", "Scripts", "", "bin/sub"])
def test_protected_path_shortcut_gives_the_split_rule(scripts):
    paths = ["pyvenv.cfg", ".transplant", ".transplant/x", ".transplantx", "bin/python", "bin/python3.11",
             "bin/activate", "bin/activate.fish", "bin/Activate.ps1", "bin/pip", "binx/python", "bin/sub/python",
             "bin", "python", "activate", "Scripts/python", "Scripts/pythonw", "lib/python3.11/site-packages/a.py",
             "bin/sub/activate", "bin/python3.11x", "", "/bin/python", "bin/"]
    answers = [(p, protected_path(p, scripts), _protected_by_split(p, scripts)) for p in paths]
    assert [a for a in answers if a[1] != a[2]] == []
    assert any(new for _, new, _ in answers) and not all(new for _, new, _ in answers)


def _pair(donor_files, target_files):
    return (inv([dist("pkg", "2.0", donor_files)], "d:/v", hostname="d"),
            inv([dist("pkg", "1.0", target_files)], "t:/v", prefix=TARGET, hostname="t"))


def test_bytecode_moves_with_its_source_only():
    """A .pyc whose source is copied goes with it; one whose source is identical stays; one whose
    source the target lacks is copied; a name ending in .pyc outside __pycache__ is a plain file."""
    pyc = "pkg/__pycache__/{}.cpython-311.pyc"
    donor, target = _pair(
        {"pkg/moved.py": "new", pyc.format("moved"): "pyc new", "pkg/same.py": "same", pyc.format("same"): "pyc d",
         "pkg/fresh.py": "fresh", pyc.format("fresh"): "pyc f", "pkg/data.pyc": "data d"},
        {"pkg/moved.py": "old", pyc.format("moved"): "pyc old", "pkg/same.py": "same", pyc.format("same"): "pyc t",
         pyc.format("fresh"): "pyc f0", "pkg/data.pyc": "data t"})
    (change,) = plan(manifest(["pkg"]), donor, target).changes
    copied = {c.path.removeprefix(SITE + "/") for c in change.copy}
    assert copied == {"pkg/moved.py", pyc.format("moved"), "pkg/fresh.py", pyc.format("fresh"), "pkg/data.pyc",
                      "pkg-2.0.dist-info/RECORD"}
    assert [c.path for c in change.copy] == sorted(c.path for c in change.copy)
    assert change.unchanged == 2  # same.py and its bytecode


def test_removal_keeps_what_arrives_or_stays_and_removes_the_rest():
    """The uninstall of a ``remove:`` distribution (one union of the kept paths, built once) and an
    overlaid change's removals (three lookups instead of a union per distribution): a file the
    arriving distribution or a staying one lists stays; the twin files are removed."""
    donor = inv([dist("new", "2.0", {"shared/arrives.py": "a", "new/x.py": "x"})], "d:/v", hostname="d")
    target = inv([dist("new", "1.0", {"new/x.py": "x0", "new/gone.py": "g", "shared/kept.py": "k"}),
                  dist("old-cu12", "1.0", {"shared/arrives.py": "a0", "old/only.py": "o", "shared/kept.py": "k"}),
                  dist("stays", "1.0", {"shared/kept.py": "k", "stays/s.py": "s"})],
                 "t:/v", prefix=TARGET, hostname="t")
    result = plan(manifest(["new"], remove=["old-*"]), donor, target)
    by = {c.name: c for c in result.changes}
    assert {p.removeprefix(SITE + "/") for p in by["old-cu12"].remove} == {
        "old/only.py", "old_cu12-1.0.dist-info/RECORD"}
    assert {p.removeprefix(SITE + "/") for p in by["new"].remove} == {"new/gone.py", "new-1.0.dist-info/RECORD"}
    assert by["old-cu12"].action == "remove" and by["new"].action == "upgrade"


def test_plain_copy_is_the_dataclass_built_by_init():
    """``FileCopy.plain`` (no ``__init__``) gives the object ``__init__`` gives: equal, same hash,
    repr, dict form and pickle; still frozen. The twin with another field differs."""
    import pickle
    from dataclasses import FrozenInstanceError, asdict

    built, plain = FileCopy(path="a/b.py", size=3, hash="sha256=x"), FileCopy.plain("a/b.py", 3, "sha256=x")
    assert plain == built and hash(plain) == hash(built) and repr(plain) == repr(built)
    assert asdict(plain) == asdict(built) and pickle.loads(pickle.dumps(plain)) == built
    assert plain.__dict__ == {"path": "a/b.py", "size": 3, "hash": "sha256=x"}  # the rest: the class's defaults
    assert plain.identity == "sha256=x" and plain.source == "donor" and plain.record_scripts == ()
    assert FileCopy.plain("a/b.py", None, "sha256=x") != built
    with pytest.raises(FrozenInstanceError):
        plain.size = 4  # type: ignore[misc]  # the assignment a frozen dataclass refuses is the test


def test_donor_has_file_asks_the_last_donor_distribution_listing_the_path():
    """``donor_has_file`` looks a path's donor row up per path: the answers of the dict of every
    donor file built in order (the last distribution listing a path wins), for a path two donor
    distributions list with other hashes, one only the first lists, one no donor distribution
    lists, and a staying file whose bytes differ from its RECORD row."""
    from transplant.core.rules.env import EnvironmentAfter

    donor = inv([dist("a", "1.0", {"shared/x.py": "from a", "a/only.py": "a"}),
                 dist("b", "1.0", {"shared/x.py": "from b", "b/y.py": "y"})], "d:/v", hostname="d")
    target = inv([dist("a", "1.0", {"shared/x.py": "from a", "a/only.py": "a"}),
                  dist("b", "1.0", {"shared/x.py": "from b", "b/y.py": "y", "b/extra.py": "e"},
                       on_disk={"b/y.py": "edited"})], "t:/v", prefix=TARGET, hostname="t")
    env = EnvironmentAfter(donor=donor, target=target, overlaid=(), after=target.latest())
    rows = {p: e.record_hash for d in donor.latest().values() for p, e in d.files.items()}  # the old rule
    staying = {}
    for d in target.latest().values():
        for p, e in d.files.items():
            staying.setdefault(p, e)
    answers = {}
    for rel in ("shared/x.py", "a/only.py", "b/y.py", "b/extra.py", "nowhere.py"):
        path = f"{SITE}/{rel}"
        entry = staying.get(path)
        old = entry is not None and entry.record_hash is not None and rows.get(path) == entry.record_hash
        answers[rel] = (env.donor_has_file(path), old)
    assert all(new == old for new, old in answers.values()), answers
    assert answers["a/only.py"][0] and not answers["b/extra.py"][0] and not answers["nowhere.py"][0]
    assert answers["shared/x.py"][0] is (rows[f"{SITE}/shared/x.py"] == staying[f"{SITE}/shared/x.py"].record_hash)
