"""The command line (face): parse arguments, call the library, map errors to exit codes.

Exit codes: ``plan`` 0 planned (with or without changes), 3 blocked by an error finding,
and with ``--detailed-exitcode`` (as Terraform's ``-detailed-exitcode``) 2 for changes and no
blocking finding; ``apply`` 0 done (or nothing to do, or ``--resume`` with nothing to
resume), 3 blocked, 1 also for ``--rollback`` with nothing interrupted; ``verify`` 0 no
stage failed, 3 a stage failed; ``clone`` 0 done, 3 done but a text file or symlink of the clone still
names the old prefix; every command 1 when it could not do its job
(unreachable host, bad manifest, failed apply) and 64 for a command-line mistake. With
``--json``, such an error is also printed on standard output as
``{"schema": "transplant.error/1", "error", "hint", "code"}`` (``code``: the finding code the
error stands for, such as ``interpreter-missing``, or null).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from transplant import __version__
from transplant.cli.commands import (apply, clone, completion, config, demo, history, init, inventory, plan, recover,
                                     rollback, snapshot, status, verify)
from transplant.errors import TransplantError
from transplant.exitcodes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_USAGE, exit_code_for

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_USAGE"]

if TYPE_CHECKING:  # rich loads in _run, after the early start (a plan's probes begin before it)
    from rich.console import Console


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit code 2 would read as "changes"
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


#: The commands, in the order ``transplant --help`` lists them: name -> the module holding its
#: ``HELP`` (the line in that list), ``add_arguments(parser)`` and ``handle(args, console)`` (the
#: exit code). Loading a module loads only the standard library, :mod:`transplant.cli.options`,
#: the errors and the exit codes; what its command runs is imported inside ``handle``, so building
#: the parser stays light and a command's early work (``apply`` opens its SSH connections first,
#: :mod:`transplant.cli.warm`) begins before the command's own modules load.
COMMANDS: dict[str, ModuleType] = {
    "plan": plan, "apply": apply, "rollback": rollback, "history": history, "verify": verify, "init": init,
    "inventory": inventory, "clone": clone, "snapshot": snapshot, "status": status, "recover": recover,
    "demo": demo, "config": config, "completion": completion,
}


def build_parser(commands: Mapping[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``transplant``: one subcommand per entry of ``commands`` (default
    :data:`COMMANDS`), its options from the module's ``add_arguments``, ``func`` its ``handle``."""
    parser = _Parser(prog="transplant", description="Move working CUDA Python environments between GPU hosts.")
    parser.add_argument("--version", action="version", version=f"transplant {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in (COMMANDS if commands is None else commands).items():
        command = sub.add_parser(name, help=module.HELP)
        module.add_arguments(command)
        command.set_defaults(func=module.handle)
    return parser


def _bare_options(argv: Sequence[str]) -> list[str]:
    """``argv`` with a bare ``--clear-jit-caches`` written ``--clear-jit-caches=`` (list, remove nothing).

    The option takes its cache names only as ``--clear-jit-caches=NAMES``: without this, argparse
    (``nargs="?"``) would take the next word as the names, so ``verify --clear-jit-caches m.yaml``
    read the manifest as a cache name and then said the manifest was missing.
    """
    return [f"{a}=" if a == "--clear-jit-caches" else a for a in argv]


def _spaced_cache_names(argv: Sequence[str]) -> str | None:
    """The word after a bare ``--clear-jit-caches`` when it is only cache names (``triton``,
    ``triton,flashinfer``, ``all``) and either no file of that name exists or another argument
    that is not an option follows it (verify takes one manifest or HOST:VENV, so a file named
    ``triton`` in the current folder is not what was meant): the names were meant with ``=``
    (:func:`_bare_options` would leave them as a stray manifest argument); else None."""
    for at, (option, word) in enumerate(zip(argv, argv[1:], strict=False)):
        later = [a for a in argv[at + 2:] if not a.startswith("-")]
        if option != "--clear-jit-caches" or (os.path.lexists(word) and not later):
            continue
        from transplant.verify.runner import JIT_CACHES

        names = word.split(",")
        if all(n in (*JIT_CACHES, "all") for n in names):
            return word
    return None


def _unknown_cache_word(argv: Sequence[str], args: argparse.Namespace) -> str | None:
    """The word after a bare ``--clear-jit-caches`` when argparse took it as the manifest argument
    and other arguments were left over (``verify --clear-jit-caches bogus VENV``): it was meant as
    cache names, and is none (:func:`_spaced_cache_names` catches real names); else None."""
    taken = getattr(args, "manifest", None)
    for option, word in zip(argv, argv[1:], strict=False):
        if option == "--clear-jit-caches" and word == taken and not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``transplant``; returns the exit code (see the module docstring)."""
    began = False
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser()
        spaced = _spaced_cache_names(argv)
        if spaced is not None:
            parser.error(f"--clear-jit-caches takes its cache names after '=' (without it, it lists them and "
                         f"removes nothing): write --clear-jit-caches={spaced}")
        args, stray = parser.parse_known_args(_bare_options(argv))
        if stray:
            word = _unknown_cache_word(argv, args)
            if word is not None:
                from transplant.verify.runner import JIT_CACHES

                parser.error(f"--clear-jit-caches: {word!r} is not a JIT cache; the caches are {', '.join(JIT_CACHES)} "
                             f"(or all), named after '=' (e.g. --clear-jit-caches=triton); without '=' it lists them "
                             f"and removes nothing")
            args = parser.parse_args(_bare_options(argv))  # argparse's own error for the stray arguments
        try:
            config_error = _use_config(args)
            if config_error is None:
                from transplant.cli.warm import connect_early

                connect_early(args)  # apply: both SSH connections open while the command's modules import
            began = True
            return _run(args, config_error)
        finally:
            from transplant.hosts import early

            early.close_unused()
    except KeyboardInterrupt:  # Ctrl-C while the command starts (its modules import), or as it ends
        print("interrupted" if began else "interrupted before the command began: nothing was changed",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def _use_config(args: argparse.Namespace) -> TransplantError | None:
    """Read the operator's config file before the command does anything, and set its SSH defaults
    (:attr:`transplant.hosts.host.SSHOptions.DEFAULTS`); the file's error, for the command to
    report instead of running (None: the file is fine or absent). ``completion`` reads none (a
    <Tab> never fails for it)."""
    from transplant.hosts.host import SSHOptions

    SSHOptions.DEFAULTS = {}
    if args.command == "completion":
        return None
    from transplant.controller.config_file import load_config

    try:
        config = load_config()
    except TransplantError as exc:
        return exc
    SSHOptions.DEFAULTS = {k: config.get(f"ssh.{k}") for k in ("identity_file", "known_hosts")
                           if config.get(f"ssh.{k}") is not None}
    return None


def _run(args: argparse.Namespace, config_error: TransplantError | None = None) -> int:
    """Run the parsed command; returns its exit code.

    Standard output and error are written through :class:`_Discarding` while it runs: a reader
    that went away (``transplant apply M --yes | head -1``) never stops the command half-way;
    its work is done (the output is not the work), the rest of its output discarded, and its
    exit code is the work's."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Discarding(sys.stdout), _Discarding(sys.stderr)
    try:
        return _run_command(args, config_error)
    finally:
        sys.stdout, sys.stderr = saved


class _Discarding:
    """A text stream that, once its reader is gone (a broken pipe), discards what is written
    instead of raising: the descriptor is pointed at /dev/null (so the interpreter's last flush,
    and whatever else writes there, succeed too) and every later write is dropped. Everything
    else is the wrapped stream's.

    :ivar closed_pipe: whether the reader went away.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.closed_pipe = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
            self._stream.flush()  # what was buffered goes to /dev/null now
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured in tests)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _run_command(args: argparse.Namespace, config_error: TransplantError | None = None) -> int:
    """:func:`_run`'s body, its output streams made :class:`_Discarding`; ``config_error``: the
    config file's, reported instead of running the command."""
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout
    width, color = _output_style(config_error is None and args.command != "completion")
    console = _console(stream, None if "COLUMNS" in os.environ else width if stream.isatty() else PIPE_WIDTH,
                       color=color)
    from rich.text import Text

    try:
        if config_error is not None:
            raise config_error
        code = args.func(args, console)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # not through _Discarding (a stream of its own): the command stopped part-way
        return _closed_pipe()
    except TransplantError as exc:
        _print_error(console, exc)
        if exc.hint:  # a command to paste: never wrapped by the console (the terminal may fold it, newline-free)
            console.print(Text.assemble(("hint: ", "bold"), exc.hint), highlight=False, soft_wrap=True)
        if getattr(args, "json", False):
            print(json.dumps({"schema": "transplant.error/1", "error": exc.message, "hint": exc.hint,
                              "code": exc.code}))
        return exit_code_for(exc)
    except KeyboardInterrupt as stop:
        console.print("interrupted")
        said = getattr(stop, "said", None)  # apply's: what the target's records show now
        if said:
            console.print(Text(said), highlight=False, soft_wrap=True)
        elif args.command == "apply" and not getattr(args, "resume", False) and not getattr(args, "rollback", False):
            # a transaction that had begun stays on the target, and the next apply refuses to start over it
            source = shlex.quote(args.source)
            console.print(Text(f"if the target's transaction had begun: transplant apply {source} --resume "
                               f"finishes it, --rollback undoes it (transplant apply {source} --yes says which "
                               f"is needed)"), highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    except EOFError:  # end of input at a [y/N] question (Ctrl-D): a "no"
        console.print("no answer (end of input): nothing was changed", markup=False)
        return EXIT_FAIL


def _print_error(console: Console, exc: TransplantError) -> None:
    """``error [<code>]: <message>``'s first line, then its problem lines and the files that differ.

    The problem lines (a manifest's ``- key: ...; fix: ...``) carry snippets to paste: one line each,
    never wrapped by the console (the terminal may fold them, newline-free)."""
    from rich.text import Text

    first, *problems = exc.message.split("\n")
    head = Text()
    head.append(f"error [{exc.code}]: " if exc.code else "error: ", style="bold red")
    head.append(first)
    console.print(head, highlight=False)
    for line in problems + [f"  {line}" for line in exc.mismatches[:50]]:
        console.print(Text(line), highlight=False, soft_wrap=True)


#: Per thread, whether a :func:`_console`'s render is under way (its nested renders do not clean).
_RENDERING = threading.local()


#: The width laid out for a pipe or a file (no ``COLUMNS``): wide enough that nothing is wrapped,
#: so each finding, path and hint stays on its own line for grep; tables are only as wide as
#: their content.
PIPE_WIDTH = 4000


def _output_style(configured: bool) -> tuple[int | None, bool]:
    """The terminal width (None: the terminal's own) and whether to colour, from the config file's
    ``[output]`` (``configured`` False: the file is not read); ``COLUMNS`` and ``NO_COLOR`` win
    where :func:`_console` is given them."""
    if not configured:
        return None, True
    from transplant.controller.config_file import load_config

    config = load_config()  # already read and checked by _use_config
    color = config.get("output.color")
    return config.get("output.width"), True if color is None else color


def _console(stream: Any, width: int | None, *, color: bool = True) -> Console:
    """rich's Console on ``stream`` (``width`` columns; None: the terminal's), but a closed pipe
    is raised to :func:`main` (rich would exit with 1), and every piece of text it writes has its
    control characters made visible (:func:`transplant.core.units.visible_lines`).

    The text is cleaned where it leaves rich, not where it is made: the plain lines, tables,
    error messages, spinner and progress texts of every command all pass through
    :meth:`Console.render`, and host names, paths, errors from hosts and registries, and names
    from files reach them from many places; rich's own control codes (cursor moves, styles) are
    segments of their own and are kept. (rich drops a few control characters itself, but not the
    escape that starts a CSI or OSC sequence.)

    Off a terminal (a pipe, a file) text is not wrapped, tables have no box drawing (their
    columns are separated by spaces) and no line ends in padding; ``NO_COLOR`` (no-color.org: set
    and not empty), or ``color`` False (the config file's ``output.color = false``), drops every
    style, bold included, on a terminal too."""
    import copy

    from rich.console import Console, Group
    from rich.segment import Segment
    from rich.table import Table
    from rich.text import Text

    from transplant.core.units import visible_lines

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

        def render(self, renderable: Any, options: Any = None) -> Any:
            # only the outermost render cleans: a table lays its cells out first and would crop
            # a cell's text made longer inside it (what was laid out too narrow overflows instead)
            plain = not self.is_terminal
            if plain and isinstance(renderable, Table) and (renderable.box is not None or renderable.title):
                title = renderable.title
                renderable = copy.copy(renderable)  # the caller's table keeps its box and title
                renderable.box, renderable.title = None, None
                if title:  # a line of its own: never folded to the table's width
                    renderable = Group(title if isinstance(title, Text) else Text(str(title)), renderable)
            if getattr(_RENDERING, "depth", 0):
                yield from super().render(renderable, options)
                return
            _RENDERING.depth = 1
            try:
                line: list[Segment] = []
                for segment in super().render(renderable, options):
                    text = segment.text
                    if not (segment.control or text.isprintable() or text == "\n"):
                        segment = Segment(visible_lines(text), segment.style)
                    if not plain:
                        yield segment
                        continue
                    # a wrapped text (COLUMNS set off a terminal) is one segment holding its line
                    # ends, each after the space it broke at: split there, so each line loses its padding
                    if segment.control or "\n" not in segment.text:
                        line.append(segment)
                        continue
                    for index, part in enumerate(segment.text.split("\n")):
                        if index:  # a line's end: its padding dropped
                            yield from _without_padding(line)
                            line = []
                            yield Segment("\n")
                        if part:
                            line.append(Segment(part, segment.style))
                yield from _without_padding(line)
            finally:
                _RENDERING.depth = 0

    no_color = bool(os.environ.get("NO_COLOR")) or not color
    return _Console(file=stream, width=width, soft_wrap=width == PIPE_WIDTH,
                    color_system=None if no_color else "auto")  # rich's default, "auto"


def _without_padding(line: list[Any]) -> list[Any]:
    """A line's segments less the spaces at its end (a table pads each cell to its column)."""
    from rich.segment import Segment

    while line and not line[-1].control and not line[-1].text.strip(" "):
        line = line[:-1]
    if line and not line[-1].control and line[-1].text != line[-1].text.rstrip(" "):
        line = [*line[:-1], Segment(line[-1].text.rstrip(" "), line[-1].style)]
    return line


def _closed_pipe() -> int:
    """The reader of our output went away and the command stopped part-way (a write that did not
    go through :class:`_Discarding`): its work may be unfinished, so this is a failure (1), said
    on standard error where it is still open; never a quiet 0.

    As the Python documentation (``signal``, "Note on SIGPIPE") recommends: point standard
    output at /dev/null so that the interpreter's final flush does not fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno())  # type: ignore[union-attr]  # None: the AttributeError below
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured in tests)
        pass
    os.close(devnull)
    try:
        print("error: the output pipe closed before the command ended; its work may be unfinished",
              file=sys.__stderr__, flush=True)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_FAIL
