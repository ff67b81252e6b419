"""The one-time key of a direct pull, on the donor: authorise it for one pull, remove it after.

Run by the controller over its own connection to the donor (``python -I -S -c <this> OP``, a JSON
request on standard input, one JSON reply). Stdlib only, Python 3.9+.

* ``add`` ``{"id", "key", "python", "sender", "root", "compress", "digest", "expires"}``: writes the
  sender script (``sender``: stream_send's text) to ``<keys folder>/transplant-pull/<id>/send.py``
  and appends to the authorized_keys file one line::

      restrict,expiry-time="YYYYMMDDHHMMSSZ",command="exec PYTHON -I -S SEND ROOT --compress MODE
      --listing-sha256 DIGEST" KEY transplant-pull:<id>:<expires>

  ``restrict``: no pty, no forwarding of any kind, no ``~/.ssh/rc``; ``command``: whatever the
  client asks, sshd runs only that, a sender that reads (never writes) and serves only a list of
  paths whose sha256 is ``DIGEST`` (the planned files); ``expiry-time``: sshd refuses the key after
  ``expires`` even if nobody removes it.
* ``remove`` ``{"id"}``: removes that line and the sender's folder.

Both also remove every ``transplant-pull`` line whose expiry has passed (and its folder), edit the
file under an exclusive ``flock`` of a lock file beside it, write a temporary file and rename it
over the old one (same mode; a file another user could write, or a symlink, is refused), and
leave every other line byte for byte.

The authorized_keys file is ``$TRANSPLANT_AUTHORIZED_KEYS`` when set on the donor (a site whose
sshd reads another ``AuthorizedKeysFile``; the test hosts set it in their sshd_config), else
``~/.ssh/authorized_keys``.
"""

import fcntl
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time

MARK = "transplant-pull:"
_ID = re.compile(r"[0-9A-Za-z-]{8,64}\Z")
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_KEY = re.compile(r"ssh-ed25519 [A-Za-z0-9+/=]{40,100}\Z")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9_@%+=:,./ -]*\Z")


class Refused(Exception):
    pass


def _keys_file():
    chosen = os.environ.get("TRANSPLANT_AUTHORIZED_KEYS") or os.path.join(os.path.expanduser("~"), ".ssh",
                                                                          "authorized_keys")
    if not os.path.isabs(chosen):
        raise Refused("the authorized_keys path {!r} is not absolute".format(chosen))
    return chosen


def _quote(text):
    if not _SAFE_PATH.match(text):
        raise Refused("refused: {!r} cannot be named in a forced command".format(text))
    return "'" + text + "'"


def _check_own(path):
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise Refused("refused: {} is a symlink or not a regular file".format(path))
    if info.st_uid not in (os.geteuid(), 0) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused("refused: {} can be written by another user (owner uid {}, mode {:04o})".format(
            path, info.st_uid, stat.S_IMODE(info.st_mode)))
    return info


def _expired(line, now):
    """The id of a transplant-pull line whose expiry has passed, else None."""
    comment = line.rsplit(" ", 1)[-1].strip()
    if not comment.startswith(MARK):
        return None
    parts = comment[len(MARK):].split(":")
    try:
        return parts[0] if len(parts) == 2 and float(parts[1]) < now else None
    except ValueError:
        return None


def _edit(path, change):
    """Rewrite ``path`` under its lock: ``change(lines) -> (lines, ids whose folders go)``."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    lock = os.open(os.path.join(folder, ".transplant-pull.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = _check_own(path)
        lines = []
        if info is not None:
            with open(path, "rb") as handle:
                lines = handle.read().decode("utf-8", "surrogateescape").splitlines(True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        now = time.time()
        gone = [i for i in (_expired(line, now) for line in lines) if i]
        lines = [line for line in lines if _expired(line, now) is None]
        lines, more = change(lines)
        fd, temporary = tempfile.mkstemp(prefix=".authorized_keys.", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write("".join(lines).encode("utf-8", "surrogateescape"))
                handle.flush()
                os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode) if info is not None else 0o600)
                os.fsync(handle.fileno())
            os.rename(temporary, path)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        for each in gone + more:
            shutil.rmtree(os.path.join(folder, "transplant-pull", each), ignore_errors=True)
        return len(gone)
    finally:
        os.close(lock)


def add(request):
    ident, key, digest = request.get("id"), request.get("key"), request.get("digest")
    expires = request.get("expires")
    if not (isinstance(ident, str) and _ID.match(ident)):
        raise Refused("refused: bad pull id")
    if not (isinstance(key, str) and _KEY.match(key.strip())):
        raise Refused("refused: the key is not one ssh-ed25519 public key")
    if not (isinstance(digest, str) and _DIGEST.match(digest)):
        raise Refused("refused: bad listing digest")
    if not isinstance(expires, (int, float)) or not time.time() < expires < time.time() + 86400:
        raise Refused("refused: the expiry is not within a day")
    if request.get("compress") not in ("none", "zlib", "zstd"):
        raise Refused("refused: bad compression")
    path = _keys_file()
    sender_folder = os.path.join(os.path.dirname(path), "transplant-pull", ident)
    send = os.path.join(sender_folder, "send.py")
    command = "exec {} -I -S {} {} --compress {} --listing-sha256 {}".format(
        _quote(request.get("python") or ""), _quote(send), _quote(request.get("root") or ""), request["compress"],
        digest)
    when = time.strftime("%Y%m%d%H%M%SZ", time.gmtime(expires))
    line = 'restrict,expiry-time="{}",command="{}" {} {}{}:{}\n'.format(when, command, key.strip(), MARK, ident,
                                                                      int(expires))
    os.makedirs(sender_folder, mode=0o700)
    with open(os.open(send, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w",
              encoding="utf-8") as handle:
        handle.write(request.get("sender") or "")
    swept = _edit(path, lambda lines: (lines + [line], []))
    return {"ok": True, "error": None, "file": path, "swept": swept}


def remove(request):
    ident = request.get("id")
    if not (isinstance(ident, str) and _ID.match(ident)):
        raise Refused("refused: bad pull id")
    path = _keys_file()
    removed = []

    def without(lines):
        kept = []
        for line in lines:
            comment = line.rsplit(" ", 1)[-1].strip()
            if comment.startswith(MARK + ident + ":"):
                removed.append(line)
            else:
                kept.append(line)
        return kept, [ident]

    swept = _edit(path, without)
    return {"ok": True, "error": None, "file": path, "removed": len(removed), "swept": swept}


def main(argv):
    try:
        request = json.loads(sys.stdin.read() or "{}")
        if not isinstance(request, dict) or len(argv) != 1 or argv[0] not in ("add", "remove"):
            raise Refused("usage: pull_key add|remove, a JSON object on standard input")
        reply = (add if argv[0] == "add" else remove)(request)
    except (Refused, OSError, ValueError) as exc:
        reply = {"ok": False, "error": str(exc)}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
