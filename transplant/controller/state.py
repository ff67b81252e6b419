"""The controller's state folder (edge): where snapshots, recover manifests and the verified log live.

Trust: what transplant reads back from its state folder (a plan memo, the verified log, a
snapshot's index) decides what it writes on a host, so a state file another user could have
written is refused, as OpenSSH refuses a private key or config file that others can write
(``StrictModes``; ``ssh`` says "Bad owner or permissions"): the file and every folder from the
state folder down to it must be owned by the user running transplant (or root) and writable by
neither its group nor others (:func:`refuse_loose`). The folders above the state folder are not
looked at (``/tmp`` is writable by all and sticky).
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from transplant.errors import StateError

__all__ = ["default_state_dir", "state_dir_source", "refuse_loose", "private_folder"]


def default_state_dir() -> Path:
    """The controller's state folder (see :func:`state_dir_source`).

    :raises ConfigError: the config file cannot be used."""
    return state_dir_source()[0]


def state_dir_source() -> tuple[Path, str]:
    """The controller's state folder and where it came from: ``$TRANSPLANT_STATE_DIR``
    (``environment (TRANSPLANT_STATE_DIR)``), else the config file's ``state_dir`` (``file``),
    else ``$XDG_STATE_HOME/transplant`` (``~/.local/state/transplant``, the XDG base directory
    specification's state home; ``default``).

    :raises ConfigError: the config file cannot be used."""
    explicit = os.environ.get("TRANSPLANT_STATE_DIR")
    if explicit:
        return Path(explicit), "environment (TRANSPLANT_STATE_DIR)"
    from transplant.controller.config_file import load_config

    configured = load_config().get("state_dir")
    if configured is not None:
        return configured, "file"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "transplant", "default"


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _check_one(path: Path, what: str) -> None:
    try:
        info = os.stat(path)  # a symlink's target is what is read
    except OSError:
        return  # absent or unreadable: the read that follows says so (or makes it)
    me = os.geteuid()
    quoted = shlex.quote(str(path))
    if info.st_uid not in (me, 0):
        raise StateError(
            f"{path}: refusing {what}: it is owned by {_user(info.st_uid)} (uid {info.st_uid}), not by you "
            f"({_user(me)}) or root; another user could have written what transplant would act on",
            hint=f"if its content is yours: chown {shlex.quote(_user(me))} {quoted}; otherwise remove it "
                 f"(transplant makes it again): rm -r {quoted}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(info.st_mode)
        who = " and ".join(w for w, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                           if info.st_mode & bit)
        raise StateError(
            f"{path}: refusing {what}: it is writable by {who} (mode {mode:04o}); another user could have "
            f"written what transplant would act on",
            hint=f"chmod go-w {quoted}   (then check its content is yours, or remove it: transplant makes it again)")


def refuse_loose(path: str | os.PathLike, what: str, *, state_dir: Path | None = None) -> None:
    """Refuse ``path`` (a state file or folder) when another user could have written it: it, or any
    folder from ``state_dir`` down to it (``state_dir`` included), is owned by another user than the
    effective one (root's are accepted, as ssh accepts them) or writable by its group or others.
    Absent paths pass (nothing to read; what makes them uses mode 0700/0600).

    :param what: what it is, for the message (``the plan memo``, ``the verified log``).
    :param state_dir: the state folder it lies in (default: :func:`default_state_dir`); a path
        outside it has only its own folder checked besides itself.
    :raises StateError: naming the first loose path, its owner or mode, and the chmod/chown fix.
    """
    target = Path(os.path.abspath(path))
    base = Path(os.path.abspath(state_dir if state_dir is not None else default_state_dir()))
    if target == base or base in target.parents:
        chain = [base, *[p for p in reversed(target.parents) if base in p.parents], target]
        chain = list(dict.fromkeys(chain))
    else:
        chain = [target.parent, target]
    for each in chain:
        _check_one(each, what if each == target else f"{what} (a folder it lies in)")


def private_folder(path: Path) -> Path:
    """``path`` made as a folder where it is missing, each missing folder on the way (the state
    folder itself too) with mode 0700 whatever the umask (a umask of 002 would make them
    group-writable, which :func:`refuse_loose` refuses); returns it.

    :raises OSError: a folder cannot be made.
    """
    missing = []
    at = Path(os.path.abspath(path))
    while not at.exists() and not at.is_symlink() and at != at.parent:
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by another command
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    return path
