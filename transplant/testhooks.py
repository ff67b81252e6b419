"""The test hooks: ``TRANSPLANT_TEST_*`` environment variables the test suite sets to inject a
fault or count work, read on the controller here and nowhere else.

Unset, a hook does nothing; none is meant for operators (manifests/REFERENCE.md lists them with
every other variable). The host scripts import nothing of transplant, so the hooks read on a host
are read in their shared module, ``transplant/remote/_common.py`` (:data:`SCRIPT_LOG`,
:data:`APPLIER_LOG`); their names are listed here too, so that :data:`HOOKS` holds every hook.
"""

from __future__ import annotations

import os

from transplant.remote._common import APPLIER_LOG, SCRIPT_LOG

__all__ = ["CRASH_AFTER", "ORPHAN_AT", "PULL_STOP_AFTER", "SCRIPT_LOG", "APPLIER_LOG", "HOOKS",
           "count", "crash_after", "orphan_at", "pull_stop_after"]

#: ``N``: the target's commit or rollback kills itself (SIGKILL) before step N: a real crash at a
#: chosen point, for the fault-injection tests.
CRASH_AFTER = "TRANSPLANT_TEST_CRASH_AFTER"
#: ``N``: the target's commit waits before step N until this controller is gone (the test kills
#: it), then finishes alone, as a host script orphaned mid-commit does.
ORPHAN_AT = "TRANSPLANT_TEST_ORPHAN_AT"
#: ``BYTES``: a target's pull from an OCI registry stops, as a dropped connection would, once that
#: many bytes have come (the resume tests).
PULL_STOP_AFTER = "TRANSPLANT_TEST_PULL_STOP_AFTER"

#: Every test hook's name: the controller's, then the host scripts'.
HOOKS = (CRASH_AFTER, ORPHAN_AT, PULL_STOP_AFTER, SCRIPT_LOG, APPLIER_LOG)


def count(hook: str) -> int | None:
    """The whole number the hook ``hook`` (one of :data:`HOOKS`) is set to in this process's
    environment; None when it is unset, empty or not a plain non-negative number (a hook never
    fails a command)."""
    value = os.environ.get(hook)
    return int(value) if value and value.isdigit() else None


def crash_after() -> int | None:
    """The step before which the target's commit or rollback kills itself (:data:`CRASH_AFTER`);
    None: unset."""
    return count(CRASH_AFTER)


def orphan_at() -> int | None:
    """The step before which the target's commit waits for its controller to be gone
    (:data:`ORPHAN_AT`); None: unset."""
    return count(ORPHAN_AT)


def pull_stop_after() -> int | None:
    """The bytes after which a target's registry pull stops (:data:`PULL_STOP_AFTER`); None: unset."""
    return count(PULL_STOP_AFTER)
