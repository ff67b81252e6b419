"""Shell completion from the operator's side: ``transplant completion bash|zsh|fish`` run as a command
(exit code, the script on a pipe and in a file), then each script loaded into the real shell and asked
to complete, in a folder of real files, with a real ``~/.ssh/config`` (with ``Include`` and wildcard
hosts) in a home folder of the test's own.

bash is driven the way readline drives it (``COMP_LINE``/``COMP_POINT`` and the function ``complete -p``
names); fish answers ``complete -C LINE`` itself; zsh runs the generated function with its completion
builtins (``compadd``, ``_files``, ``_describe``, ``compset``) standing in, since they exist only
inside a completion widget. A shell that is not installed skips its test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transplant.cli import completion
from transplant.cli.app import build_parser

TRANSPLANT = str(Path(sys.executable).parent / "transplant")


@pytest.fixture
def place(tmp_path):
    """A home with an ssh config, a work folder with manifests, a plan, other files and a folder;
    the environment for the shells (the venv's ``transplant`` first on PATH)."""
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "# the fleet\nHost gpu-07 gpu-08\n  HostName 127.0.0.7\nHost *\n  User root\n"
        "Host ct?9 !bastion\nHost=ct130\nInclude conf.d/*.conf\n")
    (home / ".ssh" / "conf.d" / "lab.conf").write_text("Host lab-a\n  Port 2222\n")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    for name in ("m.yaml", "n.yml", "plan.json", "notes.txt"):
        (work / name).write_text("x\n")
    env = {**os.environ, "HOME": str(home), "PATH": f"{Path(TRANSPLANT).parent}:{os.environ['PATH']}",
           "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("COLUMNS", None)
    return tmp_path, work, env


def _run(args, env, cwd=None, **kw):
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, **kw)


def test_completion_prints_each_script_on_a_pipe_and_into_a_file(place):
    tmp_path, work, env = place
    for shell in completion.SHELLS:
        piped = _run([TRANSPLANT, "completion", shell], env)
        assert piped.returncode == 0, piped.stderr
        assert piped.stderr == ""
        assert "transplant completion" in piped.stdout.splitlines()[0] + piped.stdout.splitlines()[1]
        # the documented form: into a file by the shell's redirection; the same bytes
        out = tmp_path / f"script.{shell}"
        filed = _run(["sh", "-c", f'"{TRANSPLANT}" completion {shell} > "{out}"'], env)
        assert filed.returncode == 0 and out.read_text() == piped.stdout
    # no shell named: a usage error that says the forms
    bare = _run([TRANSPLANT, "completion"], env)
    assert bare.returncode == 64
    assert "name the shell: transplant completion bash|zsh|fish" in bare.stdout
    wrong = _run([TRANSPLANT, "completion", "tcsh"], env)
    assert wrong.returncode == 64 and "invalid choice: 'tcsh'" in wrong.stderr


def test_hosts_are_read_from_the_ssh_config_without_wildcards(place):
    _tmp, _work, env = place
    answer = _run([TRANSPLANT, "completion", "--hosts"], env)
    assert answer.returncode == 0
    assert answer.stdout.splitlines() == ["local:", "gpu-07:", "gpu-08:", "ct130:", "lab-a:"]


def test_a_bad_config_file_never_breaks_completion(place):
    tmp_path, _work, env = place
    (tmp_path / "config" / "transplant").mkdir(parents=True)
    (tmp_path / "config" / "transplant" / "config.toml").write_text("this is = = not toml\n")
    answer = _run([TRANSPLANT, "completion", "--hosts"], env)
    assert answer.returncode == 0 and answer.stdout.startswith("local:\n")


_BASH_DRIVER = r'''
source "$1"
complete -p transplant
c() {  # what readline gives a completion function, then the candidates it returned
    COMP_LINE="$1"; COMP_POINT=${#1}; COMP_WORDS=($1); [[ "$1" == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
    _transplant
    printf '%s\n' "[$1]" "${COMPREPLY[@]}"
}
'''


def _bash(script: Path, lines: list[str], env, cwd) -> dict[str, list[str]]:
    """Each line's candidates, as bash's completion function for ``transplant`` gives them."""
    body = _BASH_DRIVER + "".join(f"c {_sq(line)}\n" for line in lines)
    done = _run(["bash", "--norc", "-c", body, "driver", str(script)], env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    out: dict[str, list[str]] = {}
    head, *rest = done.stdout.splitlines()
    assert head == "complete -F _transplant transplant"
    current = None
    for line in rest:
        if line.startswith("[") and line[1:-1] in lines:
            current = out.setdefault(line[1:-1], [])
        elif current is not None:
            current.append(line)
    return out


def _sq(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_bash_completes_commands_options_manifests_and_hosts(place):
    tmp_path, work, env = place
    script = tmp_path / "transplant.bash"
    script.write_text(_run([TRANSPLANT, "completion", "bash"], env).stdout)
    got = _bash(script, ["transplant ", "transplant pl", "transplant plan ", "transplant plan --",
                         "transplant apply ", "transplant status ", "transplant status gpu",
                         f"transplant status local:{work}/s", "transplant status gpu-07:/ro",
                         "transplant clone local:/srv/a ", "transplant init --donor ", "transplant init --out ",
                         "transplant completion ", "transplant verify --clear-jit-caches ",
                         "transplant verify --json m.yaml --junit "], env, work)
    commands = list(build_parser()._subparsers._group_actions[0].choices)
    assert got["transplant "] == [*commands, "--help", "--version"]
    assert "config" in commands and "completion" in commands
    assert got["transplant pl"] == ["plan"]
    # manifests: *.yaml and *.yml, and folders to go into; not the other files
    assert sorted(got["transplant plan "]) == ["m.yaml", "n.yml", "sub/"]
    # a saved plan too where apply takes one
    assert sorted(got["transplant apply "]) == ["m.yaml", "n.yml", "plan.json", "sub/"]
    # every option of the parser's plan, and only those
    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    assert sorted(got["transplant plan --"]) == sorted(f for a in plan._actions for f in a.option_strings
                                                       if f.startswith("--"))
    # MANIFEST|HOST:VENV: the host forms (local:, each Host without a wildcard, Include followed) and manifests
    assert sorted(got["transplant status "]) == sorted(["local:", "gpu-07:", "gpu-08:", "ct130:", "lab-a:",
                                                        "m.yaml", "n.yml", "sub/"])
    assert got["transplant status gpu"] == ["gpu-07:", "gpu-08:"]
    # after local:, the local folders; bash replaces what follows the word's last ':'
    assert got[f"transplant status local:{work}/s"] == [f"{work}/sub/"]
    assert got["transplant status gpu-07:/ro"] == []  # a remote path: nothing guessed
    # clone's second argument is a HOST:VENV only
    assert got["transplant clone local:/srv/a "] == ["local:", "gpu-07:", "gpu-08:", "ct130:", "lab-a:"]
    assert got["transplant init --donor "] == ["local:", "gpu-07:", "gpu-08:", "ct130:", "lab-a:"]
    assert sorted(got["transplant init --out "]) == ["m.yaml", "n.yml", "notes.txt", "plan.json", "sub/"]
    assert got["transplant completion "] == ["bash", "zsh", "fish"]
    # --clear-jit-caches takes its names after '=': the next word is verify's manifest or venv
    assert "m.yaml" in got["transplant verify --clear-jit-caches "]
    assert "local:" in got["transplant verify --clear-jit-caches "]
    assert sorted(got["transplant verify --json m.yaml --junit "]) == ["m.yaml", "n.yml", "notes.txt",
                                                                      "plan.json", "sub/"]


def test_install_writes_where_bash_completion_loads_it(place):
    tmp_path, work, env = place
    done = _run([TRANSPLANT, "completion", "bash", "--install"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    path = tmp_path / "data" / "bash-completion" / "completions" / "transplant"
    assert done.stdout.splitlines()[0] == f"wrote {path}"
    assert path.read_text() == _run([TRANSPLANT, "completion", "bash"], env).stdout
    assert _bash(path, ["transplant st"], env, work)["transplant st"] == ["status"]
    # zsh: ~/.zfunc, and the line ~/.zshrc needs
    done = _run([TRANSPLANT, "completion", "zsh", "--install"], env)
    assert done.returncode == 0
    assert done.stdout.splitlines() == [f"wrote {env['HOME']}/.zfunc/_transplant",
                                        "add fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc, then start a new zsh"]
    # fish's own folder, under XDG_CONFIG_HOME
    assert _run([TRANSPLANT, "completion", "fish", "--install"], env).returncode == 0
    assert (tmp_path / "config" / "fish" / "completions" / "transplant.fish").is_file()


def test_install_into_a_folder_that_cannot_be_made_is_a_clear_error(place):
    tmp_path, _work, env = place
    (tmp_path / "blocked").write_text("a file where the folder would go\n")
    done = _run([TRANSPLANT, "completion", "bash", "--install"], {**env, "XDG_DATA_HOME": str(tmp_path / "blocked")})
    assert done.returncode == 1
    assert f"cannot write {tmp_path / 'blocked'}/bash-completion/completions/transplant" in done.stdout
    assert "transplant completion bash > FILE" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_new_option_is_offered_without_editing_the_script():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["status"]
    sub.add_argument("--brand-new-option", metavar="FILE")
    for shell in completion.SHELLS:
        assert "brand-new-option" in completion.script(shell, parser)


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_from_the_generated_script(place):
    tmp_path, work, env = place
    script = tmp_path / "transplant.fish"
    script.write_text(_run([TRANSPLANT, "completion", "fish"], env).stdout)
    assert _run(["fish", "-n", str(script)], env).returncode == 0

    def ask(line: str) -> list[str]:
        done = _run(["fish", "--no-config", "-c", f"source {script}; complete -C{_sq(line)}"], env, cwd=work)
        assert done.returncode == 0, done.stderr
        return sorted(x.split("\t")[0] for x in done.stdout.splitlines())

    assert "plan" in ask("transplant ") and "config" in ask("transplant ")
    assert ask("transplant plan ") == ["m.yaml", "n.yml", "sub/"]
    assert ask("transplant status ") == sorted(["local:", "gpu-07:", "gpu-08:", "ct130:", "lab-a:",
                                                "m.yaml", "n.yml", "sub/"])
    assert ask(f"transplant status local:{work}/s") == [f"local:{work}/sub/"]
    assert ask("transplant init --donor ") == sorted(["local:", "gpu-07:", "gpu-08:", "ct130:", "lab-a:"])
    assert ask("transplant completion ") == ["bash", "fish", "zsh"]
    assert "--detailed-exitcode" in ask("transplant plan --")


_ZSH_DRIVER = r'''
compdef() { print -r -- "compdef $*" }
source "$1"
# the completion builtins exist only inside a completion widget: these say what was asked of them
compadd() { print -r -- "compadd $*" }
_files() { print -r -- "_files $*" }
_describe() { print -r -- "_describe $1 ${(j:|:)${(P)2}}" }
compset() { PREFIX=${PREFIX#local:}; print -r -- "compset $*" }
c() { words=(${=1}); [[ $1 == *' ' ]] && words+=(''); CURRENT=${#words}; PREFIX=${words[CURRENT]}
      print -r -- "[$1]"; _transplant }
'''


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_runs_and_asks_for_the_right_candidates(place):
    tmp_path, work, env = place
    script = tmp_path / "_transplant"
    script.write_text(_run([TRANSPLANT, "completion", "zsh"], env).stdout)
    assert script.read_text().startswith("#compdef transplant\n")
    assert _run(["zsh", "-n", str(script)], env).returncode == 0
    lines = ["transplant ", "transplant status ", "transplant status local:/tm", "transplant plan ",
             "transplant init --donor ", "transplant completion "]
    body = _ZSH_DRIVER + "".join(f"c {_sq(line)}\n" for line in lines)
    done = _run(["zsh", "-f", "-c", body, "driver", str(script)], env, cwd=work)
    assert done.returncode == 0, done.stderr
    registered, rest = done.stdout.split("\n", 1)
    assert registered == "compdef _transplant transplant"  # sourced: registered, not run
    out = rest.split("\n[")
    said = {part.split("]\n", 1)[0].lstrip("["): part.split("]\n", 1)[1] for part in out}
    assert said["transplant "].startswith("_describe command plan:inventory both venvs")
    assert "completion:print or install the shell completion script" in said["transplant "]
    assert said["transplant status "].splitlines() == ["compadd -S  -- local: gpu-07: gpu-08: ct130: lab-a:",
                                                       "_files -g *.(yaml|yml)(-.)"]
    assert said["transplant status local:/tm"].splitlines() == ["compset -P local:", "_files -/"]
    assert said["transplant plan "].splitlines() == ["_files -g *.(yaml|yml)(-.)"]
    assert said["transplant init --donor "].splitlines() == ["compadd -S  -- local: gpu-07: gpu-08: ct130: lab-a:"]
    assert said["transplant completion "].splitlines() == ["compadd -- bash zsh fish"]


_ZPTY = r'''
zmodload zsh/zpty
zpty -b z 'zsh -f -i'
zpty -w z "PS1='> '; fpath=($1 \$fpath); autoload -Uz compinit; compinit -u -D; echo READY"
zpty -r z line '*READY*'; zpty -r z line '*READY*'
zpty -w -n z $'transplant status gp\t'
zpty -r z out '*u-0*'  # zsh rings the bell between what was typed and what it added
print -r -- "typed: $out"
zpty -w -n z $'\t'
zpty -r z out '*gpu-08:*'
print -r -- "listed: $out"
zpty -d z
'''


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_for_real_in_an_interactive_shell(place):
    """The script as zsh autoloads it from fpath, behind compinit, in an interactive zsh on a pty:
    ``transplant status gp<Tab>`` completes to the common part of two ssh config hosts, a second
    <Tab> lists them."""
    tmp_path, work, env = place
    folder = tmp_path / "zfunc"
    folder.mkdir()
    (folder / "_transplant").write_text(_run([TRANSPLANT, "completion", "zsh"], env).stdout)
    done = _run(["zsh", "-f", "-c", _ZPTY, "driver", str(folder)], env, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    typed = done.stdout.split("typed: ", 1)[1].split("listed: ", 1)[0]
    assert "transplant status gpu-0" in typed.replace("\a", "")
    listed = done.stdout.split("listed: ", 1)[1]
    assert "gpu-07:" in listed and "gpu-08:" in listed


def test_bash_completes_for_real_on_a_pty(place):
    """The script sourced in an interactive bash on a pty, readline doing the completing (its word
    breaks at ':' included): ``transplant status gp<Tab>`` adds the common part of two hosts, ``7<Tab>``
    the rest with no backslash before the ':' and no space after it, ``plan <Tab><Tab>`` lists the
    manifests and the folder."""
    import pty
    import select
    import time

    tmp_path, work, env = place
    script = tmp_path / "transplant.bash"
    script.write_text(_run([TRANSPLANT, "completion", "bash"], env).stdout)
    pid, fd = pty.fork()
    if pid == 0:  # the child: an interactive bash in the work folder
        os.chdir(work)
        os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)

    def until(text: str, seconds: float = 20) -> str:
        seen, end = b"", time.time() + seconds
        while time.time() < end and text.encode() not in seen:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break
        return seen.decode(errors="replace")

    try:
        os.write(fd, f"PS1='> '; source {script}; echo READY\n".encode())
        until("READY\r\n")
        os.write(fd, b"transplant status gp\t")
        assert "u-0" in until("u-0").split("status gp", 1)[1]
        os.write(fd, b"7\t")
        after = until(":")
        assert after.replace("\a", "").startswith("7:") and "\\:" not in after
        os.write(fd, b"x\x15transplant plan \t\t")  # Ctrl-U: a new line
        listed = until("sub/")
        assert "m.yaml" in listed and "n.yml" in listed and "sub/" in listed and "plan.json" not in listed
    finally:
        os.write(fd, b"\x15exit\n")
        os.waitpid(pid, 0)
        os.close(fd)
