"""The command line (face): ``transplant.cli:main`` is the console script.

The parser and dispatch live in :mod:`transplant.cli.app`; importing this package imports
nothing else, so the commands and renderers load without the whole face.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (see :func:`transplant.cli.app.main`)."""
    from transplant.cli.app import main as run

    return run(argv)
