"""Errors that reach a user: each carries a message and, where one exists, a hint.

The hint is the exact command or manifest change that fixes the problem (the habit of
pip's diagnostic errors). The CLI prints ``error: <message>`` and ``hint: <hint>`` and
maps each class to an exit code; no traceback reaches a user for these.
"""

from __future__ import annotations

__all__ = ["TransplantError", "ManifestError", "HostError", "ProbeError", "PlanError"]


class TransplantError(Exception):
    """Base of every error shown to a user.

    :param message: what was found, naming the file, host or key involved.
    :param hint: the command or change that fixes it; None when there is none to give.
    :param code: the finding code this error stands for, when a plan could not be made
        because of it (``interpreter-missing`` for a venv whose python does not start); else None.
    """

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code

    def __str__(self) -> str:
        return self.message


class ManifestError(TransplantError):
    """A manifest is unreadable or invalid; ``problems`` lists every problem, one line each."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"{path}: {count} {noun}; nothing was run:\n{lines}")


class HostError(TransplantError):
    """A host could not be reached, or a command could not be run there; names the host."""


class ProbeError(TransplantError):
    """The probe ran but its report is missing, unreadable or of another schema version."""


class PlanError(TransplantError):
    """A saved plan is unreadable, of another schema, or no longer matches its hosts."""
