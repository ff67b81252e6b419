"""``transplant completion`` (face): print or install the shell completion script (bash, zsh, fish).

The scripts themselves are made from the parser by :mod:`transplant.cli.completion`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle"]

HELP = "print or install the shell completion script (bash, zsh, fish)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``SHELL``, ``--install`` and the hidden ``--hosts`` (what the scripts ask at each <Tab>)."""
    parser.add_argument("shell", nargs="?", choices=("bash", "zsh", "fish"), help="the shell to complete in")
    parser.add_argument("--install", action="store_true",
                        help="write it where the shell finds it (bash: ~/.local/share/bash-completion/completions/; "
                             "fish: ~/.config/fish/completions/; zsh: ~/.zfunc/, which must be on fpath)")
    parser.add_argument("--hosts", action="store_true", help=argparse.SUPPRESS)


def handle(args: argparse.Namespace, console: Console) -> int:
    """``completion SHELL``: the script on standard output; ``--install``: written to the shell's
    completion folder (the path said); ``--hosts``: the ``HOST:VENV`` forms, one a line. Returns 0.

    :raises UsageError: no shell named (and not ``--hosts``).
    :raises TransplantError: the completion folder cannot be written.
    """
    import os
    import shlex
    import sys

    from transplant.cli import completion
    from transplant.cli.app import build_parser
    from transplant.errors import TransplantError, UsageError
    from transplant.exitcodes import EXIT_OK

    if args.hosts:
        print("\n".join(completion.host_forms()))
        return EXIT_OK
    if args.shell is None:
        raise UsageError("name the shell: transplant completion bash|zsh|fish",
                         hint="transplant completion bash --install (or: source <(transplant completion bash))")
    text = completion.script(args.shell, build_parser())
    if not args.install:
        sys.stdout.write(text)
        return EXIT_OK
    path = completion.install_path(args.shell)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise TransplantError(f"cannot write {path}: {exc.strerror}",
                              hint=f"transplant completion {args.shell} > FILE, into a folder your shell "
                                   f"reads") from None
    console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    console.print({"bash": "a new bash loads it (bash-completion); this one: source " + shlex.quote(str(path)),
                   "zsh": "add fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc, then start a new zsh",
                   "fish": "a new fish loads it"}[args.shell], markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK
