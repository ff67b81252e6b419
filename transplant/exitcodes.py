"""The exit codes of ``transplant``, defined once; the command line and the fleet report use them.

``plan`` 0 nothing to change, 2 changes and no blocking finding, 3 blocked by an error
finding; ``apply`` 0 done (or nothing to do), 3 blocked (or, with ``--verify``, a stage
failed); ``verify`` 0 no stage failed, 3 a stage failed; ``status`` 3 when applied files
drifted; ``clone`` 3 done but the clone still names the old prefix; every command 1 when it
could not do its job and 64 for a command-line mistake (:class:`transplant.errors.UsageError`;
argparse's own 2 would read as "changes"); 130 when interrupted (SIGINT, 128 + 2).
"""

from __future__ import annotations

from transplant.errors import TransplantError, UsageError

__all__ = ["EXIT_OK", "EXIT_FAIL", "EXIT_CHANGES", "EXIT_BLOCKED", "EXIT_USAGE", "EXIT_INTERRUPTED", "exit_code_for"]

EXIT_OK, EXIT_FAIL, EXIT_CHANGES, EXIT_BLOCKED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 3, 64, 130


def exit_code_for(exc: TransplantError) -> int:
    """The exit code for an error that ended a command: 64 for a usage mistake, else 1."""
    return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAIL
