"""A private ``ssh-agent`` holding one key for one transfer (edge).

The direct SSH to SSH transfer (:mod:`transplant.hosts.direct`) lets the target log in to the
donor with the key the controller itself uses for the donor, without writing that key anywhere
and without forwarding the operator's own agent (all of its keys): :class:`ScopedAgent` starts
an ``ssh-agent`` of its own on a socket in a fresh 0700 folder under the controller's state
folder, adds only that identity file with a lifetime (``ssh-add -t``), and is stopped, and its
folder removed, when the transfer ends (success, error or Ctrl-C: a ``with`` block), or as soon
as the target's connection to the donor is up (:meth:`ScopedAgent.close` is idempotent). The key
can be restricted to hops (``ssh-add -h``, OpenSSH 8.9+ destination constraints): the agent then
signs only for a login to the target from here and for a login from the target to the donor, each
hop's host key checked by the agent itself against the lines given (``-H``).
If the controller dies without cleaning up, the agent gets SIGTERM from the kernel
(``PR_SET_PDEATHSIG``) and the key's lifetime ends anyway.

Sources: ssh-agent(1) (``-D`` foreground, ``-a`` socket path), ssh-add(1) (``-t`` lifetime, ``-h``
destination constraints ``[user@]dst`` and ``src>[user@]dst``, ``-H`` their known hosts file),
ssh(1) (``SSH_ASKPASS_REQUIRE=never``: a key that needs a passphrase fails instead of asking).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["ScopedAgent", "AgentUnavailable", "MAX_SOCKET_PATH"]

#: Longest socket path accepted (``sun_path`` holds 108 bytes on Linux, NUL included).
MAX_SOCKET_PATH = 100
_START_SECONDS = 5.0


class AgentUnavailable(Exception):
    """The private agent could not be made ready; the message says why (for the relay's note)."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; the key's lifetime still ends
        pass


class ScopedAgent:
    """A private ``ssh-agent`` that holds one identity file for ``lifetime`` seconds.

    :param state_dir: the controller's state folder; the agent's folder is made (0700) under
        ``<state_dir>/agents/`` and removed by :meth:`close`.
    :param identity: the private key file to add (the one the donor connection uses).
    :param lifetime: seconds the key stays usable in the agent (``ssh-add -t``), at least 1.
    :param constraints: ``ssh-add -h`` destination constraints (host names as in known_hosts:
        ``[host]:port`` off port 22); empty: the key is usable for any host.
    :param hostkeys: known_hosts lines naming every host of ``constraints`` (written to the agent's
        folder and given as ``-H``); ignored without constraints.
    :ivar socket: the agent's socket path (set by :meth:`start`).
    :raises AgentUnavailable: (from :meth:`start`) ``ssh-agent``/``ssh-add`` missing, the socket
        path too long, the agent did not come up, or the key was refused (a passphrase, say).
    """

    def __init__(self, state_dir: Path, identity: Path, lifetime: int, *, constraints: tuple[str, ...] = (),
                 hostkeys: str = "") -> None:
        self.state_dir, self.identity, self.lifetime = Path(state_dir), Path(identity), max(1, int(lifetime))
        self.constraints, self.hostkeys = tuple(constraints), hostkeys
        self.folder: Path | None = None
        self.socket: str | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "ScopedAgent":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the agent and add the key (see the class); on any failure nothing is left behind."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for tool in ("ssh-agent", "ssh-add"):
            if shutil.which(tool) is None:
                raise AgentUnavailable(f"no {tool} on the controller")
        base = self.state_dir / "agents"
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="agent-", dir=base))  # mode 0700
        socket = str(self.folder / "s")
        if len(socket.encode()) > MAX_SOCKET_PATH or any(ch.isspace() for ch in socket):
            raise AgentUnavailable(f"the agent socket path {socket} is too long or holds a space "
                                   f"(set TRANSPLANT_STATE_DIR to a shorter folder)")
        self._proc = subprocess.Popen(["ssh-agent", "-D", "-a", socket], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent, start_new_session=True)
        deadline = time.monotonic() + _START_SECONDS
        while not os.path.exists(socket):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise AgentUnavailable(f"ssh-agent did not start (exit {self._proc.poll()})")
            time.sleep(0.01)
        self.socket = socket
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "SSH_ASKPASS", "SSH_AUTH_SOCK")}
        env.update(SSH_AUTH_SOCK=socket, SSH_ASKPASS_REQUIRE="never")
        limits: list[str] = []
        if self.constraints:
            known = self.folder / "hosts"
            known.write_text(self.hostkeys, encoding="utf-8")
            limits = ["-H", str(known), *(arg for hop in self.constraints for arg in ("-h", hop))]
        added = subprocess.run(["ssh-add", "-q", *limits, "-t", str(self.lifetime), "--", str(self.identity)], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if added.returncode != 0:
            said = added.stderr.decode("utf-8", "replace").strip().splitlines()
            raise AgentUnavailable(f"ssh-add refused {self.identity} ({said[-1] if said else 'exit ' + str(added.returncode)}"
                                   f"; a key with a passphrase cannot be added without asking)")

    @property
    def running(self) -> bool:
        """True while the agent process lives."""
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Stop the agent (SIGTERM, then SIGKILL after 2 s), reap it, remove its folder. Idempotent,
        and safe from any thread."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for how in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, how)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(2)
                    break
                except subprocess.TimeoutExpired:
                    continue
        folder, self.folder = self.folder, None
        if folder is not None and folder.parent == self.state_dir / "agents" and folder.name.startswith("agent-"):
            shutil.rmtree(folder, ignore_errors=True)
        self.socket = None
