"""Benchmarks of transplant (``python -m bench.run``, ``bench.small``, ``bench.real``, ``bench.fleet``, ``bench.clone``)."""

from __future__ import annotations

import compileall
import shlex
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["compile_transplant", "measured"]

#: The checkout (the commands measured run there).
_ROOT = Path(__file__).resolve().parent.parent


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


#: Runs a command and prints its peak RSS (KiB) on the last line. A small wrapper process is the
#: parent, because a child's ru_maxrss starts from its parent's RSS at fork (and survives exec).
_MEASURE = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[1:]).returncode\n"
            "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)\n")


def measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int, str]:
    """Run a process on the controller: (seconds, peak RSS in bytes of it and its children,
    exit status, stdout then stderr)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, env=env, cwd=_ROOT, text=True)
    seconds = time.monotonic() - started
    lines = done.stdout.rstrip().splitlines()
    if not lines or not lines[-1].startswith("maxrss "):
        raise RuntimeError(f"{shlex.join(argv)}: the measuring wrapper failed:\n{done.stderr[-2000:]}")
    _, rss, code = lines[-1].split()
    return seconds, int(rss) * 1024, int(code), done.stdout + done.stderr
