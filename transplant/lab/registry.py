"""A real OCI registry on loopback for the tests (edge): Debian's ``docker-registry``.

:class:`LabRegistry` writes a self-signed certificate (``openssl``) for ``localhost`` and its
address, an htpasswd file with one bcrypt user (``htpasswd -B``), and a config YAML with
filesystem storage in its own folder and deletes enabled, then runs
``/usr/bin/docker-registry serve CONFIG`` on ``ADDRESS:PORT`` until :meth:`LabRegistry.stop`.

Needs ``docker-registry`` and ``apache2-utils`` (``scripts/setup`` installs them).
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from transplant.errors import TransplantError

__all__ = ["LabRegistry", "registry_skip_reason", "REGISTRY_HINT"]

REGISTRY_HINT = "apt-get install docker-registry apache2-utils (scripts/setup installs them)"
BINARY = "/usr/bin/docker-registry"


def registry_skip_reason() -> str | None:
    """Why the lab registry cannot start here (its programs are missing); None when it can."""
    for program in (BINARY, shutil.which("htpasswd"), shutil.which("openssl")):
        if program is None or not Path(program).exists():
            return f"the lab registry needs docker-registry, htpasswd and openssl: {REGISTRY_HINT}"
    return None


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


class LabRegistry:
    """One registry: TLS (``ca``: the certificate to trust), htpasswd auth (``user``/``password``),
    storage under ``folder/storage`` (``blob_path`` names a blob's data file there), manifest
    deletes enabled unless ``delete`` is False. With ``token`` the registry uses the Docker token
    flow instead of basic auth: a token server (:meth:`_serve_tokens`, on the same address)
    checks the user's password and issues RS256 JWTs (``x5c``: the TLS certificate, which the
    registry trusts as its ``rootcertbundle``) granting what the scope asks.

    :ivar host: ``localhost:PORT``, as an ``oci://`` reference names it.
    """

    def __init__(self, folder: Path, *, address: str = "127.0.0.1", user: str = "lab", password: str = "lab-secret",
                 delete: bool = True, token: bool = False):
        self.folder = folder
        self.address = address
        self.port = _free_port(address)
        self.host = f"localhost:{self.port}"
        self.user, self.password = user, password
        self.ca = folder / "cert.pem"
        self.storage = folder / "storage"
        self.delete = delete
        self.token = token
        self.tokens_issued = 0
        self._token_server: ThreadingHTTPServer | None = None
        self._proc: subprocess.Popen | None = None

    def blob_path(self, digest: str) -> Path:
        """The data file of blob ``sha256:<hex>`` in the registry's storage."""
        hexa = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexa[:2] / hexa / "data"

    def start(self) -> LabRegistry:
        """Write the certificate, htpasswd and config, start the registry and wait until it answers.

        :raises TransplantError: a program is missing, or the registry exited or did not answer.
        """
        reason = registry_skip_reason()
        if reason:
            raise TransplantError(reason)
        self.folder.mkdir(parents=True, exist_ok=True)
        key = self.folder / "key.pem"
        if not self.ca.exists():
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(self.ca),
                            "-addext", f"subjectAltName=DNS:localhost,IP:{self.address}"],
                           check=True, capture_output=True)
        htpasswd = self.folder / "htpasswd"
        subprocess.run(["htpasswd", "-B", "-b", "-c", str(htpasswd), self.user, self.password],
                       check=True, capture_output=True)
        auth: dict = {"htpasswd": {"realm": "transplant-lab", "path": str(htpasswd)}}
        if self.token:
            realm = self._serve_tokens(key)
            auth = {"token": {"realm": realm, "service": "transplant-lab", "issuer": "transplant-lab-tokens",
                              "rootcertbundle": str(self.ca)}}
        config = {
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": self.delete}},
            "http": {"addr": f"{self.address}:{self.port}", "tls": {"certificate": str(self.ca), "key": str(key)}},
            "auth": auth,
        }
        (self.folder / "config.yml").write_text(yaml.safe_dump(config))
        log = open(self.folder / "registry.log", "ab")
        self._proc = subprocess.Popen([BINARY, "serve", str(self.folder / "config.yml")], stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        context = ssl.create_default_context(cafile=str(self.ca))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                text = (self.folder / "registry.log").read_text(errors="replace")[-2000:]
                raise TransplantError(f"the lab registry exited ({self._proc.returncode}): {text}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as raw, \
                        context.wrap_socket(raw, server_hostname="localhost"):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TransplantError(f"the lab registry did not answer on {self.address}:{self.port} within 15 s")

    def _serve_tokens(self, key: Path) -> str:
        """Start the token server (a thread, TLS with the registry's certificate); returns its realm URL."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding, rsa

        loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
        assert isinstance(loaded, rsa.RSAPrivateKey)  # made with -newkey rsa:2048; the tokens say RS256
        private: rsa.RSAPrivateKey = loaded
        chain = [base64.b64encode(x509.load_pem_x509_certificate(self.ca.read_bytes())
                                  .public_bytes(serialization.Encoding.DER)).decode()]
        lab = self

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # the http.server name
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                given = self.headers.get("Authorization", "")
                expected = "Basic " + base64.b64encode(f"{lab.user}:{lab.password}".encode()).decode()
                if given != expected:
                    self.send_response(401)
                    self.end_headers()
                    return
                access = []
                for scope in query.get("scope", []):
                    kind, name, actions = scope.split(":")
                    access.append({"type": kind, "name": name, "actions": actions.split(",")})
                now = int(time.time())
                claims = {"iss": "transplant-lab-tokens", "sub": lab.user, "aud": query.get("service", [""])[0],
                          "exp": now + 300, "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex, "access": access}
                head = b64(json.dumps({"alg": "RS256", "typ": "JWT", "x5c": chain}).encode())
                body = b64(json.dumps(claims).encode())
                signature = private.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
                token = f"{head}.{body}.{b64(signature)}"
                lab.tokens_issued += 1
                data = json.dumps({"token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer((self.address, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.ca), str(key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._token_server = server
        return f"https://localhost:{server.server_address[1]}/token"

    def stop(self) -> None:
        """Stop the registry (its storage stays in ``folder``)."""
        if self._token_server is not None:
            self._token_server.shutdown()
            self._token_server.server_close()
            self._token_server = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self) -> LabRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
