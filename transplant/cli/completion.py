"""Shell completion (face): bash, zsh and fish scripts generated from ``transplant``'s own parser.

The scripts are made from :func:`transplant.cli.app.build_parser` each time they are printed, so
the commands and options they offer are the parser's (they cannot go stale, and a new option is
offered once the script is printed again). What each argument takes is read from the parser too:
a ``MANIFEST`` argument completes ``*.yaml``/``*.yml`` files (``PLAN.json`` also ``*.json``), a
``HOST:VENV`` argument the host forms (``local:`` and every ``Host`` of the operator's ssh config
without a wildcard, as ``NAME:``; after ``local:`` the local folders), ``FILE``/``PEM`` any file,
``DIR`` a folder.

The host forms are read when the shell completes, by ``transplant completion --hosts``
(:func:`ssh_config_hosts`), so a host added to ``~/.ssh/config`` is offered at once.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SHELLS", "ssh_config_hosts", "host_forms", "script", "install_path"]

SHELLS = ("bash", "zsh", "fish")

#: what an argument takes, for completion: ``manifest`` (``*.yaml``, ``*.yml``), ``plan`` (those and
#: ``*.json``), ``host`` (``HOST:VENV``), ``manifest-host`` (either), ``file``, ``dir``, ``choice``
#: (:attr:`Arg.choices`), ``text`` (nothing to offer)
KINDS = ("manifest", "plan", "host", "manifest-host", "file", "dir", "choice", "text")


@dataclass
class Arg:
    """One option or positional argument of a command, as completion sees it.

    :ivar flags: the option strings (empty for a positional).
    :ivar kind: what its value is (:data:`KINDS`); None: an option that takes no value.
    """

    flags: list[str]
    kind: str | None
    help: str = ""
    choices: list[str] = field(default_factory=list)


@dataclass
class Command:
    name: str
    help: str
    options: list[Arg]
    positionals: list[Arg]


def _kind(action: argparse.Action) -> str | None:
    """What ``action``'s value is (:data:`KINDS`), read from its metavar and name; None: no value."""
    if action.nargs == 0 or (action.option_strings and action.nargs == "?"):
        return None  # an optional value is given with '=' (--clear-jit-caches=NAMES): the next word is not it
    if action.choices:
        return "choice"
    meta = ((action.metavar if isinstance(action.metavar, str) else None) or action.dest or "").upper()
    dest = action.dest
    if "MANIFEST" in meta and "HOST" in meta:
        return "manifest-host"
    if "PLAN.JSON" in meta:
        return "plan"
    if "HOST" in meta:
        return "host"
    if meta == "MANIFEST" or dest == "manifest":
        return "manifest"
    if meta == "DIR" or dest in ("workdir",):
        return "dir"
    if meta in ("FILE", "PEM") or dest in ("identity_file", "known_hosts", "out", "junit", "ca"):
        return "file"
    return "text"


def commands(parser: argparse.ArgumentParser) -> list[Command]:
    """The commands of ``parser`` (its one subparsers action) with their options and positionals,
    in the parser's order; options hidden from ``--help`` (``argparse.SUPPRESS``) are left out."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    out = []
    for name, p in sub.choices.items():
        options: list[Arg] = []
        positionals: list[Arg] = []
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            arg = Arg(list(action.option_strings), _kind(action), _one_line(action.help or ""),
                      [str(c) for c in action.choices or ()])
            (options if action.option_strings else positionals).append(arg)
        out.append(Command(name, _one_line(helps.get(name, "")), options, positionals))
    return out


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 70 else text[:67].rstrip() + "..."


def ssh_config_hosts(path: Path | None = None, *, _depth: int = 0) -> list[str]:
    """The host names of ``Host`` lines in an ssh config (``~/.ssh/config`` when None), following
    ``Include`` (relative names under ``~/.ssh``, globs), in file order, each once; patterns
    (``*``, ``?``, ``!``) are left out. A file that cannot be read gives nothing (completion
    never fails)."""
    ssh_dir = Path.home() / ".ssh"
    path = ssh_dir / "config" if path is None else path
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found: list[str] = []
    for line in text.splitlines():
        words = line.strip().replace("=", " ", 1).split()
        if not words or words[0].startswith("#"):
            continue
        key, values = words[0].lower(), words[1:]
        if key == "host":
            found += [v for v in values if not any(c in v for c in "*?!")]
        elif key == "include" and _depth < 8:  # OpenSSH's own limit on nested includes is 16
            for value in values:
                pattern = os.path.expanduser(value)
                if not os.path.isabs(pattern):
                    pattern = str(ssh_dir / pattern)
                for name in sorted(glob.glob(pattern)):
                    found += ssh_config_hosts(Path(name), _depth=_depth + 1)
    return list(dict.fromkeys(found))


def host_forms(path: Path | None = None) -> list[str]:
    """What a ``HOST:VENV`` argument completes to before its path: ``local:``, then ``NAME:`` for
    each host of :func:`ssh_config_hosts`."""
    return ["local:"] + [f"{h}:" for h in ssh_config_hosts(path)]


def install_path(shell: str) -> Path:
    """Where ``transplant completion SHELL --install`` writes the script: the user's completion
    folder that the shell reads without set-up (bash-completion's
    ``$XDG_DATA_HOME/bash-completion/completions``, fish's ``$XDG_CONFIG_HOME/fish/completions``);
    zsh's ``~/.zfunc`` needs ``fpath=(~/.zfunc $fpath)`` before ``compinit`` in ``~/.zshrc``."""
    home = Path.home()
    data = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return {"bash": data / "bash-completion" / "completions" / "transplant",
            "zsh": home / ".zfunc" / "_transplant",
            "fish": config / "fish" / "completions" / "transplant.fish"}[shell]


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of :data:`SHELLS`), made from ``parser``."""
    cmds = commands(parser)
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](cmds)


def _q(text: str) -> str:
    return shlex.quote(text)


def _valued(cmd: Command) -> list[Arg]:
    return [o for o in cmd.options if o.kind is not None]


_BASH = r'''# transplant completion for bash, made by `transplant completion bash` from transplant's parser.
# Install: transplant completion bash --install   (or: source <(transplant completion bash))

_transplant_files() {  # $1: the word; then the endings to offer (none: every file); folders always
    local cur="$1" f s; shift
    _transplant_filenames=1
    while IFS= read -r f; do
        if [[ -d "$f" ]]; then COMPREPLY+=("${f%/}/"); continue; fi
        if (( $# == 0 )); then COMPREPLY+=("$f"); continue; fi
        for s in "$@"; do [[ "$f" == *"$s" ]] && { COMPREPLY+=("$f"); break; }; done
    done < <(compgen -f -- "$cur")
}

_transplant_hosts() {  # $1: the word; $2: the transplant command to ask
    local cur="$1" h
    if [[ "$cur" == local:* ]]; then
        while IFS= read -r h; do COMPREPLY+=("local:$h/"); done < <(compgen -d -- "${cur#local:}")
    elif [[ "$cur" != *:* ]]; then
        while IFS= read -r h; do
            [[ "$h" == "$cur"* ]] && COMPREPLY+=("$h")
        done < <("$2" completion --hosts 2>/dev/null)
    fi
}

_transplant_value() {  # $1: kind; $2: the word; $3: the transplant command; $4: the choices
    local f
    case "$1" in
        manifest) _transplant_files "$2" .yaml .yml ;;
        plan) _transplant_files "$2" .yaml .yml .json ;;
        host) _transplant_hosts "$2" "$3" ;;
        manifest-host) _transplant_hosts "$2" "$3"; [[ "$2" == *:* ]] || _transplant_files "$2" .yaml .yml ;;
        file) _transplant_files "$2" ;;
        dir) _transplant_filenames=1
             while IFS= read -r f; do COMPREPLY+=("${f%/}/"); done < <(compgen -d -- "$2") ;;
        choice) COMPREPLY+=($(compgen -W "$4" -- "$2")) ;;
    esac
}

_transplant() {
    # the words are split at blanks only (bash's own words are split at ':' and '=' too, which
    # would cut HOST:VENV in three); what bash replaces is the word after its last break, below
    local line="${COMP_LINE:0:COMP_POINT}" cur prev cmd="" kind="" i n=0 skip="" _transplant_filenames=""
    local -a words
    read -ra words <<< "$line"
    if [[ "$line" =~ [[:space:]]$ ]]; then cur=""; else cur="${words[-1]}"; unset 'words[-1]'; fi
    prev="${words[-1]}"
    local self="${words[0]:-transplant}"
    [[ "$self" == transplant ]] || command -v "$self" >/dev/null 2>&1 || self=transplant
    COMPREPLY=()
    for ((i = 1; i < ${#words[@]}; i++)); do
        [[ "${words[i]}" == -* ]] && continue
        cmd="${words[i]}"; break
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "@COMMANDS@ --help --version" -- "$cur"))
        return
    fi
    local options="" valued="" choices=""
    case "$cmd" in
@OPTIONS@
    esac
    # the value of an option that takes one
    case " $valued " in
        *" ${prev%%=*} "*)
            if [[ "$prev" != *=* ]]; then
                kind="$(_transplant_kind "$cmd" "$prev")"
                choices="$(_transplant_choices "$cmd" "$prev")"
                _transplant_value "$kind" "$cur" "$self" "$choices"
                _transplant_colon "$cur"
                return
            fi ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
        return
    fi
    # which positional this is: the words after the command, less options and their values
    for ((i = i + 1; i < ${#words[@]}; i++)); do
        if [[ -n "$skip" ]]; then skip=""; continue; fi
        if [[ "${words[i]}" == -* ]]; then
            [[ "${words[i]}" != *=* && " $valued " == *" ${words[i]} "* ]] && skip=1
            continue
        fi
        n=$((n + 1))
    done
    kind="$(_transplant_positional "$cmd" "$n")"
    _transplant_value "$kind" "$cur" "$self" "$(_transplant_choices "$cmd" "#$n")"
    _transplant_colon "$cur"
}

_transplant_colon() {  # bash replaces only what follows the word's last ':': drop what precedes it
    local cur="$1" k
    # a host form (NAME:, local:/path/) or a folder is completed further: no space after the only candidate
    if (( ${#COMPREPLY[@]} == 1 )) && [[ "${COMPREPLY[0]}" == *[:/] ]]; then compopt -o nospace 2>/dev/null; fi
    # file names are quoted by readline (spaces...), but not beside host forms: it would write NAME\:
    if [[ -n "$_transplant_filenames" && " ${COMPREPLY[*]} " != *": "* ]]; then compopt -o filenames 2>/dev/null; fi
    if [[ "$cur" == *:* && "$COMP_WORDBREAKS" == *:* ]]; then
        local colon="${cur%"${cur##*:}"}"
        for k in "${!COMPREPLY[@]}"; do COMPREPLY[k]="${COMPREPLY[k]#"$colon"}"; done
    fi
}

_transplant_kind() {
    case "$1 $2" in
@KINDS@
    esac
}

_transplant_choices() {
    case "$1 $2" in
@CHOICES@
    esac
}

_transplant_positional() {
    case "$1 $2" in
@POSITIONALS@
    esac
}

complete -F _transplant transplant
'''


def _bash(cmds: list[Command]) -> str:
    options, kinds, choices, positionals = [], [], [], []
    for c in cmds:
        flags = " ".join(f for o in c.options for f in o.flags)
        valued = " ".join(f for o in _valued(c) for f in o.flags)
        options.append(f"        {c.name}) options={_q(flags)}; valued={_q(valued)} ;;")
        for o in _valued(c):
            for f in o.flags:
                kinds.append(f"        {_q(c.name + ' ' + f)}) echo {o.kind} ;;")
                if o.choices:
                    choices.append(f"        {_q(c.name + ' ' + f)}) echo {_q(' '.join(o.choices))} ;;")
        for n, p in enumerate(c.positionals):
            positionals.append(f"        {_q(f'{c.name} {n}')}) echo {p.kind or 'text'} ;;")
            if p.choices:
                choices.append(f"        {_q(f'{c.name} #{n}')}) echo {_q(' '.join(p.choices))} ;;")
    text = _BASH
    for key, value in (("@COMMANDS@", " ".join(c.name for c in cmds)), ("@OPTIONS@", "\n".join(options)),
                       ("@KINDS@", "\n".join(kinds) or "        x) ;;"),
                       ("@CHOICES@", "\n".join(choices) or "        x) ;;"),
                       ("@POSITIONALS@", "\n".join(positionals) or "        x) ;;")):
        text = text.replace(key, value)
    return text


def _zsh_value(kind: str | None, choices: list[str]) -> str:
    return {"manifest": "_files -g '*.(yaml|yml)(-.)'", "plan": "_files -g '*.(yaml|yml|json)(-.)'",
            "host": "_transplant_hosts", "manifest-host": "_transplant_hosts; [[ ${words[CURRENT]} == *:* ]] || _files -g '*.(yaml|yml)(-.)'",
            "file": "_files", "dir": "_files -/",
            "choice": "compadd -- " + " ".join(_q(c) for c in choices)}.get(kind or "", ":")


def _zsh(cmds: list[Command]) -> str:
    lines = ["#compdef transplant",
             "# transplant completion for zsh, made by `transplant completion zsh` from transplant's parser.",
             "# Install: transplant completion zsh --install, with fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc",
             "",
             "_transplant_hosts() {",
             "  if [[ $PREFIX == local:* ]]; then compset -P 'local:'; _files -/; return; fi",
             "  [[ $PREFIX == *:* ]] && return",
             "  local -a forms; forms=(${(f)\"$(${words[1]:-transplant} completion --hosts 2>/dev/null)\"})",
             "  compadd -S '' -- $forms",
             "}",
             "",
             "_transplant() {",
             "  local cmd='' i n=0 skip=''",
             "  for ((i = 2; i < CURRENT; i++)); do",
             "    [[ ${words[i]} == -* ]] && continue",
             "    cmd=${words[i]}; break",
             "  done",
             "  if [[ -z $cmd ]]; then",
             "    local -a cmds; cmds=(",
             *[f"      {_q(c.name + ':' + c.help.replace(':', chr(92) + ':'))}" for c in cmds],
             "    )",
             "    _describe command cmds; return",
             "  fi",
             "  local prev=${words[CURRENT-1]} valued=''",
             "  case $cmd in"]
    for c in cmds:
        valued = " ".join(f for o in _valued(c) for f in o.flags)
        lines.append(f"    {c.name}) valued={_q(valued)} ;;")
    lines += ["  esac",
              "  if [[ $prev == -* && \" $valued \" == *\" $prev \"* ]]; then",
              "    case \"$cmd $prev\" in"]
    for c in cmds:
        for o in _valued(c):
            for f in o.flags:
                lines.append(f"      {_q(c.name + ' ' + f)}) {_zsh_value(o.kind, o.choices)} ;;")
    lines += ["    esac; return", "  fi",
              "  if [[ $PREFIX == -* ]]; then", "    case $cmd in"]
    for c in cmds:
        described = []
        for o in c.options:
            for f in o.flags:
                described.append(_q(f + ":" + o.help.replace(":", "\\:")))
        lines.append(f"      {c.name}) local -a opts; opts=({' '.join(described)}); _describe option opts ;;")
    lines += ["    esac; return", "  fi",
              "  for ((i = i + 1; i < CURRENT; i++)); do",
              "    if [[ -n $skip ]]; then skip=''; continue; fi",
              "    if [[ ${words[i]} == -* ]]; then",
              "      [[ ${words[i]} != *=* && \" $valued \" == *\" ${words[i]} \"* ]] && skip=1",
              "      continue",
              "    fi",
              "    n=$((n + 1))",
              "  done",
              "  case \"$cmd $n\" in"]
    for c in cmds:
        for n, p in enumerate(c.positionals):
            lines.append(f"    {_q(f'{c.name} {n}')}) {_zsh_value(p.kind, p.choices)} ;;")
    lines += ["  esac", "}", "",
              "# autoloaded from fpath: complete now; sourced (after compinit): register the function",
              "if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then _transplant \"$@\"; else compdef _transplant transplant; fi",
              ""]
    return "\n".join(lines)


def _fish(cmds: list[Command]) -> str:
    lines = ["# transplant completion for fish, made by `transplant completion fish` from transplant's parser.",
             "# Install: transplant completion fish --install",
             "complete -c transplant -e",
             "complete -c transplant -f",
             "function __transplant_files  # the folders, and the files with these endings",
             "    set -l word (commandline -ct)",
             "    for f in $word*",
             "        if test -d $f",
             "            echo $f/",
             "        else",
             "            for s in $argv",
             "                if string match -q -- \"*$s\" $f",
             "                    echo $f",
             "                    break",
             "                end",
             "            end",
             "        end",
             "    end",
             "end",
             "function __transplant_hosts",
             "    set -l word (commandline -ct)",
             "    if string match -q 'local:*' -- $word",
             "        __fish_complete_directories (string replace -r '^local:' '' -- $word) | string replace -r '^' 'local:'",
             "    else if not string match -q '*:*' -- $word",
             "        transplant completion --hosts 2>/dev/null",
             "    end",
             "end",
             "complete -c transplant -n __fish_use_subcommand -l help -s h -d 'show help'",
             "complete -c transplant -n __fish_use_subcommand -l version -d 'show the version'"]
    for c in cmds:
        lines.append(f"complete -c transplant -n __fish_use_subcommand -a {c.name} -d {_q(c.help)}")
    for c in cmds:
        seen = f"'__fish_seen_subcommand_from {c.name}'"
        for o in c.options:
            parts = []
            for f in o.flags:
                parts.append(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}")
            value = _fish_value(o.kind, o.choices)
            lines.append(f"complete -c transplant -n {seen} {' '.join(parts)}{value} -d {_q(o.help)}".rstrip())
        for p in c.positionals:
            value = _fish_value(p.kind, p.choices, positional=True)
            if value:
                lines.append(f"complete -c transplant -n {seen}{value}")
    return "\n".join(lines) + "\n"


def _fish_value(kind: str | None, choices: list[str], positional: bool = False) -> str:
    """The ``complete`` arguments for a value of ``kind``: ``-x`` (a value, no other files) or ``-r
    -F`` (any file) for an option's value; a positional's offers only its candidates."""
    if kind is None:
        return ""
    if kind == "file":
        return " -F" if positional else " -r -F"
    value = {"manifest": "(__transplant_files .yaml .yml)", "plan": "(__transplant_files .yaml .yml .json)",
             "host": "(__transplant_hosts)", "manifest-host": "(__transplant_hosts; __transplant_files .yaml .yml)",
             "dir": "(__fish_complete_directories)", "choice": " ".join(choices)}.get(kind)
    if value is None:
        return "" if positional else " -x"
    return ("" if positional else " -x") + " -a " + _q(value)
