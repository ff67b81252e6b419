"""What the commands share (face): the session of connections and the donor, ``HOST:VENV``, targets.

The manifest-driven commands (:mod:`transplant.cli.commands`) open one :class:`Session` each;
``--target`` / ``targets:`` with several targets hand the work to the fleet report.
"""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from transplant.core.manifest import Endpoint, Manifest
from transplant.core.plan import Plan
from transplant.controller.patch_files import read_patch_files
from transplant.donor.sources import Opened, open_donor
from transplant.errors import HostError, TransplantError, UsageError
from transplant.hosts.host import Host, side_error
from transplant.hosts.connecting import connect
from transplant.cli.warm import ssh_options
from transplant.cli.locations import parse_location
from transplant.pipeline import plan_target

__all__ = ["Session", "targets_of", "run_fleet_action", "refuse_inside_venvs"]


class Session:
    """Connections and inventories for one command, closed at the end.

    ``manifest`` becomes the effective one once the donor is opened (:meth:`donor`): its
    ``donor`` is then the host and venv the facts are of (a snapshot's original donor).
    """

    def __init__(self, manifest: Manifest, console: Console, stack: ExitStack) -> None:
        self.manifest = manifest
        self.console = console
        self.stack = stack
        self.ssh = ssh_options(manifest)
        self._hosts: dict[str, Host] = {}
        self._pending: bool | None = None
        self._donor: Opened | None = None

    def clone_pending(self) -> bool:
        """True when ``target.base`` is set and the target venv does not exist yet (see :mod:`transplant.clone.cloning`)."""
        if self._pending is None:
            pending = False
            if self.manifest.target.base is not None:  # the clone's module loads only then
                from transplant.clone.cloning import venv_exists

                pending = not venv_exists(self.host("target"), self.manifest.target.venv)
            self._pending = pending
        return self._pending

    def cloned(self) -> None:
        """Say that ``target.base`` was cloned: the target venv exists now."""
        self._pending = False

    def base_host(self) -> Host:
        """The host of ``target.base`` (the target's connection when it is the same host, else a new one)."""
        base = self.manifest.target.base
        assert base is not None
        if base.host == self.manifest.target.host:
            return self.host("target")
        if "base" not in self._hosts:
            with self.console.status(f"connecting to the base {base.host}"):
                self._hosts["base"] = self.stack.enter_context(connect(base.host, self.ssh))
        return self._hosts["base"]

    def host(self, side: str) -> Host:
        if side == "donor":
            opened = self.donor()
            if opened.host is None:
                raise TransplantError(f"the donor is {opened.source.label}, not a host")
            return opened.host
        if side not in self._hosts:
            spec = getattr(self.manifest, side).host
            with self.console.status(f"connecting to the {side} {spec}"):
                try:
                    self._hosts[side] = self.stack.enter_context(connect(spec, self.ssh))
                except HostError as exc:
                    raise side_error(side, exc, spec) from None
        return self._hosts[side]

    def donor(self, *, quiet: bool = False) -> Opened:
        """Open the donor source (the manifest's donor, else its first fallback that works) and say which."""
        if self._donor is None:
            from transplant.cli.progress import Shown, printer

            shown = Shown(note=printer(self.console, style="yellow", highlight=False))
            with self.console.status("opening the donor"):
                self._donor = open_donor(self.manifest, self.ssh, self.stack, reporter=shown)
            self.manifest = self._donor.manifest
            if not quiet:
                self.console.print(f"donor source: {self._donor.source.label} ({self._donor.why})", markup=False,
                                   highlight=False)
        return self._donor

    def plan(self, *, memo: bool | str = False, recalled: list | None = None) -> Plan:
        """Gather facts from the donor and the target (see :mod:`transplant.pipeline.gather`), and plan.

        :param memo: reuse the last plan when neither venv changed since, and keep this one
            (``plan_target``'s ``memo``); ``"recall"`` reuses without keeping.
        :param recalled: ``plan_target``'s: told the memo's entry when the kept plan is returned.
        """
        source = self.donor().source
        m = self.manifest
        patches = read_patch_files(m)
        target_host = self.host("target")
        if self.clone_pending():  # plan against the base: the clone will hold its files
            assert m.target.base is not None
            m, target_host = replace(m, target=m.target.base), self.base_host()
        from transplant.cli.progress import Shown, printer

        with self.console.status("probing") as status:
            return plan_target(m, source, target_host, patches=patches, memo=memo, recalled=recalled,
                               reporter=Shown(step=status.update, note=printer(self.console, highlight=False)))


    def forget_plan(self) -> bool:
        """Remove the plan memo of this manifest's donor and target (:func:`transplant.pipeline.memo.forget`),
        after an apply changed the target: its kept plan is stale. Nothing when the memo is off
        or no plan is kept for the donor; any failure is ignored.

        :returns: whether a memo was removed.
        """
        from transplant.errors import TransplantError
        from transplant.pipeline import memo as memos

        try:
            if not memos.memo_enabled() or self.clone_pending():
                return False
            key = memos.memo_key(self.manifest, self.donor().source, self.host("target"), read_patch_files(self.manifest))
        except (TransplantError, OSError):
            return False
        return key is not None and memos.forget(key)


def targets_of(args: argparse.Namespace, manifest: Manifest) -> tuple[Manifest, list[Endpoint]]:
    """The targets: ``--target`` (repeatable) replaces the manifest's ``target`` / ``targets``.

    :returns: the manifest with its first target as ``target``, and every target.
    """
    given = getattr(args, "target", None) or []
    targets = [Endpoint(host=spec, venv=venv) for spec, venv in map(parse_location, given)] or \
        list(manifest.targets or (manifest.target,))
    for t in targets:
        if t == manifest.donor or t in manifest.fallback:
            raise UsageError(f"--target {t}: that is a donor of {manifest.path}", hint="name another host or venv")
    if len(set(targets)) != len(targets):
        raise UsageError("a target is given twice", hint="name each host and venv once")
    return dataclasses.replace(manifest, target=targets[0], targets=tuple(targets)), targets


def run_fleet_action(action: str, args: argparse.Namespace, console: Console, manifest: Manifest,
           targets: list[Endpoint]) -> int:
    """plan / apply / verify on several targets (see :mod:`transplant.cli.commands.fleet`)."""
    from transplant.cli.commands.fleet import run_fleet_command

    with ExitStack() as stack:
        session = Session(manifest, console, stack)
        opened = session.donor(quiet=True)
        return run_fleet_command(action, args, console, session.manifest, targets, opened, session.ssh, stack)


def refuse_inside_venvs(path: str, manifest: Manifest) -> None:
    """A file the controller writes (``--out``) must not land inside a local donor or target venv."""
    resolved = Path(path).resolve()
    for side in ("donor", "target"):
        end = getattr(manifest, side)
        if not isinstance(end, Endpoint):
            continue
        venv = Path(end.venv).resolve()
        if end.host.is_local and (resolved == venv or venv in resolved.parents):
            raise TransplantError(f"--out {path}: that is inside the {side} venv {end.venv}",
                                  hint="save plans outside the venvs, e.g. --out plan.json")
