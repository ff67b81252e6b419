"""The one pipeline: a fleet apply applies the plans it showed, never plans made later.

Real local venvs built from real wheels; the donor and the target are ``local`` hosts.
"""

from __future__ import annotations

import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from transplant.controller.manifest_file import load_manifest
from transplant.donor.sources import open_donor
from transplant.fleet.run import run_fleet
from transplant.hosts.host import SSHOptions
from transplant.lab.wheels import build_wheel, make_venv

SITE = "lib/python3.11/site-packages"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """A local donor (foo 2.0), a target (foo 1.0), a manifest; the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    make_venv(tmp_path / "donor", [build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"})])
    make_venv(tmp_path / "target", [build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n"})])
    (tmp_path / "m.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {tmp_path / 'donor'}}}
        target: {{host: local, venv: {tmp_path / 'target'}}}
        overlay: [foo]
        """))
    return tmp_path


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
