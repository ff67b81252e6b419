"""The one typed decoder (core/decode.py): every dataclass shape the documents use, key-path errors
deep in each of the four documents, and round trips of the plan, the inventory and the ELF report."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from transplant.core.decode import DecodeError, Decoder, Problems, member, strings
from transplant.core.elf_facts import ELF_SCHEMA, DeviceCode, LibraryVersions, parse_elf_report
from transplant.core.inventory import Distribution, Inventory, parse_inventory
from transplant.core.manifest import parse_manifest
from transplant.core.plan import Change, FileCopy, Finding, Plan, Side, plan_from_dict
from transplant.errors import ManifestError, PlanError, ProbeError
from transplant.lab.realstacks import elf_document, untrim

from inventory_docs import dist, document

DATA = Path(__file__).parent / "data" / "real"


# --- the decoder on every shape ------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Leaf:
    name: str
    size: int | None = None

    def __post_init__(self) -> None:
        if self.name == "bad":
            raise ValueError("name 'bad' is refused")


@dataclass(frozen=True, kw_only=True)
class Shapes:
    text: str
    count: int
    ratio: float = 0.0
    flag: bool = False
    maybe: str | None = None
    names: tuple[str, ...] = ()
    leaves: tuple[Leaf, ...] = ()
    one: Leaf | None = None
    table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    optional_lists: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    anything: Any = None


GOOD = {"text": "t", "count": 3, "ratio": 2, "flag": True, "maybe": None, "names": ["a", "b"],
        "leaves": [{"name": "x"}, {"name": "y", "size": 4}], "one": {"name": "z"},
        "table": {"k": ["v"]}, "optional_lists": {"a": None, "b": ["c"]}, "anything": {"free": [1]}}


def test_every_shape_decodes() -> None:
    got = Decoder(Shapes)(GOOD, "top")
    assert got == Shapes(text="t", count=3, ratio=2.0, flag=True, names=("a", "b"),
                         leaves=(Leaf(name="x"), Leaf(name="y", size=4)), one=Leaf(name="z"),
                         table={"k": ("v",)}, optional_lists={"a": None, "b": ("c",)}, anything={"free": [1]})
    assert isinstance(got.ratio, float) and isinstance(got.names, tuple)
    assert Decoder(Shapes)({"text": "t", "count": 0}) == Shapes(text="t", count=0)


@pytest.mark.parametrize("edit, path, message", [
    ({"count": True}, "top.count", "expected int, got True"),
    ({"count": "3"}, "top.count", "expected int, got '3'"),
    ({"ratio": False}, "top.ratio", "expected a number, got False"),
    ({"flag": 1}, "top.flag", "expected bool, got 1"),
    ({"maybe": 5}, "top.maybe", "expected str or null, got 5"),
    ({"names": "ab"}, "top.names", "expected a list, got 'ab'"),
    ({"names": ["a", 2]}, "top.names[1]", "expected str, got 2"),
    ({"leaves": [{"name": "x"}, {"name": "y", "size": "4"}]}, "top.leaves[1].size", "expected int or null, got '4'"),
    ({"leaves": [{"size": 1}]}, "top.leaves[0].name", "missing"),
    ({"leaves": [{"name": "x", "colour": 1}]}, "top.leaves[0].colour", "unknown key"),
    ({"leaves": [{"name": "bad"}]}, "top.leaves[0]", "name 'bad' is refused"),
    ({"one": []}, "top.one", "expected an object or null, got []"),
    ({"table": {"k": ["v", None]}}, "top.table['k'][1]", "expected str, got None"),
    ({"table": []}, "top.table", "expected an object, got []"),
    ({"optional_lists": {"a": "x"}}, "top.optional_lists['a']", "expected a list or null, got 'x'"),
    ({"text": None}, "top.text", "expected str, got None"),
    ({"extra": 1}, "top.extra", "unknown key"),
])
def test_a_bad_value_is_named_by_its_key_path(edit: dict, path: str, message: str) -> None:
    with pytest.raises(DecodeError) as caught:
        Decoder(Shapes)({**GOOD, **edit}, "top")
    assert (caught.value.path, caught.value.describe()) == (path, message)
    assert str(caught.value) == f"{path}: {message}"


def test_options_unknown_null_default_fields_and_given() -> None:
    loose = Decoder(Shapes, unknown="ignore", null_default=True,
                    fields={"text": lambda v, path, obj: v.upper() + str(obj["count"])})
    got = loose({"text": "t", "count": 1, "names": None, "extra": 1, "leaves": [{"name": "x", "more": 2}]}, "top")
    assert got == Shapes(text="T1", count=1, leaves=(Leaf(name="x"),))
    assert loose({"count": 1}, "top", text="given") == Shapes(text="given", count=1)
    with pytest.raises(DecodeError, match=r"top\.count: expected int, got None"):
        loose({"text": "t", "count": None}, "top")  # a required field has no default to take
    with pytest.raises(DecodeError, match="top: expected an object, got 'x'"):
        Decoder(Shapes)("x", "top")


def test_unsupported_types_and_options_are_refused() -> None:
    @dataclass
    class Odd:
        pair: tuple[int, str]

    with pytest.raises(TypeError, match="no decoder for the type"):
        Decoder(Odd)({"pair": [1, "a"]})
    with pytest.raises(ValueError, match="unknown="):
        Decoder(Odd, unknown="keep")


def test_member_strings_and_problems() -> None:
    assert member({"a": 1}, "a", "p", int) == 1 and member({}, "a", "p", int, optional=True) is None
    with pytest.raises(DecodeError, match=r"p\.a: expected int, got True"):
        member({"a": True}, "a", "p", int)
    with pytest.raises(DecodeError, match="p: expected an object"):
        member([], "a", "p", int)
    assert strings(None, "s") == () and strings(["x"], "s") == ("x",)
    with pytest.raises(DecodeError, match="s: expected a list of strings"):
        strings(["x", 1], "s")
    c = Problems()
    assert not c and c.mapping({"hots": 1}, "donor", {"host": "host: x", "venv": "venv: /v"}, required=("venv",))
    assert c.string("", "donor.host", "write one") is None
    c.add("key\nwith newline", "bad", "fix it")
    assert c.lines == ["donor.hots: unknown key; fix: did you mean 'host'?",
                       "donor.venv: missing; fix: add it: venv: /v",
                       "donor.host: expected a non-empty string, got the string ''; fix: write one",
                       "key\\nwith newline: bad; fix: fix it"]


# --- key paths deep in each document --------------------------------------------------------------

MANIFEST = {"version": 1, "donor": {"host": "local", "venv": "/d",
                                    "fallback": [{"host": "local", "venv": "/f"}, {"host": "local", "venv": "rel"}]},
            "target": {"host": "local", "venv": "/t"}, "overlay": ["torch"],
            "verify": {"skip_imports": [{"name": "ok", "reason": "r"}, {"name": "not an import", "reason": "r"}]}}


def test_manifest_lists_every_deep_problem_at_once() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(MANIFEST, path="m.yaml")
    assert caught.value.problems == [
        "donor.fallback[1].venv: expected an absolute path, got 'rel'; fix: start it with '/', e.g. /root/venv_sglang",
        "verify.skip_imports[1].name: expected an import name, got 'not an import'; fix: write e.g. transformers",
    ]
    good = copy.deepcopy(MANIFEST)
    good["donor"]["fallback"][1]["venv"] = "/g"
    good["verify"]["skip_imports"][1]["name"] = "fine"
    assert parse_manifest(good, path="m.yaml").verify.skip_imports == {"ok": "r", "fine": "r"}


def small_inventory() -> dict:
    doc = document("/v", [dist("demo", "1.0", {"demo/__init__.py": "", "demo/a.py": "x"})],
                   nvidia={"available": True, "gpus": [{"name": "H200", "compute_capability": "9.0",
                                                        "memory_mib": 143771}]})
    doc["host"]["libcuda"] = {"searched": ["/usr/lib"], "versioned": ["/usr/lib/libcuda.so.1"], "ldconfig": True}
    six = dist("six", "1.16", {"six.py": ""}, hashed=False)
    del six["site_packages"]  # the probe lists an outside distribution under its folder
    doc["outside"] = [{"folder": "/usr/lib/python3/dist-packages", "why": "x.pth", "distributions": [six]}]
    return doc


@pytest.mark.parametrize("where, value, path, expected", [
    (("host", "nvidia", "gpus", 0, "memory_mib"), "big", "host.nvidia.gpus[0].memory_mib", "int or null"),
    (("interpreter", "markers", "python_version"), 3.11, "interpreter.markers['python_version']", "str"),
    (("interpreter", "version"), "three", "interpreter.version", "a Python version"),
    (("host", "libcuda", "versioned", 0), 1, "host.libcuda.versioned[0]", "str"),
    (("outside", 0, "distributions", 0, "wheel", "tags", 0), 7, "outside[0].distributions[0].wheel.tags",
     "a list of strings"),
    (("distributions", 0, "record", 1, "size"), "12", "distributions[0].record[1].size", "int"),
])
def test_inventory_names_a_deep_bad_value(where: tuple, value: Any, path: str, expected: str) -> None:
    doc = small_inventory()
    assert parse_inventory(doc, label="v").nvidia.gpus[0].memory_mib == 143771
    holder = doc
    for step in where[:-1]:
        holder = holder[step]
    holder[where[-1]] = value
    with pytest.raises(ProbeError, match=rf"^v: inventory key {path!r}: expected {expected}, got ".replace("[", r"\[")):
        parse_inventory(doc, label="v")


def small_elf() -> dict:
    return {"schema": ELF_SCHEMA, "seconds": 0.5, "defined": {"_Z1fv": True}, "defined_in": ["lib/a.so"],
            "defined_by": {"lib/a.so": [], "lib/gone.so": None},
            "libstdcxx": {"path": "/usr/lib/libstdc++.so.6", "versions": ["GLIBCXX_3.4"]},
            "files": {"lib/b.so": {"machine": "EM_X86_64", "elf_class": 64, "needed": ["libc.so.6"],
                                   "version_needs": {"libc.so.6": ["GLIBC_2.2.5", "GLIBC_2.34"]},
                                   "torch_undefined": ["_ZN3c10b", "_ZN3c10a"], "numpy_abi": "2",
                                   "device_code": [{"kind": "ptx", "arch": 90, "isa": "8.4"},
                                                   {"kind": "sass", "arch": 90, "variant": "a"}]},
                      "lib/a.so": {"error": "not an ELF file"}}}


@pytest.mark.parametrize("where, value, path, expected", [
    (("files", "lib/b.so", "version_needs", "libc.so.6", 1), 2, "files['lib/b.so'].version_needs['libc.so.6'][1]",
     "str"),
    (("files", "lib/b.so", "device_code", 1, "arch"), 0, "files['lib/b.so'].device_code[1].arch", "a positive int"),
    (("files", "lib/b.so", "device_code", 0, "isa"), "high", "files['lib/b.so'].ptx_isa['compute_90']",
     "a version like '9.0'"),
    (("defined_by", "lib/gone.so"), "x", "defined_by['lib/gone.so']", "a list or null"),
    (("libstdcxx", "versions", 0), None, "libstdcxx.versions[0]", "str"),
])
def test_elf_report_names_a_deep_bad_value(where: tuple, value: Any, path: str, expected: str) -> None:
    doc = small_elf()
    report = parse_elf_report(doc, label="h")
    assert report.files["lib/b.so"].ptx_isa == {"compute_90": "8.4"}
    assert report.files["lib/b.so"].torch_undefined == ("_ZN3c10a", "_ZN3c10b")
    holder = doc
    for step in where[:-1]:
        holder = holder[step]
    holder[where[-1]] = value
    pattern = rf"^h: ELF report key {path!r}: expected {expected}, got ".replace("[", r"\[")
    with pytest.raises(ProbeError, match=pattern):
        parse_elf_report(doc, label="h")


def small_plan() -> Plan:
    side = Side(label="local:/v", host="local", venv="/v", fingerprint="f" * 64, hostname="h")
    copies = (FileCopy(path="lib/a.py", size=3, hash="sha256=abc"),
              FileCopy(path="bin/tool", size=None, hash="sha256=def", head="#!/t/bin/python\n", body_hash="sha256=x",
                       record_scripts=("bin/tool",), record_identity="record:sha256=y", source="patch", local="p/x"))
    change = Change(kind="distribution", name="demo", action="upgrade", reason="newer", from_version="1.0",
                    to_version="2.0", copy=copies, remove=("lib/old.py",), dist_info="x.dist-info", unchanged=7)
    finding = Finding(code="record-drift", severity="warning", dists=("demo",), message="m", hint="h",
                      files=("lib/a.py",), accepted="why")
    return Plan(manifest="/m.yaml", donor=side, target=side, changes=(change,), findings=(finding,),
                hash_patterns=("demo",), patch_files=("p",))


@pytest.mark.parametrize("edit, path, message", [
    (lambda d: d["changes"][0]["copy"][1].update(hash=5), "plan.changes[0].copy[1].hash",
     "expected a string, got a whole number"),
    (lambda d: d["changes"][0]["copy"][1].update(hash=None), "plan.changes[0].copy[1].hash",
     "expected a string, got nothing \\(null\\)"),
    (lambda d: d["changes"][0]["copy"][0].update(size="3"), "plan.changes[0].copy[0].size",
     "expected a whole number or null, got a string"),
    (lambda d: d["findings"][0].update(severity="fatal"), "plan.findings[0]", "severity 'fatal' is not one of"),
    (lambda d: d["changes"][0].update(extra=1), "plan.changes[0].extra", "unknown key"),
    (lambda d: d["donor"].pop("hostname"), "plan.donor.hostname", "missing"),
    (lambda d: d["changes"][0].update(action="explode"), "plan.changes[0].action",
     "expected one of add, upgrade, downgrade, rebuild, refresh, keep, remove for a distribution, got 'explode'"),
    (lambda d: d["changes"][0].update(kind="wheel"), "plan.changes[0].kind",
     "expected distribution or patch, got 'wheel'"),
])
def test_plan_names_a_deep_bad_value(edit, path: str, message: str) -> None:
    data = json.loads(json.dumps(small_plan().to_dict()))
    edit(data)
    with pytest.raises(PlanError, match=rf"^saved\.json: plan key {path!r}: {message}".replace("[", r"\[")):
        plan_from_dict(data, source="saved.json")


# --- round trips ----------------------------------------------------------------------------------

def test_plan_round_trip() -> None:
    plan = small_plan()
    assert plan_from_dict(json.loads(json.dumps(plan.to_dict())), source="p") == plan


def test_elf_report_round_trip() -> None:
    report = parse_elf_report(small_elf(), label="h")
    assert report.libstdcxx == LibraryVersions(path="/usr/lib/libstdc++.so.6", versions=("GLIBCXX_3.4",))
    assert report.files["lib/b.so"].device_code == (DeviceCode(kind="ptx", arch=90),
                                                    DeviceCode(kind="sass", arch=90, variant="a"))
    assert parse_elf_report(elf_document(report), label="h") == report


def inventory_document(inv: Inventory) -> dict:
    """An inventory back in the probe's JSON form (the inverse of :func:`parse_inventory`)."""
    def entry(e) -> dict:
        out = {k: v for k, v in dataclasses.asdict(e).items() if k not in ("record_path", "path")}
        return {**out, "path": e.record_path, "venv_path": e.path}

    def distribution(d: Distribution, site: str) -> dict:
        folder, _, name = d.dist_info.rpartition("/")
        return {"name": d.display_name, "version": d.raw_version, "site_packages": folder, "dist_info": name,
                "metadata_present": d.metadata_present, "summary": d.summary, "requires_python": d.requires_python,
                "requires_dist": [str(r) for r in d.requires_dist] + list(d.bad_requirements),
                "installer": d.installer, "requested": d.requested, "direct_url": d.direct_url,
                "wheel": {"tags": [str(t) for t in d.wheel_tags], "root_is_purelib": d.root_is_purelib},
                "top_level": list(d.top_level), "entry_points": d.entry_points, "hashed": d.hashed,
                "record": None if d.record is None else [entry(e) for e in d.record], "listing": list(d.listing)}

    interp = dataclasses.asdict(inv.interpreter)
    outside: dict[str, list] = {}
    for d in inv.outside:
        outside.setdefault(d.dist_info.rpartition("/")[0], []).append(distribution(d, ""))
    doc = {"schema": "transplant.inventory/1",
           "interpreter": {**interp, "version": str(inv.interpreter.version)},
           "paths": {"purelib": inv.site_packages, "scripts": inv.scripts},
           "distributions": [distribution(d, inv.site_packages) for d in inv.distributions],
           "files": {k: entry(e) for k, e in inv.files.items()},
           "host": {"hostname": inv.hostname, "nvidia": dataclasses.asdict(inv.nvidia),
                    "libcuda": None if inv.libcuda is None else dataclasses.asdict(inv.libcuda)},
           "texts": dict(inv.texts), "elsewhere": dict(inv.elsewhere),
           "outside": [{"folder": f, "why": inv.outside_folders[f], "distributions": outside.get(f, [])}
                       for f in inv.outside_folders]}
    return json.loads(json.dumps(doc))


def same_inventory(a: Inventory, b: Inventory) -> bool:
    """Equal but for the fingerprint (a digest of the document's text, which the round trip rewrites)."""
    return dataclasses.replace(a, fingerprint="") == dataclasses.replace(b, fingerprint="")


def test_inventory_round_trip() -> None:
    inv = parse_inventory(small_inventory(), label="v")
    assert inv.libcuda is not None and inv.nvidia.gpus
    assert inv.outside[0].dist_info == "/usr/lib/python3/dist-packages/six-1.16.dist-info"
    again = parse_inventory(inventory_document(inv), label="v")
    assert same_inventory(again, inv)
    assert not same_inventory(parse_inventory(small_inventory() | {"texts": {"x": "y"}}, label="v"), inv)


def test_round_trips_of_the_recorded_real_stack() -> None:
    """The real donor stack (about 110,000 file entries) and its ELF report survive the round trip."""
    with gzip.open(DATA / "forward.json.gz", "rt", encoding="utf-8") as handle:
        recorded = json.load(handle)
    inv = parse_inventory(untrim(recorded["donor"]), label="donor")
    assert sum(len(d.record or ()) for d in inv.distributions) > 100_000
    assert same_inventory(parse_inventory(inventory_document(inv), label="donor"), inv)
    report = parse_elf_report(recorded["donor_elf"], label="donor")
    assert report.files and parse_elf_report(elf_document(report), label="donor") == report
