"""The operator's config file from the operator's side: ``transplant config`` and the other commands
run as commands (exit code, output in a pipe, in a file, on a pty), with a real config file under a
``XDG_CONFIG_HOME`` of the test's own, real environment variables and flags, and a real pair of
local venvs where a bad file must change nothing."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transplant.lab.wheels import build_wheel, make_venv

TRANSPLANT = str(Path(sys.executable).parent / "transplant")
KEYS = ["state_dir", "registry.insecure", "registry.token_hosts", "registry.progress", "ssh.identity_file",
        "ssh.known_hosts", "output.width", "output.color"]
_CLEARED = ("TRANSPLANT_STATE_DIR", "XDG_STATE_HOME", "TRANSPLANT_REGISTRY_INSECURE", "TRANSPLANT_REGISTRY_TOKEN_HOSTS",
            "TRANSPLANT_REGISTRY_PROGRESS", "COLUMNS", "NO_COLOR")


@pytest.fixture
def home(tmp_path):
    """An environment with a home and XDG_CONFIG_HOME of the test's own and none of the variables
    the config file stands beside; returns (environment, the config file's path)."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    (tmp_path / "home").mkdir()
    return env, tmp_path / "xdg" / "transplant" / "config.toml"


def write(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)


def run(args, env, **kw):
    return subprocess.run([TRANSPLANT, *args], env=env, capture_output=True, text=True, timeout=120, **kw)


def settings(env, *extra) -> dict[str, tuple[str, str]]:
    done = run(["config", "--json", *extra], env)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "transplant.config/1"
    return {s["key"]: (s["value"], s["source"]) for s in doc["settings"]}


def test_without_a_file_every_value_is_the_default_and_the_file_is_named(home):
    env, path = home
    done = run(["config"], env)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == f"config file: {path} (not present: built-in defaults)"
    # in a pipe: one line per setting, no box drawing, no padding at the line ends
    for key in KEYS:
        (line,) = [x for x in lines if x.split()[:1] == [key]]
        assert line.endswith(" default") and line == line.rstrip()
    assert not any(c in done.stdout for c in "│─┃━┏┡")
    got = settings(env)
    assert got["state_dir"] == (f"{env['HOME']}/.local/state/transplant", "default")
    assert got["registry.progress"] == ("1024/30", "default")
    assert got["ssh.known_hosts"] == ("~/.ssh/known_hosts", "default")
    # XDG_CONFIG_HOME unset (or relative, which the specification says to ignore): ~/.config
    for value in (None, "relative/xdg"):
        other = {k: v for k, v in env.items() if k != "XDG_CONFIG_HOME"}
        if value:
            other["XDG_CONFIG_HOME"] = value
        first = run(["config"], other).stdout.splitlines()[0]
        assert first == f"config file: {env['HOME']}/.config/transplant/config.toml (not present: built-in defaults)"


def test_file_then_environment_then_flag_each_named_as_the_source(home, tmp_path):
    env, path = home
    write(path, f"""\
        state_dir = "~/state-from-file"
        [registry]
        insecure = ["127.0.0.1:5000", "localhost"]
        token_hosts = ["auth.example.com"]
        progress = "2048/10"
        [ssh]
        identity_file = "~/.ssh/id_file"
        known_hosts = "{tmp_path}/kh"
        [output]
        width = 100
        color = false
        """)
    got = settings(env)
    home_dir = env["HOME"]
    assert got == {"state_dir": (f"{home_dir}/state-from-file", "file"),
                   "registry.insecure": ("127.0.0.1:5000,localhost", "file"),
                   "registry.token_hosts": ("auth.example.com", "file"),
                   "registry.progress": ("2048/10", "file"),
                   "ssh.identity_file": (f"{home_dir}/.ssh/id_file", "file"),
                   "ssh.known_hosts": (f"{tmp_path}/kh", "file"),
                   "output.width": ("100", "file"), "output.color": ("false", "file")}
    # the environment variables that existed before the file still win over it
    over = {**env, "TRANSPLANT_STATE_DIR": str(tmp_path / "env-state"), "TRANSPLANT_REGISTRY_INSECURE": "[::1]:5001",
            "TRANSPLANT_REGISTRY_TOKEN_HOSTS": "other.example", "TRANSPLANT_REGISTRY_PROGRESS": "1/5",
            "COLUMNS": "90", "NO_COLOR": "1"}
    got = settings(over)
    assert got["state_dir"] == (str(tmp_path / "env-state"), "environment (TRANSPLANT_STATE_DIR)")
    assert got["registry.insecure"] == ("[::1]:5001", "environment (TRANSPLANT_REGISTRY_INSECURE)")
    assert got["registry.token_hosts"] == ("other.example", "environment (TRANSPLANT_REGISTRY_TOKEN_HOSTS)")
    assert got["registry.progress"] == ("1/5", "environment (TRANSPLANT_REGISTRY_PROGRESS)")
    assert got["output.width"] == ("90", "environment (COLUMNS)")
    assert got["output.color"] == ("false", "environment (NO_COLOR)")
    # a flag wins over the file
    got = settings(env, "--identity-file", str(tmp_path / "flag-key"), "--known-hosts", str(tmp_path / "flag-kh"))
    assert got["ssh.identity_file"] == (str(tmp_path / "flag-key"), "flag (--identity-file)")
    assert got["ssh.known_hosts"] == (str(tmp_path / "flag-kh"), "flag (--known-hosts)")
    # the table says the same, in a file
    out = tmp_path / "config.txt"
    with open(out, "w") as f:
        assert subprocess.run([TRANSPLANT, "config"], env=over, stdout=f, timeout=60).returncode == 0
    text = out.read_text()
    assert f"config file: {path}\n" in text
    assert "settings in effect (flag, then environment, then file, then default)" in text
    (line,) = [x for x in text.splitlines() if x.startswith(" registry.progress") or x.startswith("registry.progress")]
    assert line.split() == ["registry.progress", "1/5", "environment", "(TRANSPLANT_REGISTRY_PROGRESS)"]


def test_the_state_folder_of_the_file_is_the_one_commands_use(home, tmp_path):
    env, path = home
    write(path, f'state_dir = "{tmp_path}/state-from-file"\n')
    done = run(["snapshot", "--list"], env)
    assert done.returncode == 0
    assert done.stdout.splitlines()[0].endswith(f" {tmp_path}/state-from-file/snapshots")
    done = run(["snapshot", "--list"], {**env, "TRANSPLANT_STATE_DIR": str(tmp_path / "env-state")})
    assert done.stdout.splitlines()[0].endswith(f" {tmp_path}/env-state/snapshots")


def test_the_ssh_defaults_of_the_file_are_used_below_flags_and_manifests(home, tmp_path):
    """An identity file that does not exist is refused before any connection, naming its path: which
    path is named shows which setting won (the host is never reached)."""
    env, path = home
    write(path, f'[ssh]\nidentity_file = "{tmp_path}/key-from-file"\n')
    done = run(["status", "root@127.0.0.9:/srv/venv"], env)
    assert done.returncode == 1
    assert (f"identity file {tmp_path}/key-from-file does not exist (the config file's ssh.identity_file; "
            f"see 'transplant config')") in done.stdout
    done = run(["status", "root@127.0.0.9:/srv/venv", "--identity-file", str(tmp_path / "key-from-flag")], env)
    assert done.returncode == 1 and f"identity file {tmp_path}/key-from-flag does not exist\n" in done.stdout
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"version: 1\ndonor: {{host: root@127.0.0.9, venv: /srv/a}}\n"
                        f"target: {{host: root@127.0.0.10, venv: /srv/b}}\noverlay: [foo]\n"
                        f"ssh: {{identity_file: {tmp_path}/key-from-manifest}}\n")
    done = run(["plan", str(manifest)], env)
    assert done.returncode == 1
    assert f"{tmp_path}/key-from-manifest does not exist" in done.stdout
    assert "key-from-file" not in done.stdout


@pytest.mark.parametrize(("text", "said", "hint"), [
    ("state_dri = \"/x\"\n", "unknown key state_dri (did you mean state_dir?)", "the keys are state_dir, registry.insecure"),
    ("[output]\nwidht = 100\n", "unknown key output.widht (did you mean output.width?)", "the keys are"),
    ("[output]\nwidth = \"wide\"\n", "output.width = 'wide' is not a whole number from 20 to 1000",
     "write it as: [output] width = 120"),
    ("[registry]\nprogress = \"fast\"\n", "registry.progress = 'fast' is not a string \"BYTES/SECONDS\", both positive",
     'write it as: [registry] progress = "1024/30"'),
    ("[ssh]\nknown_hosts = 7\n", "ssh.known_hosts = 7 is not a string (a path; ~ is your home)",
     'write it as: [ssh] known_hosts = "~/.ssh/known_hosts"'),
    ("registry = \"localhost\"\n", "registry is a section ([registry]), not a value", "write it as a table"),
    ("state_dir = /x\n", "not valid TOML (Invalid value (at line 1, column 13))", "fix that line"),
])
def test_a_bad_file_is_an_error_naming_the_file_the_key_and_the_fix(home, text, said, hint):
    env, path = home
    write(path, text)
    for args in (["config"], ["snapshot", "--list"]):
        done = run(args, env)
        assert done.returncode == 1, done.stdout
        first, second = done.stdout.splitlines()[:2]
        assert first == f"error: {path}: {said}"
        assert second.startswith("hint: ") and hint in second
        assert "Traceback" not in done.stdout + done.stderr


def test_a_file_other_users_may_write_is_refused(home):
    env, path = home
    write(path, 'state_dir = "/tmp/elsewhere"\n', mode=0o664)
    done = run(["config"], env)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"error: {path}: writable by other users (mode 664); it names the SSH key and known_hosts file transplant "
        f"trusts, so it is not read", f"hint: chmod go-w {path}"]


def test_a_registry_entry_of_the_file_obeys_the_loopback_rule(home):
    env, path = home
    write(path, '[registry]\ninsecure = ["registry.example.com:5000"]\n')
    done = run(["config"], env)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (f"error: {path} (registry.insecure): registry.example.com:5000 is not a "
                                           f"loopback address; only a registry on this host (localhost, 127.0.0.0/8, "
                                           f"::1) may be spoken to without TLS")


def test_a_bad_file_changes_nothing(home, tmp_path):
    """apply with a bad config file: refused before anything is done; the target is as it was."""
    env, path = home
    wheels = tmp_path / "wheels"
    make_venv(tmp_path / "donor", [build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n"})])
    make_venv(tmp_path / "target", [build_wheel(wheels, "foo", "1.0", {"foo/__init__.py": "V = 1\n"})])
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"version: 1\ndonor: {{host: local, venv: {tmp_path / 'donor'}}}\n"
                        f"target: {{host: local, venv: {tmp_path / 'target'}}}\noverlay: [foo]\n")
    env = {**env, "TRANSPLANT_STATE_DIR": str(tmp_path / "state")}
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "target").rglob("*"))
    write(path, "[ssh]\nidentity = \"~/.ssh/id\"\n")
    done = run(["apply", str(manifest), "--yes"], env)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (f"error: {path}: unknown key ssh.identity (did you mean "
                                           f"ssh.identity_file?)")
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "target").rglob("*")) == before
    site = next((tmp_path / "target").glob("lib/python*/site-packages"))
    assert (site / "foo" / "__init__.py").read_text() == "V = 1\n"
    assert not (tmp_path / "target" / ".transplant").exists()
    # fixed, the same command applies
    write(path, "[ssh]\nidentity_file = \"~/.ssh/id\"\n")
    assert run(["apply", str(manifest), "--yes"], env).returncode == 0
    assert (site / "foo" / "__init__.py").read_text() == "V = 2\n"


def _on_a_pty(args, env, columns: int) -> str:
    """Run transplant with its output on a pseudo-terminal ``columns`` wide; what it wrote."""
    import fcntl
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**env, "TERM": "xterm-256color"}
    proc = subprocess.Popen([TRANSPLANT, *args], env=env, stdout=child_fd, stderr=child_fd, stdin=subprocess.DEVNULL)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(main_fd)
    return b"".join(chunks).decode()


def test_output_width_and_color_of_the_file_on_a_terminal(home, tmp_path):
    env, path = home
    deep = tmp_path / ("a-long-folder-name-" * 4) / "state"
    write(path, f'state_dir = "{deep}"\n')
    at_80 = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _on_a_pty(["config"], env, 80)).splitlines()
    assert max(len(x.rstrip("\r")) for x in at_80[1:]) <= 80
    # the long value folds inside its column, no character lost
    assert "".join(x.split("│")[2].strip() for x in at_80 if x.count("│") == 4
                   and x.split("│")[1].strip() in ("state_dir", "")) == str(deep)
    wide = _on_a_pty(["config"], env, 200)
    assert "\x1b[" in wide  # styled on a terminal by default (the table's header is bold)
    assert max(len(x) for x in wide.splitlines()) > 100
    write(path, f'state_dir = "{deep}"\n[output]\nwidth = 60\ncolor = false\n')
    narrow = _on_a_pty(["config"], env, 200)
    assert "\x1b[" not in narrow
    first, *table = narrow.splitlines()
    assert first.startswith("config file: ")  # a path to paste: never folded
    assert max(len(x.rstrip("\r")) for x in table) <= 60
    assert "state_dir" in narrow
    # COLUMNS wins over the file's width
    assert max(len(x.rstrip("\r")) for x in _on_a_pty(["config"], {**env, "COLUMNS": "150"}, 200).splitlines()) > 60
    # off a terminal the width does not apply: a pipe is never wrapped
    piped = run(["config"], env).stdout
    (line,) = [x for x in piped.splitlines() if x.split()[:1] == ["state_dir"]]
    assert line.split() == ["state_dir", str(deep), "file"]


def test_a_reader_that_goes_away_early(home):
    """``transplant config | true`` and ``transplant completion bash | true``: the reader is gone
    before the first write (``true`` exits at once, transplant takes a fifth of a second to start):
    exit 0 (the command's work is only its output), no traceback; ``| head -1``: the first line."""
    env, _path = home
    for args in ("config", "completion bash", "config --json"):
        for reader, lines in (("true", 0), ("head -1", 1)):
            done = subprocess.run(["bash", "-c", f'"{TRANSPLANT}" {args} | {reader}; echo "codes ${{PIPESTATUS[*]}}" >&2'],
                                  env=env, capture_output=True, text=True, timeout=60)
            assert len(done.stdout.splitlines()) == lines
            assert done.stderr.strip().splitlines()[-1] == "codes 0 0", done.stderr
            assert "Traceback" not in done.stderr


def test_the_registry_client_takes_the_file_settings_below_the_environment(tmp_path, monkeypatch):
    """The registry client that snapshot --push, recover and apply make: plain http to the loopback
    registry and the progress deadline the file names; the environment variable wins."""
    from transplant.donor.oci import Client, Reference

    for var in _CLEARED:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    write(tmp_path / "xdg" / "transplant" / "config.toml",
          '[registry]\ninsecure = ["127.0.0.1:5000"]\nprogress = "4096/12"\n')
    ref = Reference.parse("oci://127.0.0.1:5000/team/snaps:v1")
    client = Client(ref)
    assert client.base == "http://127.0.0.1:5000/v2/team/snaps"
    assert client.settings.progress == (4096, 12.0)
    monkeypatch.setenv("TRANSPLANT_REGISTRY_PROGRESS", "10/3")
    monkeypatch.setenv("TRANSPLANT_REGISTRY_INSECURE", "127.0.0.1:6000")
    client = Client(ref)
    assert client.base == "https://127.0.0.1:5000/v2/team/snaps" and client.settings.progress == (10, 3.0)
