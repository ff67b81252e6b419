"""What the operator reads, from the command line: history folds repeated verifies and says
when there is nothing, the inventory's bytes column has one named meaning, mistypes get
suggestions, the apply bar stays readable at 80 columns. Each command runs as a real process
with its output at 80 columns in a pipe and in a file (local venvs from real wheels; state
folders inside tmp_path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A local donor (foo 2.0, bar-utils 1.0) and target (foo 1.0, bar-utils 1.0), a manifest maker;
    the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    new = build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n", "foo/extra.py": "E = 1\n"})
    old = build_wheel(wheels / "old", "foo", "1.0", {"foo/__init__.py": "V = 1\n", "foo/gone.py": "G = 1\n"})
    bar = build_wheel(wheels / "bar", "bar-utils", "1.0", {"bar_utils/__init__.py": "B = 1\n"})
    make_venv(tmp_path / "donor", [new, bar])
    make_venv(tmp_path / "target", [old, bar])

    def manifest(name: str = "m.yaml", overlay: str = "[foo]", extra: str = "", target: Path | None = None,
                 donor: Path | None = None):
        m = tmp_path / name
        m.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {donor or tmp_path / 'donor'}}}
            target: {{host: local, venv: {target or tmp_path / 'target'}}}
            overlay: {overlay}
            """) + extra)
        return m

    return tmp_path, manifest


def run80(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    """``transplant ARGV`` as a process at 80 columns, once into a pipe and once into a file; its
    exit code (the same both times), the pipe's text and the file's text (stdout and stderr)."""
    env = {**os.environ, "COLUMNS": "80", "TRANSPLANT_STATE_DIR": str(tmp_path / "state")}
    env.pop("NO_COLOR", None)
    piped = subprocess.run([sys.executable, "-m", "transplant", *argv], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        filed = subprocess.run([sys.executable, "-m", "transplant", *argv], cwd=ROOT, env=env,
                               stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, timeout=300)
    assert piped.returncode == filed.returncode
    text = out.read_text()
    for shown in (piped.stdout.decode(), text):
        assert "\x1b[" not in shown and not re.search("[\u2500-\u257f]", shown), shown  # no styles, no boxes
        assert all(line == line.rstrip() for line in shown.splitlines()), shown  # no padding
    return piped.returncode, piped.stdout.decode(), text


def flat(text: str) -> str:
    return " ".join(text.split())


# -- history ---------------------------------------------------------------------------------------

def test_history_folds_repeated_verifies_into_one_entry_with_a_count(pair, capsys):
    tmp_path, manifest = pair
    m = manifest(extra="verify:\n  imports: [foo]\n")
    assert main(["apply", str(m), "--yes"]) == 0
    for _ in range(4):
        assert main(["verify", str(m)]) == 0
    capsys.readouterr()
    code, piped, filed = run80(tmp_path, "history", f"local:{tmp_path / 'target'}")
    assert code == 0
    for text in (piped, filed):
        [row] = [line for line in text.splitlines() if "committed" in line]
        # one entry for the four verifies: the last outcome, its time, and the count
        assert re.search(r"verify passed \d\d:\d\d:\d\d \(4 verifies: 4 passed\)", flat(text)), text
        assert flat(text).count("verify passed") == 1, text


def test_an_empty_history_says_no_transactions(pair):
    tmp_path, _ = pair
    venv = f"local:{tmp_path / 'target'}"
    code, piped, filed = run80(tmp_path, "history", venv)
    assert code == 0
    for text in (piped, filed):
        assert f"no transactions in {venv}" in flat(text), text
        assert "id" not in text.split() and "state" not in text.split(), text  # no empty table


# -- inventory -------------------------------------------------------------------------------------

def test_the_inventory_bytes_column_is_records_sizes_with_or_without_files(pair):
    """A file grown on disk after its install: the bytes column shows RECORD's sizes, says so in
    its header, and shows the same figure with ``--files`` (which looks at the disk) as without."""
    tmp_path, _ = pair
    site = next((tmp_path / "target" / "lib").glob("python3.*")) / "site-packages"
    (site / "foo" / "gone.py").write_text("G = 1\n" + "# grown by hand\n" * 4000)  # 64 KiB on disk
    venv = f"local:{tmp_path / 'target'}"
    rows = {}
    for options in ((), ("--files",)):
        code, piped, filed = run80(tmp_path, "inventory", venv, *options)
        assert code == 0
        for text in (piped, filed):
            [header] = [line for line in text.splitlines() if line.split()[:1] == ["distribution"]]
            assert "bytes (RECORD)" in header, text
            [row] = [line for line in text.splitlines() if line.split()[:2] == ["foo", "1.0"]]
            rows.setdefault(options, set()).add(row)
    assert rows[()] == rows[("--files",)] and len(rows[()]) == 1, rows
    [row] = rows[()]
    assert "KiB" not in row and "MiB" not in row, row  # RECORD's few bytes, not the 64 KiB on disk


# -- suggestions where a person mistypes -----------------------------------------------------------

def test_a_misspelled_overlay_name_gets_did_you_mean_from_either_side(pair):
    tmp_path, manifest = pair
    wheels = sorted((tmp_path / "wheels").rglob("*.whl"))
    old = [w for w in wheels if w.name.startswith(("foo-1.0", "bar_utils"))]
    only = build_wheel(tmp_path / "wheels" / "only", "quux-tool", "1.0", {"quux_tool/__init__.py": "Q = 1\n"})
    target = make_venv(tmp_path / "target2", [*old, only])
    m = manifest(overlay="[foo, bar-utlis, quux-tol]", target=target)
    code, piped, filed = run80(tmp_path, "plan", str(m))
    assert code == 3
    for text in (piped, filed):
        said = flat(text)
        assert "overlay entry 'bar-utlis' matches no distribution on the donor" in said, text
        assert "did you mean bar-utils?" in said, text  # the donor's name
        assert "did you mean quux-tool (on the target only)?" in said, text  # the target's, said to be there alone


def test_a_misspelled_remove_name_gets_did_you_mean(pair):
    tmp_path, manifest = pair
    code, piped, filed = run80(tmp_path, "plan", str(manifest(extra="remove: [bar-utlis]\n")))
    assert code == 0
    for text in (piped, filed):
        assert "remove entry 'bar-utlis' matches no distribution on the target; did you mean bar-utils?" in flat(text)


def test_a_remove_that_collides_with_the_overlay_offers_both_fixes(pair):
    tmp_path, manifest = pair
    m = manifest(extra="remove: [foo]\n")
    code, piped, filed = run80(tmp_path, "plan", str(m))
    assert code == 0
    for text in (piped, filed):
        said = flat(text)
        assert "remove entry 'foo' removes nothing: the overlay brings foo from the donor" in said, text
        assert f"either drop 'foo' from remove: in {m} (the donor's foo arrives), or drop foo from overlay: " \
               f"(the target's is removed)" in said, text


def test_a_file_owner_conflict_offers_both_fixes(pair):
    """foo-renamed on the donor writes foo's files (a renamed distribution); the target's foo stays."""
    tmp_path, manifest = pair
    renamed = build_wheel(tmp_path / "wheels" / "renamed", "foo-renamed", "3.0",
                          {"foo/__init__.py": "V = 3\n", "foo/extra.py": "E = 3\n"})
    donor = make_venv(tmp_path / "donor2", [renamed])
    m = manifest(overlay="[foo-renamed]", donor=donor)
    code, piped, filed = run80(tmp_path, "plan", str(m))
    assert code == 3
    for text in (piped, filed):
        said = flat(text)
        assert "file-owner-conflict" in said, text
        # the snippet takes the first fix; the second is said with the other hints
        assert "add: remove: [foo]" in said and "overlay:" not in said.split("add:", 1)[1].split("file-owner")[0], text
        assert "file-owner-conflict: the other fix: leave foo-renamed out of overlay: (the target keeps foo)" in said


@pytest.mark.parametrize("host, said, code", [
    # OpenSSH's URL is read as one: the port is the port, not a path or a host called "ssh"
    ("ssh://root@127.0.0.1:1", "root@127.0.0.1:1: cannot connect to port 1", 1),
    ("http://127.0.0.1", "transplant reaches hosts over ssh only; write local, [user@]host[:port] or "
                         "ssh://[user@]host[:port]", 1),
    ("ssh://127.0.0.1/opt/venv", "the path goes in 'venv' (host: ssh://127.0.0.1, venv: /opt/venv)", 1),
])
def test_a_manifest_host_written_as_an_ssh_url_is_read_as_one(pair, host, said, code):
    tmp_path, _ = pair
    m = tmp_path / "url.yaml"
    m.write_text(f"version: 1\ndonor: {{host: local, venv: {tmp_path / 'donor'}}}\n"
                 f"target: {{host: '{host}', venv: /opt/venv}}\noverlay: [foo]\n")
    got, piped, filed = run80(tmp_path, "plan", str(m))
    assert got == code
    for text in (piped, filed):
        assert said in flat(text) and "Traceback" not in text, text


@pytest.mark.parametrize("location, said, code", [
    ("ssh://root@127.0.0.1:1/opt/venv", "root@127.0.0.1:1: cannot connect to port 1", 1),
    ("ssh://root@127.0.0.1:1", "expected the venv's absolute path after the host", 64),
    ("http://127.0.0.1/opt/venv", "transplant reaches hosts over ssh only", 64),
])
def test_host_venv_written_as_an_ssh_url_is_read_as_one(pair, location, said, code):
    tmp_path, _ = pair
    got, piped, filed = run80(tmp_path, "inventory", location)
    assert got == code
    for text in (piped, filed):
        assert said in flat(text) and "Traceback" not in text, text


def test_clone_and_verify_given_a_bare_path_suggest_its_local_form(pair):
    tmp_path, _ = pair
    target = tmp_path / "target"
    code, piped, filed = run80(tmp_path, "clone", str(target), f"local:{tmp_path / 'copy'}")
    assert code == 64 and not (tmp_path / "copy").exists()
    for text in (piped, filed):
        assert f"local:{target}" in flat(text) and "venv_sglang" not in text, text
    # a relative path: its absolute local: form (the process runs in the repository)
    code, piped, _ = run80(tmp_path, "clone", "some/venv", f"local:{tmp_path / 'copy'}")
    assert code == 64 and f"local:{ROOT / 'some' / 'venv'}" in flat(piped), piped
    for given in (str(target), str(tmp_path / "not-there")):
        code, piped, filed = run80(tmp_path, "verify", given)
        assert code == 64
        for text in (piped, filed):
            assert f"hint: to name the venv itself: transplant verify local:{given}" in flat(text), text


# -- a Python minor mismatch -----------------------------------------------------------------------

OTHER_MINOR = next((p for p in sorted(Path("/root/.pyenv/versions").glob("3.1[2-9].*/bin/python3"))
                    if p.exists()), None) if Path("/root/.pyenv/versions").is_dir() else None


@pytest.mark.skipif(OTHER_MINOR is None, reason="needs a second Python minor (pyenv) for the target venv")
def test_a_python_minor_mismatch_is_named_so_and_its_script_note_names_the_targets_own_interpreter(pair):
    """The donor's console script starts with its ``bin/python3.11``; the target venv is 3.12 and
    has no ``bin/python3.11``: the finding is python-version-mismatch, and the script-prefix note
    names the interpreter apply writes, which the target venv has."""
    tmp_path, manifest = pair
    tool = build_wheel(tmp_path / "wheels" / "tool", "tool", "1.0", {"tool.py": "def main():\n    print('ran')\n"},
                       entry_points="[console_scripts]\ntool = tool:main\n")
    donor = make_venv(tmp_path / "donor3")
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(donor / "bin" / f"python{minor}"), "install", "-q",
                    "--no-index", "--no-deps", "--disable-pip-version-check", str(tool)], check=True)
    assert (donor / "bin" / "tool").read_text().startswith(f"#!{donor}/bin/python{minor}\n")
    target = tmp_path / "target3"
    subprocess.run([str(OTHER_MINOR), "-m", "venv", "--without-pip", str(target)], check=True)
    theirs = subprocess.run([str(target / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert theirs != minor and not (target / "bin" / f"python{minor}").exists()
    code, piped, filed = run80(tmp_path, "plan", str(manifest(overlay="[tool]", donor=donor, target=target)))
    assert code == 0  # a pure-Python distribution moves into the target's site-packages (an info)
    for text in (piped, filed):
        said = flat(text)
        assert "python-version-mismatch" in said and f"Python {minor} vs {theirs}" in said, text
        assert "interpreter-missing" not in said, text
        joined = "".join(text.split())  # at 80 columns a long path is folded where it reaches the edge
        assert f"applyrewritesitsfirstlineto{target}/bin/python{theirs}" in joined, text
        named = set(re.findall(re.escape(str(target)) + r"/bin/python[0-9]*(?:\.[0-9]+)?", joined))
        assert named and all(Path(p).exists() for p in named), named  # no interpreter the target venv lacks
    # apply writes that interpreter into the script, not the donor's minor
    code, piped, _ = run80(tmp_path, "apply", str(tmp_path / "m.yaml"), "--yes")
    assert code == 0, piped
    assert (target / "bin" / "tool").read_text().splitlines()[0] == f"#!{target}/bin/python{theirs}"
    assert (target / "lib" / f"python{theirs}" / "site-packages" / "tool.py").is_file()
    assert not (target / "lib" / f"python{minor}").exists()


# -- the apply bar at 80 columns -------------------------------------------------------------------

@pytest.mark.parametrize("width", [80, 60, 40])
def test_the_apply_bar_at_80_columns_drops_columns_not_digits_and_speaks_bytes_alone(width):
    """apply's ByteProgress on a terminal of ``width`` columns, a 9 GiB copy reported as rsync
    reports it, then the commit's long step name: each frame it draws is one line within the
    width, every figure whole (rich's columns cut them: ``9.0/…``, ``0:00:…``, and put a second line
    under them), and bytes are counted in one unit family (``GiB``, ``GiB/s``; not ``GB/s``)."""
    import io
    import time

    from rich.console import Console

    from transplant.cli.progress import ByteProgress

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    total = 9 * 1024 ** 3
    frames = []

    def frame() -> list[str]:
        bar._progress.refresh()
        drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "\n", out.getvalue())
        lines = [line for line in drawn.split("\n") if line.strip()]
        return lines[-1:]

    with ByteProgress(console, total, {"files": total - 4096, "patches": 4096}) as bar:
        bar.step("files")
        for done in (1, 10, 37, 99):
            bar.progress(done, 100)
            time.sleep(0.05)
            frames += frame()
        bar.step("commit")
        frames += frame()
    assert len(frames) == 5, frames
    for line in frames:
        assert len(line) <= width, (width, line)
        amounts = re.search(r"\d+(?:\.\d)? (?:B|KiB|MiB|GiB) of 9\.0 GiB", line)
        assert amounts, line  # the done-of-total figure, whole
        assert "…" not in line[amounts.start():], line  # no figure after it is cut either
        assert not re.search(r"\b[kMGT]B\b|[kMGT]B/s", line), line  # one family: binary units only
    copying = frames[:4]
    assert all(line.startswith("copying files") for line in copying), copying
    if width >= 80:
        assert all(re.search(r"\d+% [\d.]+ (?:B|KiB|MiB|GiB)/s", line) for line in copying[1:]), copying
        assert "━" in copying[-1], copying  # the bar stays where there is room for it
    assert frames[-1].startswith("committing"), frames


def test_apply_in_a_real_80_column_terminal_keeps_each_line_within_it(pair):
    """apply run in a pseudo-terminal of 80 columns (its bar, spinner and summary as a person sees
    them): exit 0, and no line it draws is wider than the terminal or cut inside a figure."""
    import fcntl
    import pty
    import struct
    import termios
    import time

    tmp_path, manifest = pair
    big = build_wheel(tmp_path / "wheels" / "big", "foo", "3.0",
                      {"foo/__init__.py": "V = 3\n", "foo/blob.bin": os.urandom(48 * 1024 * 1024)})
    donor = make_venv(tmp_path / "donor-big", [big])
    m = manifest(donor=donor)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(tmp_path / "state"), "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "transplant", "apply", str(m), "--yes"], cwd=ROOT, env=env,
                            stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    got = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: the command ended
            break
        if not chunk:
            break
        got += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, got.decode(errors="replace")
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", got.decode(errors="replace"))
    lines = [line for line in re.split(r"[\r\n]", drawn) if line.strip()]
    assert any(line.startswith("applied transaction") for line in lines), lines
    frames = [(line, amounts) for line in lines if (amounts := re.search(r"(?:B|KiB|MiB) of 48\.0 MiB", line))]
    assert frames, lines  # the bar drew at least its first frame
    for line in lines:
        assert len(line) <= 80, line
    for line, amounts in frames:  # every figure whole (a long step name may be shortened), bytes in one family
        assert "…" not in line[amounts.start():] and not re.search(r"[kMG]B/s", line), line


@pytest.mark.parametrize("command", ["inventory", "status", "history", "rollback"])
def test_commands_that_take_host_venv_given_a_bare_path_suggest_its_local_form(pair, command):
    tmp_path, _ = pair
    for given in (tmp_path / "target", tmp_path / "not-there"):
        code, piped, filed = run80(tmp_path, command, str(given))
        assert code == 64
        for text in (piped, filed):
            assert f"local:{given}" in flat(text) and "/root/venv" not in text and "Traceback" not in text, text
