"""The command line against hostile surroundings: a reader that closes the output pipe early, an
``--out`` that is no regular file in a writable folder, a ``HOST:VENV`` whose path is not UTF-8.
Real processes, real pipes, real folders (local venvs built from real wheels)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


from alpha_pair import alpha_pair

ROOT = Path(__file__).resolve().parent.parent
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A donor with alpha 2.0 and a maker of fresh targets with alpha 1.0, each with its manifest."""
    base = tmp_path_factory.mktemp("outputs")
    target = alpha_pair(base, {f"alpha/m{i}.py": f"N = {i}\n" for i in range(40)}, "verify:\n  imports: [alpha]\n")

    return base, target


def _env(base: Path) -> dict[str, str]:
    return {**os.environ, "TRANSPLANT_STATE_DIR": str(base / "state"), "COLUMNS": "100"}


def _into_a_pipe_closed_early(argv: list[str], env: dict[str, str], *, read_lines: int,
                              both: bool = False) -> tuple[int, str, bytes]:
    """Run transplant with standard output a real pipe whose reader reads ``read_lines`` lines (0:
    none) and closes its end, as ``| head -N`` does (``both``: standard error too, as ``2>&1 | head``);
    its exit code, standard error (empty with ``both``), and what was read."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "transplant", *argv], stdout=write,
                            stderr=write if both else subprocess.PIPE, cwd=ROOT, env=env)
    os.close(write)
    got = b""
    with os.fdopen(read, "rb") as reader:
        for _ in range(read_lines):
            got += reader.readline()
    # the read end is closed now: every later write of the command meets a broken pipe
    _, err = proc.communicate(timeout=300)
    return proc.returncode, (err or b"").decode(errors="replace"), got


@pytest.mark.parametrize("read_lines, both", [(0, False), (1, False), (1, True)])
def test_apply_into_a_pipe_closed_early_applies_or_fails(pair, read_lines, both):
    """``transplant apply M --yes | head -1`` (a reader gone before the first line; ``2>&1 | head
    -1``): the transaction is done, shown by its exit code 0 and the target's files; never a quiet
    0 with nothing applied."""
    base, target = pair
    venv, manifest = target(f"piped-apply-{read_lines}-{both}")
    code, err, got = _into_a_pipe_closed_early(["apply", str(manifest), "--yes"], _env(base), read_lines=read_lines,
                                               both=both)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert code == 0, err
    assert (venv / SITE / "alpha" / "m39.py").read_text() == "N = 39\n"  # the work is done
    assert (venv / SITE / "alpha" / "__init__.py").read_text() == "V = 2\n"
    assert read_lines == 0 or got  # the reader had its line
    history = subprocess.run([sys.executable, "-m", "transplant", "history", str(manifest)], capture_output=True,
                             text=True, cwd=ROOT, env=_env(base))
    assert "committed" in history.stdout and "applied" in history.stdout, history.stdout + history.stderr


def test_verify_into_a_pipe_closed_early_reports_its_outcome(pair):
    """verify's exit code is its checks' outcome whether or not anyone reads its table: 3 for an
    import that fails, 0 for one that passes."""
    base, target = pair
    venv, manifest = target("piped-verify")
    code, err, _ = _into_a_pipe_closed_early(["verify", str(manifest)], _env(base), read_lines=0)
    assert code == 0 and "Traceback" not in err, err
    (venv / SITE / "alpha" / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    code, err, _ = _into_a_pipe_closed_early(["verify", str(manifest)], _env(base), read_lines=1)
    assert code == 3 and "Traceback" not in err, err


def test_plan_out_into_a_pipe_closed_early_saves_its_plan(pair):
    """plan --out: the file is the work; it is written, and plan exits as planned (2 with
    --detailed-exitcode: changes to make)."""
    base, target = pair
    venv, manifest = target("piped-plan")
    saved = base / "piped-plan.json"
    code, err, _ = _into_a_pipe_closed_early(["plan", str(manifest), "--out", str(saved), "--detailed-exitcode"],
                                             _env(base), read_lines=0)
    assert code == 2 and "Traceback" not in err, err
    assert '"changes"' in saved.read_text()


# -- outputs that are not regular files in a writable folder --------------------------------------

@pytest.mark.parametrize("out, said", [
    ("/proc/self/mem", "no file can be written in the folder /proc/self"),
    ("/proc/self/plan.json", "no file can be written in the folder /proc/self"),
    ("/sys/kernel/plan.json", "no file can be written in the folder /sys/kernel"),
    ("/dev/stdout", "exists and is not a regular file"),
    ("FIFO", "exists and is not a regular file"),
    ("LINK", "exists and is not a regular file"),
])
def test_plan_out_that_is_no_regular_file_in_a_writable_folder_is_refused(pair, out, said):
    base, target = pair
    venv, manifest = target("out-" + out.strip("/").replace("/", "-"))
    if out == "FIFO":
        out = str(base / "a-fifo")
        if not os.path.exists(out):
            os.mkfifo(out)
    elif out == "LINK":
        out = str(base / "a-link")
        (base / "elsewhere.json").write_text("{}")
        if not os.path.lexists(out):
            os.symlink(base / "elsewhere.json", out)
    before = sorted(p.name for p in base.iterdir())
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "transplant", "plan", str(manifest), "--out", out],
                          capture_output=True, text=True, cwd=ROOT, env=_env(base), timeout=120)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, output
    assert f"error: --out {out}: {said}" in output and "hint: give --out a new file name" in output, output
    assert "Traceback" not in output
    assert time.monotonic() - started < 30
    assert sorted(p.name for p in base.iterdir()) == before  # nothing written beside it (no trial file left)
    assert (base / "elsewhere.json").read_text() == "{}" if out.endswith("a-link") else True


def test_init_out_and_verify_junit_into_proc_are_refused(pair):
    base, target = pair
    venv, manifest = target("proc-outputs")
    init = subprocess.run([sys.executable, "-m", "transplant", "init", "--donor", f"local:{base / 'donor'}",
                           "--target", f"local:{venv}", "--out", "/proc/self/manifest.yaml"],
                          capture_output=True, text=True, cwd=ROOT, env=_env(base), timeout=120)
    assert init.returncode == 1 and "--out /proc/self/manifest.yaml: no file can be written" in init.stdout, \
        init.stdout + init.stderr
    junit = subprocess.run([sys.executable, "-m", "transplant", "verify", str(manifest), "--junit", "/proc/self/mem"],
                           capture_output=True, text=True, cwd=ROOT, env=_env(base), timeout=120)
    assert junit.returncode == 1 and "--junit /proc/self/mem: no file can be written" in junit.stdout, \
        junit.stdout + junit.stderr
    assert "Traceback" not in init.stderr + junit.stderr


# -- a HOST:VENV path that is not UTF-8 ------------------------------------------------------------

@pytest.mark.parametrize("command", ["inventory", "status", "verify", "init-donor", "init-target", "plan-target"])
def test_a_venv_path_that_is_not_utf8_is_a_clear_error(pair, command):
    """A real venv folder whose name holds the byte 0xff, named on the command line as bytes."""
    base, target = pair
    odd = os.fsencode(base) + b"/venv-\xff"
    if not os.path.exists(odd):
        os.mkdir(odd)
        (Path(os.fsdecode(odd)) / "pyvenv.cfg").write_text("home = /usr/bin\n")
    before = sorted(os.listdir(odd))
    location = b"local:" + odd
    venv, manifest = target("utf8-" + command)
    argv = {
        "inventory": [b"inventory", location],
        "status": [b"status", location],
        "verify": [b"verify", location, b"--imports", b"os"],
        "init-donor": [b"init", b"--donor", location, b"--target", f"local:{venv}".encode(), b"--out",
                       os.fsencode(base / "never.yaml")],
        "init-target": [b"init", b"--donor", f"local:{venv}".encode(), b"--target", location, b"--out",
                        os.fsencode(base / "never.yaml")],
        "plan-target": [b"plan", os.fsencode(manifest), b"--target", location],
    }[command]
    done = subprocess.run([sys.executable.encode(), b"-m", b"transplant", *argv], capture_output=True, cwd=ROOT,
                          env=_env(base), timeout=120)
    output = (done.stdout + done.stderr).decode("utf-8")  # what transplant printed is UTF-8 text itself
    assert done.returncode == 64, output
    assert "UnicodeEncodeError" not in output and "Traceback" not in output, output
    assert "venv-\\xff: the venv path holds bytes that are not UTF-8" in " ".join(output.split()), output
    assert sorted(os.listdir(odd)) == before and not (base / "never.yaml").exists()


@pytest.mark.parametrize("out, said", [
    ("/proc/self/store", "no file can be written in the folder /proc/self"),
    ("/proc/self/mem", "/proc/self/mem exists and is not a folder"),
    ("/dev/null", "/dev/null exists and is not a folder"),
    ("/sys/kernel/store", "no file can be written in the folder /sys/kernel"),
])
def test_snapshot_out_that_is_no_folder_one_can_fill_is_refused(pair, out, said):
    base, target = pair
    venv, manifest = target("snapshot-" + out.strip("/").replace("/", "-"))
    done = subprocess.run([sys.executable, "-m", "transplant", "snapshot", str(manifest), "--out", out],
                          capture_output=True, text=True, cwd=ROOT, env=_env(base), timeout=120)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1 and f"error: --out {out}: {said}" in output, output
    assert "Traceback" not in output
