"""The controller's state folder (edge): where snapshots, recover manifests and the verified log live."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_state_dir", "state_dir_source"]


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
