"""Errors that reach a user, all in this module: each has a stable reference, a message and, where one
exists, a hint, and renders itself.

The hint is the exact command or manifest change that fixes the problem, and each class
carries a stable ``reference`` (a kebab-case name scripts and documentation may rely on),
the habit of pip's diagnostic errors (``pip/_internal/exceptions.py``). The command line
prints :meth:`TransplantError.render` (``error: <message>`` and ``hint: <hint>``) and maps
each class to an exit code (:mod:`transplant.cli.exitcodes`); no traceback reaches a user
for these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich loads when an error renders, not when a command starts (every command pays its import)
    from rich.text import Text

__all__ = ["TransplantError", "ManifestError", "HostError", "ProbeError", "PlanError", "ApplyError",
           "TransactionError", "NoDonorError", "StoreError", "SnapshotError", "RecoverError", "FleetError",
           "UsageError", "RegistryError", "StateError", "ConfigError"]


class TransplantError(Exception):
    """Base of every error shown to a user.

    :param message: what was found, naming the file, host or key involved.
    :param hint: the command or change that fixes it; None when there is none to give.
    :param code: the finding code this error stands for, when a plan could not be made
        because of it (``interpreter-missing`` for a venv whose python does not start); else None.
    :param mismatches: files that differ from a planned state (apply, transactions), one line
        each; empty for the others.
    :cvar reference: the class's stable name (kebab-case), the same for every instance.
    """

    reference = "transplant-error"

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None,
                 mismatches: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code
        self.mismatches = list(mismatches or [])

    def __str__(self) -> str:
        return self.message

    def render(self, *, max_mismatches: int = 50, hint: bool = True) -> Text:
        """``error [<code>]: <message>``, the first ``max_mismatches`` files that differ, and
        ``hint: <fix>`` (``hint`` False: without it, for a caller that prints it on its own line,
        unwrapped), as rich text; nothing of the message is read as markup."""
        from rich.text import Text

        text = Text()
        text.append(f"error [{self.code}]: " if self.code else "error: ", style="bold red")
        text.append(self.message)
        for line in self.mismatches[:max_mismatches]:
            text.append(f"\n  {line}")
        if self.hint and hint:
            text.append("\nhint: ", style="bold")
            text.append(self.hint)
        return text


class ManifestError(TransplantError):
    """A manifest is unreadable or invalid; ``problems`` lists every problem, one line each."""

    reference = "manifest-invalid"

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"{path}: {count} {noun}; nothing was run:\n{lines}")


class HostError(TransplantError):
    """A host could not be reached, or a command could not be run there; names the host."""

    reference = "host-unreachable"


class ProbeError(TransplantError):
    """The probe ran but its report is missing, unreadable or of another schema version."""

    reference = "probe-unreadable"


class PlanError(TransplantError):
    """A saved plan is unreadable, of another schema, or no longer matches its hosts."""

    reference = "plan-unusable"


class ApplyError(TransplantError):
    """Apply failed; ``mismatches`` lists the files that differ from the plan, if any."""

    reference = "apply-failed"


class TransactionError(TransplantError):
    """A transaction step failed or was refused; ``mismatches`` lists files that differ, if any."""

    reference = "transaction-failed"


class NoDonorError(TransplantError):
    """No donor source could be used; the message lists why for each."""

    reference = "no-donor"


class StoreError(TransplantError):
    """A stored file is missing or does not have the content it is stored under."""

    reference = "store-damaged"


class SnapshotError(TransplantError):
    """A snapshot is missing, unreadable, damaged, or does not hold what is asked of it."""

    reference = "snapshot-unusable"


class RecoverError(TransplantError):
    """Nothing to recover from: no verified state, no recipe, drift, or a patch file that changed."""

    reference = "nothing-to-recover"


class FleetError(TransplantError):
    """The fleet cannot run as asked (a target named twice or that is a donor, a bad ``--jobs``); nothing ran."""

    reference = "fleet-invalid"


class UsageError(TransplantError):
    """A command-line mistake (exit code 64)."""

    reference = "usage"


class RegistryError(TransplantError):
    """A registry refused a request, could not be reached, or sent content that fails its digest.

    :ivar status: the HTTP status (None when no answer came); :ivar unreachable: True when no
        connection could be made (refused, no route, TLS failed, timed out).
    """

    reference = "registry-failed"

    def __init__(self, message: str, *, hint: str | None = None, status: int | None = None,
                 unreachable: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.unreachable = unreachable


class StateError(TransplantError):
    """A state file or folder (the controller's state folder, a plan memo, the verified log, a snapshot
    index; a target's ``.transplant`` folder, journal, history) that another user could have written:
    owned by someone other than the user running transplant (or root), or writable by its group or
    others. Refused as OpenSSH refuses a loose key or config file; the hint is the chmod/chown."""

    reference = "state-untrusted"


class ConfigError(TransplantError):
    """The operator's config file (``~/.config/transplant/config.toml``) cannot be used: not TOML,
    an unknown key, a value of the wrong type, or a file others may write; the message names the
    file and the key, the hint the fix."""

    reference = "config-invalid"
