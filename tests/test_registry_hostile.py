"""Registries out to break transplant: real loopback HTTP(S) servers (http.server in a thread on
127.0.0.x) that answer as a hostile or broken registry would. A token realm that is not https or
on another host, an endless blob, a trickle, a 400 MB answer, a 100,000-deep JSON document and a
redirect from https to http: each is refused with a clear error, on the controller (the registry
client, the relay path's download) and in the target's own pull script (``remote/oci_pull.py``,
run as the target runs it), with nothing written where the files were to go."""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.donor.oci import Client, Credentials, Reference, RegistryError, Settings, parse_json

PULL = Path(__file__).resolve().parent.parent / "transplant" / "remote" / "oci_pull.py"
FAST = Settings(progress=(64, 1.0))  # a short progress deadline keeps the trickle tests fast
CREDS = Credentials("lab", "s3cret", "the test")


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> Path:
    """A self-signed certificate for localhost, 127.0.0.1 and 127.0.0.2 (its key beside it, ``key.pem``)."""
    folder = tmp_path_factory.mktemp("hostile-tls")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(crt),
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:127.0.0.2"], check=True, capture_output=True)
    return crt


@pytest.fixture(autouse=True)
def _own_state(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker"))
    for name in ("TRANSPLANT_REGISTRY_INSECURE", "TRANSPLANT_REGISTRY_TOKEN_HOSTS", "TRANSPLANT_REGISTRY_PROGRESS",
                 "TRANSPLANT_REGISTRY_USER", "TRANSPLANT_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


class Server:
    """A real HTTP(S) server on ``address`` answering every request with ``serve(handler)`` (TLS with
    ``cert`` and the ``key.pem`` beside it); ``seen`` records (method, path, headers) of each request, ``sent`` the body bytes written."""

    def __init__(self, serve: Callable[[BaseHTTPRequestHandler], None], *, cert: Path | None = None,
                 address: str = "127.0.0.1"):
        self.serve, self.cert, self.address = serve, cert, address
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.sent = 0

    def __enter__(self) -> Server:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def handle_one(self) -> None:
                owner.seen.append((self.command, self.path, dict(self.headers)))
                try:
                    owner.serve(self)
                except (OSError, ssl.SSLError):
                    pass  # the client hung up: what these tests want

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = handle_one  # http.server names

        self.httpd = ThreadingHTTPServer((self.address, 0), Handler)
        self.httpd.daemon_threads = True
        if self.cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.cert), str(self.cert.with_name("key.pem")))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"{'https' if self.cert else 'http'}://{self.address}:{self.port}"

    @property
    def registry(self) -> str:
        """``host:port`` as an ``oci://`` reference names it."""
        return f"{'localhost' if self.address == '127.0.0.1' else self.address}:{self.port}"

    def write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(data)
        handler.wfile.flush()
        self.sent += len(data)


def answer(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", **headers: str) -> None:
    handler.send_response(status)
    for key, value in headers.items():
        handler.send_header(key.replace("_", "-"), value)
    if "Content_Length" not in headers:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def client(server: Server, cert: Path, *, credentials: Credentials | None = CREDS,
           settings: Settings = FAST) -> Client:
    return Client(Reference.parse(f"oci://{server.registry}/lab/snaps:v1"), ca=cert, credentials=credentials,
                  settings=settings)


def pull(server: Server, cert: Path, tmp_path: Path, blob: bytes, *, size: int | None = None,
         progress=(64, 1.0)) -> dict:
    """Run the target's pull script as apply runs it (``-I``, the request on standard input)."""
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    request = {"url": f"https://{server.registry}/v2/lab/snaps", "authorization": "Bearer t", "ca": cert.read_text(),
               "timeout": 30, "progress": list(progress), "cache": str(tmp_path / "cache"),
               "dest": str(tmp_path / "dest"),
               "blobs": [{"digest": digest, "size": len(blob) if size is None else size,
                          "files": [["lib/x.py", 0o644]]}], "links": []}
    done = subprocess.run([sys.executable, "-I", "-S", str(PULL)], input=json.dumps(request), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").iterdir()), "no file was staged"
    left = [p for p in (tmp_path / "cache").glob("*") if not p.name.endswith(".partial")]
    assert left == [], "no blob was kept as verified"


# -- 2: credentials only to allowed token realms, only over https -------------------------------

def test_a_token_realm_over_http_gets_no_credentials(cert, tmp_path, capsys, monkeypatch):
    with Server(lambda h: answer(h, 200, b'{"token": "stolen"}')) as realm, \
            Server(lambda h: answer(h, 401, WWW_Authenticate=f'Bearer realm="{realm.url}/token",service="r"'),
                   cert=cert) as registry:
        with pytest.raises(RegistryError) as info:
            client(registry, cert).get_manifest()
        assert "which is not an https address: refused" in info.value.message
        assert realm.seen == [], "the realm was not asked anything: no credentials went in clear text"

        # the same through the command line: a clear error, no traceback
        monkeypatch.setenv("TRANSPLANT_REGISTRY_USER", "lab")
        monkeypatch.setenv("TRANSPLANT_REGISTRY_PASSWORD", "s3cret")
        assert main(["snapshot", "--list", "--out", f"oci://{registry.registry}/lab/snaps", "--ca", str(cert)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "not an https address" in out and "Traceback" not in out and "s3cret" not in out
        assert realm.seen == []


def test_a_token_realm_on_another_host_gets_credentials_only_when_allowed(cert, tmp_path, monkeypatch):
    tokens = []

    def token_service(h: BaseHTTPRequestHandler) -> None:
        tokens.append(h.headers.get("Authorization"))
        answer(h, 200, b'{"token": "good"}')

    def registry_answer(h: BaseHTTPRequestHandler) -> None:
        if h.headers.get("Authorization") == "Bearer good":
            answer(h, 200, b'{"tags": ["v1"]}')
        else:
            answer(h, 401, WWW_Authenticate=f'Bearer realm="https://127.0.0.2:{realm.port}/token",service="r"')

    with Server(token_service, cert=cert, address="127.0.0.2") as realm, \
            Server(registry_answer, cert=cert) as registry:
        with pytest.raises(RegistryError) as info:
            client(registry, cert).tags()
        assert "another host: the credentials from the test are not sent there" in info.value.message
        assert "TRANSPLANT_REGISTRY_TOKEN_HOSTS=127.0.0.2" in info.value.hint
        assert realm.seen == []
        # the operator allows that host: the credentials go there (over https), the token to the registry
        allowed = Settings(token_hosts=("127.0.0.2",), progress=FAST.progress)
        assert client(registry, cert, settings=allowed).tags() == ["v1"]
        assert tokens == ["Basic " + base64.b64encode(b"lab:s3cret").decode()]
        # anonymous: nothing secret to send, so another https host may hand out an anonymous token
        assert client(registry, cert, credentials=None).tags() == ["v1"]
        assert tokens[-1] is None


def test_plain_http_only_for_a_loopback_registry_the_operator_names(cert, tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_REGISTRY_INSECURE", "registry.example:5000")
    with pytest.raises(RegistryError) as info:
        Settings.from_env()
    assert "registry.example:5000 is not a loopback address" in info.value.message
    seen = []

    def registry_answer(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.headers.get("Authorization"))
        if h.headers.get("Authorization"):
            answer(h, 200, b'{"tags": ["v1"]}')
        else:
            answer(h, 401, WWW_Authenticate='Basic realm="lab"')

    with Server(registry_answer) as registry:  # no TLS
        monkeypatch.setenv("TRANSPLANT_REGISTRY_INSECURE", registry.registry)
        plain = Client(Reference.parse(f"oci://{registry.registry}/lab/snaps:v1"), credentials=CREDS)
        assert plain.base.startswith("http://") and plain.tags() == ["v1"]
        assert seen[-1] == CREDS.basic()
        monkeypatch.setenv("TRANSPLANT_REGISTRY_INSECURE", "")
        assert client(registry, cert).base.startswith("https://"), "not named: https, as always"


# -- 3: a blob is read no further than its descriptor's size -----------------------------------

def endless(server_box: list) -> Callable[[BaseHTTPRequestHandler], None]:
    def serve(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()  # no Content-Length: the body ends when the connection does (never)
        while True:
            server_box[0].write(h, b"x" * 65536)
    return serve


def test_an_endless_blob_is_cut_at_its_size_on_the_controller(cert, tmp_path):
    box: list = []
    blob = b"y" * 5000
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with Server(endless(box), cert=cert) as registry:
        box.append(registry)
        dest = tmp_path / "blob.tar"
        with pytest.raises(RegistryError) as info:
            client(registry, cert).fetch_blob(digest, dest, size=len(blob))
        assert "kept coming, more than its descriptor's 5000 bytes: refused" in info.value.message
        assert not dest.exists(), "nothing of it was kept"
        assert registry.sent < 64 << 20, "the download stopped at the size, not at the end of the disk"


def test_a_blob_announced_larger_than_its_descriptor_is_refused_before_reading(cert, tmp_path):
    def serve(h: BaseHTTPRequestHandler) -> None:
        answer(h, 200, Content_Length=str(400 << 20))
        for _ in range(100):
            h.wfile.write(b"z" * 65536)

    blob = b"y" * 5000
    with Server(serve, cert=cert) as registry:
        dest = tmp_path / "blob.tar"
        with pytest.raises(RegistryError, match="is announced as 419430400 bytes, more than its descriptor's 5000"):
            client(registry, cert).fetch_blob("sha256:" + hashlib.sha256(blob).hexdigest(), dest, size=5000)
        assert not dest.exists()
        reply = pull(registry, cert, tmp_path, blob)
        assert reply["ok"] is False and reply["refused"] is True
        assert "announced as 419430400 bytes, more than its descriptor's 5000" in reply["error"]
        nothing_written(tmp_path)
        assert not list((tmp_path / "cache").glob("*")), "the refused blob is not kept"


def test_an_endless_blob_is_cut_at_its_size_on_the_target(cert, tmp_path):
    box: list = []
    with Server(endless(box), cert=cert) as registry:
        box.append(registry)
        started = time.monotonic()
        reply = pull(registry, cert, tmp_path, b"y" * 5000)
        assert reply["ok"] is False and reply["refused"] is True and reply.get("unreachable") is not True
        assert "kept coming past its descriptor's 5000 bytes: refused" in reply["error"]
        assert time.monotonic() - started < 60
        nothing_written(tmp_path)
        assert not list((tmp_path / "cache").glob("*")), "the partial blob was deleted"
        assert reply["received"] <= 5000


# -- 4: a progress deadline, not only a per-read timeout ----------------------------------------

def trickle(body: bytes, *, length: int | None = None) -> Callable[[BaseHTTPRequestHandler], None]:
    """Answer 200 and then one byte every half second (a per-read timeout never fires)."""
    def serve(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        for byte in body[:60]:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.5)
    return serve


@pytest.mark.parametrize("what", ["blob", "manifest", "tags", "token"])
def test_a_trickling_registry_is_stopped_by_the_progress_deadline(cert, tmp_path, what):
    body = json.dumps({"tags": ["v1"], "token": "t", "schemaVersion": 2, "pad": "p" * 500}).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if what == "token":
        def serve(h: BaseHTTPRequestHandler) -> None:
            if h.path.startswith("/token"):
                trickle(body)(h)
            else:
                answer(h, 401, WWW_Authenticate=f'Bearer realm="https://localhost:{h.server.server_address[1]}/token"')
    else:
        serve = trickle(body)
    with Server(serve, cert=cert) as registry:
        c = client(registry, cert)
        started = time.monotonic()
        with pytest.raises(RegistryError) as info:
            if what == "blob":
                c.fetch_blob(digest, tmp_path / "blob", size=len(body))
            elif what == "manifest":
                c.get_manifest()
            else:
                c.tags()
        took = time.monotonic() - started
        assert "came slower than 64 bytes in 1 s" in info.value.message and "stopped" in info.value.message
        assert "TRANSPLANT_REGISTRY_PROGRESS" in info.value.hint
        assert took < 10, f"stopped after {took:.1f} s, not after the 30 s the trickle lasts"


def test_a_trickle_of_headers_is_stopped_too(cert, tmp_path):
    def serve(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(60):
            h.wfile.write(b"X: y\r\n")
            h.wfile.flush()
            time.sleep(0.5)

    with Server(serve, cert=cert) as registry:
        started = time.monotonic()
        with pytest.raises(RegistryError, match="came slower than 64 bytes in 1 s"):
            client(registry, cert).get_manifest()
        assert time.monotonic() - started < 10


def test_a_trickling_blob_is_stopped_on_the_target(cert, tmp_path):
    blob = b"q" * 5000
    with Server(trickle(blob), cert=cert) as registry:
        started = time.monotonic()
        reply = pull(registry, cert, tmp_path, blob)
        assert time.monotonic() - started < 20
        assert reply["ok"] is False and reply.get("unreachable") is not True
        assert "came slower than 64 bytes in 1 s: stopped" in reply["error"]
        nothing_written(tmp_path)


def test_a_bad_progress_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRANSPLANT_REGISTRY_PROGRESS", "fast")
    with pytest.raises(RegistryError) as info:
        Settings.from_env()
    assert "is not BYTES/SECONDS" in info.value.message and "1024/30" in info.value.hint
    monkeypatch.setenv("TRANSPLANT_REGISTRY_PROGRESS", "4096/10")
    assert Settings.from_env().progress == (4096, 10.0)


# -- 5: bounded reads of manifests, tags and token answers --------------------------------------

@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("what", ["manifest", "tags", "token"])
def test_a_huge_answer_is_refused_not_read_whole(cert, tmp_path, what, declared):
    box: list = []

    def huge(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        if declared:
            h.send_header("Content-Length", str(400 << 20))
        h.end_headers()
        for _ in range((400 << 20) // 65536):
            box[0].write(h, b" " * 65536)

    def serve(h: BaseHTTPRequestHandler) -> None:
        if what != "token" or h.path.startswith("/token"):
            huge(h)
        else:
            answer(h, 401, WWW_Authenticate=f'Bearer realm="https://localhost:{h.server.server_address[1]}/token"')

    with Server(serve, cert=cert) as registry:
        box.append(registry)
        c = client(registry, cert, settings=Settings())
        with pytest.raises(RegistryError) as info:
            c.get_manifest() if what == "manifest" else c.tags()
        limit = 1 << 20 if what == "token" else 4 << 20
        assert ("is 419430400 bytes, more than the" if declared else "is larger than the") in info.value.message
        assert f"{limit} bytes" in info.value.message or f"the {limit} transplant" in info.value.message
        assert registry.sent < 64 << 20, "the answer was not read whole"


# -- 6: deep JSON is a clear error, not a RecursionError ----------------------------------------

def test_deep_json_from_a_registry_is_a_clear_error(cert, tmp_path, capsys):
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(RegistryError, match="nested more than 64 levels deep"):
        parse_json(deep, "it")
    assert parse_json(b'{"a": "' + b"[" * 100 + b'\\"{"}', "it") == {"a": "[" * 100 + '"{'}, \
        "brackets inside strings (escaped quotes too) are text"

    def serve(h: BaseHTTPRequestHandler) -> None:
        if "/tags/" in h.path:
            answer(h, 200, b'{"tags": ["v1"]}')
        elif h.path.startswith("/token"):
            answer(h, 200, deep)
        elif h.headers.get("Authorization"):
            answer(h, 200, b'{"tags": ' + deep + b"}")
        else:
            answer(h, 200, deep)

    with Server(serve, cert=cert) as registry:
        with pytest.raises(RegistryError, match="the manifest v1 is nested more than 64 levels deep"):
            client(registry, cert).get_manifest()
        assert main(["snapshot", "--list", "--out", f"oci://{registry.registry}/lab/snaps", "--ca", str(cert)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "nested more than 64 levels deep" in out and "RecursionError" not in out and "Traceback" not in out

    def token_challenge(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/token"):
            answer(h, 200, deep)
        elif h.headers.get("Authorization"):
            answer(h, 200, b'{"tags": ' + deep + b"}")
        else:
            answer(h, 401, WWW_Authenticate=f'Bearer realm="https://localhost:{h.server.server_address[1]}/token"')

    with Server(token_challenge, cert=cert) as registry:
        with pytest.raises(RegistryError, match="the token answer is nested more than 64 levels deep"):
            client(registry, cert).tags()


# -- 7: no redirect from https down to http -----------------------------------------------------

def test_a_redirect_from_https_to_http_is_refused_on_the_controller_and_the_target(cert, tmp_path):
    blob = b"r" * 5000
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with Server(lambda h: answer(h, 200, blob)) as storage, \
            Server(lambda h: answer(h, 307, Location=f"{storage.url}/data{h.path}"), cert=cert) as registry:
        dest = tmp_path / "blob.tar"
        with pytest.raises(RegistryError) as info:
            client(registry, cert).fetch_blob(digest, dest, size=len(blob))
        assert f"was redirected to {storage.url}/data" in info.value.message and "not https: refused" in info.value.message
        with pytest.raises(RegistryError, match="not https: refused"):
            client(registry, cert).get_manifest()
        reply = pull(registry, cert, tmp_path, blob)
        assert reply["ok"] is False and reply["refused"] is True and reply.get("unreachable") is not True
        assert "which is not https: refused" in reply["error"]
        nothing_written(tmp_path)
        assert storage.seen == [], "the http address was never asked"


def tar_of(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_redirect_to_another_https_host_still_works_and_keeps_the_credential_home(cert, tmp_path):
    blob = tar_of({"lib/x.py": b"X = 1\n"})
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with Server(lambda h: answer(h, 200, blob), cert=cert, address="127.0.0.2") as storage, \
            Server(lambda h: answer(h, 307, Location=f"{storage.url}/data{h.path}"), cert=cert) as registry:
        reply = pull(registry, cert, tmp_path, blob)
        assert reply["ok"] is True, reply
        assert (tmp_path / "dest" / "lib" / "x.py").read_bytes() == b"X = 1\n"
        assert storage.seen and "Authorization" not in storage.seen[0][2], "the credential stayed with the registry"
        dest = tmp_path / "blob.tar"
        assert client(registry, cert).fetch_blob(digest, dest, size=len(blob)) == len(blob)
        assert dest.read_bytes() == blob
