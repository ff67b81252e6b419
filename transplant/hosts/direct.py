"""SSH to SSH without the controller in the way: the target pulls the files from the donor (edge).

The relay (:func:`transplant.hosts.stream.stream_files`) runs the sender and the receiver and
joins them with a pipe on the controller: every byte is decrypted and encrypted again there. Here
the controller starts only the receiver, on the target, over a connection of its own, and the
receiver starts ``ssh <donor> python stream_send ...`` itself (``stream_receive --from-ssh``):
the donor's bytes cross one wire, donor to target, and the controller carries only the list of
paths and the reply.

What lets the target log in to the donor, and what it trusts (:func:`route`):

* authentication: a one-time ed25519 key pair made on the controller for this pull
  (:class:`transplant.hosts.pullkey.OneTimeKey`), its public key authorised on the donor, over the
  controller's own connection, for this pull alone: ``restrict`` (no pty, no forwarding), a forced
  command that runs ``stream_send`` read-only and serves only the planned list of paths (its
  sha256; any other list is refused before a byte is sent), an ``expiry-time``; the private key is
  handed to the receiver on its standard input, written beside the staged files (0600) and removed
  once the login is done. The line is removed from the donor's authorized_keys when the pull ends;
  what a killed controller left is removed by the next apply from that donor, which says so
  (:func:`transplant.hosts.pullkey.sweep_left`). No agent is forwarded: a process on the target
  that takes the key can fetch the planned files and nothing else;
* the donor's host key: the lines the controller's own known_hosts files hold for the donor, as
  the controller connects to it (``ssh -G``'s host name, port, ``HostKeyAlias``; found with
  ``ssh-keygen -F``), written only in the transaction's folder on the target (``PATH`` beside
  ``staged/``), and the target's ``ssh`` reads no ssh_config of the target (``-F /dev/null``) and
  checks strictly against that file alone (``StrictHostKeyChecking=yes``, ``GlobalKnownHostsFile
  /dev/null``, ``BatchMode=yes``), connecting to the host name, port and user the controller
  resolved, forwarding nothing (``-a -x``, ``ClearAllForwardings``), with the one-time key alone
  (``IdentitiesOnly``, ``IdentityAgent=none``).

Not direct (the relay instead, the reason said): a donor reached through
``ProxyJump``/``ProxyCommand``, with host key checking off, or with no key line found; donor and
target the same SSH server. A direct transfer that cannot start (the key could not be authorised on
the donor, the target cannot reach the donor, login refused, no ``ssh`` there: no byte of the
stream came, nothing written) raises ``HostError`` with code
:data:`transplant.hosts.stream.UNAVAILABLE`, and the caller relays.
"""

from __future__ import annotations

import math
import posixpath
import shlex
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transplant import remote
from transplant.errors import HostError
from transplant.hosts.pullkey import KeyUnavailable, OneTimeKey, sweep_left
from transplant.hosts.host import Host
from transplant.hosts.ssh import SSHHost
from transplant.hosts.stream import UNAVAILABLE, _Side, _stop, _reply, compression_for, progress_line
from transplant.hosts.transfer import TransferResult, check_relpath
from transplant.reporting import QUIET, Reporter

__all__ = ["Route", "route", "stream_direct", "pin_path", "DIRECT_MIN_BYTES"]

#: Below this many bytes the relay is used unless direct is forced: direct's fresh SSH handshake
#: (target -> donor; the relay rides the master connections) and its credential cost 1.2-1.5 s on the
#: loaded 2-core loopback lab (measured with the scoped agent the one-time key replaced; the key's own
#: cost, a key made and two host scripts on the donor, was not measured apart), which its saving per byte (no
#: decryption and encryption again on the controller) repays from about 100 MB there (measured:
#: BENCHMARKS.md, "When direct pays"). A real network to a remote controller favours direct sooner.
DIRECT_MIN_BYTES = 100 << 20
#: Name of the pinned known_hosts file in the transaction's folder (beside ``staged/``).
PIN_NAME = "donor-known-hosts"
#: Name of the one-time key's file on the target while the login to the donor is made.
KEY_NAME = "donor-pull-key"
_UNSAFE = set(" \t\n\"'\\")


@dataclass(frozen=True)
class Route:
    """How the target reaches the donor, as the controller does.

    :ivar hostname: / :ivar port: / :ivar user: ``ssh -G``'s answer for the donor.
    :ivar key_alias: its ``HostKeyAlias``, or None.
    :ivar pinned: the donor's host key lines (known_hosts form, newline-terminated).
    :ivar connect_timeout: seconds, as the controller's.
    """

    hostname: str
    port: int
    user: str
    key_alias: str | None
    pinned: str
    connect_timeout: float


def pin_path(staged: str) -> str:
    """The pinned known_hosts file of a transaction whose staged folder is ``staged`` (absolute)."""
    return posixpath.join(posixpath.dirname(posixpath.normpath(staged)), PIN_NAME)


def key_path(pin: str) -> str:
    """Where the target's receiver writes the one-time key while it logs in: beside the pinned file."""
    return posixpath.join(posixpath.dirname(pin), KEY_NAME)


def _keys_for(name: str, files: Sequence[str]) -> str:
    """The known_hosts lines of ``files`` that match ``name`` (``ssh-keygen -F``: hashed names and
    markers included), comment lines dropped; "" when none."""
    lines: list[str] = []
    for file in files:
        path = Path(file).expanduser()
        if str(path) == "/dev/null" or not path.is_file():
            continue
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, timeout=30)
        for line in found.stdout.decode("utf-8", "replace").splitlines():
            if line.strip() and not line.startswith("#") and line not in lines:
                lines.append(line)
    return "".join(line + "\n" for line in lines)


def _known_name(resolved: dict[str, str], fallback: str) -> tuple[str, str, int, str | None]:
    """(name in known_hosts, host name, port, HostKeyAlias or None) of ``ssh -G``'s answer."""
    hostname, port = resolved.get("hostname") or fallback, int(resolved.get("port") or 22)
    alias = resolved.get("hostkeyalias")
    alias = None if alias in (None, "", "none") else alias
    return alias or (hostname if port == 22 else f"[{hostname}]:{port}"), hostname, port, alias


def _files(resolved: dict[str, str]) -> list[str]:
    return (resolved.get("userknownhostsfile", "") + " " + resolved.get("globalknownhostsfile", "")).split()


def route(donor: Host, target: Host) -> tuple[Route | None, str]:
    """Whether the target can pull from the donor directly, and why not.

    :returns: (the route, "") or (None, the reason in words, for the relay's note); ("" with None:
        not an SSH to SSH copy at all). ``ssh -G`` or ``ssh-keygen`` that cannot run is a reason too.
    """
    if not (isinstance(donor, SSHHost) and isinstance(target, SSHHost)):
        return None, ""
    try:
        return _route(donor, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the controller's OpenSSH tools could not say how to reach the donor ({exc})"


def _route(donor: SSHHost, target: SSHHost) -> tuple[Route | None, str]:
    opts = donor.options
    if not opts.verify_host_keys:
        return None, "host key checking is off for the donor (ssh.verify_host_keys: false), and the target is " \
                     "never let connect unchecked"
    seen, other = donor.resolved(), target.resolved()
    for key, what in (("proxyjump", "ProxyJump"), ("proxycommand", "ProxyCommand")):
        if seen.get(key, "none") not in ("", "none"):
            return None, f"the donor is reached through {what} {seen[key]}, which the target may not reach"
    name, hostname, port, alias = _known_name(seen, donor.spec.hostname)
    user = seen.get("user") or ""
    if (hostname, port) == (other.get("hostname"), int(other.get("port") or 22)):
        return None, "donor and target are the same SSH server"
    files = _files(seen)
    pinned = _keys_for(name, files)
    if not pinned:
        return None, f"no host key line for {name} in {', '.join(files) or 'the known_hosts files'} to pin"
    for value in (hostname, user, alias or ""):
        if value.startswith("-") or _UNSAFE & set(value):
            return None, f"the donor's resolved name {value!r} cannot be passed to ssh safely"
    return Route(hostname, port, user, alias, pinned, opts.connect_timeout), ""


def _pull_argv(r: Route, pin: str, key: str, send: list[str]) -> list[str]:
    """The ``ssh`` the receiver runs on the target: the one-time key alone (no agent, no other
    identity), strict checks against the pinned file only. ``send`` is what it asks for; the
    donor's forced command runs the planned sender whatever is asked."""
    argv = ["ssh", "-F", "/dev/null", "-T", "-a", "-x", "-i", key, "-o", "IdentitiesOnly=yes",
            "-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={pin.replace('%', '%%')}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "CheckHostIP=no", "-o", "UpdateHostKeys=no", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "-o", "ClearAllForwardings=yes", "-o", "PermitLocalCommand=no", "-o", "PasswordAuthentication=no",
            "-o", "KbdInteractiveAuthentication=no", "-o", f"ConnectTimeout={max(1, math.ceil(r.connect_timeout))}",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-p", str(r.port)]
    if r.key_alias:
        argv += ["-o", f"HostKeyAlias={r.key_alias}"]
    if r.user:
        argv += ["-l", r.user]
    return [*argv, "--", r.hostname, shlex.join(send)]


def stream_direct(
    donor: SSHHost,
    donor_root: str,
    target: SSHHost,
    dst_root: str,
    relpaths: Sequence[str],
    *,
    route: Route,
    state_dir: Path,
    pin: str,
    src_python: str,
    dst_python: str,
    compress: bool | str = False,
    total: int = 0,
    reporter: Reporter = QUIET,
    timeout: float | None = None,
) -> TransferResult:
    """Copy ``donor_root/<relpath>`` to ``dst_root/<relpath>`` on the target, the target pulling.

    The same files, checks and reply as :func:`transplant.hosts.stream.stream_files` (each file
    written under a temporary name and renamed, hashed as written), but the bytes go donor ->
    target only (see the module docstring).

    :param route: from :func:`route`. :param pin: where the target writes the pinned known_hosts
        lines (absolute; must lie beside ``dst_root``: :func:`pin_path`).
    :param state_dir: the controller's state folder (the one-time key's record lives under it).
    :param src_python: / :param dst_python: the interpreters on the donor / the target.
    :param compress: as for ``stream_files``: the stream is compressed between donor and target.
    :param total: / :param reporter: / :param timeout: as for ``stream_files`` (seconds, None: no limit).
    :returns: as ``stream_files``, with ``how`` ``direct``.
    :raises ValueError: a relpath or root refused (as ``stream_files``).
    :raises HostError: with code ``UNAVAILABLE``: the direct path could not start (a blank in
        ``pin``'s path, the one-time key could not be authorised on the donor, the target
        could not reach or log in to the donor, no ``ssh`` on the target; nothing was written but
        the pinned file); otherwise a side failed or the timeout passed (both stopped).
    """
    for root in (donor_root, dst_root, pin):
        if not root.startswith("/"):
            raise ValueError(f"root folders must be absolute paths, got {root!r}")
    paths = list(dict.fromkeys(check_relpath(p) for p in relpaths))
    if not paths:
        return TransferResult(files=0, bytes=0, seconds=0.0, how="direct")
    if _UNSAFE & set(pin):  # ssh would read UserKnownHostsFile as several files
        raise HostError(f"direct: the pinned file's path {pin!r} holds a blank or a quote, which ssh's "
                        f"UserKnownHostsFile cannot take", code=UNAVAILABLE)
    started = time.monotonic()
    if compress not in (True, False, "zstd", "zlib"):
        raise ValueError(f"compress must be True, False, 'zstd' or 'zlib', got {compress!r}")
    mode = compress if isinstance(compress, str) else compression_for(donor, target) if compress else "none"
    key_file = key_path(pin)
    receive = [dst_python, "-I", "-S", "-c", remote.source("stream_receive").decode(), dst_root, "--compress", mode,
               "--known-hosts", pin, route.pinned, "--identity", key_file,
               "--from-ssh", *_pull_argv(route, pin, key_file, ["transplant-pull"])]
    listing = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths) + b"\0"
    # long enough for the whole pull at a slow 5 MB/s, at least ten minutes; removed when the pull ends anyway
    lifetime = max(600.0, total / 5e6 + 120) if timeout is None else min(max(600.0, total / 5e6 + 120), timeout + 120)
    lifetime = min(lifetime, 86_000.0)  # the donor accepts an expiry within a day
    sweep_left(state_dir, donor, reporter)  # what a killed controller left authorised on this donor
    key = OneTimeKey(state_dir, donor, src_python, donor_root, paths, mode, lifetime)
    try:
        try:
            key.start()
        except KeyUnavailable as exc:
            raise HostError(f"direct: {exc}", code=UNAVAILABLE) from None
        assert key.private is not None
        secret = str(len(key.private)).encode() + b"\n" + key.private
        try:
            proc = target.spawn(receive)
        except HostError as exc:
            raise HostError(f"direct: the receiving side could not start: {exc.message}", code=UNAVAILABLE) from None
        side = _Side("receiving", target, dst_root, proc)
        threads = _watch(side, secret + listing, total, reporter)
        deadline = None if timeout is None else started + timeout
        try:
            while proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    _stop(proc)
                    raise HostError(f"direct stream from {donor.label} to {target.label} timed out after "
                                    f"{timeout:g} s and was stopped")
                time.sleep(0.02)
        except BaseException:
            _stop(proc)
            raise
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
            for thread in threads:
                thread.join(5)
    finally:
        key.close()
    reply = _reply(side)
    return _result(reply, side, donor, donor_root, target, paths, mode, total, reporter, started)


def _watch(side: _Side, listing: bytes, total: int, reporter: Reporter) -> list[threading.Thread]:
    """Threads, started, that write the one-time key and the listing to the receiver (its standard
    input left open: its end tells the receiver the controller stopped), read its standard error
    (progress lines, the ``transplant-connected`` line; the rest kept as its tail) and its reply."""
    proc = side.proc
    side.connected = False

    def feed() -> None:
        try:
            proc.stdin.write(listing)
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def errors() -> None:
        for line in iter(proc.stderr.readline, b""):
            if progress_line(line.rstrip(b"\n"), reporter, total):
                continue
            if line.strip() == b"transplant-connected":
                side.connected = True
            else:
                side.tail.extend(line)
                del side.tail[:-8192]

    def reply() -> None:
        for chunk in iter(lambda: proc.stdout.read1(1 << 20), b""):
            side.out.extend(chunk)

    threads = [threading.Thread(target=body, daemon=True, name=f"direct {body.__name__}")
               for body in (feed, errors, reply)]
    for thread in threads:
        thread.start()
    return threads


def _result(reply: dict | None, side: _Side, donor: Host, donor_root: str, target: Host, paths: list[str], mode: str,
            total: int, reporter: Reporter, started: float) -> TransferResult:
    where = f"{donor.label}:{donor_root}"
    if reply is None:
        said = side.error_text() or f"exit status {side.proc.returncode}"
        code = side.proc.returncode
        if code in (126, 127) or (code == 255 and not side.connected):
            raise HostError(f"direct: the receiving side on {target.label} could not start (exit {code}): {said}",
                            code=UNAVAILABLE)
        raise HostError(f"direct stream to {side.where}: the receiving side failed (exit {code}): {said}")
    sender = reply.get("sender") or {}
    if not reply.get("ok"):
        error = str(reply.get("error"))
        if reply.get("unavailable"):
            raise HostError(f"{target.label} could not pull from {donor.label}: {error}"
                            + (f" ({sender.get('said')})" if sender.get("said") else ""), code=UNAVAILABLE)
        if sender.get("code") not in (0, None):
            said = sender.get("said") or error
            raise HostError(f"stream from {where} (pulled by {target.label}): the sending side failed "
                            f"(exit {sender.get('code')}): {said}",
                            hint="if the source changed since the plan (a file gone or rewritten), plan again, then apply")
        raise HostError(f"stream to {side.where} (pulling from {donor.label}): the receiving side failed: {error}")
    written = {rel: tuple(entry) for rel, entry in (reply.get("files") or {}).items()}
    missing = [p for p in paths if p not in written]
    if missing:
        raise HostError(f"stream to {side.where}: {len(missing)} listed files were not written, first {missing[0]}")
    wire = (sender.get("sent") or {}).get("wire")
    if not isinstance(wire, int):
        wire = reply.get("wire") or 0
    done = int(reply.get("bytes") or 0)
    reporter.progress(done, max(total, done))
    return TransferResult(files=len(written), bytes=wire, seconds=time.monotonic() - started, how="direct",
                          compression=None if mode == "none" else mode, written=written)
