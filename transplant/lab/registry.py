"""A real OCI registry on loopback for the tests (edge): Debian's ``docker-registry``.

:class:`LabRegistry` writes a self-signed certificate (``openssl``) for ``localhost`` and its
address, an htpasswd file with one bcrypt user (``htpasswd -B``), and a config YAML with
filesystem storage in its own folder and deletes enabled, then runs
``/usr/bin/docker-registry serve CONFIG`` on ``ADDRESS:PORT`` until :meth:`LabRegistry.stop`.

Needs ``docker-registry`` and ``apache2-utils`` (``scripts/setup`` installs them).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import yaml

from ..errors import TransplantError

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
    deletes enabled unless ``delete`` is False.

    :ivar host: ``localhost:PORT``, as an ``oci://`` reference names it.
    """

    def __init__(self, folder: Path, *, address: str = "127.0.0.1", user: str = "lab", password: str = "lab-secret",
                 delete: bool = True):
        self.folder = folder
        self.address = address
        self.port = _free_port(address)
        self.host = f"localhost:{self.port}"
        self.user, self.password = user, password
        self.ca = folder / "cert.pem"
        self.storage = folder / "storage"
        self.delete = delete
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
        config = {
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": self.delete}},
            "http": {"addr": f"{self.address}:{self.port}", "tls": {"certificate": str(self.ca), "key": str(key)}},
            "auth": {"htpasswd": {"realm": "transplant-lab", "path": str(htpasswd)}},
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

    def stop(self) -> None:
        """Stop the registry (its storage stays in ``folder``)."""
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
