"""A small client for OCI registries (edge): references, credentials, TLS, the distribution API.

The distribution API is plain HTTPS (the OCI distribution specification, v1.0/1.1):
``HEAD/GET /v2/<name>/blobs/<digest>`` (``Range: bytes=N-`` resumes), monolithic upload
(``POST /v2/<name>/blobs/uploads/`` then ``PUT <location>?digest=<digest>``),
``PUT/GET/DELETE /v2/<name>/manifests/<reference>`` and ``GET /v2/<name>/tags/list``.

Authentication as registries do it (the Docker token specification): a 401 carries
``WWW-Authenticate: Basic realm=...`` (the credentials are then sent as basic auth) or
``Bearer realm=...,service=...,scope=...`` (a token is asked of the realm, with the
credentials when there are any, and sent as ``Authorization: Bearer``). The realm must be https
and, to get credentials, on the registry's host or one the operator names (:class:`Settings`).
Every answer is bounded: a progress deadline, a size limit, a nesting limit for its JSON, and no
redirect from https to http. Credentials come
from ``TRANSPLANT_REGISTRY_USER``/``TRANSPLANT_REGISTRY_PASSWORD``, else from the Docker
credential file (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``: ``auths.<registry>.auth``,
base64 ``user:password``); credential helpers are reported as unsupported. TLS is verified
against the system CAs, or the CA bundle a manifest names. Stdlib only (urllib, ssl).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import ipaddress
import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from transplant.errors import RegistryError
from transplant.reporting import QUIET, Reporter

__all__ = ["RegistryError", "Reference", "Credentials", "find_credentials", "Client", "parse_challenge",
           "is_oci", "MANIFEST_TYPE", "USER_VAR", "PASSWORD_VAR", "INSECURE_VAR", "TOKEN_HOSTS_VAR", "PROGRESS_VAR",
           "Settings", "parse_json", "MANIFEST_LIMIT"]

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
USER_VAR = "TRANSPLANT_REGISTRY_USER"
PASSWORD_VAR = "TRANSPLANT_REGISTRY_PASSWORD"
INSECURE_VAR = "TRANSPLANT_REGISTRY_INSECURE"
TOKEN_HOSTS_VAR = "TRANSPLANT_REGISTRY_TOKEN_HOSTS"
PROGRESS_VAR = "TRANSPLANT_REGISTRY_PROGRESS"
MANIFEST_LIMIT = 4 << 20  # the distribution spec's limit a registry must accept, and what transplant reads
TAGS_LIMIT = 4 << 20
TOKEN_LIMIT = 1 << 20
ERROR_LIMIT = 64 << 10
JSON_DEPTH = 64  # OCI manifests nest 4 deep, a snapshot's index about 6
PROGRESS_DEFAULT = (1024, 30.0)  # at least 1 KiB every 30 s, whatever the per-read timeout
_BLOCK = 1 << 20
_NAME = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_FORMS = "oci://REGISTRY[:PORT]/REPO:TAG or oci://REGISTRY[:PORT]/REPO@sha256:<64 hex>"


def is_oci(text: str) -> bool:
    """Whether a snapshot reference names a registry (``oci://...``)."""
    return isinstance(text, str) and text.startswith("oci://")


@dataclass(frozen=True)
class Reference:
    """``oci://REGISTRY/REPOSITORY:TAG`` or ``...@sha256:HEX`` (pinned).

    :ivar registry: ``host[:port]``; :ivar repository: lower-case path (the spec's name grammar);
    :ivar tag: None when only a digest is given; :ivar digest: ``sha256:<hex>`` or None.
    """

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str, *, need_version: bool = True) -> Reference:
        """Parse a reference; with ``need_version`` False a bare repository (for list and prune) is fine.

        :raises ValueError: not ``oci://``, no repository, a bad tag or digest (the message gives the forms).
        """
        if not is_oci(text):
            raise ValueError(f"{text!r} is not a registry reference; write {_FORMS}")
        rest = text[len("oci://"):]
        registry, slash, path = rest.partition("/")
        if not registry or not slash or not path or any(c in registry for c in "@ ?#"):
            raise ValueError(f"{text!r}: give a registry and a repository: {_FORMS}")
        digest = tag = None
        if "@" in path:
            path, _, digest = path.partition("@")
            if not _DIGEST.fullmatch(digest):
                raise ValueError(f"{text!r}: the digest must be sha256:<64 lower-case hex>")
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, _, tag = path.rpartition(":")
            if not _TAG.fullmatch(tag):
                raise ValueError(f"{text!r}: {tag!r} is not a valid tag (letters, digits, '_', '.', '-')")
        if not _NAME.fullmatch(path):
            raise ValueError(f"{text!r}: {path!r} is not a valid repository name (lower-case, '/'-separated)")
        if need_version and tag is None and digest is None:
            raise ValueError(f"{text!r}: name a tag or a digest: {_FORMS}")
        return cls(registry=registry, repository=path, tag=tag, digest=digest)

    @property
    def version(self) -> str:
        """What names the manifest: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> Reference:
        """The same repository pinned to ``digest``."""
        return Reference(registry=self.registry, repository=self.repository, tag=self.tag, digest=digest)

    def __str__(self) -> str:
        return f"oci://{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + \
            (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True)
class Credentials:
    """A user name and password (or identity token) for basic auth or the token realm;
    ``source`` says where they came from (for messages), never the secret."""

    username: str
    password: str
    source: str

    def basic(self) -> str:
        """The ``Authorization`` header value for basic auth."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, source={self.source!r})"


def find_credentials(registry: str, env: Mapping[str, str] | None = None, home: Path | None = None) -> Credentials | None:
    """Credentials for ``registry`` (``host[:port]``): the environment variables
    ``TRANSPLANT_REGISTRY_USER``/``TRANSPLANT_REGISTRY_PASSWORD`` first, else the Docker
    credential file's ``auths`` entry (keyed ``host[:port]`` or ``https://host[:port]``...).

    :param env: the environment (None: ``os.environ``); :param home: the home folder (None: ``~``).
    :returns: None when neither has any (anonymous access is tried).
    :raises RegistryError: only one of the two variables is set, the file is not JSON, its
        ``auth`` is not base64 ``user:password``, or the registry is served by a credential
        helper (``credHelpers``/``credsStore``), which transplant does not run.
    """
    env = os.environ if env is None else env
    user, password = env.get(USER_VAR), env.get(PASSWORD_VAR)
    if user or password:
        if not (user and password):
            raise RegistryError(f"set both {USER_VAR} and {PASSWORD_VAR} (only one is set)",
                                hint=f"export {USER_VAR}=NAME {PASSWORD_VAR}=SECRET, or unset both")
        return Credentials(user, password, f"the environment ({USER_VAR})")
    folder = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else (home or Path.home()) / ".docker"
    path = folder / "config.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path}: cannot be read as JSON ({exc})", hint="fix the file, or set "
                            f"{USER_VAR} and {PASSWORD_VAR}") from None
    auths = found if isinstance(found := doc.get("auths"), dict) else {}
    for key, entry in auths.items():
        if _registry_key(key) == registry and isinstance(entry, dict) and entry.get("auth"):
            try:
                name, sep, secret = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (binascii.Error, ValueError, UnicodeDecodeError):
                name, sep, secret = "", "", ""
            if not sep or not name:
                raise RegistryError(f"{path}: auths.{key}.auth is not base64 of user:password",
                                    hint=f"log in again (docker login {registry}), or set {USER_VAR} and {PASSWORD_VAR}")
            return Credentials(name, secret, f"{path} (auths.{key})")
    helpers = found if isinstance(found := doc.get("credHelpers"), dict) else {}
    helper = helpers.get(registry) or (doc.get("credsStore") if registry not in auths else None)
    if helper:
        raise RegistryError(f"{path}: {registry} is served by the credential helper docker-credential-{helper}, "
                            f"which transplant does not run",
                            hint=f"set {USER_VAR} and {PASSWORD_VAR} (e.g. from the helper: echo {registry} | "
                                 f"docker-credential-{helper} get)")
    return None


def _registry_key(key: str) -> str:
    """``https://host:port/v1/`` -> ``host:port`` (the forms docker login writes)."""
    text = re.sub(r"^https?://", "", key.strip())
    return text.split("/", 1)[0]


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="...",scope="..."`` -> (``bearer``, {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str:
    """``host[:port]`` (``[v6]:port`` too) -> ``host``, lower-case."""
    return (urllib.parse.urlsplit("//" + netloc).hostname or "").lower()


@dataclass(frozen=True)
class Settings:
    """What the operator allows a registry client (from the environment; see :meth:`from_env`).

    :ivar insecure: ``host[:port]`` entries of loopback registries spoken to over plain http
        (an entry without a port: every port of that host).
    :ivar token_hosts: host names besides the registry's own that may receive the credentials
        as its token service (``Bearer realm``).
    :ivar progress: (bytes, seconds): an answer must bring at least that many bytes in every
        such interval (its headers within the first), or it is cut off.
    """

    insecure: tuple[str, ...] = ()
    token_hosts: tuple[str, ...] = ()
    progress: tuple[int, float] = PROGRESS_DEFAULT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, config: Any = None) -> Settings:
        """Read ``TRANSPLANT_REGISTRY_INSECURE`` (comma-separated ``host[:port]``, loopback only),
        ``TRANSPLANT_REGISTRY_TOKEN_HOSTS`` (comma-separated host names) and
        ``TRANSPLANT_REGISTRY_PROGRESS`` (``BYTES/SECONDS``, default ``1024/30``); a variable that is
        not set takes the config file's ``registry.insecure``, ``registry.token_hosts``,
        ``registry.progress`` (:mod:`transplant.controller.config_file`).

        :param env: the environment (None: ``os.environ``); :param config: the config file's
            :class:`~transplant.controller.config_file.Config` (None: read it when ``env`` is None,
            none when an environment is given).
        :raises RegistryError: an insecure entry that is not a loopback address, a bad progress value.
        :raises ConfigError: the config file cannot be used.
        """
        return cls.with_sources(env, config)[0]

    @classmethod
    def with_sources(cls, env: Mapping[str, str] | None = None,
                     config: Any = None) -> tuple[Settings, dict[str, str]]:
        """:meth:`from_env`, and where each value came from: ``insecure``, ``token_hosts``,
        ``progress`` -> ``environment (VAR)``, ``file`` or ``default``."""
        if config is None and env is None:
            from transplant.controller.config_file import load_config

            config = load_config()
        env = os.environ if env is None else env
        sources: dict[str, str] = {}

        def text_of(name: str, var: str, key: str) -> tuple[str, str]:
            """The setting's text (comma-separated for lists) and the name its errors give it."""
            if env.get(var, "").strip():
                sources[name] = f"environment ({var})"
                return env[var], var
            value = config.get(key) if config is not None else None
            if value is not None:
                sources[name] = "file"
                return (",".join(value) if isinstance(value, tuple) else value), config.label(key)
            sources[name] = "default"
            return "", var

        text, where = text_of("insecure", INSECURE_VAR, "registry.insecure")
        insecure = tuple(e.strip().lower() for e in text.split(",") if e.strip())
        for entry in insecure:
            if not _is_loopback(_hostname(entry)):
                raise RegistryError(f"{where}: {entry} is not a loopback address; only a registry on this "
                                    f"host (localhost, 127.0.0.0/8, ::1) may be spoken to without TLS",
                                    hint=f"give the registry a certificate (ca: names a private CA), or remove "
                                         f"{entry} from {where}")
        text, _ = text_of("token_hosts", TOKEN_HOSTS_VAR, "registry.token_hosts")
        hosts = tuple(e.strip().lower() for e in text.split(",") if e.strip())
        progress = PROGRESS_DEFAULT
        text, where = text_of("progress", PROGRESS_VAR, "registry.progress")
        text = text.strip()
        if text:
            least, _, seconds = text.partition("/")
            try:
                progress = (int(least), float(seconds))
                if progress[0] < 1 or not 0 < progress[1] < 86400:
                    raise ValueError
            except ValueError:
                raise RegistryError(f"{where}={text!r} is not BYTES/SECONDS (both positive)",
                                    hint=f"e.g. {where}=1024/30: at least 1 KiB every 30 s") from None
        return cls(insecure=insecure, token_hosts=hosts, progress=progress), sources

    def is_insecure(self, netloc: str) -> bool:
        """Whether ``host[:port]`` is a loopback registry the operator allows plain http to."""
        netloc = netloc.lower()
        return _is_loopback(_hostname(netloc)) and (netloc in self.insecure or _hostname(netloc) in self.insecure)


_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def parse_json(body: bytes, what: str, *, depth: int = JSON_DEPTH) -> Any:
    """Decode a registry's JSON answer, refusing one nested deeper than ``depth`` before decoding it
    (the decoder recurses once per level: 100,000 levels would end in a RecursionError).

    :raises RegistryError: not JSON, or nested too deep (the message names ``what``).
    """
    level = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b'""', body)):
        level += 1 if bracket in b"[{" else -1
        if level > deepest:
            deepest = level
            if deepest > depth:
                raise RegistryError(f"{what} is nested more than {depth} levels deep: refused (no registry "
                                    f"document is)", hint="check what answers at that address")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise RegistryError(f"{what} is not JSON", hint="check what answers at that address") from None


class _Progress:
    """A progress deadline for one answer: at least ``least`` bytes every ``seconds`` (the headers
    within the first interval), else its socket is shut down, which ends any read blocked on it.
    A per-read timeout alone lets a byte every few seconds keep a download open forever.
    """

    def __init__(self, least: int, seconds: float) -> None:
        self.least, self.seconds = least, seconds
        self.expired = False
        self.received = 0
        self._window = 0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._started = time.monotonic()
        threading.Thread(target=self._watch, daemon=True, name="registry-progress").start()

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._cut()

    def add(self, count: int) -> None:
        with self._lock:
            self._window += count
            self.received += count

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        start = self._started
        while not self._done.wait(min(1.0, self.seconds / 4)):
            now = time.monotonic()
            if now - start < self.seconds:
                continue
            with self._lock:
                if self._window < self.least:
                    self.expired = True
                    self._cut()
                    return
                self._window = 0
            start = now

    def _cut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def error(self, where: str, what: str) -> RegistryError:
        return RegistryError(f"{where}: {what} came slower than {self.least} bytes in {self.seconds:g} s "
                             f"({self.received} bytes in all): stopped",
                             hint=f"check the registry and the network; {PROGRESS_VAR}=BYTES/SECONDS sets the "
                                  f"least progress (default {PROGRESS_DEFAULT[0]}/{PROGRESS_DEFAULT[1]:g})")


def _watched(connection: type, request: urllib.request.Request):
    """A connection factory for ``do_open`` that hands the connected socket to the request's deadline."""
    progress = getattr(request, "transplant_progress", None)

    def factory(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        conn = connection(host, **kwargs)
        if progress is not None:
            plain = conn.connect

            def connect() -> None:
                plain()
                progress.attach(conn.sock)
            conn.connect = connect
        return conn
    return factory


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self._tls = context

    def https_open(self, req: urllib.request.Request):  # urllib's name
        return self.do_open(_watched(http.client.HTTPSConnection, req), req, context=self._tls)


class _HTTP(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request):  # urllib's name
        return self.do_open(_watched(http.client.HTTPConnection, req), req)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects (blob storage elsewhere) but never from https down to http; the
    redirected request keeps the progress deadline."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # urllib's name and signature
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if old.scheme == "https" and new.scheme != "https":
            raise RegistryError(f"{old.netloc}: {req.get_method()} {old.path} was redirected to {newurl}, which is "
                                f"not https: refused (a downgrade would let anyone on the path change the bytes)",
                                hint="the registry's storage must be served over https")
        out = super().redirect_request(req, fp, code, msg, headers, newurl)
        if out is not None:
            out.transplant_progress = getattr(req, "transplant_progress", None)
        return out


class _Answer:
    """An open answer: ``status``, ``headers``, bounded reads under the progress deadline; close it."""

    def __init__(self, response: Any, deadline: _Progress | None, where: str) -> None:
        self.response, self.progress, self.where = response, deadline, where
        self.status = response.status
        self.headers = response.headers

    def blocks(self, what: str):
        """Yield the body in blocks as they arrive (each at most 1 MiB).

        :raises RegistryError: the progress deadline passed, or the connection broke."""
        read = getattr(self.response, "read1", None) or self.response.read
        while True:
            try:
                block = read(_BLOCK)
            except (OSError, http.client.HTTPException) as exc:
                if self.progress is not None and self.progress.expired:
                    raise self.progress.error(self.where, what) from None
                raise RegistryError(f"{self.where}: {what} broke off ({exc})") from None
            if self.progress is not None:
                if self.progress.expired:
                    raise self.progress.error(self.where, what)
                self.progress.add(len(block))
            if not block:
                return
            yield block

    def read(self, limit: int, what: str) -> bytes:
        """The whole body, refused when it is (or says it is) larger than ``limit`` bytes.

        :raises RegistryError: larger than ``limit``, too slow, or broken off."""
        declared = self.headers.get("Content-Length") or ""
        if declared.isdigit() and int(declared) > limit:
            raise RegistryError(f"{self.where}: {what} is {declared} bytes, more than the {limit} transplant "
                                f"reads: refused", hint="check what answers at that address")
        data = bytearray()
        for block in self.blocks(what):
            data += block
            if len(data) > limit:
                raise RegistryError(f"{self.where}: {what} is larger than the {limit} bytes transplant reads: "
                                    f"refused", hint="check what answers at that address")
        return bytes(data)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.response.close()

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """One repository on one registry, authenticated lazily on the first 401.

    :param ca: a CA bundle (PEM) to verify the registry's certificate with; None: the system CAs.
    :param credentials: None: anonymous (a registry asking for credentials then gets a clear error).
    :param timeout: seconds for each request's connect and reads.
    :param settings: what the operator allows (plain http to a loopback registry, token hosts, the
        progress deadline); None: :meth:`Settings.from_env`.
    :raises RegistryError: the CA bundle cannot be read; bad settings in the environment.
    """

    def __init__(self, reference: Reference, *, ca: Path | None = None, credentials: Credentials | None = None,
                 timeout: float = 60.0, settings: Settings | None = None) -> None:
        self.ref = reference
        self.settings = settings if settings is not None else Settings.from_env()
        scheme = "http" if self.settings.is_insecure(reference.registry) else "https"
        self.base = f"{scheme}://{reference.registry}/v2/{reference.repository}"
        self.credentials = credentials
        self.timeout = timeout
        self.ca = ca
        try:
            self.context = ssl.create_default_context(cafile=str(ca) if ca else None)
        except (OSError, ssl.SSLError) as exc:
            raise RegistryError(f"the CA bundle {ca} cannot be read ({exc})",
                                hint="name a PEM file of CA certificates with ca:") from None
        # redirects (blob storage elsewhere) are followed, never down to http; Authorization is an
        # unredirected header, so it never leaves for the storage host
        self._opener = urllib.request.build_opener(_HTTPS(self.context), _HTTP(), _Redirects())
        self._auth: str | None = None
        self._scheme: str | None = None
        self.bytes_sent = 0
        self.bytes_received = 0

    # -- transport ---------------------------------------------------------------------------
    def _send(self, request: urllib.request.Request, *, watch: bool = True) -> _Answer:
        """Send one request under the progress deadline (``watch``; not for a streamed upload,
        whose answer waits for the whole body to be sent).

        :raises urllib.error.HTTPError: an error status (its body still readable, bounded).
        :raises RegistryError: too slow, unreachable, or redirected to http.
        """
        progress = _Progress(*self.settings.progress) if watch else None
        request.transplant_progress = progress  # type: ignore[attr-defined]  # read back by the handlers below, which get only the request
        where = self.ref.registry
        try:
            return _Answer(self._opener.open(request, timeout=self.timeout), progress, where)
        except urllib.error.HTTPError as exc:
            exc.transplant_progress = progress  # type: ignore[attr-defined]  # stopped by _drop
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            if progress is not None:
                progress.stop()
                if progress.expired:
                    raise progress.error(where, f"the answer to {request.get_method()} "
                                                f"{urllib.parse.urlsplit(request.full_url).path}") from None
            reason = getattr(exc, "reason", exc)
            raise RegistryError(f"{where}: cannot be reached ({reason})",
                                hint="check the address, the network, and the CA bundle (ca:) if it uses a "
                                     "private CA", unreachable=True) from None
        except BaseException:
            if progress is not None:
                progress.stop()
            raise

    def _open(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
              data: bytes | BinaryIO | None = None, ok: tuple[int, ...] = (200,), scope: str = "pull") -> _Answer:
        """One request, authenticated (a 401 is answered once); returns the open answer.

        :raises RegistryError: unreachable, too slow, or a status not in ``ok`` (the registry's error text in the message).
        """
        for attempt in (0, 1):
            request = urllib.request.Request(url, method=method, data=data)
            for key, value in (headers or {}).items():
                request.add_header(key, value)
            if self._auth:
                request.add_unredirected_header("Authorization", self._auth)
            try:
                answer = self._send(request, watch=not hasattr(data, "read"))
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 0 and exc.headers.get("WWW-Authenticate"):
                    _drop(exc)
                    self._authenticate(exc.headers["WWW-Authenticate"], scope)
                    if hasattr(data, "seek"):
                        data.seek(0)  # type: ignore[union-attr]  # hasattr just above
                    continue
                raise self._status_error(method, url, exc) from None
            if answer.status not in ok:
                answer.close()
                raise RegistryError(f"{self.ref.registry}: {method} {url} answered {answer.status}",
                                    status=answer.status)
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _status_error(self, method: str, url: str, exc: urllib.error.HTTPError) -> RegistryError:
        try:
            body = json.loads(exc.read(ERROR_LIMIT).decode("utf-8", "replace"))
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in body.get("errors", []))
        except (ValueError, AttributeError, OSError, RecursionError, http.client.HTTPException):
            detail = ""
        finally:
            _drop(exc)
        where = f"{self.ref.registry}/{self.ref.repository}"
        if exc.code == 401:
            who = f"the credentials from {self.credentials.source}" if self.credentials else "no credentials"
            return RegistryError(f"{where}: authentication failed with {who} ({detail or 'unauthorized'})",
                                 hint=f"log in (docker login {self.ref.registry}) or set {USER_VAR} and {PASSWORD_VAR}",
                                 status=401)
        if exc.code == 403:
            return RegistryError(f"{where}: {method} denied ({detail or 'forbidden'})",
                                 hint="ask for push/pull/delete rights on this repository", status=403)
        return RegistryError(f"{where}: {method} {urllib.parse.urlsplit(url).path} answered {exc.code}"
                             + (f" ({detail})" if detail else ""), status=exc.code)

    def _check_realm(self, realm: str) -> urllib.parse.SplitResult:
        """The token service's address, if credentials and tokens may go there: https (or a loopback
        registry configured insecure), and, when there are credentials, the registry's own host or
        one the operator allows (``TRANSPLANT_REGISTRY_TOKEN_HOSTS``), as docker and oras do.

        :raises RegistryError: the realm is not https, or another host with credentials to send."""
        parts = urllib.parse.urlsplit(realm)
        host = (parts.hostname or "").lower()
        where = self.ref.registry
        if not host or parts.scheme not in ("https", "http") or \
                (parts.scheme == "http" and not self.settings.is_insecure(parts.netloc)):
            raise RegistryError(f"{where}: the registry sends token requests to {realm!r}, which is not an https "
                                f"address: refused (credentials and tokens never go in clear text)",
                                hint=f"a loopback token service without TLS must be named in {INSECURE_VAR}",
                                status=401)
        if self.credentials is not None and host != _hostname(where) and host not in self.settings.token_hosts:
            raise RegistryError(f"{where}: the registry sends token requests to {host} ({realm}), another host: "
                                f"the credentials from {self.credentials.source} are not sent there",
                                hint=f"if {host} is this registry's token service, allow it: "
                                     f"export {TOKEN_HOSTS_VAR}={host}", status=401)
        return parts

    def _authenticate(self, header: str, scope: str) -> None:
        scheme, params = parse_challenge(header)
        if scheme == "basic":
            if self.credentials is None:
                raise RegistryError(f"{self.ref.registry}: the registry asks for credentials and none were found",
                                    hint=f"docker login {self.ref.registry}, or set {USER_VAR} and {PASSWORD_VAR}",
                                    status=401)
            self._scheme, self._auth = "basic", self.credentials.basic()
            return
        if scheme != "bearer" or not params.get("realm"):
            raise RegistryError(f"{self.ref.registry}: unsupported authentication challenge {header!r}", status=401)
        self._check_realm(params["realm"])
        query = {"service": params.get("service", ""),
                 "scope": params.get("scope") or f"repository:{self.ref.repository}:{scope}"}
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
        request = urllib.request.Request(url)
        if self.credentials is not None:
            request.add_unredirected_header("Authorization", self.credentials.basic())
        what = f"the token service {params['realm']}"
        try:
            with self._send(request) as answer:
                doc = parse_json(answer.read(TOKEN_LIMIT, "the token answer"), f"{self.ref.registry}: the token answer")
        except urllib.error.HTTPError as exc:
            raise self._status_error("token", url, exc) from None
        except RegistryError as exc:
            raise RegistryError(f"{self.ref.registry}: {what} failed ({exc.message})", hint=exc.hint,
                                unreachable=exc.unreachable) from None
        token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.ref.registry}: {what} returned no token")
        self._scheme, self._auth = "bearer", f"Bearer {token}"

    @property
    def scheme(self) -> str | None:
        """``basic`` or ``bearer`` once the registry asked for credentials; None before (or anonymous)."""
        return self._scheme

    def pull_authorization(self, *, fresh: bool = False) -> str | None:
        """The ``Authorization`` value a host script uses to pull (a bearer token, short-lived,
        scoped to pull; or basic credentials when the registry uses basic auth); None when
        anonymous pulls work. Obtained by one authenticated request (``GET /v2/.../tags/list``);
        ``fresh`` asks for a new token (the last one expired)."""
        if fresh and self._scheme == "bearer":
            self._auth = self._scheme = None
        if self._auth is None:
            try:
                self._open("GET", f"{self.base}/tags/list", ok=(200, 404)).close()
            except RegistryError as exc:
                if exc.status != 404:
                    raise
        return self._auth

    # -- blobs --------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """HEAD the blob: True when the registry has it."""
        try:
            self._open("HEAD", f"{self.base}/blobs/{digest}", ok=(200,), scope="pull,push").close()
            return True
        except RegistryError as exc:
            if exc.status == 404:
                return False
            raise

    def upload_blob(self, path: Path, digest: str) -> int:
        """Upload the file ``path`` as blob ``digest`` unless the registry has it (monolithic upload).

        :returns: bytes uploaded (0 when it was already there).
        :raises RegistryError: the upload was refused (a digest mismatch among them).
        """
        if self.has_blob(digest):
            return 0
        started = self._open("POST", f"{self.base}/blobs/uploads/", ok=(202,), scope="pull,push",
                             headers={"Content-Length": "0"}, data=b"")
        location = started.headers.get("Location") or ""
        started.close()
        url = urllib.parse.urljoin(self.base.split("/v2/", 1)[0] + "/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        size = path.stat().st_size
        with open(path, "rb") as body:
            self._open("PUT", url, data=body, ok=(201,), scope="pull,push",
                       headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)}).close()
        self.bytes_sent += size
        return size

    def read_blob(self, digest: str, *, size: int | None = None, limit: int = 64 << 20) -> bytes:
        """A small blob (a config) in memory, its digest checked.

        :param size: the descriptor's size in bytes: no more is read (None: up to ``limit``).
        :raises RegistryError: missing, larger than ``size`` or ``limit``, too slow, or its bytes do
            not hash to ``digest``.
        """
        if size is not None and size > limit:
            raise RegistryError(f"{self.ref}: blob {digest} is {size} bytes, more than the {limit} transplant reads "
                                f"into memory: refused", hint="push the snapshot again")
        with self._open("GET", f"{self.base}/blobs/{digest}") as answer:
            data = answer.read(limit if size is None else size, f"blob {digest}")
        self.bytes_received += len(data)
        check_digest(data, digest, f"{self.ref}: blob")
        return data

    def fetch_blob(self, digest: str, dest: Path, *, size: int | None = None, reporter: Reporter = QUIET) -> int:
        """Download blob ``digest`` to ``dest``, resuming a partial ``dest`` with a Range request,
        and verify its sha256; a blob that fails is removed.

        :param size: the descriptor's size in bytes: a registry sending more is cut off there and
            refused (None: not capped; the digest is still checked).
        :param reporter: its ``progress`` told (bytes of the blob in ``dest``, the blob's size in
            bytes; 0 when unknown) after each block.
        :returns: bytes received now.
        :raises RegistryError: unreachable, missing, too slow, larger than ``size``, or a digest
            mismatch (tampered or damaged).
        """
        have = dest.stat().st_size if dest.exists() else 0
        if size is not None and have > size:
            dest.unlink()
            have = 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        answer = self._open("GET", f"{self.base}/blobs/{digest}", headers=headers, ok=(200, 206))
        got = 0
        length = answer.headers.get("Content-Length") or ""
        start = have if answer.status == 206 else 0  # a 200 sends the whole blob again
        total = size if size is not None else (start + int(length) if length.isdigit() else 0)

        def too_large(amount: str) -> RegistryError:
            dest.unlink(missing_ok=True)
            return RegistryError(f"{self.ref}: blob {digest} {amount}, more than its descriptor's {size} bytes: "
                                 f"refused (nothing of it was used)", hint="push the snapshot again from its store; "
                                                                           "check what answers at that address")
        with answer, open(dest, "ab" if answer.status == 206 else "wb") as out:
            if size is not None and length.isdigit() and start + int(length) > size:
                raise too_large(f"is announced as {start + int(length)} bytes")
            try:
                for block in answer.blocks(f"blob {digest}"):
                    if size is not None and start + got + len(block) > size:
                        raise too_large("kept coming")
                    out.write(block)
                    got += len(block)
                    reporter.progress(start + got, total)
            finally:
                self.bytes_received += got
        found = "sha256:" + file_sha256(dest)
        if found != digest:
            dest.unlink()
            raise RegistryError(f"{self.ref}: blob {digest} arrived with the digest {found}: refused (tampered or "
                                f"damaged in the registry, or changed on the way)",
                                hint="push the snapshot again from its store; check the registry's storage")
        return got

    # -- manifests and tags -------------------------------------------------------------------
    def put_manifest(self, tag: str, body: bytes, media_type: str = MANIFEST_TYPE) -> str:
        """Upload a manifest under ``tag``; returns its digest (``sha256:<hex>`` of ``body``)."""
        self._open("PUT", f"{self.base}/manifests/{tag}", data=body, ok=(201,), scope="pull,push",
                   headers={"Content-Type": media_type, "Content-Length": str(len(body))}).close()
        self.bytes_sent += len(body)
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def get_manifest(self, version: str | None = None, *, limit: int = MANIFEST_LIMIT) -> tuple[dict[str, Any], str]:
        """The manifest named by ``version`` (a tag or digest; None: the reference's) and its digest.

        :param limit: the most bytes read (default 4 MiB, the distribution spec's manifest limit).
        :raises RegistryError: missing (404 names the reference), larger than ``limit``, too slow,
            not a JSON object (or nested too deep), or (for a digest) content that does not hash to it.
        """
        version = version or self.ref.version
        try:
            answer = self._open("GET", f"{self.base}/manifests/{version}", headers={"Accept": MANIFEST_TYPE})
        except RegistryError as exc:
            if exc.status == 404:
                raise RegistryError(f"{self.ref.registry}/{self.ref.repository}: no manifest {version}",
                                    hint=f"list the snapshots there: transplant snapshot --list --out "
                                         f"oci://{self.ref.registry}/{self.ref.repository}", status=404) from None
            raise
        with answer:
            body = answer.read(limit, f"the manifest {version}")
        self.bytes_received += len(body)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if version.startswith("sha256:"):
            check_digest(body, version, f"{self.ref}: manifest")
        doc = parse_json(body, f"{self.ref}: the manifest {version}")
        if not isinstance(doc, dict):
            raise RegistryError(f"{self.ref}: the manifest {version} is not a JSON object")
        return doc, digest

    def tags(self) -> list[str]:
        """The repository's tags (``[]`` when the repository does not exist).

        :raises RegistryError: as :meth:`get_manifest` (the answer read up to 4 MiB)."""
        try:
            with self._open("GET", f"{self.base}/tags/list") as answer:
                doc = parse_json(answer.read(TAGS_LIMIT, "the tag list"), f"{self.ref.registry}/{self.ref.repository}: "
                                                                          f"the tag list")
        except RegistryError as exc:
            if exc.status == 404:
                return []
            raise
        tags = doc.get("tags") if isinstance(doc, dict) else None
        return sorted(t for t in tags or [] if isinstance(t, str))

    def delete_manifest(self, digest: str) -> None:
        """Delete the manifest ``digest`` (and so every tag on it).

        :raises RegistryError: the registry has deletes disabled (405, with the fix), or refused.
        """
        try:
            self._open("DELETE", f"{self.base}/manifests/{digest}", ok=(202, 200), scope="pull,push,delete").close()
        except RegistryError as exc:
            if exc.status == 405 or (exc.status == 400 and "UNSUPPORTED" in exc.message):
                raise RegistryError(f"{self.ref.registry}: deleting manifests is disabled on this registry",
                                    hint="enable it (distribution: storage.delete.enabled: true; Harbor and cloud "
                                         "registries: a retention policy), or delete in the registry's interface",
                                    status=exc.status) from None
            raise


def _drop(exc: urllib.error.HTTPError) -> None:
    """Close an error answer and end its progress deadline."""
    progress = getattr(exc, "transplant_progress", None)
    if progress is not None:
        progress.stop()
    exc.close()

def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def check_digest(data: bytes, digest: str, what: str) -> None:
    """:raises RegistryError: ``data`` does not hash to ``digest`` (``sha256:<hex>``)."""
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    if found != digest:
        raise RegistryError(f"{what} {digest} arrived with the digest {found}: refused (tampered or damaged)",
                            hint="push the snapshot again from its store; check the registry's storage")
