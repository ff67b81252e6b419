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
* ``stop_after``: testing hook: stop (as a dropped connection would) once that many bytes
  have been received in this run.

Reply: ``{"ok": true, "received", "resumed", "files", "blobs"}`` or ``{"ok": false, "error",
"unreachable", "refused"}`` (``unreachable``: no connection could be made, so the controller
may relay instead; ``refused``: a digest did not match).
"""

import hashlib
import json
import os
import re
import posixpath
import ssl
import sys
import tarfile
import urllib.error
import urllib.request

BLOCK = 1 << 20


class Stop(Exception):
    pass


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
        response = opener.open(request, timeout=req.get("timeout") or 60)
        mode = "ab" if response.status == 206 else "wb"
        if mode == "ab":
            state["resumed"] += have
        with response, open(partial, mode) as out:
            for block in iter(lambda: response.read(BLOCK), b""):
                limit = req.get("stop_after")
                if limit is not None and state["received"] + len(block) >= limit:
                    keep = max(0, limit - state["received"])
                    out.write(block[:keep])
                    state["received"] += keep
                    raise Stop()
                out.write(block)
                state["received"] += len(block)
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
                for block in iter(lambda: source.read(BLOCK), b""):
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
        for path, _mode in blob["files"]:
            if not inside(path):
                print(json.dumps({"ok": False, "error": "refusing the path %r: it leaves the venv" % path}))
                return
    os.makedirs(req["cache"], mode=0o700, exist_ok=True)
    context = ssl.create_default_context(cadata=req["ca"]) if req.get("ca") else ssl.create_default_context()
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
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
