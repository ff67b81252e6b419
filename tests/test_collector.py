"""The cyclic collector's pause (transplant.collector): nested and overlapping pauses restore it once, as it was."""

from __future__ import annotations

import gc

from transplant.collector import collector_paused


def test_pauses_nest_and_restore_the_collector_as_it_was():
    assert gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the inner pause's end must not turn it back on while the outer runs"
    assert gc.isenabled()
    gc.disable()  # the twin: off before, off after
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
