"""SSH hosts through the system OpenSSH client (edge): one connection, shared by every command and rsync.

Why OpenSSH and not paramiko: operators reach GPU hosts through ``~/.ssh/config`` (aliases,
``User``, ``Port``, ``IdentityFile``, ``ProxyJump`` through a bastion), ssh-agent, the default
known_hosts files (``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts``, hashed entries) and host
certificates (``@cert-authority``). paramiko has no host certificate support and only a partial
reading of ssh_config (no ``ProxyJump``), and rsync already runs OpenSSH, so two clients could
give two answers for one host. Here both paths are the same OpenSSH, as Ansible does it: a
master connection per host (``ControlMaster``/``ControlPath``/``ControlPersist``) that each command
and each rsync rides, all reading one generated ssh_config file; with ``SSHOptions.persist`` (the
commands') the master stays up a while after the command for the next one with the same settings
(:mod:`transplant.hosts.ssh_persist`):

* first (OpenSSH keeps the first value it reads) the controller's own settings, which nothing
  read from a host or an included file can lower: ``BatchMode yes``, ``StrictHostKeyChecking yes``
  (``accept-new`` only when the manifest says ``verify_host_keys: false``), the manifest's
  ``known_hosts`` (then the global file is not read) and ``identity_file``;
* then ``Include`` of the operator's ssh_config (``ssh.config`` of the manifest,
  ``$TRANSPLANT_SSH_CONFIG``, else ``~/.ssh/config``) and the system one, for aliases, users,
  ports, keys and jump hosts.

A ``ProxyJump`` host is reached by a second ``ssh`` that OpenSSH starts with the same ``-F``
file, so it gets the same host-key checks. Remote commands are ``shlex.join(argv)``, never
pasted text.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import math
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from transplant.errors import HostError
from transplant.hosts.host import (CommandResult, Host, SSHOptions, tracked, _check_argv, _check_env, _host_matches, _ssh_config_path,
                    kill_group, read_known_hosts, stopping)
from transplant.core.hostspec import HostSpec
from transplant.hosts.probing import close_prestarted

__all__ = ["SSHHost", "CONFIG_ENV", "end_masters"]

#: The environment variable naming the ssh_config file when the manifest's ``ssh.config`` does not.
CONFIG_ENV = "TRANSPLANT_SSH_CONFIG"
#: Seconds an idle master connection stays up (it is closed when the host is closed, unless kept
#: for the next command: ``SSHOptions.persist``; opened again when a command finds it gone).
PERSIST = 120
_SERVER_KEY = re.compile(r"Server host key: (\S+) (SHA256:\S+)")
#: The hosts whose master connection this controller opened and has not closed (weak).
_MASTERS: weakref.WeakSet[SSHHost] = weakref.WeakSet()


def _operator_config(options: SSHOptions) -> list[str]:
    """The ssh_config files to include, in order: the given one, else ~/.ssh/config; then the system's."""
    given = options.config or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
    user = Path(given).expanduser().absolute() if given else Path("~/.ssh/config").expanduser()
    return [str(user), "/etc/ssh/ssh_config"]


class SSHHost(Host):
    """An SSH host reached with the system ``ssh`` over one master connection.

    The master connection is opened by the constructor, so an unreachable host fails early.
    Commands run as ``shlex.join(argv)`` in the login shell of the remote user; ``env``
    becomes an ``env K=V ...`` prefix, because sshd refuses most environment requests.

    :param spec: where to connect: ``[user@]host[:port]``, where ``host`` may be an alias of the
        ssh_config file; a user or port given here wins over the file's.
    :param options: identity, known_hosts file, ssh_config file, timeouts and host key checking.
    :raises HostError: the connection, host key check or authentication failed.
    """

    def __init__(self, spec: HostSpec, options: SSHOptions) -> None:
        if spec.is_local:
            raise ValueError("SSHHost needs a remote host spec, not 'local'")
        self.spec = spec
        self.options = options
        self.label = str(spec)
        self._lock = threading.Lock()
        self._folder: str | None = None
        self._master = False
        self._kept: Path | None = None  # the control socket of a master kept between commands
        if options.identity_file is not None and not Path(options.identity_file).expanduser().is_file():
            # the operator's config file gave it (no flag, no manifest key): say so, or it is a mystery
            configured = options.identity_file == SSHOptions.DEFAULTS.get("identity_file")
            raise HostError(f"{self.label}: identity file {options.identity_file} does not exist"
                            + (" (the config file's ssh.identity_file; see 'transplant config')" if configured else ""),
                            hint=f"ssh-keygen -t ed25519 -f {shlex.quote(str(options.identity_file))}")
        if not options.verify_host_keys:
            import sys
            print(f"warning: {self.label}: host key checking is off (ssh.verify_host_keys: false): an unknown "
                  f"host key is accepted without being recorded; a changed or revoked one is still refused",
                  file=sys.stderr)
        self._open()

    # -- the generated configuration ----------------------------------------------------

    def _dir(self) -> str:
        if getattr(self, "_folder", None) is None:
            self._folder = tempfile.mkdtemp(prefix="transplant-ssh-")  # mode 0700: the socket is ours
            self._lock = getattr(self, "_lock", None) or threading.Lock()
            self._master = getattr(self, "_master", False)
            Path(self._folder, "config").write_text(self._config_text(), encoding="utf-8")
        assert self._folder is not None  # made just above
        return self._folder

    def _config_text(self) -> str:
        """The ssh_config file every ``ssh`` of this host reads (see the module docstring)."""
        opts = self.options
        lines = ["# written by transplant: its own settings first (OpenSSH keeps the first value), then the",
                 "# operator's ssh_config for aliases, users, ports, keys and jump hosts", "Host *",
                 "  BatchMode yes", f"  ConnectTimeout {max(1, math.ceil(opts.connect_timeout))}",
                 "  ServerAliveInterval 15", "  ServerAliveCountMax 4"]
        if opts.identity_file is not None:
            ident = Path(opts.identity_file).expanduser().absolute()
            lines += [f"  IdentityFile {_ssh_config_path(ident)}", "  IdentitiesOnly yes"]
        if opts.verify_host_keys:
            lines.append("  StrictHostKeyChecking yes")
            if opts.known_hosts is not None:
                lines += [f"  UserKnownHostsFile {_ssh_config_path(opts.known_hosts_path())}",
                          "  GlobalKnownHostsFile /dev/null"]
        else:
            # accept-new: an unknown key is accepted (and "recorded" in /dev/null, the first file); a changed or
            # revoked one in the real file is refused
            lines += ["  StrictHostKeyChecking accept-new",
                      f"  UserKnownHostsFile /dev/null {_ssh_config_path(opts.known_hosts_path())}",
                      "  LogLevel ERROR"]
        lines.append("Match all")
        lines += [f"  Include {_ssh_config_path(Path(path))}" for path in _operator_config(opts)]
        return "\n".join(lines) + "\n"

    def _argv(self, *, control: bool = True) -> list[str]:
        """``ssh`` and the options every connection to this host takes (no destination)."""
        folder = self._dir()
        argv = ["ssh", "-F", str(Path(folder, "config")), "-o", "BatchMode=yes"]
        if self.options.verify_host_keys:
            argv += ["-o", "StrictHostKeyChecking=yes"]
        if self.spec.port is not None:
            argv += ["-p", str(self.spec.port)]
        if control:
            argv += ["-o", f"ControlPath={_ssh_config_path(self._socket())}", "-o", "ControlMaster=no"]
        return argv

    def _socket(self) -> Path:
        """The master connection's control socket: kept between commands, or in this host's folder."""
        kept = getattr(self, "_kept", None)
        return kept if kept is not None else Path(self._dir(), "master")

    def _destination(self) -> str:
        return f"{self.spec.user}@{self.spec.hostname}" if self.spec.user else self.spec.hostname

    def resolved(self) -> dict[str, str]:
        """What OpenSSH makes of this host (``ssh -G``): ``user``, ``hostname``, ``port``, ``proxyjump``..."""
        done = subprocess.run([*self._argv(control=False), "-G", self._destination()], capture_output=True,
                              timeout=30)
        out: dict[str, str] = {}
        for line in done.stdout.decode("utf-8", "replace").splitlines():
            key, _, value = line.partition(" ")
            out.setdefault(key.lower(), value)
        return out

    # -- the master connection ----------------------------------------------------------

    def _open(self) -> None:
        """Open the master connection, or, with ``options.persist``, ride the one a command with
        the same settings kept (opened and checked alike: :mod:`transplant.hosts.ssh_persist`).

        :raises HostError: connecting failed (:meth:`_connect_error`)."""
        kept = self._kept_path() if getattr(self.options, "persist", False) else None
        if kept is None:
            self._kept = None
            self._start_master(Path(self._dir(), "master"), Path(self._dir(), "master.log"))
            return
        from transplant.hosts import ssh_persist

        log = Path(f"{kept}.log")
        with ssh_persist.locked(kept):
            self._kept = kept
            try:  # the master writes its -v log there as long as it lives (appending): one command's lines at most
                os.truncate(log, 0)
            except OSError:
                pass
            if not ssh_persist.answers(kept):
                self._start_master(kept, log)
        self._master = True
        _MASTERS.add(self)

    def _kept_path(self) -> Path | None:
        """Where a master kept for this host's settings listens; None: none is kept (see
        :func:`transplant.hosts.ssh_persist.control_path`)."""
        from transplant.hosts import ssh_persist

        opts = self.options
        known = [opts.known_hosts_path()]
        if opts.known_hosts is None:
            known.append(Path("/etc/ssh/ssh_known_hosts"))
        return ssh_persist.control_path(self._config_text(), self._destination(), self.spec.port, known,
                                        _operator_config(opts))

    def _start_master(self, control: Path, log: Path) -> None:
        """Start ``ssh -N -f`` as the master on ``control``, its ``-v`` log in ``log``."""
        argv = [*self._argv(control=False), "-v", "-o", "ControlMaster=yes",
                "-o", f"ControlPath={_ssh_config_path(control)}",
                "-o", f"ControlPersist={PERSIST}", "-N", "-f", "--", self._destination()]
        with open(log, "ab") as sink:
            # -f: ssh goes to the background once authenticated; its log goes to a file, never a pipe
            # that the background master would hold open
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=self.options.connect_timeout * 3 + 30)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                raise HostError(f"{self.label}: timed out connecting after {self.options.connect_timeout:g} s") \
                    from None
        text = log.read_text(encoding="utf-8", errors="replace")
        if code != 0:
            error = self._connect_error(text)
            self._remove()
            raise error
        self._master = True
        _MASTERS.add(self)

    def _connect_error(self, text: str) -> HostError:
        """Translate what ``ssh`` said when it could not connect."""
        where, opts = self.label, self.options
        said = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("debug")]
        try:  # what the ssh_config makes of an alias: the real host name and port, for the hints
            real = self.resolved()
        except (OSError, subprocess.TimeoutExpired):
            real = {}
        port = int(real.get("port") or self.spec.port or 22)
        host = real.get("hostname") or self.spec.hostname
        known = opts.known_hosts_path()
        offered = _SERVER_KEY.findall(text)
        key = f"{offered[-1][0]} {offered[-1][1]}" if offered else "a key"
        named = host if port == 22 else f"[{host}]:{port}"
        jump = f" (or the ProxyJump host {real['proxyjump']} on the way)" \
            if real.get("proxyjump", "none") != "none" else ""
        if "REVOKED HOST KEY" in text or re.search(r"Host key .* revoked", text):
            return HostError(f"{where}: the host offered {key}, a key {known} marks @revoked; refusing to connect",
                             hint=f"if the host has a new key, record it and drop the revoked host key line: "
                                  f"ssh-keyscan -p {port} {host} (check its fingerprint out of band first)")
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "has changed and you have requested strict" in text:
            line = re.search(r"Offending \S+ key in (\S+):(\d+)", text)
            other = f"{line.group(1)} line {line.group(2)}" if line else str(known)
            return HostError(f"{where}: HOST KEY CHANGED: the host offered {key} but {other} has another key for it; "
                             f"someone may be intercepting the connection, or the host was reinstalled",
                             hint=f"if the host was reinstalled, remove the old key and scan again: "
                                  f"ssh-keygen -R {shlex.quote(named)} -f {shlex.quote(str(known))}")
        if "Host key verification failed" in text:
            authority = False
            try:
                authority = known.exists() and any(_host_matches(e, named)
                                                   for e in read_known_hosts(known).authorities)
            except OSError:
                pass
            if authority:
                return HostError(
                    f"{where}: host key not in {known} (offered {key}); {known} trusts a certificate authority "
                    f"(@cert-authority) for this host, but the host showed no certificate that authority signed; "
                    f"refusing to connect to an unverified host",
                    hint=f"sign the host key with the authority (ssh-keygen -s CA -h) and set HostCertificate in its "
                         f"sshd_config, or record its own key: ssh-keyscan -p {port} {host} >> {shlex.quote(str(known))}")
            return HostError(f"{where}: host key not in {known}{jump} (offered {key}); refusing to connect to an "
                             f"unverified host",
                             hint=f"ssh-keyscan -p {port} {host} >> {shlex.quote(str(known))}")
        if "Permission denied" in text:
            user = self.spec.user or real.get("user", "?")
            ident = opts.identity_file
            dest = shlex.join(["-p", str(port), f"{user}@{host}"])
            if ident is not None:
                return HostError(f"{where}: authentication failed: the server refused the key {ident} for user {user}",
                                 hint=f"ssh-copy-id -i {shlex.quote(str(ident))} {dest}")
            return HostError(f"{where}: authentication failed for user {user} (tried ssh-agent and the keys of "
                             f"the ssh config and ~/.ssh/id_*)",
                             hint="give the key to use with an identity file, or add it: ssh-copy-id " + dest)
        if m := re.search(r"Could not resolve hostname (\S+?): (.+)", text):
            return HostError(f"{where}: cannot resolve host name {m.group(1)!r}: {m.group(2).strip()}")
        if "banner exchange" in text and "timed out" in text:
            return HostError(f"{where}: no SSH banner from port {port} within {opts.connect_timeout:g} s; is an SSH "
                             f"server listening there?")
        if m := re.search(r"connect to host \S+ port (\d+): (.+)", text):
            reason = m.group(2).strip()
            if "timed out" in reason.lower():
                return HostError(f"{where}: timed out connecting to port {m.group(1)} after {opts.connect_timeout:g} s")
            return HostError(f"{where}: cannot connect to port {m.group(1)}: {reason}")
        tail = "; ".join(said[-4:]) or "no message"
        return HostError(f"{where}: ssh could not connect: {tail}",
                         hint="try the same with: " + shlex.join([*self._argv(control=False), self._destination(),
                                                                   "true"]))

    def _ensure_master(self) -> None:
        """Open the master again when it is gone (idle past ControlPersist, or killed)."""
        with self._lock:
            if self._master and os.path.exists(self._socket()):
                return
            if stopping():
                raise HostError(f"{self.label}: interrupted (Ctrl-C): not connecting again")
            self._open()

    # -- commands -------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, env: Mapping[str, str] | None = None,
            timeout: float | None = None) -> CommandResult:
        """Run ``argv`` on the SSH host; see :meth:`Host.run`. A command that runs past ``timeout``
        has its local ``ssh`` killed; the remote command may run on until it notices (the read-only
        host scripts notice at once: ``end_when_unread`` in ``transplant/remote/_common.py``).

        :raises HostError: also when an interrupt is stopping the commands
            (:func:`transplant.hosts.host.stopping`) and the master connection is gone."""
        items = _check_argv(argv)
        extra = _check_env(env)
        command_argv = ["env", *(f"{k}={v}" for k, v in extra.items()), *items] if extra else list(items)
        self._ensure_master()
        started = time.monotonic()
        ssh = [*self._argv(), "-T", "--", self._destination(), shlex.join(command_argv)]
        try:
            proc = tracked(subprocess.Popen(ssh, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            start_new_session=True))
        except OSError as exc:
            raise HostError(f"{self.label}: cannot start ssh: {exc.strerror or exc}",
                            hint="install the OpenSSH client (apt-get install openssh-client)") from None
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise HostError(f"{self.label}: {shlex.join(items)} timed out after {timeout:g} s") from None
        except BaseException:
            kill_group(proc)
            raise
        if proc.returncode == 255 and not self._alive():
            reason = err.decode("utf-8", "replace").strip() or "the connection closed before an exit status came"
            raise HostError(f"{self.label}: connection lost while running {shlex.join(items)}: {reason}")
        return CommandResult(argv=items, returncode=proc.returncode, stdout=out, stderr=err,
                             seconds=time.monotonic() - started)

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: int | None = None,
              stdout: int | None = None) -> subprocess.Popen:
        """Start ``argv`` on the SSH host over the master connection, pipes open; see
        :meth:`Host.spawn`. Closing its standard input ends the remote command's input; killing
        the local ``ssh`` leaves the remote command to notice on its own (sshd closes its end of the
        command's output then: the read-only host scripts end at once)."""
        items = _check_argv(argv)
        extra = _check_env(env)
        command_argv = ["env", *(f"{k}={v}" for k, v in extra.items()), *items] if extra else list(items)
        self._ensure_master()
        ssh = [*self._argv(), "-T", "--", self._destination(), shlex.join(command_argv)]
        try:
            return tracked(subprocess.Popen(ssh, stdin=subprocess.PIPE if stdin is None else stdin,
                                            stdout=subprocess.PIPE if stdout is None else stdout,
                                            stderr=subprocess.PIPE, start_new_session=True))
        except OSError as exc:
            raise HostError(f"{self.label}: cannot start ssh: {exc.strerror or exc}",
                            hint="install the OpenSSH client (apt-get install openssh-client)") from None

    def _alive(self) -> bool:
        """Whether the master connection still answers (``ssh -O check``)."""
        done = subprocess.run([*self._argv(), "-O", "check", "--", self._destination()], capture_output=True,
                              timeout=30)
        return done.returncode == 0

    # -- rsync --------------------------------------------------------------------------

    def rsync_location(self, path: str) -> str:
        """``[user@]host:path``, with an IPv6 address in brackets."""
        host = f"[{self.spec.hostname}]" if ":" in self.spec.hostname else self.spec.hostname
        user = f"{self.spec.user}@" if self.spec.user else ""
        return f"{user}{host}:{path}"

    def rsync_rsh(self) -> str:
        """``ssh`` over this host's master connection (the same file, checks and keys as the
        commands; a fresh connection with the same checks when the master is gone), as one
        string quoted for ``rsync -e``."""
        return shlex.join(self._argv())

    def close(self) -> None:
        """End the host scripts started ahead and never asked (:func:`transplant.hosts.probing.prestart`),
        close the master connection (one kept between commands stays, for the next command: it
        ends itself once idle ``PERSIST`` seconds) and remove this host's folder."""
        if getattr(self, "_prestarted", None):
            close_prestarted(self)
        if getattr(self, "_kept", None) is not None:
            self._master = False
        if getattr(self, "_master", False):
            try:
                subprocess.run([*self._argv(), "-O", "exit", "--", self._destination()], capture_output=True,
                               timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._master = False
        _MASTERS.discard(self)
        self._remove()

    def _remove(self) -> None:
        folder = getattr(self, "_folder", None)
        if folder is not None and os.path.basename(folder).startswith("transplant-ssh-"):
            shutil.rmtree(folder, ignore_errors=True)
        self._folder = None

    def __del__(self) -> None:  # a master left by a host never closed is stopped with it
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def end_masters(timeout: float = 3.0) -> int:
    """Ask every master connection this controller opened and has not closed to exit now
    (``ssh -O exit`` through its own control socket, all at once), for an interrupt
    (:func:`transplant.hosts.connecting.interrupt_stops_commands`): a master holds the pipes of each
    command it carries (the local ``ssh`` passed them to it) until the remote command ends, so
    a thread waiting for a command's output would wait for the remote end even after its local
    ``ssh`` was killed; once the master is gone they close, and sshd closes the remote command's
    pipes. Nothing but those masters is signalled; a master kept between commands
    (``SSHOptions.persist``) ends too, so another command riding it at that moment loses its
    connection. The hosts open a master again when asked to run a command later (not while
    :func:`transplant.hosts.host.stopping`).

    Safe to call from a signal handler: it takes no lock, and the copy of the set is retried
    when another thread changes it meanwhile.

    :param timeout: seconds to wait for all the ``ssh -O exit`` together; one still running then
        is killed.
    :returns: how many masters were asked to exit.
    """
    for _ in range(5):
        try:
            hosts = [host for host in list(_MASTERS) if getattr(host, "_master", False)]
            break
        except RuntimeError:  # the set changed while it was copied
            continue
    else:
        return 0
    asked = []
    for host in hosts:
        folder = getattr(host, "_folder", None)
        if folder is None:
            continue
        try:
            asked.append(subprocess.Popen([*host._argv(), "-O", "exit", "--", host._destination()],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        except OSError:
            continue
        host._master = False
    deadline = time.monotonic() + timeout
    for proc in asked:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(proc)
    return len(asked)
