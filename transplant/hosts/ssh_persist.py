"""Master connections kept between commands (edge): a command's SSH master connection stays up
``ControlPersist`` seconds after the command ends, for the next command with the same settings
to ride, as Ansible keeps its own: the key exchange and login of each host's connection are
otherwise a large share of a plan with nothing to change.

The control socket lies in the controller's state folder, ``<state>/ssh/<key>`` (a folder of mode
0700 owned by this user: whoever can reach the socket can run commands on the host as the login
user; a folder that is not so is not used, and the command opens a connection of its own as before).
The key (:func:`control_path`) is a digest of everything the connection was checked against: the
generated ssh_config text (host-key checking, the manifest's known_hosts and identity file, the
included files' paths), the destination and port, and the bytes of the known_hosts files and of
the included ssh_config files. So a known_hosts file edited since (a key removed or revoked, a host
reinstalled) or another ssh_config never rides a master opened before: it opens a new one, with its
own host-key check. Nested ``Include`` files of the operator's config are not read for the key.

``TRANSPLANT_SSH_PERSIST=0`` on the controller turns this off (each command opens its masters and
ends them as it ends); ``1`` or unset keeps it on; any other value is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from transplant.errors import TransplantError

__all__ = ["PERSIST_ENV", "persist_enabled", "control_path", "locked", "answers"]

#: The environment variable that turns the kept master connections off (``0``).
PERSIST_ENV = "TRANSPLANT_SSH_PERSIST"
#: The longest control socket path: a ``sockaddr_un`` holds 107 bytes and a NUL, and OpenSSH binds
#: ``<path>.<16 random characters>`` first, then renames it.
_MAX_PATH = 107 - 17


def persist_enabled() -> bool:
    """Whether commands keep their SSH master connections for the next one (``TRANSPLANT_SSH_PERSIST``
    ``1`` or unset: yes; ``0``: no).

    :raises TransplantError: any other value (one that reads as "off" must not leave them on).
    """
    value = os.environ.get(PERSIST_ENV, "1")
    if value not in ("0", "1"):
        raise TransplantError(f"environment variable {PERSIST_ENV}={value!r}: not 0 or 1; nothing was done",
                              hint=f"{PERSIST_ENV}=0 ends each command's SSH connections with it; 1 or unset keeps "
                                   f"them a while for the next command")
    return value == "1"


def _folder() -> Path | None:
    """``<state>/ssh``, made with mode 0700; None when it cannot be made, or is a symlink, another
    user's, or open to others (its sockets would let them in)."""
    from transplant.controller.state import default_state_dir, private_folder

    # absolute, with ~ expanded as ssh would: a relative or ~ state folder would otherwise be checked
    # here in one place and bound by ssh in another (ControlPath expands ~ to the login's home)
    folder = Path(os.path.abspath(os.path.expanduser(default_state_dir() / "ssh")))
    try:
        private_folder(folder)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return folder


def _bytes_of(path: str | Path) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError:
        return b"\0absent"


def control_path(config_text: str, destination: str, port: int | None, known_hosts: Sequence[str | Path],
                 included: Sequence[str | Path]) -> Path | None:
    """Where the kept master connection for these settings listens (see the module docstring);
    None when there is no private state folder for it or the path would be too long for a
    socket (the command then keeps its master in a temporary folder, as before).

    :param config_text: the generated ssh_config file's text.
    :param destination: ``[user@]host`` as given to ``ssh``.
    :param port: the port given to ``ssh -p``; None: the ssh_config's.
    :param known_hosts: the known_hosts files host keys are checked against (their bytes are keyed).
    :param included: the ssh_config files the generated one includes (their bytes are keyed).
    """
    folder = _folder()
    if folder is None:
        return None
    digest = hashlib.sha256(b"transplant.ssh-master/1")
    for part in (config_text.encode(), destination.encode(), str(port).encode(),
                 *(_bytes_of(p) for p in known_hosts), *(_bytes_of(p) for p in included)):
        digest.update(b"\0" + hashlib.sha256(part).digest())
    path = folder / digest.hexdigest()[:16]
    return path if len(os.fsencode(path)) <= _MAX_PATH else None


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (an exclusive ``flock``) in the block, so that two commands starting at
    once open one master, not two on one socket path.

    :raises OSError: the lock file cannot be opened.
    """
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def answers(path: Path) -> bool:
    """Whether a master connection listens on the control socket ``path`` (a connection to it is
    accepted); a socket file left by a master that died is removed. Asks nothing of the host."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(os.fsencode(path))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            pass
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass
    return False
