"""The one pipeline: a fleet apply applies the plans it showed, never plans made later.

Real local venvs built from real wheels; the donor and the target are ``local`` hosts.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from transplant.controller.manifest_file import load_manifest
from transplant.donor.sources import open_donor
from transplant.fleet.run import run_fleet
from transplant.hosts.host import SSHOptions

SITE = "lib/python3.11/site-packages"


@pytest.fixture
def fleet(foo_pair: Path) -> Path:
    return foo_pair


def _shown_then_applied(root: Path, between) -> list:
    """Plan the fleet (what a confirmation shows), run ``between``, then apply the shown plans."""
    manifest = load_manifest(root / "m.yaml")
    with ExitStack() as stack:
        opened = open_donor(manifest, SSHOptions(), stack)
        targets = [manifest.target]
        shown = run_fleet("plan", manifest, targets, opened, SSHOptions(), jobs=1)
        assert [r.code for r in shown] == [2], shown[0].error
        between()
        return run_fleet("apply", manifest, targets, opened, SSHOptions(), jobs=1,
                         plans={r.target: r.plan for r in shown})


def test_a_fleet_apply_applies_the_shown_plan_and_refuses_it_when_the_target_changed_since(fleet):
    edited = fleet / "target" / SITE / "foo" / "__init__.py"
    [result] = _shown_then_applied(fleet, lambda: edited.write_text("V = 'edited'\n"))
    assert result.code == 1 and result.applied is None
    assert "refusing a stale plan: the target changed since the plan was made" in result.error
    assert edited.read_text() == "V = 'edited'\n", "nothing was written"


def test_a_fleet_apply_applies_the_shown_plan_when_nothing_changed(fleet):
    [result] = _shown_then_applied(fleet, lambda: None)
    assert result.code == 0 and result.applied is not None and result.error is None
    assert (fleet / "target" / SITE / "foo" / "__init__.py").read_text() == "V = 2\n"
    assert sorted(p.name for p in (fleet / "target" / SITE).glob("foo-*.dist-info")) == ["foo-2.0.dist-info"]
