"""Where a command that reaches one venv finds it (face): ``HOST:VENV`` or a manifest.

``status``, ``inventory`` (and ``verify``) accept either. Given a manifest, the venv is its
target's and the SSH settings are the manifest's ``ssh:`` block (key, known_hosts, timeout,
host-key checking), so a command reaches the host exactly as ``plan`` and ``apply`` do; the
command line's ``--identity-file`` / ``--known-hosts`` still win where given.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from transplant.cli.warm import ssh_options
from transplant.hosts.host import SSHOptions
from transplant.core.hostspec import HostSpec
from transplant.core.units import visible
from transplant.errors import UsageError

__all__ = ["is_location", "parse_location", "resolve_location", "local_form", "refuse_bare_venv_path"]


def is_location(text: str) -> bool:
    """Whether an argument is ``HOST:VENV`` (it holds ``:/`` and names no file) rather than a manifest."""
    return ":/" in text and not os.path.exists(text)


def parse_location(text: str) -> tuple[HostSpec, str]:
    """Split ``HOST:VENV`` (``root@gpu:22:/root/venv``, ``local:/srv/venv``) at the ``:`` before the venv's ``/``,
    or ``ssh://[user@]host[:port]/VENV`` (OpenSSH's URL; the path is the venv's) after its host.

    :raises UsageError: no ``:/`` in the text, bytes that are not UTF-8 (the command line's
        undecodable bytes, as lone surrogates), a control character in the venv path, or a bad host part.
    """
    host, sep, venv = text.partition(":/")
    fix = "write e.g. local:/root/venv_sglang, root@gpu-07:/root/venv_sglang or ssh://root@gpu-07:2222/root/venv_sglang"
    scheme, url, rest = text.partition("://")
    # a URL: its path is the venv (local:///srv/venv stays the controller's //srv/venv, as it always was)
    if url and "/" not in scheme and "@" not in scheme and scheme != "local" and _utf8(text):
        authority, slash, path = rest.partition("/")
        if scheme.lower() == "ssh" and not path:
            raise UsageError(f"{text!r}: expected the venv's absolute path after the host "
                             f"(ssh://[user@]host[:port]/VENV)", hint=fix)
        host, sep, venv = f"{scheme}://{authority}", slash, path
    if not _utf8(text):
        # the command line's bytes that are not UTF-8 arrive as lone surrogates: they cannot go into the
        # JSON of a host script's request, an SSH command or a message, so they are refused here, named
        shown = visible(text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
        if not _utf8(host):
            raise UsageError(f"{shown}: the host holds bytes that are not UTF-8 (shown as \\xNN)",
                             hint="name the host in UTF-8 text, as ssh_config and DNS do")
        raise UsageError(f"{shown}: the venv path holds bytes that are not UTF-8 (shown as \\xNN); transplant "
                         f"names venvs in UTF-8 text only", hint="rename the folder to a UTF-8 name (mv), then name it so")
    if not sep:
        if ":" not in text and text.strip():  # a bare path: the same path, as the form that names it
            fix = f"a venv on this machine is written local:PATH: {local_form(text)}"
        raise UsageError(f"{text!r}: expected HOST:VENV with an absolute venv path", hint=fix)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in venv):
        raise UsageError(f"{text!r}: the venv path holds a control character (a newline, a tab...)", hint=fix)
    try:
        return HostSpec.parse(host), "/" + venv
    except ValueError as exc:
        raise UsageError(f"{text!r}: {exc}", hint=fix) from None


def local_form(path: str) -> str:
    """``local:`` and ``path`` made absolute (``~`` expanded; from the current folder), as a
    hint names it for a bare path given where ``HOST:VENV`` belongs."""
    return "local:" + os.path.abspath(os.path.expanduser(path))


def refuse_bare_venv_path(text: str, command: str) -> None:
    """A folder, or a path that is not there and is not named like a YAML file, given where a
    manifest or ``HOST:VENV`` belongs: most likely the venv itself, written without ``local:``.

    :param command: the command as the hint names it (``verify``).
    :raises UsageError: naming that path in the ``local:`` form (``transplant verify local:/abs/path``).
    """
    import shlex

    if os.path.isdir(text) or (not os.path.lexists(text) and not text.endswith((".yaml", ".yml"))):
        what = "is a folder" if os.path.isdir(text) else "is no file here"
        raise UsageError(f"{text!r} {what}, not a manifest",
                         hint=f"to name the venv itself: transplant {command} {shlex.quote(local_form(text))}")


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogate, which is how Python decodes a command
    line's bytes that are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve_location(text: str, identity_file: str | None = None,
                     known_hosts: str | None = None) -> tuple[HostSpec, str, SSHOptions, str]:
    """The host, venv, SSH settings and label (for messages) that ``text`` names.

    :param text: ``HOST:VENV`` (``local:/srv/venv``, ``root@gpu:/root/venv``) or a manifest file.
    :param identity_file: ``--identity-file``, or None; :param known_hosts: ``--known-hosts``, or None.
    :raises UsageError: a bad ``HOST:VENV``; :raises ManifestError: an invalid manifest;
        :raises TransplantError: a manifest whose target is given as several (``targets:``).
    """
    from transplant.controller.manifest_file import load_manifest

    if is_location(text):
        spec, venv = parse_location(text)
        return spec, venv, SSHOptions.from_files(identity_file, known_hosts), text
    if not os.path.exists(text):
        raise UsageError(f"{text!r}: neither a manifest file nor HOST:VENV",
                         hint="give a manifest (its target is read), or the venv as HOST:VENV"
                              + (f": {local_form(text)} on this machine" if ":" not in text and text.strip() else
                                 ", e.g. local:/root/venv or root@gpu-07:/root/venv"))
    if os.path.isdir(text):  # the venv itself, written without local:
        raise UsageError(f"{text!r} is a folder, not a manifest", hint=f"name the venv itself: {local_form(text)}")
    manifest = load_manifest(text)
    if manifest.targets and len(manifest.targets) > 1:
        raise UsageError(f"{text}: the manifest names {len(manifest.targets)} targets; this command reads one",
                         hint="name it as HOST:VENV, e.g. " + str(manifest.targets[0]))
    options = ssh_options(manifest)
    if identity_file:
        options = dataclasses.replace(options, identity_file=Path(identity_file))
    if known_hosts:
        options = dataclasses.replace(options, known_hosts=Path(known_hosts))
    target = manifest.target
    return target.host, target.venv, options, f"{target.host}:{target.venv}"

