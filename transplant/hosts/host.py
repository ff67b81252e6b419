"""The host edge: run a command on the controller or on an SSH host, and say how rsync reaches it.

A :class:`Host` runs argv lists (never shell text built by pasting strings), with binary
standard input, output and error of any size, and returns a :class:`CommandResult`; a
non-zero exit status is data, not an exception. Only "could not run it at all" (cannot
connect, host key unknown or changed, authentication failed, timed out) raises
:class:`~transplant.errors.HostError`, and its message names the host.

SSH goes through the system OpenSSH client, for the commands and for rsync alike, over one
master connection per host (:class:`transplant.hosts.ssh.SSHHost`, which says why), with host
key verification on by default; :func:`transplant.hosts.connecting.connect` gives the host a
:class:`~transplant.core.hostspec.HostSpec` names.
"""

from __future__ import annotations

import abc
import logging
import re
import os
import shlex
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from transplant.errors import HostError
from transplant.core.hostspec import LOCAL, HostSpec

#: Guards every host's remembered facts (:meth:`Host.remembered`).
_REMEMBERING = threading.Lock()
_T = TypeVar("_T")

__all__ = [
    "HostSpec",
    "LOCAL",
    "SSHOptions",
    "CommandResult",
    "Host",
    "LocalHost",
    "kill_group",
    "tracked",
    "stop_commands",
    "stopping",
    "KnownHosts",
    "read_known_hosts",
    "side_error",
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
    #: the ssh_config file OpenSSH reads (``ssh -F``); None: ``$TRANSPLANT_SSH_CONFIG`` if set, else
    #: OpenSSH's own (~/.ssh/config, then /etc/ssh/ssh_config)
    config: Path | None = None
    #: keep each host's master connection up after the host is closed, for the next command with the
    #: same settings to ride (:mod:`transplant.hosts.ssh_persist`; the commands' setting); False: each
    #: host opens its own and closes it
    persist: bool = False

    #: the operator's defaults for ``identity_file`` and ``known_hosts`` (their config file's
    #: ``[ssh]``), which the command line sets before a command runs: a field left None (no flag,
    #: no manifest ``ssh:`` key) takes it; empty: the SSH defaults above
    DEFAULTS: ClassVar[dict[str, Path]] = {}

    def __post_init__(self) -> None:
        for name, value in SSHOptions.DEFAULTS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: set once, as it is made

    @classmethod
    def from_files(cls, identity_file: str | None, known_hosts: str | None) -> SSHOptions:
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

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: int | None = None,
              stdout: int | None = None) -> subprocess.Popen:
        """Start ``argv`` on the host and return at once, its standard input, output and error
        pipes open (bytes), for a conversation (a host script session); the caller writes,
        reads, and waits for it or kills it (:func:`kill_group`).

        The process runs in a session of its own, so a signal to the controller's process
        group does not reach it (an orphaned host script finishes its step).

        :param stdin: a file descriptor (an ``os.pipe`` end) to use as its standard input
            instead of a new pipe (then ``Popen.stdin`` is None); over SSH it is the local
            ``ssh``'s, which carries it to the remote command. The caller closes its own copy.
        :param stdout: likewise for standard output (``Popen.stdout`` is None then).

        :raises HostError: ``ssh`` cannot be started at all.
        :raises OSError: a local program is missing or cannot be executed.
        :raises ValueError: an empty argv, NUL bytes, or a bad environment variable name.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot start a process to talk to")

    @abc.abstractmethod
    def rsync_location(self, path: str) -> str:
        """The rsync argument for ``path`` on this host: ``path`` or ``[user@]host:path``."""

    @abc.abstractmethod
    def rsync_rsh(self) -> str | None:
        """The value for ``rsync -e`` that reaches this host, quoted for rsync; None for local."""

    def remembered(self, key: tuple, compute: Callable[[], _T]) -> _T:
        """``compute()``'s answer for ``key``, computed once per connection (so once per command: a
        command opens each host once) and kept for the connection's life: for facts of the host that
        a command asks more than once and that do not change while it runs (a venv folder's identity).

        Safe across threads: a caller asking while another computes the same key waits for that
        answer (an apply asks a venv's identity in the background while it imports, then again).

        :param key: hashable, names the fact and its arguments (``("venv-identity", venv)``).
        :raises: whatever ``compute`` raises (nothing is remembered then: the next call asks again;
            a caller that was waiting for that computation computes it itself).
        """
        with _REMEMBERING:
            facts = self.__dict__.setdefault("_remembered", {})
            entry = facts.get(key)
            if entry is None:
                entry = facts[key] = Future()
                entry.set_running_or_notify_cancel()
                mine = True
            else:
                mine = False
        if not mine:
            try:
                return entry.result()
            except Exception:  # noqa: BLE001 - the other caller's failure: ask again here (a Ctrl-C while waiting is ours: raised)
                return self.remembered(key, compute)
        try:
            value = compute()
        except BaseException as exc:
            with _REMEMBERING:
                facts.pop(key, None)
            entry.set_exception(exc)
            raise
        entry.set_result(value)
        return value

    def close(self) -> None:
        """Release the connection, if any (and end the host scripts started ahead and never asked:
        :func:`transplant.hosts.probing.close_prestarted`; for a local host, those started on the
        local host by any :class:`LocalHost`); the host may not be used afterwards."""
        import sys

        probing = sys.modules.get("transplant.hosts.probing")  # not imported: nothing was started ahead
        if probing is not None and (getattr(self, "_prestarted", None) or
                                    (isinstance(self, LocalHost) and probing._LOCAL_KEPT)):
            probing.close_prestarted(self)

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
            tracked(proc)
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

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: int | None = None,
              stdout: int | None = None) -> subprocess.Popen:
        """Start ``argv`` as a local subprocess with open pipes; see :meth:`Host.spawn`.

        :raises OSError: the program is missing or cannot be executed (``FileNotFoundError``,
            ``PermissionError``), where :meth:`run` reports exit status 127 or 126.
        """
        items = _check_argv(argv)
        extra = _check_env(env)
        return tracked(subprocess.Popen(items, stdin=subprocess.PIPE if stdin is None else stdin,
                                        stdout=subprocess.PIPE if stdout is None else stdout, stderr=subprocess.PIPE,
                                        env={**os.environ, **extra} if extra else None, start_new_session=True))

    def rsync_location(self, path: str) -> str:
        """``path`` itself."""
        return path

    def rsync_rsh(self) -> None:
        """None: rsync needs no remote shell for the controller."""
        return None


#: The host commands this controller started (:func:`tracked`) that may still run: what
#: :func:`stop_commands` stops. Weak: a command whose Popen is gone is gone from here.
_LIVE: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()


#: Set while an interrupt stops this controller's commands (:func:`interrupt_stops_commands`):
#: a command started after that is stopped as it starts (:func:`tracked`), and no SSH master
#: connection opens again (a stage still queued would otherwise start its host script then).
_STOPPING = threading.Event()


def stopping() -> bool:
    """Whether an interrupt is stopping this controller's host commands (then none may start)."""
    return _STOPPING.is_set()


def tracked(proc: subprocess.Popen) -> subprocess.Popen:
    """Note ``proc`` (started with ``start_new_session``) among the commands :func:`stop_commands`
    stops; returns it.

    :raises HostError: an interrupt is stopping the commands (:func:`stopping`): ``proc`` is
        killed and reaped first, as it started after the others were stopped.
    """
    _LIVE.add(proc)
    if _STOPPING.is_set():
        kill_group(proc)
        raise HostError("interrupted (Ctrl-C): the command was stopped as it started")
    return proc


def stop_commands() -> int:
    """Send SIGKILL to the process group of every tracked command not yet reaped (a local host
    script, or the local ``ssh`` of a remote one: the remote command then finds its input closed).
    Reaps nothing and takes no lock, so that a signal handler may call it while the interrupted
    thread is inside ``communicate`` or :func:`tracked`; each owner reaps its own process (its
    ``communicate`` returns once the pipes close). A process already reaped (``returncode`` set)
    is skipped: its id may have been reused. Returns how many groups were signalled."""
    for _ in range(5):
        try:
            live = list(_LIVE)  # another thread may add while this copies
            break
        except RuntimeError:
            continue
    else:
        return 0
    stopped = 0
    for proc in live:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
    return stopped


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
    import paramiko  # known_hosts lines are parsed with its HostKeyEntry; imported here, as it costs 0.4 s

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
    import paramiko

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


def side_error(side: str, exc: HostError, spec: HostSpec) -> HostError:
    """``exc`` (a host that could not be reached) said as the manifest's ``side`` (``donor``,
    ``target``, ``donor.fallback[0]``, ``target.base``), with what to try when it has no hint.

    The hint for a connection that failed (refused, timed out, no such name) names the
    ``ssh`` command that tries the same host, and for a donor the ways to go on without it.
    """
    if exc.message.startswith(f"{side} "):
        return exc
    hint = exc.hint
    if hint is None:
        dest = [f"{spec.user}@{spec.hostname}" if spec.user else spec.hostname]
        if spec.port is not None:
            dest = ["-p", str(spec.port), *dest]
        hint = (f"check the host and port in the manifest's {side.split('[')[0]}.host, and that an SSH server answers "
                f"there: ssh {shlex.join(dest)} true")
        if side.startswith("donor"):
            hint += "; without the donor, use a snapshot: donor: {snapshot: ID} or a donor.fallback"
    error = HostError(f"{side} {exc.message}", hint=hint, code=exc.code)
    return error
