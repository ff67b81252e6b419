"""Where a command that reaches one venv finds it (face): ``HOST:VENV`` or a manifest.

``status``, ``inventory`` (and ``verify``) accept either. Given a manifest, the venv is its
target's and the SSH settings are the manifest's ``ssh:`` block (key, known_hosts, timeout,
host-key checking), so a command reaches the host exactly as ``plan`` and ``apply`` do; the
command line's ``--identity-file`` / ``--known-hosts`` still win where given.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

from .errors import HostError
from .hosts import SSHOptions
from .hostspec import HostSpec

__all__ = ["is_location", "resolve_location", "side_error"]


def is_location(text: str) -> bool:
    """Whether an argument is ``HOST:VENV`` (it holds ``:/`` and names no file) rather than a manifest."""
    return ":/" in text and not os.path.exists(text)


def resolve_location(text: str, identity_file: str | None = None,
                     known_hosts: str | None = None) -> tuple[HostSpec, str, SSHOptions, str]:
    """The host, venv, SSH settings and label (for messages) that ``text`` names.

    :param text: ``HOST:VENV`` (``local:/srv/venv``, ``root@gpu:/root/venv``) or a manifest file.
    :param identity_file: ``--identity-file``, or None; :param known_hosts: ``--known-hosts``, or None.
    :raises UsageError: a bad ``HOST:VENV``; :raises ManifestError: an invalid manifest;
        :raises TransplantError: a manifest whose target is given as several (``targets:``).
    """
    from .cli import UsageError, _ssh_options, parse_location
    from .files import load_manifest

    if is_location(text):
        spec, venv = parse_location(text)
        return spec, venv, SSHOptions.from_files(identity_file, known_hosts), text
    if not os.path.exists(text):
        raise UsageError(f"{text!r}: neither a manifest file nor HOST:VENV",
                         hint="give a manifest (its target is read), or e.g. local:/root/venv or root@gpu-07:/root/venv")
    manifest = load_manifest(text)
    if manifest.targets and len(manifest.targets) > 1:
        raise UsageError(f"{text}: the manifest names {len(manifest.targets)} targets; this command reads one",
                         hint="name it as HOST:VENV, e.g. " + str(manifest.targets[0]))
    options = _ssh_options(manifest)
    if identity_file:
        options = dataclasses.replace(options, identity_file=Path(identity_file))
    if known_hosts:
        options = dataclasses.replace(options, known_hosts=Path(known_hosts))
    target = manifest.target
    return target.host, target.venv, options, f"{target.host}:{target.venv}"


def side_error(side: str, exc: HostError, spec: HostSpec) -> HostError:
    """``exc`` (a host that could not be reached) said as the manifest's ``side`` (``donor``,
    ``target``, ``donor.fallback[0]``, ``target.base``), with what to try when it has no hint.

    The hint for a connection that failed (refused, timed out, no such name) names the
    ``ssh`` command that tries the same host, and for a donor the ways to go on without it.
    """
    if exc.message.startswith(f"{side} "):
        return exc
    hint = exc.hint
    if hint is None:
        dest = [f"{spec.user}@{spec.hostname}" if spec.user else spec.hostname]
        if spec.port is not None:
            dest = ["-p", str(spec.port), *dest]
        hint = (f"check the host and port in the manifest's {side.split('[')[0]}.host, and that an SSH server answers "
                f"there: ssh {shlex.join(dest)} true")
        if side.startswith("donor"):
            hint += "; without the donor, use a snapshot: donor: {snapshot: ID} or a donor.fallback"
    error = HostError(f"{side} {exc.message}", hint=hint, code=exc.code)
    return error
