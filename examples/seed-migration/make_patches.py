"""Generate the demo's hand patches (the story's DDTree work) from the donor's installed sglang.

The story's DDTree patch touched sglang's CLI declarations and added a module under
``sglang/srt/speculative/``. No copy of sglang's code is kept in this repository: at demo
time this script reads the donor venv's installed sglang 0.5.23 file that declares the
speculative-decoding arguments, adds one argument to it, and writes the result, plus a
small module of our own, into a ``patches/`` folder that the demo's manifest points at.

    python make_patches.py DONOR_SITE_PACKAGES OUT_DIR

Standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: The file of sglang 0.5.23 where ``--speculative-dflash-block-size`` is declared: fields of
#: the ``spec`` namespace (a ``msgspec.Struct``), from which sglang derives the CLI flags and
#: the flat attributes of ``ServerArgs``.
SPEC_FIELDS = Path("sglang/srt/arg_groups/fields/spec.py")
DDTREE_UTILS = Path("sglang/srt/speculative/ddtree_utils.py")

#: The class whose fields become ``--speculative-*`` flags.
_CLASS_ANCHOR = re.compile(r"^class Spec\(msgspec\.Struct\):\n", re.M)
#: The field the new one goes after, and the line that closes that field's declaration.
_FIELD_ANCHOR = re.compile(r"^    speculative_dflash_block_size: A\[\n", re.M)
_FIELD_END = re.compile(r"^    \] = [^\n]*\n", re.M)
_IMPORT_ANCHOR = re.compile(r"^from sglang\.srt\.arg_groups\.arg_utils import \(\n    A,\n", re.M)

NEW_FIELD = '''\
    speculative_ddtree_budget: A[
        int,
        "DDTree only. Node budget of the dynamic draft-token tree verified per step "
        "(hand patch; see sglang.srt.speculative.ddtree_utils).",
    ] = 15
'''

DDTREE_UTILS_TEXT = '''\
"""Draft-token tree budgets for DDTree speculative decoding.

This module is the transplant demo's stand-in for the story's DDTree patch: written for the
demo, not taken from sglang or from the original patch. ``--speculative-ddtree-budget`` (added
to ``sglang/srt/arg_groups/fields/spec.py`` by the same patch) sets the number of draft-token
nodes a step may verify; the functions here shape a tree of that many nodes. Standard library
only, so it imports anywhere sglang does.
"""

from __future__ import annotations

__all__ = ["budget_schedule", "parent_indices"]


def budget_schedule(budget: int, max_depth: int, max_branch: int = 2) -> list[int]:
    """Return how many draft nodes each tree level gets, for a tree of at most ``budget`` nodes.

    Level 1 holds the children of the last verified token, so it has at most ``max_branch``
    nodes; each further level at most ``max_branch`` times the one above. Levels are filled
    in order, widest allowed first, and the last level takes what is left of the budget.

    >>> budget_schedule(15, 4)
    [2, 4, 8, 1]
    >>> budget_schedule(15, 2, max_branch=4)
    [4, 11]
    >>> budget_schedule(3, 8, max_branch=1)
    [1, 1, 1]
    """
    for name, value in (("budget", budget), ("max_depth", max_depth), ("max_branch", max_branch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    widths: list[int] = []
    left, width = budget, 1
    while left > 0 and len(widths) < max_depth:
        width = min(width * max_branch, left)
        widths.append(width)
        left -= width
    return widths


def parent_indices(schedule: list[int]) -> list[int]:
    """Return each node's parent in breadth-first order; -1 is the last verified token.

    The nodes of a level are spread over the level above it as evenly as possible, the
    first parents taking the extra children, so the tree stays balanced.

    >>> parent_indices([2, 4, 1])
    [-1, -1, 0, 0, 1, 1, 2]
    """
    parents: list[int] = []
    above = [-1]
    for width in schedule:
        if width < 1:
            raise ValueError(f"every level needs at least one node, got {schedule!r}")
        start = len(parents)
        share, extra = divmod(width, len(above))
        for i, parent in enumerate(above):
            parents.extend([parent] * (share + (1 if i < extra else 0)))
        above = list(range(start, start + width))
    return parents
'''


def patch_server_args(text: str) -> str:
    """Return sglang 0.5.23's ``arg_groups/fields/spec.py`` text with ``--speculative-ddtree-budget``.

    The new field (int, default 15) goes right after ``speculative_dflash_block_size`` in the
    ``Spec`` namespace; sglang derives the flag ``--speculative-ddtree-budget`` and the
    ``ServerArgs.speculative_ddtree_budget`` attribute from it.

    :raises ValueError: the text lacks an anchor this patch relies on (the message names it),
        or already declares ``speculative_ddtree_budget``.
    """
    if "speculative_ddtree_budget" in text:
        raise ValueError("already patched: the text declares speculative_ddtree_budget")
    for name, anchor in (("class Spec(msgspec.Struct)", _CLASS_ANCHOR),
                         ("from sglang.srt.arg_groups.arg_utils import (A, ...)", _IMPORT_ANCHOR)):
        if not anchor.search(text):
            raise ValueError(f"anchor not found: {name!r}; is this sglang 0.5.23's {SPEC_FIELDS}?")
    field = _FIELD_ANCHOR.search(text)
    if field is None:
        raise ValueError("anchor not found: 'speculative_dflash_block_size: A[' "
                         f"(the DFLASH block-size field); is this sglang 0.5.23's {SPEC_FIELDS}?")
    end = _FIELD_END.search(text, field.end())
    if end is None:
        raise ValueError("anchor not found: the '    ] = ...' line closing speculative_dflash_block_size")
    return text[:end.end()] + NEW_FIELD + text[end.end():]


def main(site_packages: Path, out_dir: Path) -> list[Path]:
    """Write the patched ``spec.py`` and ``ddtree_utils.py`` under ``out_dir``; return their paths.

    ``site_packages`` is the donor venv's site-packages holding sglang 0.5.23; each file is
    written at its path relative to site-packages (``out_dir/sglang/srt/...``).
    """
    site_packages, out_dir = Path(site_packages), Path(out_dir)
    source = site_packages / SPEC_FIELDS
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: is {site_packages} a site-packages with sglang 0.5.23?")
    written = []
    for rel, text in ((SPEC_FIELDS, patch_server_args(source.read_text(encoding="utf-8"))),
                      (DDTREE_UTILS, DDTREE_UTILS_TEXT)):
        dest = out_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
        written.append(dest)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {Path(sys.argv[0]).name} DONOR_SITE_PACKAGES OUT_DIR")
    for path in main(Path(sys.argv[1]), Path(sys.argv[2])):
        print(path)
