"""Benchmarks of transplant (``python -m bench.run``, ``bench.small``, ``bench.real``, ``bench.fleet``)."""

from __future__ import annotations

import compileall
from pathlib import Path

__all__ = ["compile_transplant"]


def compile_transplant() -> bool:
    """Write the bytecode of transplant's own modules (``__pycache__`` beside each, as ``pip
    install`` does for an installed package), so that each measured command loads it rather than
    compiling its modules again: with ``PYTHONDONTWRITEBYTECODE`` set, or an editable checkout
    never run, every command would otherwise compile about 200 modules first (a large share of a
    plan with nothing to change). Files already compiled are left as they are.

    :returns: whether every module compiled (False: a syntax error, which the measured command
        will then report itself).
    """
    import transplant

    return bool(compileall.compile_dir(str(Path(transplant.__file__).parent), quiet=1))
