"""Issue 14, item 8: relay folders a killed controller left under the state folder's staging/
are removed by the next transfer, and nothing else there is (real processes, real folders)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from transplant.hosts.host import LocalHost
from transplant.hosts.transfer import clean_dead_relays, copy_files, relay_prefix

ROOT = Path(__file__).resolve().parent.parent


def _relay_of_a_killed_controller(staging: Path) -> Path:
    """A process makes its relay folder (with a file) as a transfer does, then is SIGKILLed."""
    code = textwrap.dedent(f"""\
        import os, sys, tempfile
        from transplant.hosts.transfer import relay_prefix
        relay = tempfile.mkdtemp(prefix=relay_prefix(), dir={str(staging)!r})
        open(os.path.join(relay, "half-copied.bin"), "wb").write(b"x" * 4096)
        print(relay, flush=True)
        sys.stdin.read()
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    relay = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert relay.is_dir() and (relay / "half-copied.bin").exists(), "a killed controller leaves its relay"
    return relay


def test_the_next_transfer_removes_only_dead_controllers_relays(tmp_path):
    staging = tmp_path / "state" / "staging"
    staging.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not transplant's\n")
    dead = _relay_of_a_killed_controller(staging)
    (dead / "link-out").symlink_to(outside)  # removing the relay must not follow it
    tag = relay_prefix().split("-")[2]
    gone = int(dead.name.split("-")[1])
    live = staging / f"{relay_prefix()}live0001"
    live.mkdir()
    kept = {
        "live": live,
        "other host": staging / f"relay-{gone}-00000000-abcd1234",
        "old naming": staging / "relay-k2j3h4x9",
        "other name": staging / f"patches-{gone}-{tag}-abcd1234",
        "symlink": staging / f"relay-{gone}-{tag}-symlink1",
        "file": staging / f"relay-{gone}-{tag}-afile001",
    }
    for name, path in kept.items():
        if name == "symlink":
            path.symlink_to(outside)
        elif name == "file":
            path.write_text("a file\n")
        elif not path.exists():
            path.mkdir()
            (path / "data").write_text(name)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "f.txt").write_text("payload\n")
    copy_files(LocalHost(), str(src), LocalHost(), str(dst), ["f.txt"], staging=staging)  # the next transfer
    assert (dst / "f.txt").read_text() == "payload\n"
    assert not os.path.lexists(dead), "the dead controller's relay is removed"
    for name, path in kept.items():
        assert os.path.lexists(path), f"{name}: {path.name} must stay"
    assert (outside / "keep.txt").read_text() == "not transplant's\n" and sorted(os.listdir(outside)) == ["keep.txt"]


def test_a_staging_folder_that_is_a_symlink_is_not_cleaned(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    dead = _relay_of_a_killed_controller(real)
    link = tmp_path / "staging"
    link.symlink_to(real)
    assert clean_dead_relays(link) == []
    assert dead.is_dir()
    assert clean_dead_relays(real) == [dead.name] and not dead.exists()
