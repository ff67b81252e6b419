"""Pull a snapshot's blobs straight from an OCI registry into a transaction's staging folder.

Runs on the target with its venv's python (``-I -S``, stdlib only, Python 3.9+). The JSON
request on standard input (never in argv or a file, since it may carry a credential):

* ``url``: ``https://REGISTRY/v2/REPOSITORY``; ``authorization``: the ``Authorization`` header
  value (a short-lived bearer token, or basic credentials) or null; ``ca``: PEM text of the
  CA bundle to trust, or null for the system CAs; ``timeout``: seconds per read.
* ``cache``: the folder for blobs on their way in (``<venv>/.transplant/blobs``): a blob is
  downloaded to ``<hex>.partial``, resumed from its size with ``Range: bytes=N-`` when a pull
  was interrupted, and checked against its sha256 before any byte is used; a blob that fails
  is deleted and refused. A used blob is deleted once its files are staged.
* ``dest``: the staging folder; ``blobs``: ``[{"digest", "size", "files": [[path, mode]]}]``, each
  blob an uncompressed tar whose members are venv-relative paths; only the listed members are
  written, at ``dest/path``. ``links``: ``[[path, target]]`` symlinks to create in ``dest``.
* ``progress``: ``[bytes, seconds]``: each answer must bring at least that many bytes in every
  such interval (its headers within the first), else its connection is cut and the pull stops
  (a per-read timeout alone lets a byte every few seconds hold a pull open forever).
  A blob is never read past its ``size``; a redirect from https to http is refused.
* ``stop_after``: testing hook: stop (as a dropped connection would) once that many bytes
  have been received in this run.

Reply: ``{"ok": true, "received", "resumed", "files", "blobs"}`` or ``{"ok": false, "error",
"unreachable", "refused"}`` (``unreachable``: no connection could be made, so the controller
may relay instead; ``refused``: a digest did not match).
"""

import hashlib
import http.client
import json
import os
import re
import posixpath
import socket
import ssl
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

BLOCK = 1 << 20


class Stop(Exception):
    pass


class Slow(Exception):
    pass


class TooLarge(ValueError):
    pass


class Progress:
    """At least ``least`` bytes every ``seconds`` on one answer, else its socket is shut down."""

    def __init__(self, least, seconds):
        self.least, self.seconds = least, seconds
        self.expired = False
        self.window = 0
        self.sock = None
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.started = time.monotonic()
        thread = threading.Thread(target=self.watch)
        thread.daemon = True
        thread.start()

    def attach(self, sock):
        with self.lock:
            self.sock = sock
            if self.expired:
                self.cut()

    def add(self, count):
        with self.lock:
            self.window += count

    def watch(self):
        start = self.started
        while not self.done.wait(min(1.0, self.seconds / 4.0)):
            now = time.monotonic()
            if now - start < self.seconds:
                continue
            with self.lock:
                if self.window < self.least:
                    self.expired = True
                    self.cut()
                    return
                self.window = 0
            start = now

    def cut(self):
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self):
        self.done.set()


def watched(connection, request):
    progress = getattr(request, "progress", None)

    def factory(host, **kwargs):
        conn = connection(host, **kwargs)
        if progress is not None:
            plain = conn.connect

            def connect():
                plain()
                progress.attach(conn.sock)
            conn.connect = connect
        return conn
    return factory


class HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, context):
        urllib.request.HTTPSHandler.__init__(self, context=context)
        self.tls = context

    def https_open(self, req):
        return self.do_open(watched(http.client.HTTPSConnection, req), req, context=self.tls)


class HTTP(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(watched(http.client.HTTPConnection, req), req)


class Redirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(req.full_url).scheme == "https" and urllib.parse.urlsplit(newurl).scheme != "https":
            raise ValueError("the registry redirected %s to %s, which is not https: refused (a downgrade would let "
                             "anyone on the path change the bytes)" % (urllib.parse.urlsplit(req.full_url).path, newurl))
        out = urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        if out is not None:
            out.progress = getattr(req, "progress", None)
        return out


def too_slow(deadline, what):
    return Slow("%s came slower than %d bytes in %g s: stopped" % (what, deadline.least, deadline.seconds))


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")

def inside(path):
    normal = posixpath.normpath(path)
    return not (path.startswith("/") or normal != path or normal == ".." or normal.startswith("../"))


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def fetch(req, opener, blob, state):
    """Download one blob to the cache (resuming), verify it; returns its path."""
    hexa = blob["digest"].split(":", 1)[1]
    final = os.path.join(req["cache"], hexa)
    if os.path.exists(final) and sha256_of(final) == blob["digest"]:
        state["cached"] += 1
        return final
    partial = final + ".partial"
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    if have > blob["size"]:
        os.unlink(partial)
        have = 0
    request = urllib.request.Request(req["url"] + "/blobs/" + blob["digest"])
    if req.get("authorization"):
        request.add_unredirected_header("Authorization", req["authorization"])
    if have:
        request.add_header("Range", "bytes=%d-" % have)
    if have < blob["size"] or blob["size"] == 0:
        least, seconds = req.get("progress") or (1024, 30)
        progress = Progress(int(least), float(seconds))
        request.progress = progress
        what = "blob %s" % blob["digest"]
        try:
            try:
                response = opener.open(request, timeout=req.get("timeout") or 60)
            except (OSError, http.client.HTTPException):
                if progress.expired:
                    raise too_slow(progress, "the answer for " + what) from None
                raise
            start = have if response.status == 206 else 0  # a 200 sends the whole blob again
            if start:
                state["resumed"] += have
            length = response.headers.get("Content-Length") or ""
            read = getattr(response, "read1", None) or response.read
            with response, open(partial, "ab" if start else "wb") as out:
                if length.isdigit() and start + int(length) > blob["size"]:
                    raise TooLarge("%s is announced as %d bytes, more than its descriptor's %d: refused"
                                   % (what, start + int(length), blob["size"]))
                got = start
                while True:
                    try:
                        block = read(BLOCK)
                    except (OSError, http.client.HTTPException):
                        if progress.expired:
                            raise too_slow(progress, what) from None
                        raise
                    if progress.expired:
                        raise too_slow(progress, what)
                    if not block:
                        break
                    progress.add(len(block))
                    if got + len(block) > blob["size"]:
                        raise TooLarge("%s kept coming past its descriptor's %d bytes: refused" % (what, blob["size"]))
                    limit = req.get("stop_after")
                    if limit is not None and state["received"] + len(block) >= limit:
                        keep = max(0, limit - state["received"])
                        out.write(block[:keep])
                        state["received"] += keep
                        raise Stop()
                    out.write(block)
                    got += len(block)
                    state["received"] += len(block)
        except TooLarge:
            os.unlink(partial)
            raise
        finally:
            progress.stop()
    found = sha256_of(partial)
    if found != blob["digest"]:
        os.unlink(partial)
        raise ValueError("blob %s arrived with the digest %s: refused (tampered or damaged in the registry, "
                         "or changed on the way)" % (blob["digest"], found))
    os.replace(partial, final)
    return final


def extract(path, blob, dest):
    wanted = {p: m for p, m in blob["files"]}
    written = 0
    with tarfile.open(path, "r:") as tar:
        for member in tar:
            if member.name not in wanted or not member.isfile():
                continue
            target = os.path.join(dest, member.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            source = tar.extractfile(member)
            with open(target, "wb") as out:
                for block in iter(lambda: source.read(BLOCK), b""):  # noqa: B023 - used up in this iteration
                    out.write(block)
            os.chmod(target, wanted[member.name] & 0o777)
            written += 1
            del wanted[member.name]
    if wanted:
        raise ValueError("blob %s lacks %s" % (blob["digest"], ", ".join(sorted(wanted)[:5])))
    return written


def main():
    req = json.loads(sys.stdin.read())
    state = {"received": 0, "resumed": 0, "cached": 0, "files": 0}
    for blob in req["blobs"]:
        if not isinstance(blob.get("digest"), str) or not _DIGEST.match(blob["digest"]):
            # the digest names a file in the cache folder: only the OCI sha256 form is taken
            print(json.dumps({"ok": False, "error": "refusing the blob digest %r: not sha256:<64 hex>" % blob.get("digest")}))
            return
        if type(blob.get("size")) is not int or blob["size"] < 0:
            # the size caps the download: without one a registry could send without end
            print(json.dumps({"ok": False, "error": "refusing the blob %s: its size %r is not a number of bytes"
                              % (blob["digest"], blob.get("size"))}))
            return
        for path, _mode in blob["files"]:
            if not inside(path):
                print(json.dumps({"ok": False, "error": "refusing the path %r: it leaves the venv" % path}))
                return
    os.makedirs(req["cache"], mode=0o700, exist_ok=True)
    context = ssl.create_default_context(cadata=req["ca"]) if req.get("ca") else ssl.create_default_context()
    opener = urllib.request.build_opener(HTTPS(context), HTTP(), Redirects())
    try:
        for blob in req["blobs"]:
            path = fetch(req, opener, blob, state)
            state["files"] += extract(path, blob, req["dest"])
            os.unlink(path)
        for path, target in req.get("links") or []:
            if not inside(path):
                raise ValueError("refusing the link %r: it leaves the venv" % path)
            full = os.path.join(req["dest"], path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            os.symlink(target, full)
            state["files"] += 1
    except Stop:
        print(json.dumps(dict(state, ok=False, error="the pull stopped part-way (testing hook)", interrupted=True)))
        return
    except Slow as exc:
        print(json.dumps(dict(state, ok=False, error=str(exc), interrupted=True)))
        return
    except urllib.error.HTTPError as exc:
        print(json.dumps(dict(state, ok=False, error="the registry answered %s %s" % (exc.code, exc.reason),
                              status=exc.code)))
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        unreachable = isinstance(exc, urllib.error.URLError) and state["received"] == 0
        print(json.dumps(dict(state, ok=False, error="cannot reach the registry (%s)" % (reason,)
                              if unreachable else str(exc), unreachable=unreachable)))
        return
    except (ValueError, tarfile.TarError) as exc:
        print(json.dumps(dict(state, ok=False, error=str(exc), refused=True)))
        return
    print(json.dumps(dict(state, ok=True, blobs=len(req["blobs"]))))


main()
