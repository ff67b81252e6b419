"""The manifest, version 1: model and validation (pure core; :mod:`transplant.controller.manifest_file` reads it).

A manifest names the donor and target (host and venv), the distributions to overlay,
the patch files, and the verify settings. :func:`parse_manifest` checks all of it and
raises one :class:`ManifestError` listing every problem with its key path
(``patches[1].dest``), what was expected and the fix. Unknown keys are errors. Problems are
collected by :class:`transplant.core.decode.Problems` (the one decoder's collecting mode: a
person wants every problem at once); each key has its own check, message and fix.
"""

from __future__ import annotations

import difflib
import re
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import PurePosixPath
from typing import Any

from transplant.errors import ManifestError
from transplant.core import verify_stages
from transplant.core.decode import Problems, kind
from transplant.core.hostspec import HostSpec

__all__ = [
    "Endpoint",
    "SnapshotRef",
    "SSHSettings",
    "Patch",
    "Acceptance",
    "ServerArgsCheck",
    "ServeCheck",
    "VerifySettings",
    "Manifest",
    "parse_manifest",
    "normalize_pattern",
    "SMOKE_DEVICES",
]

SMOKE_DEVICES = ("cpu", "cuda", "auto")
_SEPARATORS = re.compile(r"[-_.]+")
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-*?[]!")


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """A venv on a host: ``host`` parsed from ``local`` or ``[user@]host[:port]``, ``venv`` absolute.

    :ivar base: the target only (``target.base``): a venv to clone to ``venv`` (and relocate)
        while ``venv`` does not exist, before the overlay; None when there is none.
    :ivar allow_shared_interpreter: a target only (``allow_shared_interpreter: true``): apply may
        write into a Python prefix that is not a venv (no ``pyvenv.cfg``: a pyenv or system
        interpreter, which other programs share); refused otherwise, even with ``--force``.
    """

    host: HostSpec
    venv: str
    base: Endpoint | None = None
    allow_shared_interpreter: bool = False

    def __str__(self) -> str:
        return f"{self.host}:{self.venv}"


@dataclass(frozen=True, kw_only=True)
class SnapshotRef:
    """A snapshot playing the donor: ``path`` as the manifest writes it, an index file
    (relative to the manifest's folder) or a snapshot id in the default store, or a registry
    reference ``oci://REGISTRY/REPO:TAG`` / ``...@sha256:<hex>`` (see
    :mod:`transplant.donor.registry_snapshot`); ``ca``: a CA bundle for that registry (None: system CAs)."""

    path: str
    ca: str | None = None

    def __str__(self) -> str:
        return f"snapshot {self.path}"


@dataclass(frozen=True, kw_only=True)
class SSHSettings:
    """SSH settings: key file and known_hosts (None = OpenSSH's defaults, ``~/.ssh``).

    ``verify_host_keys`` is True unless the manifest turns it off explicitly.
    """

    identity_file: str | None = None
    known_hosts: str | None = None
    verify_host_keys: bool = True
    connect_timeout: float = 10.0
    #: the ssh_config file (aliases, User, Port, IdentityFile, ProxyJump); None: ``$TRANSPLANT_SSH_CONFIG``, else ~/.ssh/config
    config: str | None = None


@dataclass(frozen=True, kw_only=True)
class Patch:
    """A hand-patched file or folder copied from the controller into the target.

    :ivar source: path relative to the manifest's folder (POSIX); a trailing ``/`` or
        an existing folder means every file below it.
    :ivar dest: path relative to the target's site-packages (POSIX, never escaping it);
        for a folder source, the folder the files go into.
    """

    source: str
    dest: str


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """A finding the operator accepts: it is still shown, with ``reason``, but an accepted
    error does not block apply.

    :ivar code: the finding code (``lockstep-mismatch``).
    :ivar dists: normalised names or globs; a finding is accepted when every distribution
        it names matches one of them (empty: every finding with that code), so accepting
        one fault never accepts a wider one with the same code; a finding that names no
        distribution is accepted only by an entry without ``dists``.
    :ivar reason: why, in the operator's words (shown beside the finding).
    """

    code: str
    dists: tuple[str, ...]
    reason: str

    def matches(self, code: str, dists: tuple[str, ...]) -> bool:
        """Whether a finding with ``code`` about ``dists`` is accepted by this entry."""
        if code != self.code:
            return False
        if not self.dists:
            return True
        return bool(dists) and all(any(fnmatchcase(d, p) for p in self.dists) for d in dists)


@dataclass(frozen=True, kw_only=True)
class ServerArgsCheck:
    """Call the serving framework's own argument parser and compare attributes.

    :ivar entry: ``module:function``, called with ``args`` as its one argument (sglang's
        ``prepare_server_args(argv: list[str])``).
    :ivar expect: attribute name -> expected value; an enum matches by its name or value.
    """

    entry: str
    args: tuple[str, ...]
    expect: Mapping[str, Any]
    resolve: bool = False


#: The generation request ``verify.serve`` sends by default: sglang's ``/generate`` with token
#: ids (no tokenizer in the tiny model), greedy, four new tokens.
SERVE_BODY: Mapping[str, Any] = {"input_ids": [1, 5, 7, 9], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


@dataclass(frozen=True, kw_only=True)
class ServeCheck:
    """Start the server with a tiny model, wait for health, ask once, stop it.

    :ivar command: argv; ``{model}``, ``{port}`` and ``{python}`` are replaced by the tiny
        model's folder, a free loopback port and the venv's python.
    :ivar health: path answered with 200 once the server is up.
    :ivar path: path of the generation request, POSTed ``body`` as JSON.
    :ivar answer: dotted path of the generated value in the answer (``output_ids``,
        ``choices.0.text``); it must be a non-empty string or list.
    :ivar max_tokens: an answer list longer than this fails (None: not checked).
    :ivar config: the tiny model's config.json, or None for the built-in two-layer Llama.
    :ivar timeout: seconds for start, request and stop together.
    """

    command: tuple[str, ...]
    health: str = "/health"
    path: str = "/generate"
    body: Mapping[str, Any] = field(default_factory=lambda: dict(SERVE_BODY))
    answer: str = "output_ids"
    max_tokens: int | None = 4
    config: Mapping[str, Any] | None = None
    timeout: float = 600.0


@dataclass(frozen=True, kw_only=True)
class VerifySettings:
    """How ``verify`` proves the target works.

    :ivar env: extra environment for every stage (``CUDA_VISIBLE_DEVICES``).
    :ivar imports: import names checked beside those of the overlaid distributions.
    :ivar server_args: the argument-parser check, or None to skip that stage.
    :ivar smoke_device: ``cpu``, ``cuda`` or ``auto``; None to skip the smoke stage.
    :ivar timeout: seconds each stage may take before it is failed.
    :ivar serve: the serve check, or None to skip that stage.
    :ivar overlay: the manifest's overlay patterns: their distributions' import names and
        shared objects are checked too (empty: only ``imports``).
    :ivar skip_imports: import name -> the operator's reason not to import it (a derived
        top-level name that is not meant to work here); shown as skipped, with the reason.
    :ivar python: the Python version the target must run (``3.11`` or ``3.11.9``), or None.
    :ivar needs: import name of ``imports`` -> what it needs besides the venv (:data:`IMPORT_NEEDS`:
        ``gpu``); an import that needs a GPU and fails on a host without the NVIDIA driver, whose
        donor has none either, is not checkable here.
    :ivar required: stages of :data:`REQUIRABLE_STAGES` whose failure counts even when the donor
        fails the same way (by default such a failure is what the donor runs: a skip, or an
        unchecked item, with the donor's evidence).
    """

    env: Mapping[str, str] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    server_args: ServerArgsCheck | None = None
    smoke_device: str | None = None
    timeout: float = 300.0
    serve: ServeCheck | None = None
    overlay: tuple[str, ...] = ()
    skip_imports: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None
    required: tuple[str, ...] = ()
    needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


#: The verify stages that run again in the donor when they fail in the target (the donor is the
#: reference): what ``verify.required`` may name (the requirable rows of the stage table).
REQUIRABLE_STAGES = verify_stages.REQUIRABLE


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A validated manifest. ``path`` is where it was read from (for messages and patch sources).

    ``overlay`` holds the plain names and globs; ``closures`` the ``{closure: NAME}`` entries
    (normalised, extras kept: ``sglang[http2]``), whose distributions
    :func:`transplant.core.closure.expand` adds to ``overlay`` once both inventories are known;
    ``exclude`` the names or globs a closure never pulls in.

    ``donor`` is a host and venv or a :class:`SnapshotRef`; ``fallback`` the other sources
    tried in order when it cannot be reached (``donor.fallback``). ``target`` is the first
    of ``targets`` (``target:`` gives one, ``targets:`` several, a fleet).
    """

    path: str
    donor: Endpoint | SnapshotRef
    target: Endpoint
    ssh: SSHSettings
    overlay: tuple[str, ...]
    patches: tuple[Patch, ...]
    verify: VerifySettings
    remove: tuple[str, ...] = ()
    accept: tuple[Acceptance, ...] = ()
    fallback: tuple[Endpoint | SnapshotRef, ...] = ()
    targets: tuple[Endpoint, ...] = ()
    closures: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


def normalize_pattern(pattern: str) -> str:
    """PEP 503-normalise a distribution name or glob (``NVIDIA_*`` -> ``nvidia-*``).

    The rule is PEP 503's: runs of ``-``, ``_`` and ``.`` become one ``-``, then
    lower case; the glob characters ``*`` and ``?`` pass through unchanged.
    """
    return _SEPARATORS.sub("-", pattern).lower()


_MAX_SECONDS = 86400


def _seconds(value: Any) -> bool:
    """A timeout in seconds: a number from 1 to one day (no bool, NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value <= _MAX_SECONDS


def _relative(path: str) -> str | None:
    """Normalised POSIX relative path, or None if absolute, empty or escaping with '..'."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return None
    norm = posixpath.normpath(path)
    if norm == "." or norm == ".." or norm.startswith("../"):
        return None
    return norm


def _endpoint(c: Problems, value: Any, key: str, *, base: bool = False, target: bool = False) -> Endpoint | None:
    allowed = {"host": 'host: root@gpu-07 (or "local")', "venv": "venv: /root/venv_sglang"}
    if base:
        allowed["base"] = "base: /root/venv_base (a venv on the target's host to clone first)"
    if target:
        allowed["allow_shared_interpreter"] = ("allow_shared_interpreter: true (let apply write into a Python "
                                               "prefix that is not a venv)")
    data = c.mapping(value, key, allowed, required=("host", "venv"))
    shared = data.get("allow_shared_interpreter", False)
    if not isinstance(shared, bool):
        c.add(f"{key}.allow_shared_interpreter", f"expected true or false, got {kind(shared)}",
              "write allow_shared_interpreter: true only to write into a Python prefix that is not a venv")
        shared = False
    host = venv = None
    if "host" in data:
        text = c.string(data["host"], f"{key}.host", 'write "local" or [user@]host[:port], e.g. root@ct200')
        if text is not None and len(text) > 2 and text.startswith("@") and text.endswith("@"):
            c.add(f"{key}.host", f"{text!r} is a template placeholder (the demo's manifest template; "
                  "`transplant demo` fills it in)", 'write the real host: "local" or [user@]host[:port]')
            text = None
        if text is not None:
            try:
                host = HostSpec.parse(text)
            except ValueError as exc:
                c.add(f"{key}.host", str(exc), 'write "local" or [user@]host[:port], e.g. root@ct200:22')
    if "venv" in data:
        venv = c.string(data["venv"], f"{key}.venv", "give the venv's absolute path, e.g. /root/venv_sglang")
        if venv is not None and not PurePosixPath(venv).is_absolute():
            c.add(f"{key}.venv", f"expected an absolute path, got {venv!r}", "start it with '/', e.g. /root/venv_sglang")
            venv = None
        elif venv is not None and any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in venv):
            c.add(f"{key}.venv", f"the path {venv!r} holds a control character (a newline, a tab...)",
                  "give the venv's path on one line, without control characters")
            venv = None
        elif venv is not None and any(len(part.encode()) > 255 for part in venv.split("/")):
            c.add(f"{key}.venv", "a path component is longer than 255 bytes", "give the venv's real path")
            venv = None
        elif venv is not None:
            venv = posixpath.normpath(venv)
            if venv == "/":
                c.add(f"{key}.venv", "the filesystem root is not a venv", "name the venv's folder")
                venv = None
    if host is None or venv is None:
        return None
    if base and data.get("base") is not None:
        found = _with_base(c, Endpoint(host=host, venv=venv), data["base"], f"{key}.base")
        return replace(found, allow_shared_interpreter=shared) if found is not None else None
    return Endpoint(host=host, venv=venv, allow_shared_interpreter=shared)


def _with_base(c: Problems, target: Endpoint, value: Any, key: str) -> Endpoint | None:
    """``target.base``: a path on the target's host, or ``{host, venv}``; both venvs must be
    clone paths (:func:`transplant.core.relocation.check_venv_path`) and not overlap on one host."""
    from transplant.core.relocation import check_clone_paths, check_venv_path

    if not isinstance(value, (str, dict)) or (isinstance(value, str) and not value.startswith("/")):
        c.add(key, f"expected an absolute venv path or {{host, venv}}, got {kind(value)}",
              "write e.g. base: /root/venv_base (on the target's host) or base: {host: root@ct129, venv: /root/venv_base}")
        return None
    if isinstance(value, str):
        found = _endpoint(c, {"host": str(target.host), "venv": value}, key)
    else:
        found = _endpoint(c, value, key)
    if found is None:
        return None
    problems = 0
    for where, path in ((f"{key}.venv" if not isinstance(value, str) else key, found.venv),
                        (key.rsplit(".", 1)[0] + ".venv", target.venv)):
        try:
            check_venv_path(path, where)
        except ValueError as exc:
            problems += 1
            c.add(where, str(exc).split(": ", 1)[1], "give a plain absolute path (letters, digits, ._+@=,~- and /)")
    if problems:
        return None
    try:
        check_clone_paths(found.venv, target.venv, same_host=found.host == target.host)
    except ValueError as exc:
        c.add(key, str(exc), "clone the base to a venv path of its own, beside it")
        return None
    return Endpoint(host=target.host, venv=target.venv, base=found)


def _source(c: Problems, value: Any, key: str, *, fallback: bool = False) -> tuple[Endpoint | SnapshotRef | None, Any]:
    """A donor source: ``{host, venv}`` or ``{snapshot}``; with ``fallback`` the key ``fallback`` is allowed
    and its value returned as the second item (None when absent)."""
    if not isinstance(value, dict) or "snapshot" not in value:
        extra = value.get("fallback") if fallback and isinstance(value, dict) else None
        rest = {k: v for k, v in value.items() if not (fallback and k == "fallback")} if isinstance(value, dict) \
            else value
        return _endpoint(c, rest, key), extra
    allowed = {"snapshot": "snapshot: snapshots/index/ID.json (or a snapshot id, or oci://REGISTRY/REPO:TAG)",
               "ca": "ca: path/to/registry-ca.pem (a registry snapshot's CA bundle)"}
    if fallback:
        allowed["fallback"] = "fallback: [{host: root@gpu-2, venv: /root/venv}, {snapshot: ID}]"
    data = c.mapping(value, key, allowed)
    path = c.string(data["snapshot"], f"{key}.snapshot",
                    "give the snapshot's index file or id (transplant snapshot --list)")
    ca = c.string(data["ca"], f"{key}.ca", "give a PEM file of CA certificates") if "ca" in data else None
    return (SnapshotRef(path=path, ca=ca) if path is not None else None), data.get("fallback")


def _fallback(c: Problems, value: Any) -> tuple[Endpoint | SnapshotRef, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        c.add("donor.fallback", f"expected a non-empty list, got {kind(value)}",
              "write e.g. fallback: [{host: root@gpu-2, venv: /root/venv}, {snapshot: ID}]")
        return ()
    out = []
    for i, item in enumerate(value):
        source, _ = _source(c, item, f"donor.fallback[{i}]")
        if source is not None:
            out.append(source)
    return tuple(out)


def _targets(c: Problems, value: Any) -> tuple[Endpoint, ...]:
    if not isinstance(value, list) or not value:
        c.add("targets", f"expected a non-empty list of {{host, venv}}, got {kind(value)}",
              "write e.g. targets: [{host: root@gpu-1, venv: /root/venv}, {host: root@gpu-2, venv: /root/venv}]")
        return ()
    out: list[Endpoint] = []
    for i, item in enumerate(value):
        end = _endpoint(c, item, f"targets[{i}]", target=True)
        if end is not None and end in out:
            c.add(f"targets[{i}]", f"{end} is listed twice", "keep one entry per host and venv")
        elif end is not None:
            out.append(end)
    return tuple(out)


def _ssh(c: Problems, value: Any) -> SSHSettings:
    if value is None:
        return SSHSettings()
    allowed = {
        "identity_file": "identity_file: ~/.ssh/id_ed25519",
        "known_hosts": "known_hosts: ~/.ssh/known_hosts",
        "verify_host_keys": "verify_host_keys: true",
        "connect_timeout": "connect_timeout: 10",
        "config": "config: ~/.ssh/config",
    }
    data = c.mapping(value, "ssh", allowed)
    out: dict[str, Any] = {}
    for name in ("identity_file", "known_hosts", "config"):
        if name in data:
            out[name] = c.string(data[name], f"ssh.{name}", "give a file path")
    if "verify_host_keys" in data:
        if isinstance(data["verify_host_keys"], bool):
            out["verify_host_keys"] = data["verify_host_keys"]
        else:
            c.add("ssh.verify_host_keys", f"expected true or false, got {kind(data['verify_host_keys'])}",
                  "write true (the default) or false")
    if "connect_timeout" in data:
        t = data["connect_timeout"]
        if _seconds(t):
            out["connect_timeout"] = float(t)
        else:
            c.add("ssh.connect_timeout", f"expected a number of seconds from 1 to {_MAX_SECONDS}, got {kind(t)}",
                  "write e.g. 10")
    return SSHSettings(**{k: v for k, v in out.items() if v is not None})


def _names(c: Problems, value: Any, key: str, *, example: str, empty_ok: bool = False) -> tuple[str, ...]:
    """A list of distribution names or globs, PEP 503-normalised."""
    if not isinstance(value, list) or (not value and not empty_ok):
        c.add(key, f"expected a {'' if empty_ok else 'non-empty '}list of distribution names or globs, "
                   f"got {kind(value)}", f"write e.g. {key.rsplit('.', 1)[-1]}: {example}")
        return ()
    out = []
    for i, item in enumerate(value):
        pattern = _name(c, item, f"{key}[{i}]")
        if pattern is not None:
            out.append(pattern)
    return tuple(out)


def _name(c: Problems, item: Any, key: str) -> str | None:
    """One distribution name or glob, PEP 503-normalised; None (and a problem) when it is not one."""
    text = c.string(item, key, 'write a distribution name or glob, e.g. "nvidia-*"')
    if text is None:
        return None
    pattern = normalize_pattern(text.strip())
    if not set(pattern) <= _NAME_CHARS or pattern.strip("*?") == "" and pattern != "*":
        c.add(key, f"{text!r} is not a distribution name or glob",
              "use letters, digits, '-', '_', '.' and the globs '*' and '?'")
        return None
    return pattern


def _root_name(text: str) -> str:
    return text.split("[", 1)[0]


def _overlay(c: Problems, value: Any, path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``overlay``: names, globs and ``{closure: NAME}`` mappings -> (patterns, closure roots)."""
    example = '[torch, "nvidia-*", {closure: sglang}]'
    if not isinstance(value, list) or not value:
        c.add("overlay", f"expected a non-empty list of distribution names, globs or {{closure: NAME}}, got "
                         f"{kind(value)}", f"write e.g. overlay: {example} in {path}")
        return (), ()
    plain: list[Any] = []
    closures: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            plain.append((i, item))
            continue
        key = f"overlay[{i}]"
        data = c.mapping(item, key, {"closure": "closure: sglang (a donor distribution and what it needs)"},
                         required=("closure",))
        if "closure" not in data:
            continue
        text = c.string(data["closure"], f"{key}.closure",
                        f"name one donor distribution, e.g. {{closure: sglang}}, in overlay of {path}")
        if text is None:
            continue
        # here, not at the top: packaging's requirement parser costs a command's start 60-80 ms,
        # and only a manifest with a closure needs it
        from transplant.core.requirements import parse_root
        try:
            name, extras = parse_root(text.strip())
        except ValueError as exc:
            c.add(f"{key}.closure", str(exc), f"write a distribution name with optional extras, e.g. "
                                              f"{{closure: sglang}} or {{closure: 'sglang[http2]'}}, in {path}")
            continue
        if any(ch in text for ch in "*?[]") and not extras:
            c.add(f"{key}.closure", f"{text!r} is a glob", f"a closure starts from one name; list globs as plain "
                                                            f"overlay entries in {path}")
            continue
        root = name + (f"[{','.join(sorted(extras))}]" if extras else "")
        if root in closures:
            c.add(f"{key}.closure", f"{text!r} is listed twice", f"keep one {{closure: {name}}} entry in {path}")
            continue
        closures.append(root)
    patterns: list[str] = []
    for i, item in plain:
        pattern = _name(c, item, f"overlay[{i}]")
        if pattern is not None:
            patterns.append(pattern)
    return tuple(patterns), tuple(closures)


def _accept(c: Problems, value: Any, codes: tuple[str, ...]) -> tuple[Acceptance, ...]:
    if value is None:
        return ()
    example = "[{code: lockstep-mismatch, dists: [flashinfer-jit-cache], reason: why}]"
    if not isinstance(value, list):
        c.add("accept", f"expected a list, got {kind(value)}", f"write e.g. accept: {example}")
        return ()
    allowed = {"code": "code: lockstep-mismatch", "dists": "dists: [flashinfer-jit-cache]",
               "reason": "reason: why this finding does not stop this target (shown beside it)"}
    out = []
    for i, item in enumerate(value):
        key = f"accept[{i}]"
        data = c.mapping(item, key, allowed, required=("code", "reason"))
        code = c.string(data["code"], f"{key}.code", "write a finding code") if "code" in data else None
        if code is not None and code not in codes:
            close = difflib.get_close_matches(code, list(codes), n=1)
            c.add(f"{key}.code", f"{code!r} is not a finding code",
                  f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(codes)}")
            code = None
        reason = c.string(data["reason"], f"{key}.reason", "say why the finding is acceptable here") \
            if "reason" in data else None
        dists = _names(c, data["dists"], f"{key}.dists", example="[flashinfer-jit-cache]") if "dists" in data else ()
        if code is not None and reason is not None:
            out.append(Acceptance(code=code, dists=dists, reason=reason.strip()))
    return tuple(out)


def _patch_path(c: Problems, data: dict, key: str, name: str, root: str, fix: str) -> str | None:
    """One of a patch's two paths, normalised and relative; a trailing ``/`` (a folder) is kept."""
    if name not in data:
        return None
    text = c.string(data[name], f"{key}.{name}", f"give a path relative to {root}")
    if text is None:
        return None
    path = _relative(text)
    if path is None:
        c.add(f"{key}.{name}", f"{text!r} is absolute or leaves {root}", fix)
        return None
    return path + "/" if text.endswith("/") else path


def _patches(c: Problems, value: Any) -> tuple[Patch, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        c.add("patches", f"expected a list, got {kind(value)}",
              "write e.g. patches: [{source: patches/x.py, dest: sglang/x.py}]")
        return ()
    out = []
    allowed = {"source": "source: patches/server_args.py (relative to the manifest)",
               "dest": "dest: sglang/srt/server_args.py (relative to site-packages)"}
    for i, item in enumerate(value):
        key = f"patches[{i}]"
        data = c.mapping(item, key, allowed, required=("source", "dest"))
        source = _patch_path(c, data, key, "source", "the manifest's folder",
                             "keep patch files in a folder beside the manifest and name them relative to it")
        dest = _patch_path(c, data, key, "dest", "site-packages",
                           "name it relative to site-packages, e.g. sglang/srt/server_args.py")
        if source is not None and dest is not None:
            if source.endswith("/") and not dest.endswith("/"):
                dest += "/"
            out.append(Patch(source=source, dest=dest))
    return tuple(out)


def _server_args(c: Problems, value: Any) -> ServerArgsCheck | None:
    allowed = {"entry": "entry: sglang.srt.server_args:prepare_server_args",
               "args": "args: [--model-path, /models/x]",
               "expect": "expect: {speculative_algorithm: DFLASH}",
               "resolve": "resolve: true"}
    data = c.mapping(value, "verify.server_args", allowed, required=("entry", "args"))
    entry = None
    if "entry" in data:
        entry = c.string(data["entry"], "verify.server_args.entry", "write module:function")
        if entry is not None:
            module, colon, func = entry.partition(":")
            if not colon or not all(p.isidentifier() for p in module.split(".") + func.split(".")):
                c.add("verify.server_args.entry", f"expected module:function, got {entry!r}",
                      "write e.g. sglang.srt.server_args:prepare_server_args")
                entry = None
    args: list[str] = []
    if "args" in data:
        if not isinstance(data["args"], list):
            c.add("verify.server_args.args", f"expected a list of strings, got {kind(data['args'])}",
                  "write e.g. args: [--model-path, /dev/shm/model]")
        else:
            for i, a in enumerate(data["args"]):
                if isinstance(a, bool) or not isinstance(a, (str, int, float)) or "\0" in str(a):
                    c.add(f"verify.server_args.args[{i}]", f"expected a string without NUL, got {kind(a)}", "quote it")
                else:
                    args.append(str(a))
    expect: dict[str, Any] = {}
    if "expect" in data:
        if not isinstance(data["expect"], dict):
            c.add("verify.server_args.expect", f"expected a mapping, got {kind(data['expect'])}",
                  "write e.g. expect: {speculative_algorithm: DFLASH}")
        else:
            for k, v in data["expect"].items():
                if not isinstance(k, str) or not k.isidentifier():
                    c.add(f"verify.server_args.expect.{k}", "expected an attribute name", "use the ServerArgs field name")
                elif not (v is None or isinstance(v, (str, int, float, bool))):
                    c.add(f"verify.server_args.expect.{k}", f"expected a scalar, got {kind(v)}",
                          "compare one value per attribute")
                else:
                    expect[k] = v
    resolve = False
    if "resolve" in data:
        if isinstance(data["resolve"], bool):
            resolve = data["resolve"]
        else:
            c.add("verify.server_args.resolve", f"expected true or false, got {kind(data['resolve'])}",
                  "write resolve: true to run the framework's deeper resolution step too")
    if entry is None:
        return None
    return ServerArgsCheck(entry=entry, args=tuple(args), expect=expect, resolve=resolve)


def _serve(c: Problems, value: Any) -> ServeCheck | None:
    allowed = {"command": "command: [python, -m, sglang.launch_server, --model-path, '{model}', --port, '{port}']",
               "health": "health: /health", "path": "path: /generate", "body": "body: {input_ids: [1, 2]}",
               "answer": "answer: output_ids", "max_tokens": "max_tokens: 4", "config": "config: {model_type: llama}",
               "timeout": "timeout: 600"}
    data = c.mapping(value, "verify.serve", allowed, required=("command",))
    out: dict[str, Any] = {}
    if "command" in data:
        cmd = data["command"]
        if not isinstance(cmd, list) or not cmd or not all(
                isinstance(a, (str, int, float)) and not isinstance(a, bool) and "\0" not in str(a) for a in cmd):
            c.add("verify.serve.command", f"expected a non-empty list of strings, got {kind(cmd)}",
                  "write e.g. command: ['{python}', -m, sglang.launch_server, --model-path, '{model}', --port, '{port}']")
        else:
            out["command"] = tuple(str(a) for a in cmd)
    for key in ("health", "path", "answer"):
        if key in data:
            text = c.string(data[key], f"verify.serve.{key}", allowed[key].replace(": ", " is e.g. "))
            if text is not None and key != "answer" and not text.startswith("/"):
                c.add(f"verify.serve.{key}", f"expected a URL path starting with /, got {text!r}", f"write e.g. /{text}")
            elif text is not None:
                out[key] = text
    for key in ("body", "config"):
        if key in data:
            if isinstance(data[key], dict):
                out[key] = data[key]
            else:
                c.add(f"verify.serve.{key}", f"expected a mapping, got {kind(data[key])}", f"write e.g. {allowed[key]}")
    if "max_tokens" in data:
        m = data["max_tokens"]
        if m is None or (isinstance(m, int) and not isinstance(m, bool) and m > 0):
            out["max_tokens"] = m
        else:
            c.add("verify.serve.max_tokens", f"expected a positive whole number, got {kind(m)}", "write e.g. max_tokens: 4")
    if "timeout" in data:
        if _seconds(data["timeout"]):
            out["timeout"] = float(data["timeout"])
        else:
            c.add("verify.serve.timeout", f"expected a number of seconds from 1 to {_MAX_SECONDS}, got "
                  f"{kind(data['timeout'])}", "write e.g. timeout: 600")
    return ServeCheck(**out) if "command" in out else None


def _verify(c: Problems, value: Any) -> VerifySettings:
    if value is None:
        return VerifySettings()
    allowed = {"env": "env: {CUDA_VISIBLE_DEVICES: '0'}", "imports": "imports: [torch, sglang]",
               "server_args": "server_args: {entry: ..., args: [...], expect: {...}}",
               "smoke": "smoke: {device: auto}", "timeout": "timeout: 300",
               "serve": "serve: {command: [...]}",
               "skip_imports": "skip_imports: [{name: transformers, reason: why}]",
               "python": 'python: "3.11"', "required": "required: [imports]"}
    data = c.mapping(value, "verify", allowed)
    env: dict[str, str] = {}
    if "env" in data:
        if not isinstance(data["env"], dict):
            c.add("verify.env", f"expected a mapping, got {kind(data['env'])}", "write e.g. env: {CUDA_VISIBLE_DEVICES: '1'}")
        else:
            for k, v in data["env"].items():
                if not isinstance(k, str) or not k or not (k.replace("_", "a").isalnum() and not k[0].isdigit()):
                    c.add(f"verify.env.{k}", "not an environment variable name", "use letters, digits and '_'")
                elif isinstance(v, bool) or not isinstance(v, (str, int, float)) or "\0" in str(v):
                    c.add(f"verify.env.{k}", f"expected a string without NUL, got {kind(v)}", f"quote it: {k}: \"...\"")
                else:
                    env[k] = str(v)
    imports: list[str] = []
    needs: dict[str, tuple[str, ...]] = {}
    if "imports" in data:
        if not isinstance(data["imports"], list):
            c.add("verify.imports", f"expected a list, got {kind(data['imports'])}", "write e.g. imports: [torch, sglang]")
        else:
            for i, item in enumerate(data["imports"]):
                name, wants = _import_item(c, f"verify.imports[{i}]", item)
                if name is not None:
                    imports.append(name)
                    if wants:
                        needs[name] = wants
    server_args = _server_args(c, data["server_args"]) if "server_args" in data else None
    smoke = None
    if "smoke" in data:
        sm = c.mapping(data["smoke"], "verify.smoke", {"device": "device: auto"}, required=("device",))
        if "device" in sm:
            if sm["device"] in SMOKE_DEVICES:
                smoke = sm["device"]
            else:
                c.add("verify.smoke.device", f"expected one of {', '.join(SMOKE_DEVICES)}, got {kind(sm['device'])}",
                      "write device: auto to use a GPU when there is one")
    timeout = 300.0
    if "timeout" in data:
        t = data["timeout"]
        if _seconds(t):
            timeout = float(t)
        else:
            c.add("verify.timeout", f"expected a number of seconds from 1 to {_MAX_SECONDS}, got {kind(t)}",
                  "write e.g. timeout: 300")
    serve = _serve(c, data["serve"]) if "serve" in data else None
    skips: dict[str, str] = {}
    if "skip_imports" in data:
        example = "skip_imports: [{name: transformers, reason: travels without its dependencies here}]"
        if not isinstance(data["skip_imports"], list):
            c.add("verify.skip_imports", f"expected a list, got {kind(data['skip_imports'])}", f"write e.g. {example}")
        else:
            for i, item in enumerate(data["skip_imports"]):
                key = f"verify.skip_imports[{i}]"
                entry = c.mapping(item, key, {"name": "name: transformers", "reason": "reason: why"},
                                  required=("name", "reason"))
                name = c.string(entry["name"], f"{key}.name", "write an import name") if "name" in entry else None
                reason = c.string(entry["reason"], f"{key}.reason", "say why it is not imported here") \
                    if "reason" in entry else None
                if name is not None and not all(p.isidentifier() for p in name.split(".")):
                    c.add(f"{key}.name", f"expected an import name, got {name!r}", "write e.g. transformers")
                elif name is not None and reason is not None:
                    skips[name] = reason.strip()
    python = None
    if "python" in data:
        # a string only: YAML reads 3.10 as the number 3.1
        text = data["python"] if isinstance(data["python"], str) else None
        if text is not None and re.fullmatch(r"3\.\d+(\.\d+)?", text):
            python = text
        else:
            c.add("verify.python", f"expected a version like \"3.11\", got {kind(data['python'])}",
                  'write it quoted: python: "3.11"')
    required: list[str] = []
    if "required" in data:
        accepted = verify_stages.requirable()
        hint = f"name stages of {', '.join(accepted)}, e.g. required: [imports]"
        if not isinstance(data["required"], list):
            c.add("verify.required", f"expected a list, got {kind(data['required'])}", hint)
        else:
            for i, name in enumerate(data["required"]):
                if name not in accepted:
                    c.add(f"verify.required[{i}]", f"expected a stage the donor is compared in, got {kind(name)}", hint)
                else:
                    required.append(name)
    return VerifySettings(env=env, imports=tuple(imports), server_args=server_args, smoke_device=smoke, timeout=timeout,
                          serve=serve, skip_imports=skips, python=python, required=tuple(dict.fromkeys(required)),
                          needs=needs)


#: What an import of ``verify.imports`` may need besides the venv: ``gpu`` (the NVIDIA driver and
#: a device; on a host without them, and a donor without them, the import is not checkable here).
IMPORT_NEEDS = ("gpu",)


def _import_item(c: Problems, key: str, item: Any) -> tuple[str | None, tuple[str, ...]]:
    """One ``verify.imports`` entry: ``NAME`` or ``{name: NAME, needs: [gpu]}`` -> (name, needs)."""
    if isinstance(item, dict):
        entry = c.mapping(item, key, {"name": "name: deep_ep", "needs": "needs: [gpu]"}, required=("name",))
        name = entry.get("name")
        wants = entry.get("needs", [])
        if not isinstance(wants, list) or any(w not in IMPORT_NEEDS for w in wants):
            c.add(f"{key}.needs", f"expected a list of {', '.join(IMPORT_NEEDS)}, got {kind(wants)}",
                  "write needs: [gpu]")
            wants = []
        key = f"{key}.name"
    else:
        name, wants = item, []
    if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
        if name is not None or not isinstance(item, dict):
            c.add(key, f"expected an import name, got {kind(name)}", "write e.g. flashinfer")
        return None, ()
    return name, tuple(dict.fromkeys(wants))


def parse_manifest(data: Any, *, path: str, codes: tuple[str, ...] = ()) -> Manifest:
    """Validate a decoded YAML document as a version-1 manifest.

    :param data: what ``yaml.safe_load`` returned.
    :param path: the manifest's path, used in messages and kept on the result.
    :param codes: the finding codes ``accept`` may name (default: every code in
        :data:`transplant.core.plan.FINDING_CODES`).
    :raises ManifestError: listing every problem, each as ``key: what; fix: how``; a document
        that is empty or not a mapping is one problem naming that.
    """
    if not isinstance(data, dict):  # one problem, said of the whole file: no key can be named missing
        start = ("write a manifest: version: 1, donor: {host, venv}, target: {host, venv}, overlay: [NAME] "
                 "(manifests/REFERENCE.md), or let 'transplant init --donor HOST:VENV --target HOST:VENV --out "
                 "FILE' write one")
        if data is None:
            raise ManifestError(path, [f"(file): it is empty (no YAML document, only blank lines or comments); "
                                       f"fix: {start}"])
        raise ManifestError(path, [f"(top level): the file holds {kind(data)}, not a mapping of keys (version, donor, "
                                   f"target, overlay...); fix: write it as 'key: value' lines"
                                   + (", not '- item' lines" if isinstance(data, list) else "") + f"; {start}"])
    c = Problems()
    allowed = {
        "version": "version: 1",
        "donor": "donor: {host: root@ct129, venv: /root/venv_sglang}",
        "target": "target: {host: root@ct200, venv: /root/venv_sglang}",
        "targets": "targets: [{host: root@gpu-1, venv: /root/venv}, ...]",
        "ssh": "ssh: {identity_file: ..., known_hosts: ...}",
        "overlay": "overlay: [torch, sglang]",
        "patches": "patches: [{source: ..., dest: ...}]",
        "remove": "remove: [nvidia-cuda-runtime-cu12]",
        "exclude": "exclude: [flash-attn-4] (names a closure never pulls in)",
        "accept": "accept: [{code: ..., dists: [...], reason: ...}]",
        "verify": "verify: {imports: [...]}",
    }
    top = c.mapping(data, "", allowed, required=("version", "donor", "overlay"))
    if "version" in top and (top["version"] != 1 or isinstance(top["version"], bool)):
        c.add("version", f"expected 1, got {kind(top['version'])}", "write version: 1 (the only manifest version)")
    donor, fallback_value = _source(c, top["donor"], "donor", fallback=True) if "donor" in top else (None, None)
    fallback = _fallback(c, fallback_value)
    targets: tuple[Endpoint, ...] = ()
    if "target" in top and "targets" in top:
        c.add("targets", "both target and targets are given", "list every target under targets: and drop target:")
    elif "target" in top:
        one = _endpoint(c, top["target"], "target", base=True, target=True)
        targets = (one,) if one is not None else ()
    elif "targets" in top:
        targets = _targets(c, top["targets"])
    elif isinstance(top, dict):
        c.add("target", "missing", "add it: target: {host: root@ct200, venv: /root/venv_sglang} "
                                   "(or targets: [...] for several)")
    target = targets[0] if targets else None
    ssh = _ssh(c, top.get("ssh"))
    overlay, closures = _overlay(c, top["overlay"], path) if "overlay" in top else ((), ())
    exclude = _names(c, top["exclude"], "exclude", example="[flash-attn-4]", empty_ok=True) \
        if "exclude" in top else ()
    if exclude and not closures and "overlay" in top:
        c.add("exclude", "exclude: keeps distributions out of a closure, and the overlay has no {closure: NAME} "
                         "entry", f"drop exclude: from {path}, or write the overlay entry as {{closure: NAME}}")
    patches = _patches(c, top.get("patches"))
    remove = _names(c, top["remove"], "remove", example="[nvidia-cuda-runtime-cu12]", empty_ok=True) \
        if "remove" in top else ()
    if not codes:
        from transplant.core.plan import FINDING_CODES
        codes = FINDING_CODES
    accept = _accept(c, top.get("accept"), codes)
    verify = _verify(c, top.get("verify"))
    donors = [d for d in (donor, *fallback) if isinstance(d, Endpoint)]
    for i, one in enumerate(targets):
        same = next((d for d in donors if (d.host, d.venv) == (one.host, one.venv)), None)
        if same is not None:
            where = "target" if "target" in top else f"targets[{i}]"
            which = "the donor" if same is donor else "a fallback donor"
            c.add(where, f"the target is {which} ({same})", "name another host or venv as the target")
    if c.lines or donor is None or target is None:
        raise ManifestError(path, c.lines or ["donor and target are required"])
    roots = overlay + tuple(r for r in (_root_name(x) for x in closures) if r not in overlay)
    verify = replace(verify, overlay=roots)
    return Manifest(path=path, donor=donor, target=target, ssh=ssh, overlay=overlay, patches=patches, verify=verify,
                    remove=remove, accept=accept, fallback=fallback, targets=targets, closures=closures,
                    exclude=exclude)
