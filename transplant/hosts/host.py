"""The host edge: run a command on the controller or on an SSH host, and say how rsync reaches it.

A :class:`Host` runs argv lists (never shell text built by pasting strings), with binary
standard input, output and error of any size, and returns a :class:`CommandResult`; a
non-zero exit status is data, not an exception. Only "could not run it at all" (cannot
connect, host key unknown or changed, authentication failed, timed out) raises
:class:`~transplant.errors.HostError`, and its message names the host.

SSH goes through Fabric (paramiko) with host key verification on by default: Fabric 3
auto-accepts unknown host keys, so :class:`SSHHost` replaces its policy with paramiko's
``RejectPolicy`` and loads the known_hosts file itself. rsync reaches the same host with
OpenSSH, given the same identity, known_hosts file and strict checking
(:meth:`Host.rsync_rsh`).
"""

from __future__ import annotations

import abc
import logging
import math
import re
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Connection

from transplant.errors import HostError
from transplant.core.hostspec import LOCAL, HostSpec

__all__ = [
    "HostSpec",
    "LOCAL",
    "SSHOptions",
    "CommandResult",
    "Host",
    "LocalHost",
    "SSHHost",
    "connect",
    "kill_group",
    "KnownHosts",
    "read_known_hosts",
]

# paramiko logs a traceback for every failed handshake on its transport thread; with no
# logging configured, Python's last-resort handler prints it on stderr. The HostError
# raised here says it better. An application that configures logging still sees them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_READ_CHUNK = 1 << 16
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TAIL_CHARS = 2000


@dataclass(frozen=True, kw_only=True)
class SSHOptions:
    """How the controller reaches SSH hosts; the same settings feed paramiko and rsync's ssh.

    :ivar identity_file: private key to log in with; None means the SSH defaults
        (ssh-agent and ``~/.ssh/id_*``).
    :ivar known_hosts: the known_hosts file that host keys are checked against; None means
        ``~/.ssh/known_hosts`` (OpenSSH, under rsync, also reads its global file then).
    :ivar connect_timeout: seconds to wait for the TCP connection, the SSH banner and
        authentication, each. Fabric keeps whole seconds, so it is rounded up.
    :ivar verify_host_keys: False accepts an unknown host key without recording it (for
        throw-away test hosts only), and says so on stderr at every connection; a key that
        differs from the known_hosts file's, or that it marks ``@revoked``, is refused all the same.
    """

    identity_file: Path | None = None
    known_hosts: Path | None = None
    connect_timeout: float = 10.0
    verify_host_keys: bool = True

    @classmethod
    def from_files(cls, identity_file: str | None, known_hosts: str | None) -> "SSHOptions":
        """Settings from the ``--identity-file`` / ``--known-hosts`` options (paths as given;
        None or empty where an option is not given: the SSH defaults above)."""
        return cls(identity_file=Path(identity_file) if identity_file else None,
                   known_hosts=Path(known_hosts) if known_hosts else None)

    def known_hosts_path(self) -> Path:
        """The known_hosts file in effect, as an absolute path (it may not exist)."""
        if self.known_hosts is not None:
            return Path(self.known_hosts).expanduser().absolute()
        return Path("~/.ssh/known_hosts").expanduser()


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    """What a finished command left behind.

    :ivar argv: the command as run (without the ``env`` prefix added for SSH).
    :ivar returncode: exit status; -1 when an SSH server reported none (the command was
        killed by a signal); 126/127 when a local command could not be executed/found,
        as a shell reports it.
    :ivar stdout: everything the command wrote to standard output, as bytes.
    :ivar stderr: everything it wrote to standard error, as bytes.
    :ivar seconds: wall-clock time from start to exit, in seconds.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def ok(self) -> bool:
        """True when the exit status is 0."""
        return self.returncode == 0

    def stderr_tail(self, chars: int = _TAIL_CHARS) -> str:
        """The last ``chars`` characters of standard error, decoded leniently and stripped."""
        return _tail(self.stderr, chars)


def _tail(data: bytes, chars: int = _TAIL_CHARS) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text if len(text) <= chars else "..." + text[-chars:]


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a sequence of strings, not one string")
    items = tuple(argv)
    if not items:
        raise ValueError("argv is empty")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"argv items must be str, got {type(item).__name__}: {item!r}")
        if "\0" in item:
            raise ValueError(f"argv item contains a NUL byte: {item!r}")
    return items


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    if not env:
        return {}
    checked = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ValueError(f"bad environment variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"bad value for environment variable {key}: {value!r}")
        checked[key] = value
    return checked


class Host(abc.ABC):
    """One place commands run: the controller itself or an SSH host.

    :ivar spec: the :class:`HostSpec` this host was made from.
    :ivar label: how messages name the host (``root@127.0.0.10:2222`` or ``local``).
    """

    spec: HostSpec
    label: str

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` on the host and wait for it.

        :param argv: program and arguments; no shell parses them.
        :param stdin: bytes fed to standard input, then closed; None gives an empty input.
        :param env: variables added to (or replacing) the host's environment; None adds none.
        :param timeout: seconds for the whole command; None waits without limit.
        :returns: the exit status and both outputs; a non-zero status does not raise.
        :raises HostError: the host cannot be reached or the command ran past ``timeout``.
        :raises ValueError: an empty argv, NUL bytes, or a bad environment variable name.
        """

    @abc.abstractmethod
    def rsync_location(self, path: str) -> str:
        """The rsync argument for ``path`` on this host: ``path`` or ``[user@]host:path``."""

    @abc.abstractmethod
    def rsync_rsh(self) -> str | None:
        """The value for ``rsync -e`` that reaches this host, quoted for rsync; None for local."""

    def close(self) -> None:
        """Release the connection, if any; the host may not be used afterwards."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"


class LocalHost(Host):
    """The controller itself: commands are local subprocesses."""

    def __init__(self, spec: HostSpec = LOCAL) -> None:
        self.spec = spec
        self.label = "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` as a local subprocess; see :meth:`Host.run`.

        A program that is not found or not executable gives returncode 127 or 126 and the
        reason on stderr, as a shell (and so an SSH host) would.
        """
        items = _check_argv(argv)
        extra = _check_env(env)
        full_env = {**os.environ, **extra} if extra else None
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                items,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=full_env,
                start_new_session=True,
            )
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            return CommandResult(
                argv=items,
                returncode=code,
                stdout=b"",
                stderr=f"{items[0]}: {exc.strerror}\n".encode(),
                seconds=time.monotonic() - started,
            )
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise HostError(
                f"local: {shlex.join(items)} timed out after {timeout:g} s and was killed"
            ) from None
        except BaseException:
            kill_group(proc)
            raise
        return CommandResult(
            argv=items,
            returncode=proc.returncode,
            stdout=out,
            stderr=err,
            seconds=time.monotonic() - started,
        )

    def rsync_location(self, path: str) -> str:
        """``path`` itself."""
        return path

    def rsync_rsh(self) -> None:
        """None: rsync needs no remote shell for the controller."""
        return None


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a process started with start_new_session and its group; reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):
        proc.kill()
        proc.wait()


class _RejectUnknownHostKey(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key so the error can show its fingerprint."""

    def missing_host_key(self, client, hostname, key):
        raise _UnknownHostKey(hostname, key)


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"Server {hostname!r} not found in known_hosts")
        self.hostname = hostname
        self.key = key


class _AcceptUnknownHostKey(paramiko.MissingHostKeyPolicy):
    """``verify_host_keys: false``: an unknown key is accepted (not recorded); a changed one is
    still refused, since the known_hosts file is loaded all the same."""

    def missing_host_key(self, client, hostname, key):
        return None


@dataclass(frozen=True)
class KnownHosts:
    """What a known_hosts file says, OpenSSH's markers included.

    :ivar entries: plain host key lines (paramiko ``HostKeyEntry``), hashed names kept.
    :ivar revoked: ``@revoked`` keys: never accepted, for any host.
    :ivar authorities: ``@cert-authority`` lines (host patterns and CA key).
    """

    entries: tuple
    revoked: tuple
    authorities: tuple


def read_known_hosts(path: Path) -> KnownHosts:
    """Parse a known_hosts file as OpenSSH writes it: plain lines, ``@revoked`` and
    ``@cert-authority`` markers (which paramiko's own reader cannot parse); comments, blank
    lines and lines of key types paramiko does not know are skipped.

    :raises OSError: the file cannot be read.
    """
    entries, revoked, authorities = [], [], []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
            except (paramiko.SSHException, ValueError, TypeError, IndexError):
                entry = None
            if entry is None:
                continue
            if marker is None:
                entries.append(entry)
            elif marker == "@revoked":
                revoked.append(entry)
            elif marker == "@cert-authority":
                authorities.append(entry)
    return KnownHosts(entries=tuple(entries), revoked=tuple(revoked), authorities=tuple(authorities))


def _host_matches(entry, name: str) -> bool:
    """Whether a known_hosts entry's host patterns (plain, hashed ``|1|``, wildcards, ``!``) name ``name``."""
    hit = False
    for pattern in entry.hostnames:
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            matched = paramiko.HostKeys.hash_host(name, pattern) == pattern
        else:  # OpenSSH patterns know only * and ? ("[host]:port" brackets are literal)
            regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern.lower())
            matched = re.fullmatch(regex, name.lower()) is not None
        if matched and negated:
            return False
        hit = hit or matched
    return hit


def _ssh_config_path(path: Path) -> str:
    """A path as an ssh -i / -o value: ``%`` tokens escaped, quoted if it has blanks or quotes."""
    text = str(path).replace("%", "%%")
    if any(c in text for c in " \t\"'\\"):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class SSHHost(Host):
    """An SSH host reached with Fabric (paramiko), key authentication only.

    The connection is opened by the constructor, so an unreachable host fails early.
    Commands run as ``shlex.join(argv)`` in the login shell of the remote user; ``env``
    becomes an ``env K=V ...`` prefix, because sshd refuses most environment requests.

    :param spec: where to connect; its port defaults to the ssh_config one, then 22.
    :param options: identity, known_hosts file, timeouts and host key checking.
    :raises HostError: the connection, host key check or authentication failed.
    """

    def __init__(self, spec: HostSpec, options: SSHOptions) -> None:
        if spec.is_local:
            raise ValueError("SSHHost needs a remote host spec, not 'local'")
        self.spec = spec
        self.options = options
        self.label = str(spec)
        self._lock = threading.Lock()
        self._conn = self._make_connection()
        self._open()

    # -- connection -----------------------------------------------------------------

    def _make_connection(self) -> Connection:
        opts = self.options
        seconds = float(opts.connect_timeout)
        connect_kwargs: dict[str, object] = {
            "banner_timeout": seconds,
            "auth_timeout": seconds,
            "channel_timeout": seconds,
        }
        if opts.identity_file is not None:
            connect_kwargs.update(
                key_filename=[str(Path(opts.identity_file).expanduser())],
                look_for_keys=False,
                allow_agent=False,
            )
        conn = Connection(
            self.spec.hostname,
            user=self.spec.user,
            port=self.spec.port,
            connect_timeout=max(1, math.ceil(seconds)),
            connect_kwargs=connect_kwargs,
        )
        client = conn.client
        # the known_hosts file is read whether or not unknown keys are accepted: a changed key is
        # always refused, a revoked one too
        known = opts.known_hosts_path()
        self._known = KnownHosts(entries=(), revoked=(), authorities=())
        if known.exists():
            try:
                self._known = read_known_hosts(known)
            except OSError as exc:
                raise HostError(f"{self.label}: cannot read known_hosts file {known}: {exc.strerror or exc}",
                                hint=f"check the file's permissions: ls -l {shlex.quote(str(known))}") from None
            client.get_host_keys()._entries.extend(self._known.entries)
        if opts.verify_host_keys:
            client.set_missing_host_key_policy(_RejectUnknownHostKey())
        else:
            client.set_missing_host_key_policy(_AcceptUnknownHostKey())
            print(f"warning: {self.label}: host key checking is off (ssh.verify_host_keys: false): an unknown "
                  f"host key is accepted without being recorded; a changed or revoked one is still refused",
                  file=sys.stderr)
        return conn

    def _key_name(self) -> str:
        """How known_hosts names this host: ``host`` on port 22, else ``[host]:port``."""
        return self._conn.host if self._port == 22 else f"[{self._conn.host}]:{self._port}"

    def _check_revoked(self) -> None:
        """Refuse a host whose key the known_hosts file marks ``@revoked`` (after the handshake,
        before any command runs)."""
        transport = self._conn.client.get_transport()
        offered = transport.get_remote_server_key() if transport is not None else None
        if offered is None:
            return
        for entry in self._known.revoked:
            if entry.key == offered:
                self._conn.close()
                known = self.options.known_hosts_path()
                raise HostError(
                    f"{self.label}: the host offered {offered.get_name()} {offered.fingerprint}, a key {known} marks "
                    f"@revoked; refusing to connect",
                    hint=f"if the host has a new key, record it and drop the revoked host key line: "
                         f"ssh-keyscan -p {self._port} {self._conn.host} (check its fingerprint out of band first)")

    @property
    def _port(self) -> int:
        return int(self._conn.port or 22)

    def _open(self) -> None:
        opts = self.options
        if opts.identity_file is not None and not Path(opts.identity_file).expanduser().is_file():
            raise HostError(
                f"{self.label}: identity file {opts.identity_file} does not exist",
                hint=f"ssh-keygen -t ed25519 -f {shlex.quote(str(opts.identity_file))}",
            )
        try:
            self._conn.open()
        except BaseException as exc:
            self._conn.close()
            error = self._connect_error(exc)
            if error is None:
                raise
            raise error from exc
        self._check_revoked()

    def _connect_error(self, exc: BaseException) -> HostError | None:
        """Translate what Fabric/paramiko/socket raised while connecting; None to re-raise."""
        where = f"{self.label}"
        host, port = self._conn.host, self._port
        known = self.options.known_hosts_path()
        if isinstance(exc, _UnknownHostKey) and any(_host_matches(e, self._key_name())
                                                    for e in self._known.authorities):
            return HostError(
                f"{where}: host key not in {known} (offered {exc.key.get_name()} {exc.key.fingerprint}); {known} "
                f"trusts a certificate authority (@cert-authority) for this host, but transplant's SSH client "
                f"(paramiko) cannot check host certificates; refusing to connect to an unverified host",
                hint=f"record the host's own key as well: ssh-keyscan -p {port} {host} >> {shlex.quote(str(known))}",
            )
        if isinstance(exc, _UnknownHostKey):
            return HostError(
                f"{where}: host key not in {known} (offered {exc.key.get_name()} "
                f"{exc.key.fingerprint}); refusing to connect to an unverified host",
                hint=f"ssh-keyscan -p {port} {host} >> {shlex.quote(str(known))}",
            )
        if isinstance(exc, paramiko.BadHostKeyException):
            hostname = host if port == 22 else f"[{host}]:{port}"
            return HostError(
                f"{where}: HOST KEY CHANGED: the host offered {exc.key.get_name()} "
                f"{exc.key.fingerprint} but {known} has {exc.expected_key.get_name()} "
                f"{exc.expected_key.fingerprint}; someone may be intercepting the connection, "
                f"or the host was reinstalled",
                hint="if the host was reinstalled, remove the old key and scan again: "
                f"ssh-keygen -R {shlex.quote(hostname)} -f {shlex.quote(str(known))}",
            )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return HostError(
                f"{where}: identity file {self.options.identity_file} is encrypted",
                hint="load it into ssh-agent (ssh-add) and leave the identity file unset",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            ident = self.options.identity_file
            dest = shlex.join(["-p", str(port), f"{self._conn.user}@{host}"])
            if ident is not None:
                return HostError(
                    f"{where}: authentication failed: the server refused the key "
                    f"{ident} for user {self._conn.user}",
                    hint=f"ssh-copy-id -i {shlex.quote(str(ident))} {dest}",
                )
            return HostError(
                f"{where}: authentication failed for user {self._conn.user} "
                "(tried ssh-agent and ~/.ssh/id_*)",
                hint="give the key to use with an identity file, or add it: ssh-copy-id " + dest,
            )
        if isinstance(exc, socket.gaierror):
            return HostError(f"{where}: cannot resolve host name {host!r}: {exc.strerror}")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return HostError(
                f"{where}: timed out connecting to port {port} after "
                f"{self.options.connect_timeout:g} s"
            )
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            reasons = {e.strerror or str(e) for e in exc.errors.values()}
            return HostError(f"{where}: cannot connect to port {port}: {'; '.join(sorted(reasons))}")
        if isinstance(exc, ConnectionRefusedError):
            return HostError(f"{where}: cannot connect to port {port}: connection refused")
        if isinstance(exc, OSError):
            return HostError(f"{where}: cannot connect to port {port}: {exc.strerror or exc}")
        if isinstance(exc, paramiko.SSHException) and str(exc) in (
            "Error reading SSH protocol banner",
            "No existing session",  # what paramiko says when start_client ran out of time
        ):
            return HostError(
                f"{where}: no SSH banner from port {port} within "
                f"{self.options.connect_timeout:g} s; is an SSH server listening there?"
            )
        if isinstance(exc, (paramiko.SSHException, EOFError)):
            return HostError(f"{where}: SSH handshake failed: {exc or type(exc).__name__}")
        return None

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            transport = self._conn.client.get_transport()
            if transport is None or not transport.is_active():
                self._conn.close()
                self._open()
                transport = self._conn.client.get_transport()
            return transport

    # -- commands -------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` on the SSH host; see :meth:`Host.run`.

        Standard input is written while both outputs are read (one thread each), so
        outputs of many megabytes never dead-lock against a large input. On a timeout
        the channel is closed; the remote command may run on until it notices.
        """
        items = _check_argv(argv)
        extra = _check_env(env)
        command_argv = ["env", *(f"{k}={v}" for k, v in extra.items()), *items] if extra else list(items)
        command = shlex.join(command_argv)
        deadline = None if timeout is None else time.monotonic() + timeout
        started = time.monotonic()
        transport = self._transport()
        try:
            channel = transport.open_session(timeout=self.options.connect_timeout)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(f"{self.label}: cannot start {shlex.join(items)}: {exc}") from exc

        out: list[bytes] = []
        err: list[bytes] = []
        failures: list[BaseException] = []

        def pump(recv, chunks: list[bytes]) -> None:
            try:
                while True:
                    data = recv(_READ_CHUNK)
                    if not data:
                        return
                    chunks.append(data)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                failures.append(exc)

        def feed() -> None:
            try:
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                # The command exited (or closed stdin) without reading everything,
                # as `true < big` does; its exit status tells the story.
                pass

        threads = [
            threading.Thread(target=pump, args=(channel.recv, out), daemon=True),
            threading.Thread(target=pump, args=(channel.recv_stderr, err), daemon=True),
            threading.Thread(target=feed, daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads[:2]:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    raise HostError(
                        f"{self.label}: {shlex.join(items)} timed out after {timeout:g} s"
                    )
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not channel.status_event.wait(remaining):
                raise HostError(f"{self.label}: {shlex.join(items)} timed out after {timeout:g} s")
        finally:
            channel.close()
        if channel.exit_status == -1 and (failures or not transport.is_active()):
            reason = failures[0] if failures else "the connection closed before an exit status came"
            raise HostError(f"{self.label}: connection lost while running {shlex.join(items)}: {reason}")
        return CommandResult(
            argv=items,
            returncode=channel.exit_status,
            stdout=b"".join(out),
            stderr=b"".join(err),
            seconds=time.monotonic() - started,
        )

    # -- rsync ----------------------------------------------------------------------

    def rsync_location(self, path: str) -> str:
        """``[user@]host:path``, with an IPv6 address in brackets."""
        host = f"[{self.spec.hostname}]" if ":" in self.spec.hostname else self.spec.hostname
        user = f"{self.spec.user}@" if self.spec.user else ""
        return f"{user}{host}:{path}"

    def rsync_rsh(self) -> str:
        """``ssh`` with this host's port, identity, known_hosts and strict checking, as one
        string quoted for ``rsync -e`` (rsync splits it on blanks and honours quotes)."""
        opts = self.options
        argv = [
            "ssh",
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, math.ceil(opts.connect_timeout))}",
        ]  # fmt: skip
        if self.spec.port is not None:
            argv += ["-p", str(self.spec.port)]
        if opts.identity_file is not None:
            ident = Path(opts.identity_file).expanduser().absolute()
            # -o IdentityFile, not -i: ssh stats an -i path before expanding its % tokens, so a
            # path holding % (escaped as %%) would not be found and the key silently not offered
            argv += ["-o", f"IdentityFile={_ssh_config_path(ident)}", "-o", "IdentitiesOnly=yes"]
        if opts.verify_host_keys:
            argv += ["-o", "StrictHostKeyChecking=yes"]
            if opts.known_hosts is not None:
                argv += [
                    "-o", f"UserKnownHostsFile={_ssh_config_path(opts.known_hosts_path())}",
                    "-o", "GlobalKnownHostsFile=/dev/null",
                ]  # fmt: skip
        else:
            # accept-new: an unknown key is accepted (and "recorded" in /dev/null, the first file), a
            # changed or revoked one in the real file is refused, as with the paramiko connection
            files = f"/dev/null {_ssh_config_path(opts.known_hosts_path())}"
            argv += [
                "-o", "StrictHostKeyChecking=accept-new",
                "-o", f"UserKnownHostsFile={files}",
                "-o", "LogLevel=ERROR",
            ]  # fmt: skip
        return shlex.join(argv)

    def close(self) -> None:
        """Close the SSH connection."""
        self._conn.close()


def connect(spec: HostSpec, ssh: SSHOptions | None = None) -> Host:
    """A :class:`LocalHost` for ``local``, else a connected :class:`SSHHost`.

    :param spec: the host to reach.
    :param ssh: SSH settings; None uses the defaults (``~/.ssh``, host keys verified).
    :raises HostError: an SSH host could not be reached or refused us; the message names it.
    """
    if spec.is_local:
        return LocalHost(spec)
    return SSHHost(spec, ssh or SSHOptions())
