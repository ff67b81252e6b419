"""The controller's state folder (edge): where snapshots, recover manifests and the verified log live."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_state_dir"]


def default_state_dir() -> Path:
    """The controller's state folder: ``$TRANSPLANT_STATE_DIR``, else ``$XDG_STATE_HOME/transplant``
    (``~/.local/state/transplant``, the XDG base directory specification's state home)."""
    explicit = os.environ.get("TRANSPLANT_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "transplant"
