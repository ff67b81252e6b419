"""Scripted transaction ids, for the tests of transactions begun in one second."""

from __future__ import annotations

import sys
from collections.abc import Iterable


def script_transaction_ids(monkeypatch, ids: Iterable[str]) -> None:
    """Give the next transactions :func:`transplant.apply.execute.execute` begins the ``ids``, in
    order (then real ones); every other id made meanwhile (the owner of a lock ``apply`` takes
    to check the target, ``rollback``'s) stays a real one, so the script does not shift with them."""
    import transplant.apply.execute as execute

    real, scripted, begins = execute.new_transaction_id, iter(ids), execute.execute.__code__

    def made() -> str:
        if sys._getframe(1).f_code is begins:
            return next(scripted, None) or real()
        return real()

    monkeypatch.setattr(execute, "new_transaction_id", made)
