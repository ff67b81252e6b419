"""Python's cyclic garbage collector paused around a large allocation pass (edge: process state).

Decoding and parsing a probe's reply of a large venv, and planning over two such inventories,
allocate hundreds of thousands to millions of objects that form no reference cycle; each full
collection those allocations set off walks every live object again (on a large venv, a
quarter of the reply's parse and of the planner's time). Reference counting frees
them as usual meanwhile. The pauses nest and may overlap across threads: the collector is turned
back on when the last one ends, and only if it was on when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]

_LOCK = threading.Lock()
_DEPTH = 0
_WAS_ENABLED = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (see the module docstring); restored when the
    outermost of the blocks open at once ends, as it was before the first. Raises nothing."""
    global _DEPTH, _WAS_ENABLED
    with _LOCK:
        if _DEPTH == 0:
            _WAS_ENABLED = gc.isenabled()
            gc.disable()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _WAS_ENABLED:
                gc.enable()
