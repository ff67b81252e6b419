"""The layering promise, checked on every module's imports (import-linter's layers contract).

The contract (:data:`CONTRACT`), read from the source with :mod:`ast` (imports inside functions
count too):

- ``transplant.remote`` (the stdlib-only host scripts) imports nothing of transplant but their shared
  module ``remote/_common.py`` (sent with them);
- the pure core (``transplant.core`` and the verify ladder's pure modules) imports only the core,
  ``transplant.errors`` and the host scripts' stdlib-only shared module (RECORD's hash form, pip's
  script head: one definition for both sides);
- ``transplant.errors``, ``transplant.exitcodes`` and ``transplant.reporting`` import only ``transplant.errors``;
- no edge imports the face (``transplant.cli``);
- no import circle between the packages (``transplant.core``, ``transplant.hosts``, ...);
- no import circle between modules at module level (:func:`module_cycles`, for ``transplant`` and
  the ``bench`` package): an import inside a function is lazy on purpose and is not counted, nor
  one under ``if TYPE_CHECKING:`` (no runtime import).

The second test shows the check is not vacuous: it adds a forbidden import to a copy of the
package and expects the checker to name it.
"""

from __future__ import annotations

import ast
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

import transplant

PACKAGE = Path(transplant.__file__).parent

#: Modules of the pure core outside ``transplant.core``: plain data in, plain data out.
PURE = ("transplant.core", "transplant.verify.judges", "transplant.verify.ladder")
BASE = ("transplant.errors", "transplant.exitcodes", "transplant.reporting")


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, prefixes: tuple[str, ...] | str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in ((prefixes,) if isinstance(prefixes, str) else prefixes))


def _type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_on_import(tree: ast.Module) -> list[ast.AST]:
    """The nodes of ``tree`` that run when the module is imported: everything but function
    bodies (a lambda's too) and ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue  # its decorators and defaults run, its body does not; neither holds an import here
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports(root: Path, *, lazy: bool = True) -> dict[str, set[str]]:
    """Every module of the package at ``root`` -> the modules (or names) of that package it imports.

    :param lazy: count the imports inside functions and under ``if TYPE_CHECKING:`` too; False:
        only those that run when the module is imported."""
    out: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        name = _module(path, root)
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree) if lazy else _run_on_import(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        out[name] = {f for f in found if _within(f, root.name)}
    return out


def _package(name: str) -> str:
    """``transplant.core.rules.env`` -> ``transplant.core``; top-level modules are their own package."""
    return ".".join(name.split(".")[:2])


def violations(root: Path) -> list[str]:
    """The broken rules of the contract for the package at ``root``, one line each (empty: none)."""
    graph = imports(root)
    known = set(graph)

    def real(targets: set[str]) -> set[str]:  # ``from transplant.x import name``: keep the modules
        return {t for t in targets if t in known or t.rsplit(".", 1)[0] not in known} - {"transplant"}

    bad: list[str] = []
    for module, targets in sorted(graph.items()):
        for target in sorted(real(targets)):
            if _within(module, "transplant.remote") and module != "transplant.remote" \
                    and not _within(target, "transplant.remote._common"):
                bad.append(f"{module} imports {target}: a host script imports nothing of transplant")
            elif _within(module, PURE) and not _within(target, PURE + ("transplant.errors", "transplant.remote._common")):
                bad.append(f"{module} imports {target}: the pure core imports only the core and errors")
            elif _within(module, BASE) and not _within(target, "transplant.errors"):
                bad.append(f"{module} imports {target}: {module} imports only transplant.errors")
            elif not _within(module, ("transplant.cli", "transplant.__main__")) and _within(target, "transplant.cli"):
                bad.append(f"{module} imports {target}: an edge imports the face")
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        for target in real(targets):
            if _package(module) != _package(target):
                packages[_package(module)].add(_package(target))
    bad += [f"import circle between packages: {' -> '.join(cycle)}" for cycle in _cycles(packages)]
    return bad


def module_cycles(root: Path) -> list[str]:
    """The import circles between the modules of the package at ``root``, over the imports that
    run when a module is imported (:func:`imports` with ``lazy=False``), one line per strongly
    connected component (empty: none). Importing a module imports its parent packages first;
    that edge is not counted (a package's ``__init__`` may import its own modules)."""
    graph = imports(root, lazy=False)
    known = set(graph)
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        modules = {t for t in targets if t in known}
        edges[module] = {t for t in modules if t != module and not _within(module, t)}
    return [f"import circle between modules: {' -> '.join(cycle)}" for cycle in _cycles(edges)]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component) + [sorted(component)[0]])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_keeps_its_layers():
    assert violations(PACKAGE) == []


BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("root", [PACKAGE, BENCH], ids=["transplant", "bench"])
def test_no_module_imports_itself_in_a_circle_at_import_time(root):
    assert root.is_dir()
    assert module_cycles(root) == []


def test_module_cycles_names_a_circle_and_leaves_lazy_imports_alone(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import a\n",  # a package importing its own module: no circle
        "a.py": "from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "import pkg.c\n",
        "c.py": "from . import a\n",  # a -> b -> c -> a
        "d.py": "def later():\n    from pkg import e\n",  # lazy: allowed
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\nelse:\n    import json\n",
        "f.py": "class F:\n    from pkg import g\n",  # a class body runs on import
        "g.py": "try:\n    import pkg.f\nexcept ImportError:\n    pass\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    assert module_cycles(pkg) == ["import circle between modules: pkg.a -> pkg.c -> pkg.sub.b -> pkg.a",
                                  "import circle between modules: pkg.f -> pkg.g -> pkg.f"]
    (pkg / "c.py").write_text("def later():\n    from . import a\n")
    (pkg / "f.py").write_text("class F:\n    def m(self):\n        from pkg import g\n")
    assert module_cycles(pkg) == []


@pytest.mark.parametrize("module, line, expected", [
    ("core/planner.py", "from transplant.hosts.connecting import connect", "the pure core imports only the core"),
    ("verify/judges.py", "import transplant.verify.runner", "the pure core imports only the core"),
    ("remote/probe.py", "from transplant.errors import HostError", "a host script imports nothing of transplant"),
    ("apply/execute.py", "from transplant.cli.render import print_plan", "an edge imports the face"),
    ("errors.py", "from transplant.core.plan import Plan", "imports only transplant.errors"),
    ("hosts/transfer.py", "from transplant.apply import txn", "import circle between packages"),
], ids=["core-imports-edge", "pure-judge-imports-runner", "host-script-imports-transplant", "edge-imports-face",
        "errors-import-core", "circle"])
def test_the_check_fails_when_a_forbidden_import_is_added(tmp_path, module, line, expected):
    copy = tmp_path / "transplant"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(copy) == [], "the copy starts clean"
    path = copy / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _injected():\n    {line}\n", encoding="utf-8")
    found = violations(copy)
    assert any(expected in v for v in found), found


def error_classes_outside(root: Path) -> list[str]:
    """Classes under ``root`` (the package folder) that derive from an error a user sees (a class
    of ``transplant.errors``), other than in ``errors.py`` itself (errors live in one
    module, each with its stable reference). Internal exceptions that never reach a user (the
    decoder's ``DecodeError(ValueError)``, turned into the document's own error) are not counted."""
    import transplant.errors as errors
    user_facing = set(errors.__all__)
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "errors.py" or rel.startswith("remote/"):  # host scripts raise stdlib errors only
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id in user_facing) or
                    (isinstance(b, ast.Attribute) and b.attr in user_facing) for b in node.bases):
                found.append(f"{rel}: class {node.name}")
    return found


def test_every_error_class_lives_in_errors_with_its_own_reference(tmp_path):
    import transplant.errors as errors
    assert error_classes_outside(PACKAGE) == []
    classes = [getattr(errors, name) for name in errors.__all__]
    references = [cls.reference for cls in classes]
    assert len(set(references)) == len(references), references
    assert all(issubclass(cls, errors.TransplantError) for cls in classes)
    # the scan sees a class added elsewhere
    (tmp_path / "donor").mkdir()
    (tmp_path / "donor" / "oci.py").write_text("class RegistryError(TransplantError):\n    pass\n")
    assert error_classes_outside(tmp_path) == ["donor/oci.py: class RegistryError"]
