"""Loopback SSH test hosts ("the lab") for the built-in demo and the tests.

Each lab host is an ``sshd -D`` listening on its own loopback address (127.0.0.10 and up)
and a free port, in its own mount and UTS namespaces: there ``/srv`` is a bind mount of the
host's private folder on the controller and the host name is the lab host's name. So
``/srv/venv`` is the same path on every host but holds different files, as on two real
machines, while everything else (``/usr``, ``/root``, the Python interpreters) is shared.

Layout of a lab folder::

    client/id_ed25519          the one client key (and .pub)
    client/authorized_keys     that key, for every host
    client/known_hosts         "[127.0.0.10]:PORT ssh-ed25519 ..." for every host
    hosts/<name>/srv/          that host's /srv
    hosts/<name>/ssh_host_ed25519_key, sshd_config, sshd.pid, sshd.log

Keys and host folders are kept when a lab is started again in the same folder (the demo
reuses its venvs); addresses, ports, sshd_config and known_hosts are made afresh.

Needs root, ``unshare``/``nsenter`` (util-linux), ``sshd`` (openssh-server) and ``rsync``.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import fcntl
import os
import posixpath
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from transplant.errors import TransplantError

__all__ = ["Lab", "LabHost", "check_requirements", "INSTALL_HINT"]

INSTALL_HINT = "apt-get install openssh-server rsync util-linux"
FIRST_ADDRESS = 10
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

_START_SCRIPT = 'mount --bind "$1" /srv && hostname "$2" && exec "$3" -D -e -f "$4"'
_PR_SET_PDEATHSIG = 1


def _sshd_path() -> str | None:
    path = os.pathsep.join(["/usr/sbin", "/usr/local/sbin", os.environ.get("PATH", "")])
    return shutil.which("sshd", path=path)


def check_requirements() -> None:
    """Check that this machine can run a lab: root, tools installed, namespaces allowed.

    :raises TransplantError: what is missing or refused, with the command that fixes it.
    """
    if os.geteuid() != 0:
        raise TransplantError(
            "the lab needs root: it bind-mounts /srv in new mount namespaces and runs sshd",
            hint="run as root (sudo), or in a container started with --privileged",
        )
    missing = [tool for tool in ("unshare", "nsenter", "ssh-keygen", "ssh", "rsync") if not shutil.which(tool)]
    if _sshd_path() is None:
        missing.append("sshd")
    if missing:
        raise TransplantError(
            f"the lab needs {', '.join(missing)}, not found on PATH", hint=INSTALL_HINT
        )
    if not Path("/srv").is_dir():
        raise TransplantError("the lab bind-mounts host folders on /srv, which does not exist", hint="mkdir /srv")
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--propagation", "private", "--", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise TransplantError(
            f"cannot create mount and UTS namespaces: {probe.stderr.strip() or probe.returncode}",
            hint="run as root with CAP_SYS_ADMIN (in docker: --privileged or --cap-add SYS_ADMIN)",
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask the kernel to SIGTERM the sshd listener if the controller dies without cleanup."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort: without it, only a dead controller leaves sshd running
        pass


def _port_is_free(address: str, port: int) -> bool:
    """True when sshd could listen there (sshd sets SO_REUSEADDR, so TIME_WAIT is no obstacle)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _gone(pid: int) -> bool:
    """True once ``pid`` has left the process table (reaping it if it is a zombie child of ours)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return not os.path.exists(f"/proc/{pid}")


def _processes_in(namespace: str) -> list[int]:
    """Every process whose mount namespace is ``namespace`` (a ``mnt:[inode]`` link)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _mount_namespace(int(entry)) == namespace:
            found.append(int(entry))
    return found


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_name(path.name + ".pub").exists():
        return
    path.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


class LabHost:
    """One lab host: an sshd in its own mount+UTS namespaces on a loopback address.

    :ivar name: the host name, as ``hostname`` prints it inside.
    :ivar address: its loopback address, ``127.0.0.N``.
    :ivar port: the TCP port its sshd listens on.
    :ivar root: the folder on the controller that is ``/srv`` inside the host.
    :ivar pid: the sshd listener's process id; None while stopped.
    """

    def __init__(self, name: str, address: str, port: int, folder: Path, sshd_config: Path) -> None:
        self.name = name
        self.address = address
        self.port = port
        self.folder = folder
        self.root = folder / "srv"
        self.sshd_config = sshd_config
        self.log = folder / "sshd.log"
        self._proc: subprocess.Popen | None = None
        self._namespace: str | None = None

    @property
    def pid(self) -> int | None:
        """The sshd listener's process id, or None while the host is stopped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def spec(self) -> str:
        """``root@ADDRESS:PORT``, for :meth:`transplant.hosts.host.HostSpec.parse`."""
        return f"root@{self.address}:{self.port}"

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid else "stopped"
        return f"<LabHost {self.name} {self.spec} {state}>"

    def path(self, inside: str) -> Path:
        """Map a path inside the host (under ``/srv``) to the same file on the controller.

        :param inside: an absolute path such as ``/srv/venv_sglang/bin/python``.
        :returns: the controller path, e.g. ``<lab>/hosts/donor/srv/venv_sglang/bin/python``.
        :raises ValueError: the path is not ``/srv`` or below it.
        """
        normal = posixpath.normpath(inside)
        if not inside.startswith("/") or not (normal == "/srv" or normal.startswith("/srv/")):
            raise ValueError(f"{inside!r} is not under /srv, the only folder private to lab host {self.name}")
        rest = normal[len("/srv") :].lstrip("/")
        return self.root / rest if rest else self.root

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the host's namespaces, for setup (building venvs, planting files).

        Runs as root through ``nsenter`` while sshd is up, else in fresh namespaces with the
        same ``/srv`` and host name; the working directory is ``/``.

        :param input: bytes for standard input; None gives an empty input.
        :param env: variables added to the controller's environment; None adds none.
        :param check: raise when the exit status is not 0.
        :param timeout: seconds; None waits without limit.
        :returns: the finished process, stdout and stderr as bytes.
        :raises subprocess.CalledProcessError: ``check`` is set and the exit status is not 0.
        :raises subprocess.TimeoutExpired: it ran past ``timeout`` (it is killed).
        """
        return subprocess.run(
            self._command(argv),
            input=input or b"",
            capture_output=True,
            env=self._environment(env),
            check=check,
            timeout=timeout,
        )

    def _command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` inside the host: through ``nsenter`` while sshd is up, else in fresh namespaces."""
        if self.pid is not None:
            return ["nsenter", "--target", str(self.pid), "--mount", "--uts", "--wd=/", "--", *argv]
        return [
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "sh", "-c", 'mount --bind "$1" /srv && hostname "$2" && shift 2 && cd / && exec "$@"',
            "sh", str(self.root), self.name, *argv,
        ]  # fmt: skip

    def _environment(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        """The environment of :meth:`run`: the controller's, with ``env`` added."""
        return {**os.environ, **env} if env else None

    def start_sshd(self) -> None:
        """Start the host's sshd and wait until it sends its SSH banner.

        :raises TransplantError: sshd exited (the message has its log) or the port is taken.
        """
        if self._proc is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sshd = _sshd_path()
        if sshd is None:
            raise TransplantError("sshd is not installed", hint=INSTALL_HINT)
        if not _port_is_free(self.address, self.port):
            raise TransplantError(
                f"lab host {self.name}: {self.address}:{self.port}: Address already in use",
                hint="stop the other lab, or start this one afresh (it picks new ports)",
            )
        log_start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                self._start_command(sshd, self.sshd_config),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_for_banner(log_start)
        except BaseException:
            self.stop_sshd()
            raise

    def _start_command(self, sshd: str, config: Path) -> list[str]:
        """The command that starts the host's namespaces and its sshd in the foreground."""
        return [
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "sh", "-c", _START_SCRIPT, "sh", str(self.root), self.name, sshd, str(config),
        ]  # fmt: skip

    def _wait_for_banner(self, log_start: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise TransplantError(
                    f"lab host {self.name}: sshd exited with status {self._proc.returncode} "
                    f"before accepting connections on {self.address}:{self.port}; its log:\n"
                    + self._log_since(log_start)
                )
            if self._namespace is None:
                namespace = _mount_namespace(self._proc.pid)
                if namespace is not None and namespace != _mount_namespace(os.getpid()):
                    self._namespace = namespace
            try:
                with socket.create_connection((self.address, self.port), timeout=1.0) as sock:
                    banner = sock.recv(256)
                if banner.startswith(b"SSH-") and self._namespace is not None:
                    return
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, errno.ECONNRESET, None) and not isinstance(
                    exc, TimeoutError
                ):
                    raise
            if time.monotonic() > deadline:
                raise TransplantError(
                    f"lab host {self.name}: sshd did not answer on {self.address}:{self.port} "
                    f"within {START_TIMEOUT:g} s; its log:\n" + self._log_since(log_start)
                )
            time.sleep(0.05)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log, "rb") as handle:
                handle.seek(offset)
                text = handle.read().decode("utf-8", "replace").strip()
        except OSError:
            return "(no log)"
        return text[-3000:] or "(empty)"

    def stop_sshd(self) -> None:
        """Stop the host as if it went down: every process in its namespaces (open SSH
        sessions and what they run), then the sshd listener, so the listener reaps its
        session processes and none is left behind as a zombie. Waits for them, and kills
        what is left after a few seconds. Nothing in ``/srv`` is touched."""
        proc, namespace = self._proc, self._namespace
        if proc is None:
            return
        self._proc = None
        self._namespace = None
        if namespace is not None:
            others: set[int] = set()

            def sessions() -> set[int]:
                # New ones may appear while we wait (a connection being accepted).
                fresh = {pid for pid in _processes_in(namespace) if pid != proc.pid} - others
                _signal_all(sorted(fresh), signal.SIGTERM)
                others.update(fresh)
                return others

            _wait_gone(sessions)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()
        if namespace is not None:
            # Anything that slipped in meanwhile (a command started through nsenter).
            left = set(_processes_in(namespace))
            _signal_all(sorted(left), signal.SIGKILL)
            _wait_gone(lambda: left)


def _wait_gone(current) -> None:
    """Wait until every pid in ``current()`` is gone; SIGKILL stragglers after STOP_TIMEOUT,
    and give up (best effort) after twice that."""
    deadline = time.monotonic() + STOP_TIMEOUT
    killed = False
    while True:
        live = [pid for pid in current() if not _gone(pid)]
        if not live:
            return
        if time.monotonic() > deadline:
            if killed:
                return
            _signal_all(live, signal.SIGKILL)
            killed = True
            deadline = time.monotonic() + STOP_TIMEOUT
        time.sleep(0.02)


#: A lab host's own authorized_keys file (its ``/srv``), read by its sshd besides the lab's shared one and
#: named to transplant's host scripts by ``TRANSPLANT_AUTHORIZED_KEYS``: a direct pull authorises its
#: one-time key here, never in the controller's own ``~/.ssh`` (the lab's hosts share its home folder).
LAB_AUTHORIZED_KEYS = "/srv/.ssh/authorized_keys"
#: PATH of every SSH session on a lab host: its own ``/srv/bin`` first.
HOST_PATH = "/srv/bin:/usr/local/bin:/usr/bin:/bin"


def sshd_config(host: LabHost, host_key: str, authorized_keys: str, pid_file: str) -> str:
    """A lab host's sshd_config: key authentication for root only, no PAM, no DNS, PATH with
    the host's own ``/srv/bin`` first; paths as the host's sshd sees them."""
    return "\n".join(
        [
            "# written by transplant.lab; remade at every start",
            f"ListenAddress {host.address}",
            f"Port {host.port}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            # the second file is the host's own (its /srv): a direct pull's one-time key is authorised there
            f"AuthorizedKeysFile {authorized_keys} {LAB_AUTHORIZED_KEYS}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "Subsystem sftp internal-sftp",
            # each host's own /srv/bin comes first: stand-ins for host tools (nvidia-smi) live there
            f"SetEnv PATH={HOST_PATH} TRANSPLANT_AUTHORIZED_KEYS={LAB_AUTHORIZED_KEYS}",
            "",
        ]
    )


class Lab:
    """A set of loopback SSH hosts, started by the constructor.

    Use it as a context manager, or call :meth:`stop`; it also stops when the interpreter
    exits, and each sshd listener gets SIGTERM if the process that started it dies (note:
    the kernel sends it when the starting *thread* exits, so start a lab from a thread
    that lives as long as the lab).

    :param directory: the lab folder (created; reused if it exists, keeping keys and /srv).
    :param names: host names, one sshd each, on 127.0.0.10, 127.0.0.11, ...
    :ivar hosts: the hosts by name, in the given order.
    :ivar identity_file: the client private key that every host accepts for root.
    :ivar known_hosts: a known_hosts file with every host's key.
    :raises TransplantError: requirements are missing (see :func:`check_requirements`), the
        folder is used by a running lab, or an sshd would not start.
    :raises ValueError: no names, a repeated name, or a name that is not a host name.
    """

    def __init__(self, directory: Path, names: Sequence[str] = ("donor", "target")) -> None:
        if not names or len(set(names)) != len(names):
            raise ValueError(f"lab host names must be distinct and at least one, got {list(names)}")
        for name in names:
            if not name.replace("-", "").isalnum() or not name.isascii() or name.startswith("-"):
                raise ValueError(f"lab host name {name!r} is not a plain host name")
        if len(names) > 245:
            raise ValueError("at most 245 lab hosts")
        check_requirements()
        self.directory = Path(directory).absolute()
        self.hosts: dict[str, LabHost] = {}
        client = self.directory / "client"
        client.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.directory / "lab.lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise TransplantError(
                f"lab folder {self.directory} is in use by another running lab",
                hint="stop that lab, or give this one another folder",
            ) from None
        self._stopped = False
        atexit.register(self.stop)
        try:
            self.identity_file = client / "id_ed25519"
            self.known_hosts = client / "known_hosts"
            self.authorized_keys = client / "authorized_keys"
            _keygen(self.identity_file, "transplant-lab-client")
            self.authorized_keys.write_bytes(self.identity_file.with_suffix(".pub").read_bytes())
            for index, name in enumerate(names):
                self.hosts[name] = self._start_host(name, f"127.0.0.{FIRST_ADDRESS + index}")
            self._write_known_hosts()
        except BaseException:
            self.stop()
            raise

    def _start_host(self, name: str, address: str) -> LabHost:
        folder = self.directory / "hosts" / name
        (folder / "srv").mkdir(parents=True, exist_ok=True)
        host_key = folder / "ssh_host_ed25519_key"
        _keygen(host_key, f"transplant-lab-{name}")
        for attempt in range(5):
            host = self._new_host(name, address, _free_port(address), folder)
            host.sshd_config.write_text(self._sshd_config(host, host_key))
            try:
                host.start_sshd()
                return host
            except TransplantError as exc:
                # Another lab may have taken the port between our probe and sshd's bind.
                if "Address already in use" not in str(exc) or attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _new_host(self, name: str, address: str, port: int, folder: Path) -> LabHost:
        """A stopped host of this lab (subclasses give hosts of another kind)."""
        return LabHost(name, address, port, folder, folder / "sshd_config")

    def _sshd_config(self, host: LabHost, host_key: Path) -> str:
        """The text of ``host``'s sshd_config, its key being ``host_key`` on the controller."""
        return sshd_config(host, str(host_key), str(self.authorized_keys), str(host.folder / "sshd.pid"))

    def _write_known_hosts(self) -> None:
        lines = []
        for host in self.hosts.values():
            key = (host.folder / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"[{host.address}]:{host.port} {key[0]} {key[1]}\n")
        self.known_hosts.write_text("".join(lines))

    def __getitem__(self, name: str) -> LabHost:
        return self.hosts[name]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every host (see :meth:`LabHost.stop_sshd`) and release the folder. Idempotent."""
        if getattr(self, "_stopped", True):
            return
        self._stopped = True
        atexit.unregister(self.stop)
        errors = []
        for host in self.hosts.values():
            try:
                host.stop_sshd()
            except Exception as exc:  # noqa: BLE001 - stop the others regardless; raised below
                errors.append(exc)
        self._lock.close()
        if errors:
            raise errors[0]
