"""--clear-jit-caches against hostile cache settings: the stage script run for real (real
folders, all inside tmp_path) must refuse every unsafe target and remove nothing there; targets
outside tmp_path (/, system folders, the venv) are put to the refusal check alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import transplant.remote as remote
from transplant.remote import stage_jit

SCRIPT = Path(remote.__file__).parent / "stage_jit.py"


def _clear(env_extra, home, cwd):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home.parent / "tmp"),
           "TRITON_CACHE_DIR": str(home / "unset-triton"), "FLASHINFER_WORKSPACE_BASE": str(home / "unset-fi"),
           "TORCHINDUCTOR_CACHE_DIR": str(home / "unset-inductor"), **env_extra}
    (home.parent / "tmp").mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps({"clear": True}), env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=60, check=True)
    return {c["name"]: c for c in json.loads(out.stdout)["caches"]}


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / "precious").mkdir(parents=True)
    (home / "precious" / "data.txt").write_text("keep")
    return home


def test_env_pointing_at_home_or_its_parent_is_refused(home, tmp_path):
    caches = _clear({"TRITON_CACHE_DIR": str(home), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}, home, tmp_path)
    assert caches["triton"]["removed"] is False and "home folder" in caches["triton"]["error"]
    assert caches["torch-inductor"]["removed"] is False and "home folder" in caches["torch-inductor"]["error"]
    assert (home / "precious" / "data.txt").read_text() == "keep"


@pytest.mark.parametrize("path,why", [
    ("/", "top-level"), ("/usr", "top-level"), ("/usr/share", "system folder /usr"),
    ("/etc/ssl", "system folder /etc"), (sys.prefix, "the venv"), (str(Path(sys.prefix) / "bin"), "inside the venv"),
    (str(Path(sys.prefix).parent), "it is or holds"),
])
def test_root_system_and_venv_folders_are_refused(path, why):
    # Asked of the check alone: a test that ran the removal on these would wreck the machine
    # the day the check regressed.
    assert why in stage_jit._removable(path)


def test_relative_paths_and_the_current_folder_are_refused(home, tmp_path):
    work = tmp_path / "work"
    (work / "cache").mkdir(parents=True)
    caches = _clear({"TRITON_CACHE_DIR": "cache", "TORCHINDUCTOR_CACHE_DIR": str(work)}, home, work)
    assert "relative path" in caches["triton"]["error"]
    assert "current folder" in caches["torch-inductor"]["error"]
    assert (work / "cache").is_dir()


def test_a_symlink_anywhere_on_the_way_is_refused(home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "cache").mkdir(parents=True)
    (elsewhere / "cache" / "kernel.json").write_text("{}")
    (home / ".triton").symlink_to(elsewhere)           # a parent is the symlink: ~/.triton/cache
    (tmp_path / "link").symlink_to(elsewhere / "cache")  # the folder itself is the symlink
    caches = _clear({"TRITON_CACHE_DIR": "", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "link")}, home, tmp_path)
    assert caches["triton"]["path"] == str(home / ".triton" / "cache")
    assert "symlink" in caches["triton"]["error"] and "symlink" in caches["torch-inductor"]["error"]
    assert (elsewhere / "cache" / "kernel.json").exists()


def test_a_plain_cache_folder_is_still_removed(home, tmp_path):
    (home / ".triton" / "cache" / "k").mkdir(parents=True)
    caches = _clear({"TRITON_CACHE_DIR": ""}, home, tmp_path)
    assert caches["triton"]["removed"] is True and caches["triton"]["error"] is None
    assert not (home / ".triton" / "cache").exists() and (home / ".triton").is_dir()
    assert (home / "precious" / "data.txt").read_text() == "keep"
