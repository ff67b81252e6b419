"""What a command starts before it has finished importing (face): the SSH settings of a manifest
and, for ``transplant apply MANIFEST``, its two hosts' connections opened side by side
(:mod:`transplant.hosts.early`) while the command's modules import, so that the two overlap.

Kept free of the heavy imports (rich, the planner, the pipeline): it runs first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transplant.core.manifest import Endpoint, Manifest
from transplant.hosts.host import SSHOptions

__all__ = ["ssh_options", "connect_early"]


def ssh_options(manifest: Manifest) -> SSHOptions:
    """The manifest's ``ssh`` settings, its relative paths resolved against the manifest's folder;
    master connections kept between commands unless ``TRANSPLANT_SSH_PERSIST=0``.

    :raises TransplantError: ``TRANSPLANT_SSH_PERSIST`` is neither 0 nor 1
        (:func:`transplant.hosts.ssh_persist.persist_enabled`).
    """
    from transplant.hosts.ssh_persist import persist_enabled

    base = Path(manifest.path).resolve().parent

    def resolve(value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    return SSHOptions(identity_file=resolve(manifest.ssh.identity_file), known_hosts=resolve(manifest.ssh.known_hosts),
                      connect_timeout=manifest.ssh.connect_timeout, verify_host_keys=manifest.ssh.verify_host_keys,
                      config=resolve(manifest.ssh.config), persist=persist_enabled())


_Script = tuple[str, tuple[str, ...]]  # (host script, its arguments)
_PROBE: _Script = ("probe", ("--stdin",))
_ELF: _Script = ("elf_facts", ())


def connect_early(args: argparse.Namespace) -> None:
    """For ``transplant apply MANIFEST`` with one target (no ``--target``, ``--resume``,
    ``--rollback``), start opening the donor's and the target's SSH connections, both at once,
    each then asking its venv's identity (for the donor-is-not-the-target check: it only reads);
    the command takes them when it connects (:func:`transplant.hosts.connecting.connect`). Once each is
    open, the host scripts the command will ask first start there, waiting for their requests
    (:func:`transplant.hosts.probing.prestart`): both plan probes, the target's stale-plan probe
    and its ELF script, and (without ``--compress``) the two sides of a small apply's stream.

    For ``transplant plan MANIFEST`` with one target (no ``--target``), each side's probe
    (``probe --stdin``) starts likewise, on an SSH host once its connection is open and on the
    local host at once: the plan memo's fingerprint (or, when the memo is off or misses, the
    plan's probe) asks it, so its interpreter start, imports and compile (0.2 s of CPU each on
    the real pair's venvs) overlap the command's imports (for a plan with nothing to change
    they are most of its time). Anything else (a saved plan, a fleet, a snapshot donor, a clone's
    target, a local apply) starts nothing here; what is started and never asked is ended when the command ends.

    Never raises: a manifest that does not load, or settings that are bad, start nothing, and
    the command reports them itself as it always did.
    """
    if args.command == "plan":
        if getattr(args, "target", None):
            return
        source = args.manifest
    elif args.command != "apply" or getattr(args, "target", None) or args.resume or args.rollback \
            or str(args.source).endswith(".json"):
        return
    else:
        source = args.source
    try:
        from transplant.controller.manifest_file import load_manifest
        from transplant.hosts import early

        manifest = load_manifest(source)
        if len(manifest.targets or (manifest.target,)) != 1 or manifest.target.base is not None:
            return
        if args.command == "plan":
            _probes_early(manifest)
            return
        from transplant.hosts.stream import side_argv

        options = ssh_options(manifest)
        if options.identity_file is not None and not Path(options.identity_file).expanduser().is_file():
            return  # the command says so, with its hint
        # each side's plan probe and the target's ELF script first (the donor's runs only when a
        # shared object moves); once the identity is answered (asked later, they would only slow
        # it) the target's stale-plan probe and the two sides of a small apply's stream
        # (uncompressed: the receiver learns its folder from its input); all wait for their requests
        first: dict[str, list[_Script]] = {"donor": [_PROBE], "target": [_PROBE, _ELF]}
        later: dict[str, list[_Script]] = {"donor": [], "target": [_PROBE]}
        if not getattr(args, "compress", False):
            if not isinstance(manifest.donor, Endpoint):
                return  # a snapshot donor has no venv to stream from: nothing started, as before
            later["donor"].append(("stream_send", side_argv("stream_send", manifest.donor.venv)))
            later["target"].append(("stream_receive", side_argv("stream_receive", "")))
        for side in ("donor", "target"):
            end = getattr(manifest, side)
            if isinstance(end, Endpoint):
                early.start(end.host, options, end.venv, scripts=first[side], later=later[side])
    except Exception:  # noqa: BLE001 - the command itself reports whatever is wrong
        return


def _probes_early(manifest: Manifest) -> None:
    """Start each live side's ``probe --stdin`` of a one-target plan, waiting for its request
    (:func:`connect_early`): over SSH with the connection :mod:`transplant.hosts.early` opens
    (its venv's identity said by that probe as it starts), locally at once."""
    from transplant.hosts import early

    options: SSHOptions | None = None
    for side in ("donor", "target"):
        end = getattr(manifest, side)
        if not isinstance(end, Endpoint):
            continue  # a snapshot donor: nothing runs on a host for it
        if end.host.is_local:
            from transplant.hosts.host import LocalHost
            from transplant.hosts.probing import prestart

            prestart(LocalHost(end.host), end.venv, *_PROBE)
            continue
        if options is None:
            options = ssh_options(manifest)
            if options.identity_file is not None and not Path(options.identity_file).expanduser().is_file():
                return  # the command says so, with its hint
        early.start(end.host, options, end.venv, scripts=[_PROBE])
