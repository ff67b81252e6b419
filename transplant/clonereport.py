"""How ``transplant clone`` reports (face): what was rewritten, and what still names the old prefix."""

from __future__ import annotations

import shlex
from collections import Counter

from rich.console import Console
from rich.text import Text

from .cloning import CloneResult
from .render import human_bytes

__all__ = ["clone_report"]

_SHOWN = 20


def _names(paths: tuple[str, ...], limit: int = _SHOWN) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more (--json lists all)" if len(paths) > limit else "")


def clone_report(console: Console, result: CloneResult) -> None:
    """Print a clone's result: the copy, the edits by kind, warnings, and leftovers.

    Text files and symlinks that still name the old prefix are printed as an error (the
    command exits 3); binary files as a warning with their names, bytecode counted apart.
    """
    r, left = result.relocation, result.leftovers
    kinds = Counter(e.kind for e in r.edits)
    edited = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "no file"
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"copied {result.files} files ({human_bytes(result.bytes)}) from {result.source} to {result.dest} "
        f"with {result.method}")
    say(f"rewrote what named {r.old} ({edited}); repointed {len(r.links)} symlink(s); updated {len(result.records)} "
        f"RECORD file(s) for the rewritten files")
    for line in result.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), line))
    other = tuple(p for p in left.binary if p not in left.bytecode)
    if other:
        console.print(Text.assemble(("warning: ", "yellow"), f"{len(other)} binary file(s) still contain {r.old}: "
                                    f"{_names(other)}"))
    if left.bytecode:
        console.print(Text.assemble(("warning: ", "yellow"), f"{len(left.bytecode)} bytecode file(s) record "
                                    f"{r.old} as their source path (Python corrects it at import): "
                                    f"{_names(left.bytecode, 3)}"))
    if left.errors:
        if left.text:
            console.print(Text.assemble(("error: ", "bold red"), f"{len(left.text)} text file(s) of the clone still "
                                        f"name {r.old}: {_names(left.text)}"))
        if left.links:
            console.print(Text.assemble(("error: ", "bold red"), f"{len(left.links)} symlink(s) of the clone still "
                                        f"point into {r.old}: {_names(left.links)}"))
        console.print(Text.assemble(("hint: ", "bold"), f"edit those files in {r.new} so they name {r.new}, or "
                                    f"delete the clone (rm -rf {shlex.quote(r.new)}) and fix them in the source first"))
        return
    console.print(Text.assemble(("cloned", "bold green"), f" in {result.seconds:.1f} s: no text file or symlink of "
                                f"{result.dest} names {r.old}"))
