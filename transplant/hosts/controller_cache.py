"""Caches a host script keeps on the controller (edge): for a venv the controller must not write
in (a donor), a host script's cache travels in its request (``known``) and comes back in its reply
(``entries``), and the controller keeps it in its state folder, one file per host and venv.

The probe's content-hash cache (:mod:`transplant.hosts.probing`, :class:`HashGroups`: grouped by
distribution, only the groups a request hashes travel, and only the groups that changed come back)
and the ELF script's facts cache (:mod:`transplant.hosts.elf_facts`, :class:`ControllerCache`: sent
whole) are the two; a target's caches live in the target venv's own state folder and never pass
through here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from transplant.hosts.host import Host

__all__ = ["ControllerCache", "HashGroups"]


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
            from transplant.controller.state import private_folder

            private_folder(path.parent)
            temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            with temporary.open("w") as handle:  # encoded as it is written: tens of MB for a large donor
                json.dump({"schema": self.schema, "entries": entries if isinstance(entries, dict) else dict(entries)},
                          handle, separators=(",", ":"))
            os.replace(temporary, path)
        except OSError:
            return


_NORMALIZE = re.compile(r"[-_.]+")


class HashGroups:
    """The donor's content-hash cache on the controller, one group per distribution, so
    that a probe is sent only the groups it needs and sends back only those that changed (whole, the
    cache is tens of MB to decode into objects on the controller and send both ways).

    The file (``<controller state>/hash-cache/<key>.json``, the key as :meth:`ControllerCache.path`'s)
    is text: the line ``{"schema":"transplant.hashes/2"}``, then one line per group,
    ``<normalised distribution name>\\t<{"venv-relative path": [dev, ino, size, mtime_ns, ctime_ns,
    hash, head, body_hash]} as JSON>``, sorted by name. It is never decoded here: a request carries
    the lines of the groups it hashes (:meth:`select`), the probe prints the groups whose entries
    changed, and :meth:`merge` puts those lines in place of the old ones. A file of the first
    schema (one JSON object of all entries, ``transplant.hashes/1``) is sent once as the probe's
    ``known`` lookups and replaced by the groups the probe prints (the entries of distributions
    that run did not hash are not carried over: they are hashed again when next asked for).
    """

    schema = "transplant.hashes/2"
    legacy_schema = "transplant.hashes/1"

    def __init__(self, folder: str = "hash-cache") -> None:
        self._paths = ControllerCache(folder, self.legacy_schema, "hash_cache")

    def path(self, host: Host, venv: str) -> Path:
        """The file kept for ``venv`` on ``host`` (as :meth:`ControllerCache.path`)."""
        return self._paths.path(host, venv)

    def _lines(self, host: Host, venv: str) -> tuple[dict[bytes, bytes], dict[str, Any] | None]:
        """``({group: its whole line}, None)`` for a file of this schema, ``({}, entries)`` for one
        of the first schema, ``({}, None)`` for an absent, unreadable or other file."""
        try:
            data = self.path(host, venv).read_bytes()
        except OSError:
            return {}, None
        head, _, rest = data.partition(b"\n")
        if head.strip() == json.dumps({"schema": self.schema}, separators=(",", ":")).encode():
            groups = {}
            for line in rest.splitlines(keepends=True):
                name, tab, body = line.partition(b"\t")
                if tab and name and body.strip():
                    groups[name] = line if line.endswith(b"\n") else line + b"\n"
            return groups, None
        if data.startswith(b"{"):
            try:
                document = json.loads(data)
            except ValueError:
                return {}, None
            if isinstance(document, dict) and document.get("schema") == self.legacy_schema and \
                    isinstance(document.get("entries"), dict):
                return {}, document["entries"]
        return {}, None

    def select(self, host: Host, venv: str, patterns: Sequence[str]) -> tuple[bytes, dict[str, Any] | None]:
        """The lines of the groups whose name matches one of ``patterns`` (normalised distribution
        names or globs, as the probe's ``hash``; matched as the probe matches them), joined, and
        the first schema's entries (None when the file is of this schema, absent or unreadable)."""
        wanted = [_NORMALIZE.sub("-", p).lower() for p in patterns]
        head = json.dumps({"schema": self.schema}, separators=(",", ":")).encode()
        chosen = []
        try:  # line by line: only the chosen groups are held (the file keeps every manifest's groups)
            with self.path(host, venv).open("rb") as handle:
                if handle.readline().strip() == head:
                    for line in handle:
                        name, tab, body = line.partition(b"\t")
                        if tab and name and body.strip() and \
                                any(fnmatch.fnmatchcase(name.decode("utf-8", "replace"), p) for p in wanted):
                            chosen.append(line if line.endswith(b"\n") else line + b"\n")
                    return b"".join(chosen), None
        except OSError:
            return b"", None
        return b"", self._lines(host, venv)[1]  # another schema: the first one's entries, or none

    def merge(self, host: Host, venv: str, printed: Iterable[tuple[bytes, Any]]) -> int:
        """Put the groups a probe printed (``(name, entries)``, the entries' JSON text as bytes or
        a view of them) in place of the kept ones: a group printed with ``{}`` is dropped, the
        others kept as they are. Written atomically, only when something was printed; a failure
        only costs speed, so an unwritable state folder is not an error.

        :returns: how many groups were printed.
        """
        fresh = {name: body for name, body in printed if name and b"\t" not in name and b"\n" not in name}
        if not fresh:
            return 0
        groups: dict[bytes, Any] = dict(self._lines(host, venv)[0])
        for name, body in fresh.items():
            if len(body) < 8 and bytes(body).strip() == b"{}":  # the distribution is gone, or kept nothing
                groups.pop(name, None)
            else:
                groups[name] = (name + b"\t", body, b"\n")
        path = self.path(host, venv)
        try:
            from transplant.controller.state import private_folder

            private_folder(path.parent)
            temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            with temporary.open("wb") as handle:
                handle.write(json.dumps({"schema": self.schema}, separators=(",", ":")).encode() + b"\n")
                for name in sorted(groups):
                    line = groups[name]
                    for part in (line if isinstance(line, tuple) else (line,)):
                        handle.write(part)
            os.replace(temporary, path)
        except OSError:
            pass
        return len(fresh)
