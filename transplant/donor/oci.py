"""A small client for OCI registries (edge): references, credentials, TLS, the distribution API.

The distribution API is plain HTTPS (the OCI distribution specification, v1.0/1.1):
``HEAD/GET /v2/<name>/blobs/<digest>`` (``Range: bytes=N-`` resumes), monolithic upload
(``POST /v2/<name>/blobs/uploads/`` then ``PUT <location>?digest=<digest>``),
``PUT/GET/DELETE /v2/<name>/manifests/<reference>`` and ``GET /v2/<name>/tags/list``.

Authentication as registries do it (the Docker token specification): a 401 carries
``WWW-Authenticate: Basic realm=...`` (the credentials are then sent as basic auth) or
``Bearer realm=...,service=...,scope=...`` (a token is asked of the realm, with the
credentials when there are any, and sent as ``Authorization: Bearer``). Credentials come
from ``TRANSPLANT_REGISTRY_USER``/``TRANSPLANT_REGISTRY_PASSWORD``, else from the Docker
credential file (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``: ``auths.<registry>.auth``,
base64 ``user:password``); credential helpers are reported as unsupported. TLS is verified
against the system CAs, or the CA bundle a manifest names. Stdlib only (urllib, ssl).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import ssl
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
           "is_oci", "MANIFEST_TYPE", "USER_VAR", "PASSWORD_VAR"]

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
USER_VAR = "TRANSPLANT_REGISTRY_USER"
PASSWORD_VAR = "TRANSPLANT_REGISTRY_PASSWORD"
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
    auths = doc.get("auths") if isinstance(doc.get("auths"), dict) else {}
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
    helpers = doc.get("credHelpers") if isinstance(doc.get("credHelpers"), dict) else {}
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


class Client:
    """One repository on one registry, authenticated lazily on the first 401.

    :param ca: a CA bundle (PEM) to verify the registry's certificate with; None: the system CAs.
    :param credentials: None: anonymous (a registry asking for credentials then gets a clear error).
    :param timeout: seconds for each request's connect and reads.
    """

    def __init__(self, reference: Reference, *, ca: Path | None = None, credentials: Credentials | None = None,
                 timeout: float = 60.0) -> None:
        self.ref = reference
        self.base = f"https://{reference.registry}/v2/{reference.repository}"
        self.credentials = credentials
        self.timeout = timeout
        self.ca = ca
        try:
            self.context = ssl.create_default_context(cafile=str(ca) if ca else None)
        except (OSError, ssl.SSLError) as exc:
            raise RegistryError(f"the CA bundle {ca} cannot be read ({exc})",
                                hint="name a PEM file of CA certificates with ca:") from None
        # redirects (blob storage elsewhere) are followed; Authorization is an unredirected header,
        # so it never leaves for the storage host
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.context))
        self._auth: str | None = None
        self._scheme: str | None = None
        self.bytes_sent = 0
        self.bytes_received = 0

    # -- transport ---------------------------------------------------------------------------
    def _open(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
              data: bytes | BinaryIO | None = None, ok: tuple[int, ...] = (200,), scope: str = "pull"):
        """One request, authenticated (a 401 is answered once); returns the open response.

        :raises RegistryError: unreachable, or a status not in ``ok`` (the registry's error text in the message).
        """
        for attempt in (0, 1):
            request = urllib.request.Request(url, method=method, data=data)
            for key, value in (headers or {}).items():
                request.add_header(key, value)
            if self._auth:
                request.add_unredirected_header("Authorization", self._auth)
            try:
                response = self._opener.open(request, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 0 and exc.headers.get("WWW-Authenticate"):
                    self._authenticate(exc.headers["WWW-Authenticate"], scope)
                    if hasattr(data, "seek"):
                        data.seek(0)  # type: ignore[union-attr]
                    continue
                raise self._status_error(method, url, exc) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise RegistryError(f"{self.ref.registry}: cannot be reached ({reason})",
                                    hint="check the address, the network, and the CA bundle (ca:) if it uses a "
                                         "private CA", unreachable=True) from None
            if response.status not in ok:
                response.close()
                raise RegistryError(f"{self.ref.registry}: {method} {url} answered {response.status}",
                                    status=response.status)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _status_error(self, method: str, url: str, exc: urllib.error.HTTPError) -> RegistryError:
        try:
            body = json.loads(exc.read().decode("utf-8", "replace"))
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in body.get("errors", []))
        except (ValueError, AttributeError, OSError):
            detail = ""
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
        query = {"service": params.get("service", ""),
                 "scope": params.get("scope") or f"repository:{self.ref.repository}:{scope}"}
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
        request = urllib.request.Request(url)
        if self.credentials is not None:
            request.add_unredirected_header("Authorization", self.credentials.basic())
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                doc = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise self._status_error("token", url, exc) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(f"{self.ref.registry}: the token service {params['realm']} failed ({exc})",
                                unreachable=isinstance(exc, (urllib.error.URLError, OSError))) from None
        token = doc.get("token") or doc.get("access_token")
        if not token:
            raise RegistryError(f"{self.ref.registry}: the token service {params['realm']} returned no token")
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
        url = urllib.parse.urljoin(f"https://{self.ref.registry}/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        size = path.stat().st_size
        with open(path, "rb") as body:
            self._open("PUT", url, data=body, ok=(201,), scope="pull,push",
                       headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)}).close()
        self.bytes_sent += size
        return size

    def read_blob(self, digest: str, *, limit: int = 64 << 20) -> bytes:
        """A small blob (a config) in memory, its digest checked.

        :raises RegistryError: missing, larger than ``limit``, or its bytes do not hash to ``digest``.
        """
        with self._open("GET", f"{self.base}/blobs/{digest}") as response:
            data = response.read(limit + 1)
        if len(data) > limit:
            raise RegistryError(f"{self.ref}: blob {digest} is larger than {limit} bytes")
        self.bytes_received += len(data)
        check_digest(data, digest, f"{self.ref}: blob")
        return data

    def fetch_blob(self, digest: str, dest: Path, *, reporter: Reporter = QUIET) -> int:
        """Download blob ``digest`` to ``dest``, resuming a partial ``dest`` with a Range request,
        and verify its sha256; a blob that fails is removed.

        :param reporter: its ``progress`` told (bytes of the blob in ``dest``, the blob's size in
            bytes; 0 when the registry does not say) after each block.
        :returns: bytes received now.
        :raises RegistryError: unreachable, missing, or a digest mismatch (tampered or damaged).
        """
        have = dest.stat().st_size if dest.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        response = self._open("GET", f"{self.base}/blobs/{digest}", headers=headers, ok=(200, 206))
        got = 0
        length = response.headers.get("Content-Length") or ""
        start = have if response.status == 206 else 0  # a 200 sends the whole blob again
        size = start + int(length) if length.isdigit() else 0
        with response, open(dest, "ab" if response.status == 206 else "wb") as out:
            for block in iter(lambda: response.read(_BLOCK), b""):
                out.write(block)
                got += len(block)
                reporter.progress(start + got, size)
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

    def get_manifest(self, version: str | None = None) -> tuple[dict[str, Any], str]:
        """The manifest named by ``version`` (a tag or digest; None: the reference's) and its digest.

        :raises RegistryError: missing (404 names the reference), not JSON, or (for a digest)
            content that does not hash to it.
        """
        version = version or self.ref.version
        try:
            response = self._open("GET", f"{self.base}/manifests/{version}", headers={"Accept": MANIFEST_TYPE})
        except RegistryError as exc:
            if exc.status == 404:
                raise RegistryError(f"{self.ref.registry}/{self.ref.repository}: no manifest {version}",
                                    hint=f"list the snapshots there: transplant snapshot --list --out "
                                         f"oci://{self.ref.registry}/{self.ref.repository}", status=404) from None
            raise
        with response:
            body = response.read()
        self.bytes_received += len(body)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if version.startswith("sha256:"):
            check_digest(body, version, f"{self.ref}: manifest")
        try:
            doc = json.loads(body)
        except ValueError:
            raise RegistryError(f"{self.ref}: the manifest {version} is not JSON") from None
        return doc, digest

    def tags(self) -> list[str]:
        """The repository's tags (``[]`` when the repository does not exist)."""
        try:
            with self._open("GET", f"{self.base}/tags/list") as response:
                doc = json.loads(response.read())
        except RegistryError as exc:
            if exc.status == 404:
                return []
            raise
        return sorted(doc.get("tags") or [])

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
