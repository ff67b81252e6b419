"""A clone killed part-way (SIGKILL of transplant and of the copy it runs, as a power cut would)
leaves a destination that the next clone names for what it is: "an interrupted clone is here;
--replace removes it", never "exists and is not empty"; ``--replace`` removes it and clones whole,
and a finished clone carries no marker.

A real venv of 12,000 files and a 256 MiB file, a real ``transplant clone`` process started
here, killed by the pids it and its children have (read from /proc while the copy runs)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.clone.cloning import MARKER

SITE = "lib/python3.11/site-packages"


def _tree(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}\0{info.st_mode}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s descendants, now (Linux /proc)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        except OSError:
            continue
        for child in map(int, text.split()):
            found += [child, *_children(child)]
    return found


@pytest.fixture
def big_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    src = tmp_path / "src"
    python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([python, "-m", "venv", "--without-pip", str(src)], check=True)
    pkg = src / SITE / "bulk"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("OK = 1\n")
    for i in range(12000):
        (pkg / f"m{i:05}.py").write_text(f"N = {i}\n" + "#" * 2000 + "\n")
    with open(pkg / "blob.bin", "wb") as handle:
        block = os.urandom(1 << 20)
        for _ in range(256):
            handle.write(block)
    return src


def test_a_clone_killed_mid_copy_is_named_an_interrupted_clone_and_replace_removes_it(big_source, tmp_path, capsys):
    dst = tmp_path / "dst"
    proc = subprocess.Popen([sys.executable, "-m", "transplant", "clone", f"local:{big_source}", f"local:{dst}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    copying: list[int] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            kids = _children(proc.pid)
            # the marker is there and cp runs: some of the venv is copied, not all
            if (dst / MARKER).exists() and (dst / "lib").exists() and any(
                    Path(f"/proc/{k}/comm").read_text().strip() == "cp" for k in kids
                    if Path(f"/proc/{k}/comm").exists()):
                copying = kids
                break
            time.sleep(0.005)
    finally:
        for pid in [proc.pid, *copying]:  # only the pids this test started (and their children)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert copying, "the clone was killed while cp copied"
    for pid in copying:  # reaped by init once their parent died: wait until they are gone
        while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text():
            time.sleep(0.01)
    assert (dst / MARKER).is_file(), "the killed clone left its marker"
    assert not (dst / SITE / "bulk" / "blob.bin").exists() or \
        (dst / SITE / "bulk" / "blob.bin").stat().st_size < (256 << 20) or \
        len(list((dst / SITE / "bulk").iterdir())) < 12002, "a partial copy"
    partial = _tree(dst)

    assert main(["clone", f"local:{big_source}", f"local:{dst}"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "an interrupted clone is here" in out and "--replace removes it" in out, out
    assert "exists and is not empty" not in out
    assert _tree(dst) == partial, "the refusal changed nothing"

    assert main(["clone", f"local:{big_source}", f"local:{dst}", "--replace"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert not (dst / MARKER).exists(), "a finished clone has no marker"
    assert len(list((dst / SITE / "bulk").iterdir())) == 12002
    assert (dst / SITE / "bulk" / "blob.bin").read_bytes() == (big_source / SITE / "bulk" / "blob.bin").read_bytes()
    ran = subprocess.run([str(dst / "bin" / "python"), "-c", "import sys, bulk; print(sys.prefix, bulk.OK)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.split() == [str(dst), "1"]
    # the finished clone is a venv like any other: without --replace it is "not empty", not "interrupted"
    assert main(["clone", f"local:{big_source}", f"local:{dst}"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "exists and is not empty" in out and "interrupted" not in out, out


def test_an_interrupted_clone_is_not_a_source_and_not_a_finished_target_base(big_source, tmp_path, capsys):
    from transplant.clone.cloning import venv_exists
    from transplant.hosts.host import LocalHost

    half = tmp_path / "half"
    subprocess.run(["cp", "-a", str(big_source), str(half)], check=True)
    (half / MARKER).touch()  # as a killed clone leaves it: pyvenv.cfg copied, the marker still there
    assert not venv_exists(LocalHost(), str(half)), "target.base clones again (and is told it is interrupted)"
    assert venv_exists(LocalHost(), str(big_source))
    assert main(["clone", f"local:{half}", f"local:{tmp_path / 'other'}"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "is itself an interrupted clone" in out and not (tmp_path / "other").exists(), out
