"""Caches a host script keeps on the controller (edge): for a venv the controller must not write
in (a donor), a host script's cache travels in its request (``known``) and comes back in its reply
(``entries``), and the controller keeps it in its state folder, one file per host and venv.

The probe's content-hash cache (:mod:`transplant.hosts.probing`) and the ELF script's facts cache
(:mod:`transplant.hosts.elf_facts`) are the two; a target's caches live in the target venv's own
state folder and never pass through here.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from transplant.hosts.host import Host

__all__ = ["ControllerCache"]


@dataclass(frozen=True)
class ControllerCache:
    """One kind of host-script cache kept on the controller.

    :ivar folder: the folder under the controller's state folder (``hash-cache``, ``elf-cache``).
    :ivar schema: the file's ``schema`` value; a file of another schema is ignored (rebuilt).
    :ivar option: the setting's name in messages (``hash_cache``, ``elf_cache``).
    """

    folder: str
    schema: str
    option: str

    def path(self, host: Host, venv: str) -> Path:
        """``<controller state>/<folder>/<first 32 hex of sha256 of "host label:venv">.json``."""
        from transplant.controller.state import default_state_dir

        key = hashlib.sha256(f"{host.label}:{posixpath.normpath(venv)}".encode()).hexdigest()[:32]
        return default_state_dir() / self.folder / f"{key}.json"

    def options(self, host: Host, venv: str, setting: str | Mapping[str, Any] | None) -> Any:
        """The script's request option for ``setting``: False (off: None, or the environment's
        ``TRANSPLANT_HASH_CACHE=0``), ``{"enabled": True, "store": "venv"}`` (the script keeps it in
        the venv), a given mapping as it is, or for ``"controller"`` ``store: reply`` with the
        entries kept here (``known``; empty when the file is absent, unreadable or of another schema).

        :raises ValueError: ``setting`` is none of those (a programming error).
        """
        if os.environ.get("TRANSPLANT_HASH_CACHE", "1") == "0" or setting is None:
            return False
        if isinstance(setting, Mapping):
            return dict(setting)
        if setting == "venv":
            return {"enabled": True, "store": "venv"}
        if setting != "controller":
            raise ValueError(f"{self.option} must be 'venv', 'controller', a mapping or None, not {setting!r}")
        return {"enabled": True, "store": "reply", "known": self.read(host, venv)}

    def read(self, host: Host, venv: str) -> dict[str, Any]:
        """The entries kept for ``venv`` on ``host``; empty when absent or unreadable."""
        try:
            document = json.loads(self.path(host, venv).read_text())
        except (OSError, ValueError):
            return {}  # absent or unreadable: this run rebuilds it
        if isinstance(document, dict) and document.get("schema") == self.schema and \
                isinstance(document.get("entries"), dict):
            return document["entries"]
        return {}

    def write(self, host: Host, venv: str, entries: Mapping[str, Any]) -> None:
        """Replace the kept entries, atomically (a temporary file renamed over it); a failure
        only costs speed, so an unwritable state folder is not an error."""
        path = self.path(host, venv)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            with temporary.open("w") as handle:  # encoded as it is written: tens of MB for a large donor
                json.dump({"schema": self.schema, "entries": entries if isinstance(entries, dict) else dict(entries)},
                          handle, separators=(",", ":"))
            os.replace(temporary, path)
        except OSError:
            return
