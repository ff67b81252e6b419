"""The operator's config file (edge): one place for the controller's defaults.

``$XDG_CONFIG_HOME/transplant/config.toml`` (``~/.config/transplant/config.toml`` when
``XDG_CONFIG_HOME`` is unset or not absolute, as the XDG base directory specification says), TOML::

    state_dir = "~/transplant-state"          # the controller's state folder
    [registry]
    insecure = ["127.0.0.1:5000"]             # loopback registries spoken to over plain http
    token_hosts = ["auth.example.com"]        # token services besides the registry's own host
    progress = "1024/30"                      # at least BYTES every SECONDS per answer
    [ssh]
    identity_file = "~/.ssh/id_ed25519"       # when neither --identity-file nor the manifest names one
    known_hosts = "~/.ssh/known_hosts_gpu"
    [output]
    width = 120                               # columns on a terminal (COLUMNS wins)
    color = false                             # false: no colour or bold (as NO_COLOR)

Every value is overridden by the environment variable for it that existed before the file
(``TRANSPLANT_STATE_DIR``, ``TRANSPLANT_REGISTRY_*``, ``COLUMNS``, ``NO_COLOR``) and by a flag
(``--identity-file``, ``--known-hosts``); the file overrides the built-in defaults only.

A file that cannot be used (not TOML, an unknown key, a wrong type, writable by others) is a
:class:`~transplant.errors.ConfigError` naming the file, the key and the fix, raised before a
command does anything.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from transplant.errors import ConfigError

__all__ = ["KEYS", "Config", "config_path", "load_config"]

#: Every key the file may hold (``section.key``): its type and an example line for the hint.
KEYS: dict[str, tuple[str, str]] = {
    "state_dir": ("path", 'state_dir = "~/.local/state/transplant"'),
    "registry.insecure": ("list", '[registry] insecure = ["127.0.0.1:5000"]'),
    "registry.token_hosts": ("list", '[registry] token_hosts = ["auth.example.com"]'),
    "registry.progress": ("progress", '[registry] progress = "1024/30"'),
    "ssh.identity_file": ("path", '[ssh] identity_file = "~/.ssh/id_ed25519"'),
    "ssh.known_hosts": ("path", '[ssh] known_hosts = "~/.ssh/known_hosts"'),
    "output.width": ("width", "[output] width = 120"),
    "output.color": ("bool", "[output] color = false"),
}

_TYPES = {"path": "a string (a path; ~ is your home)", "list": "a list of strings",
          "progress": 'a string "BYTES/SECONDS", both positive', "width": "a whole number from 20 to 1000",
          "bool": "true or false"}
_PROGRESS = re.compile(r"\d+/\d+(\.\d+)?\Z")


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the config file is read from: ``$XDG_CONFIG_HOME/transplant/config.toml``, else
    ``~/.config/transplant/config.toml`` (a relative ``XDG_CONFIG_HOME`` is ignored, per the
    specification). ``env``: the environment (None: ``os.environ``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "transplant" / "config.toml"


@dataclass(frozen=True)
class Config:
    """The config file as read.

    :ivar path: where it is (or would be).
    :ivar present: whether it exists (False: every value is the built-in default).
    :ivar values: ``section.key`` -> its checked value (paths with ``~`` expanded, as
        :class:`~pathlib.Path`); a key the file does not set is absent.
    """

    path: Path
    present: bool
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        """The file's value for ``key`` (one of :data:`KEYS`), or None when it does not set it."""
        return self.values.get(key)

    def label(self, key: str) -> str:
        """``key`` as a message names it: ``<path> (registry.insecure)``."""
        return f"{self.path} ({key})"


_CACHE: dict[Path, tuple[tuple[int, int], Config]] = {}


def load_config(path: Path | None = None) -> Config:
    """Read and check the config file (``path``; None: :func:`config_path`). A missing file is
    an empty :class:`Config`; the result is kept until the file changes.

    :raises ConfigError: the file cannot be read, is not TOML, is writable by other users (it
        names the SSH key and known_hosts file, so whoever can write it could make transplant
        trust their host), holds an unknown key or a value of the wrong type.
    """
    path = config_path() if path is None else path
    try:
        st = path.stat()
    except FileNotFoundError:
        return Config(path, False)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})",
                          hint=f"fix its permissions (chmod 600 {path}), or remove it") from None
    stamp = (st.st_mtime_ns, st.st_size)
    kept = _CACHE.get(path)
    if kept and kept[0] == stamp:
        return kept[1]
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file", hint=f"make {path} a TOML file, or remove it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path}: writable by other users (mode {stat.S_IMODE(st.st_mode):o}); it names the SSH "
                          f"key and known_hosts file transplant trusts, so it is not read",
                          hint=f"chmod go-w {path}")
    if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
        raise ConfigError(f"{path}: owned by another user (uid {st.st_uid}); it is not read",
                          hint=f"chown {os.getuid()} {path}, or remove it")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})",
                          hint=f"fix its permissions (chmod 600 {path}), or remove it") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})",
                          hint='fix that line; values are TOML, e.g. state_dir = "~/state" (strings in quotes)') from None
    config = Config(path, True, _check(path, doc))
    _CACHE[path] = (stamp, config)
    return config


def _check(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    sections = {k.partition(".")[0] for k in KEYS if "." in k}
    for name, value in doc.items():
        if name in sections:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {name} is a section ([{name}]), not a value",
                                  hint=f"write it as a table: [{name}] then its keys on the lines below")
            items = [(f"{name}.{k}", v) for k, v in value.items()]
        else:
            items = [(name, value)]
        for key, item in items:
            if key not in KEYS:
                close = get_close_matches(key, list(KEYS), n=1)
                raise ConfigError(f"{path}: unknown key {key}" + (f" (did you mean {close[0]}?)" if close else ""),
                                  hint=f"the keys are {', '.join(KEYS)} (manifests/REFERENCE.md, \"The config file\")")
            values[key] = _value(path, key, item)
    return values


def _value(path: Path, key: str, value: Any) -> Any:
    kind, example = KEYS[key]
    ok = {"path": isinstance(value, str) and value.strip() != "",
          "list": isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value),
          "progress": isinstance(value, str) and bool(_PROGRESS.match(value.strip())),
          "width": isinstance(value, int) and not isinstance(value, bool) and 20 <= value <= 1000,
          "bool": isinstance(value, bool)}[kind]
    if kind == "progress" and ok:
        least, _, seconds = value.strip().partition("/")
        ok = int(least) >= 1 and 0 < float(seconds) < 86400
    if not ok:
        raise ConfigError(f"{path}: {key} = {value!r} is not {_TYPES[kind]}", hint=f"write it as: {example}")
    if kind == "path":
        return Path(os.path.expanduser(value))
    if kind == "list":
        return tuple(v.strip() for v in value)
    if kind == "progress":
        return value.strip()
    return value
