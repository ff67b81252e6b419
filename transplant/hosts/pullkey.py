"""The one-time key of a direct pull (edge): a credential that can do only this transfer.

The direct transfer (:mod:`transplant.hosts.direct`) lets the target log in to the donor. Instead
of lending it an agent (any root process on the target could have used a forwarded socket to run
any command on the donor), the controller makes a fresh ed25519 key pair for each pull
(:class:`OneTimeKey`) and, over its own connection to the donor, authorises the public key there
for this pull alone (the host script ``pull_key``): ``restrict`` (no pty, no forwarding, no rc
file), a forced ``command`` that runs ``stream_send`` read-only on the donor's venv and serves only
the list of paths whose sha256 is the planned list's, and an ``expiry-time`` a few minutes on. The
private key goes to the target's receiver on its standard input, is written beside the staged files
(0600) and removed as soon as the login is done. Held by anyone, the key can fetch the planned
files and nothing else, until the pull ends: the controller then removes the line from the donor's
authorized_keys (success, error, Ctrl-C: a ``with`` block).

A controller killed before it could remove the line (SIGKILL, a power cut) leaves a record in its
state folder (``<state>/pulls/<id>.json``, written before the key is authorised); the next apply
from that donor (whichever way it copies) removes what a killed one left and says so
(:func:`sweep_left`), and the
donor itself drops lines past their expiry whenever a pull key is added or removed there (and
sshd refuses them anyway).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from transplant import remote
from transplant.controller.state import private_folder
from transplant.errors import HostError
from transplant.hosts.host import Host
from transplant.hosts.probing import run_script
from transplant.reporting import QUIET, Reporter

__all__ = ["OneTimeKey", "KeyUnavailable", "listing_digest", "sweep_left"]


class KeyUnavailable(Exception):
    """The one-time key could not be made or authorised; the message says why (for the relay's note)."""


def listing_digest(paths: Sequence[str]) -> str:
    """sha256 hex of the list of paths as the receiver hands it to the donor's sender (each path's
    UTF-8 bytes and a NUL), which the forced command checks."""
    return hashlib.sha256(b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)).hexdigest()


def _records(state_dir: Path) -> Path:
    return Path(state_dir) / "pulls"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OneTimeKey:
    """A key pair made for one pull, authorised on the donor for it alone (the module docstring).

    :param state_dir: the controller's state folder (the key and its record live under ``pulls/``).
    :param donor: the donor's host (the controller's own connection to it authorises the key).
    :param python: the donor's interpreter (the forced command runs the sender with it; it also
        runs the ``pull_key`` host script).
    :param root: the donor folder the planned paths are relative to.
    :param paths: the planned paths (the forced command serves this list and no other).
    :param compress: the stream's compression (``none``, ``zlib``, ``zstd``).
    :param lifetime: seconds until sshd refuses the key even if nobody removes it.
    :ivar id: the pull's id; :ivar public: / :ivar private: the key's texts (set by :meth:`start`).
    """

    def __init__(self, state_dir: Path, donor: Host, python: str, root: str, paths: Sequence[str], compress: str,
                 lifetime: float) -> None:
        self.state_dir, self.donor, self.python, self.root = Path(state_dir), donor, python, root
        self.digest, self.compress, self.lifetime = listing_digest(paths), compress, max(60.0, float(lifetime))
        self.id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:12]
        self.folder = _records(self.state_dir) / self.id
        self.record = _records(self.state_dir) / f"{self.id}.json"
        self.public: str | None = None
        self.private: bytes | None = None
        self._authorised = False

    def __enter__(self) -> OneTimeKey:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Make the key pair, record the pull, authorise the key on the donor.

        :raises KeyUnavailable: ``ssh-keygen`` missing or failing, or the donor refused the key
            (its authorized_keys not writable, a path the forced command cannot name).
        """
        if shutil.which("ssh-keygen") is None:
            raise KeyUnavailable("no ssh-keygen on the controller")
        private_folder(self.folder)
        made = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"transplant-pull:{self.id}",
                               "-f", str(self.folder / "key")], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=30)
        if made.returncode != 0:
            self._forget_local()
            raise KeyUnavailable(f"ssh-keygen failed: {made.stderr.decode('utf-8', 'replace').strip()[-300:]}")
        self.private = (self.folder / "key").read_bytes()
        self.public = " ".join((self.folder / "key.pub").read_text().split()[:2])
        (self.folder / "key").unlink()  # kept in memory only, for the target; the record names the pull
        expires = time.time() + self.lifetime
        # the record first: a controller killed from here on leaves what the next run needs to clean up
        record = {"id": self.id, "donor": self.donor.label, "spec": str(getattr(self.donor, "spec", "")),
                  "python": self.python, "controller": socket.gethostname(), "pid": os.getpid(),
                  "started": time.time(), "expires": expires}
        temporary = self.record.with_suffix(".tmp")
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as out:
            json.dump(record, out)
        os.replace(temporary, self.record)
        try:
            answer = run_script(self.donor, self.root, "pull_key", ["add"], python=self.python, timeout=60, request={
                "id": self.id, "key": self.public, "python": self.python, "root": self.root,
                "sender": remote.source("stream_send").decode(), "compress": self.compress, "digest": self.digest,
                "expires": expires})
        except HostError as exc:
            self._authorised = True  # perhaps it was: remove() is harmless when it was not
            self.close()
            raise KeyUnavailable(f"the donor could not authorise the pull's key: {exc.message}") from None
        if not answer.get("ok"):
            self.close()
            raise KeyUnavailable(f"the donor refused the pull's key: {answer.get('error')}")
        self._authorised = True

    def close(self) -> None:
        """Remove the key from the donor's authorized_keys, then the record; idempotent. A donor
        that cannot be asked keeps the record (the next pull from it removes the key; it expires
        anyway)."""
        self.private = None
        if self._authorised:
            try:
                answer = run_script(self.donor, self.root, "pull_key", ["remove"], python=self.python, timeout=60,
                                    request={"id": self.id})
            except HostError:
                return
            if not answer.get("ok"):
                return
            self._authorised = False
        self._forget_local()

    def _forget_local(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.record.unlink()
        except FileNotFoundError:
            pass


def sweep_left(state_dir: Path, donor: Host, reporter: Reporter = QUIET) -> list[str]:
    """Remove from ``donor`` the pull keys that killed controllers of this machine left authorised
    there (their records name this donor and a process of this host that is gone), and say so.

    :returns: the ids removed. A donor that cannot be asked is left for the next time.
    """
    folder = _records(state_dir)
    done: list[str] = []
    if not folder.is_dir():
        return done
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            ident, pid = str(record["id"]), int(record["pid"])
            if record.get("donor") != donor.label or path.stem != ident:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.get("controller") == socket.gethostname() and _alive(pid) and pid != os.getpid():
            continue  # a pull under way in another command
        try:
            answer = run_script(donor, "/", "pull_key", ["remove"], python=str(record.get("python")), timeout=60,
                                request={"id": ident})
        except HostError:
            continue
        if not answer.get("ok"):
            continue
        shutil.rmtree(folder / ident, ignore_errors=True)
        path.unlink(missing_ok=True)
        done.append(ident)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("started") or 0)))
        reporter.note(f"removed the one-time pull key that a transplant killed during its direct pull (pid {pid}, "
                      f"started {when}) had left authorised on {donor.label} ({answer.get('file')}, "
                      f"{answer.get('removed', 0)} line)")
    return done
