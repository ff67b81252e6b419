"""A venv folder's identity on its host (edge): (boot id, device, inode), for the
donor-is-not-the-target check, asked early.

One script and one remembered key for the plan's check (:func:`transplant.pipeline.gather.refuse_self_target`)
and for an apply that asks it in the background as soon as a connection is open
(:mod:`transplant.hosts.early`): the check that follows takes the remembered answer instead of
starting the interpreter again. There the answer comes from the plan's probe started ahead, which
prints it as its first line (``transplant-identity BOOT DEV INO``: :func:`parse_identity`) before it
reads its request; the script runs only when the probe said nothing.
"""

from __future__ import annotations

import posixpath

from transplant.hosts.host import Host
from transplant.remote._common import SCRIPT_LOG

__all__ = ["IDENTITY_SCRIPT", "venv_identity", "parse_identity"]

IDENTITY_SCRIPT = ("import os, sys\n"
                   "try:\n    boot = open('/proc/sys/kernel/random/boot_id').read().strip()\n"
                   "except OSError:\n    boot = ''\n"
                   "info = os.stat(sys.argv[1])\nprint(boot, info.st_dev, info.st_ino)\n"
                   f"log = os.environ.get({SCRIPT_LOG!r})\n"
                   "if log:\n    open(log, 'a').write('identity %s\\n' % sys.argv[1])\n")


def parse_identity(text: str) -> tuple[str, int, int] | None:
    """(boot id, device, inode) from the identity script's output (``BOOT DEV INO``; also the
    probe's ``transplant-identity BOOT DEV INO`` line, the prefix dropped); None when it does not
    hold three such words (the identity could not be told)."""
    words = text.split()
    if words[:1] == ["transplant-identity"]:
        words = words[1:]
    if len(words) != 3 or not words[0] or not all(w.isdigit() for w in words[1:]):
        return None
    return words[0], int(words[1]), int(words[2])


def venv_identity(host: Host, venv: str, timeout: float | None = 60.0) -> tuple[str, int, int] | None:
    """(boot id, device, inode) of the folder ``venv`` on ``host``, symlinks followed: two spellings
    of one folder (a symlink, a bind mount, another host name for the same machine) give the same
    triple. None when it cannot be told (no boot id, the venv's python does not run).

    Asked once per connection (:meth:`Host.remembered`, key ``("venv-identity", venv)``): the
    apply command asks it early and the plan's gathering again; the second answer is the first
    one, not another interpreter start on the host. ``TRANSPLANT_TEST_SCRIPT_LOG`` in the host's
    environment names a file where each run of the script appends a line (a testing hook).

    :raises HostError: the host cannot be reached.
    """
    def ask() -> tuple[str, int, int] | None:
        python = posixpath.join(venv, "bin", "python")  # as transplant.hosts.probing.venv_python
        result = host.run([python, "-I", "-S", "-c", IDENTITY_SCRIPT, venv], timeout=timeout)
        return parse_identity(result.stdout.decode("ascii", "replace")) if result.ok else None

    return host.remembered(("venv-identity", venv), ask)
