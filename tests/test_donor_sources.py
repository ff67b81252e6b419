"""The donor source protocol: every kind of source says everything the pipeline asks, and no
caller asks a source which kind it is (by its type's name, ``getattr``, ``hasattr`` or ``isinstance``)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from transplant.donor.registry_snapshot import RegistrySource
from transplant.donor.snapshot import SnapshotSource
from transplant.donor.sources import DonorSource, HostSource

ROOT = Path(__file__).resolve().parent.parent / "transplant"
# where a donor source is used: the pipeline and the steps and commands around it
CALLERS = ["pipeline", "cli/commands/verify.py", "clone", "fleet", "recover"]
# an expression that names a donor source (or the Opened holding one) in those modules
SOURCE_WORDS = ("source", "opened", "live")
SOURCE_CLASSES = ("HostSource", "SnapshotSource", "RegistrySource", "DonorSource")


def protocol_members(protocol: type) -> dict[str, object]:
    """The members ``protocol`` declares (name -> its function or property), dunders left out."""
    return {name: value for name, value in vars(protocol).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


def _declares(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base) declares the data member ``name``: an annotation, a class
    attribute or a property."""
    return any(name in vars(k).get("__annotations__", {}) or name in vars(k) for k in cls.__mro__)


def conformance_problems(cls: type, protocol: type = DonorSource) -> list[str]:
    """What ``cls`` lacks of ``protocol``: a missing member, or a method whose signature (names,
    kinds, defaults, annotations) differs from the protocol's. Empty: it conforms."""
    problems = []
    for name, member in protocol_members(protocol).items():
        if isinstance(member, property):
            if not _declares(cls, name):
                problems.append(f"{cls.__name__}.{name}: missing")
            continue
        mine = getattr(cls, name, None)
        if not callable(mine):
            problems.append(f"{cls.__name__}.{name}(): missing")
        elif inspect.signature(mine) != inspect.signature(member):  # type: ignore[arg-type]  # a method of the protocol here
            problems.append(f"{cls.__name__}.{name}{inspect.signature(mine)}: the protocol says "
                            f"{name}{inspect.signature(member)}")  # type: ignore[arg-type]  # a method of the protocol here
    return problems


@pytest.mark.parametrize("cls", [HostSource, SnapshotSource, RegistrySource], ids=lambda c: c.__name__)
def test_each_source_has_every_member_with_the_protocol_signature(cls: type) -> None:
    assert conformance_problems(cls) == []


def test_the_protocol_says_what_the_pipeline_asks() -> None:
    assert set(protocol_members(DonorSource)) == {
        "label", "venv", "live", "snapshot", "memo_identity", "inventory", "elf", "files", "stager", "transfer_note"}


def test_a_source_missing_a_member_or_with_another_signature_is_named() -> None:
    """The positive twin: the check fires on a toy source."""

    class Toy(HostSource):
        stager = None  # type: ignore[assignment]  # the toy lacks the method on purpose

        def files(self, paths):  # type: ignore[no-untyped-def,override]  # another signature on purpose
            return super().files(paths)

    class Bare:
        label = "toy"

    problems = conformance_problems(Toy)
    assert "Toy.stager(): missing" in problems
    assert any(p.startswith("Toy.files(") for p in problems)
    assert {"Bare.venv: missing", "Bare.live: missing", "Bare.snapshot: missing",
            "Bare.inventory(): missing"} <= set(conformance_problems(Bare))
    assert "Bare.label: missing" not in conformance_problems(Bare)


def source_probes(text: str, where: str = "<text>") -> list[str]:
    """Each place in the Python ``text`` that asks a donor source which kind it is: ``getattr`` or
    ``hasattr`` on an expression naming a source, ``isinstance`` against a source class or of a
    source, ``type(...)`` of a source (its name compared); as ``where:line: code``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        probe = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            first = ast.unparse(node.args[0]).lower()
            names_source = any(w in first for w in SOURCE_WORDS)
            if node.func.id in ("getattr", "hasattr", "type"):
                probe = names_source
            elif node.func.id == "isinstance" and len(node.args) == 2:
                probe = names_source or any(c in ast.unparse(node.args[1]) for c in SOURCE_CLASSES)
        if probe:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def _caller_files() -> list[Path]:
    files: list[Path] = []
    for part in CALLERS:
        path = ROOT / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_no_caller_asks_a_source_which_kind_it_is() -> None:
    files = _caller_files()
    assert len(files) > 10 and (ROOT / "pipeline" / "gather.py") in files
    probes = [p for f in files for p in source_probes(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert probes == []


def test_the_probe_check_fires_on_each_kind_of_probe() -> None:
    """The positive twin: each form the pipeline used before the protocol is found."""
    text = "\n".join([
        'stager = getattr(opened.source, "stage", None)',
        'ok = hasattr(source, "label")',
        'live = isinstance(source.live, Host)',
        'snap = isinstance(source, SnapshotSource)',
        'named = type(source).__name__ == "SnapshotSource"',
        'fine = isinstance(kept, str) and getattr(args, "json", False) and type(exc).__name__',
    ])
    assert {int(f.split(":")[1]) for f in source_probes(text)} == {1, 2, 3, 4, 5}
