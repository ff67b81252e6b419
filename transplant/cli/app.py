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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transplant import __version__
from transplant.cli.options import fleet_options, ssh_options
from transplant.errors import TransplantError
from transplant.exitcodes import EXIT_BLOCKED, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, exit_code_for

__all__ = ["main", "EXIT_USAGE"]

if TYPE_CHECKING:  # rich loads in _run, after the early start (a plan's probes begin before it)
    from rich.console import Console



class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code 2 would read as "changes"
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# Each command's module is imported when it runs, so no command pays for the others': ``apply``
# first starts its SSH connections (:func:`transplant.cli.warm.connect_early`), then imports the
# planner and the rest.
def plan_command(args: argparse.Namespace, console: Console) -> int:
    """:func:`transplant.cli.commands.plan.plan_command`, its module imported when it runs."""
    from transplant.cli.commands.plan import plan_command as command

    return command(args, console)


def apply_command(args: argparse.Namespace, console: Console) -> int:
    """:func:`transplant.cli.commands.apply.apply_command`, its module imported when it runs."""
    from transplant.cli.commands.apply import apply_command as command

    return command(args, console)


def rollback_command(args: argparse.Namespace, console: Console) -> int:
    """:func:`transplant.cli.commands.apply.rollback_command`, its module imported when it runs."""
    from transplant.cli.commands.apply import rollback_command as command

    return command(args, console)


def history_command(args: argparse.Namespace, console: Console) -> int:
    """:func:`transplant.cli.commands.apply.history_command`, its module imported when it runs."""
    from transplant.cli.commands.apply import history_command as command

    return command(args, console)


def inventory_command(args: argparse.Namespace, console: Console) -> int:
    """:func:`transplant.cli.commands.inventory.inventory_command`, its module imported when it runs."""
    from transplant.cli.commands.inventory import inventory_command as command

    return command(args, console)


def _cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.verify import verify_command  # the verify ladder: off the other commands' path

    return verify_command(args, console)


def _cmd_init(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.init import init_command
    from transplant.cli.locations import parse_location

    init_command(args, console, parse_location)
    return EXIT_OK


def _cmd_clone(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.clone import clone_command
    from transplant.cli.locations import parse_location

    return EXIT_OK if clone_command(args, console, parse_location) else EXIT_BLOCKED


def _cmd_status(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.status import status_command

    return status_command(args, console)


def _cmd_recover(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.recover import recover_command

    return recover_command(args, console)


def _cmd_snapshot(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.snapshot import snapshot_command

    return snapshot_command(args, console)


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.demo import run_demo  # the demo pulls in the lab; keep it off the other commands' path

    return run_demo(console, workdir=Path(args.workdir) if args.workdir else None, keep=args.keep)


def _cmd_config(args: argparse.Namespace, console: Console) -> int:
    from transplant.cli.commands.config import config_command

    return config_command(args, console)


def _cmd_completion(args: argparse.Namespace, console: Console) -> int:
    """``completion SHELL``: the script on standard output; ``--install``: written to the shell's
    completion folder (the path said); ``--hosts``: the ``HOST:VENV`` forms, one a line."""
    from transplant.cli import completion
    from transplant.errors import UsageError

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
                              hint=f"transplant completion {args.shell} > FILE, into a folder your shell reads") from None
    console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    console.print({"bash": "a new bash loads it (bash-completion); this one: source " + shlex.quote(str(path)),
                   "zsh": "add fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc, then start a new zsh",
                   "fish": "a new fish loads it"}[args.shell], markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``transplant``."""
    parser = _Parser(prog="transplant", description="Move working CUDA Python environments between GPU hosts.")
    parser.add_argument("--version", action="version", version=f"transplant {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("plan", help="inventory both venvs and show what apply would change")
    p.add_argument("manifest", help="the manifest (YAML; see manifests/REFERENCE.md)")
    p.add_argument("--json", action="store_true", help="print the plan document (schema transplant.plan/1)")
    p.add_argument("--out", help="save the plan as JSON for a later 'transplant apply FILE'")
    p.add_argument("--detailed-exitcode", action="store_true",
                   help="exit 2 when there are changes (0 none, 3 blocked, 1 failed), as Terraform's")
    fleet_options(p)
    p.set_defaults(func=plan_command)
    a = sub.add_parser("apply", help="copy exactly what differs, then check the target against the plan")
    a.add_argument("source", metavar="MANIFEST|PLAN.json",
                   help="a manifest (plans again), or a plan saved with 'plan --out' (refused if the hosts changed)")
    a.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    a.add_argument("--force", action="store_true", help="apply despite error findings")
    a.add_argument("--resume", action="store_true", help="finish the target's interrupted transaction")
    a.add_argument("--rollback", action="store_true", help="undo the target's interrupted transaction")
    a.add_argument("--break-lock", action="store_true",
                   help="take the target's lock even if another controller holds it (only when that one is gone)")
    a.add_argument("--verify", action="store_true", help="verify each target after applying to it")
    a.add_argument("--strict", action="store_true", help="with --verify: what could not be checked here fails")
    a.add_argument("--rollback-on-failure", action="store_true",
                   help="with --verify: roll the transaction back, unattended, when verify fails (fleets, CI)")
    a.add_argument("--compress", action="store_true",
                   help="compress the file stream (zstd where both hosts have it, else zlib): for a slow link "
                        "between the controller and a host; one target only")
    a.add_argument("--json", action="store_true", help="with several targets: print the fleet report as JSON")
    fleet_options(a)
    a.set_defaults(func=apply_command)
    r = sub.add_parser("rollback", help="restore the target to the state before its newest (or every later) transaction")
    r.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                   help="the manifest whose target to roll back, or the venv itself (local:/srv/venv, "
                        "root@gpu-07:/root/venv): its transactions are recorded in it")
    r.add_argument("--to", metavar="ID", help="undo every transaction after this one (see 'transplant history')")
    r.add_argument("--force", action="store_true", help="roll back even if files changed since the transaction")
    r.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    r.add_argument("--break-lock", action="store_true",
                   help="take the target's lock even if another controller holds it (only when that one is gone)")
    ssh_options(r, what=", for HOST:VENV")
    r.set_defaults(func=rollback_command)
    h = sub.add_parser("history", help="list the transactions recorded in the target venv")
    h.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                   help="the manifest whose target to read, or the venv itself (local:/srv/venv)")
    h.add_argument("--json", action="store_true", help="print them as JSON (schema transplant.history/1)")
    ssh_options(h, what=", for HOST:VENV")
    h.set_defaults(func=history_command)
    v = sub.add_parser("verify", help="prove the target venv works: the verify ladder, interpreter to a served request")
    v.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                   help="the manifest whose target and verify settings to use, or a venv (local:/srv/venv) to "
                        "check without one")
    v.add_argument("--json", action="store_true", help="print the results (schema transplant.verify/3)")
    v.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE")
    v.add_argument("--strict", action="store_true",
                   help="fail every stage and item that could not be checked here (no driver, no GPU, no torch, "
                        "fails identically in the donor): for GPU hosts where everything must run")
    v.add_argument("--imports", metavar="NAMES", help="comma-separated import names (without a manifest: the "
                   "distributions providing them are checked too)")
    v.add_argument("--clear-jit-caches", nargs="?", const="", default=None, metavar="NAMES",
                   help="list the triton, flashinfer and torch-inductor cache folders of the target's user (they are "
                        "outside the venv, shared by the user's other venvs: nothing is removed); "
                        "--clear-jit-caches=triton,flashinfer,torch-inductor (or =all) removes the ones named")
    ssh_options(v, what=", for HOST:VENV")
    fleet_options(v)
    v.set_defaults(func=_cmd_verify)
    n = sub.add_parser("init", help="probe a donor and a target and write a starting manifest")
    n.add_argument("--donor", required=True, metavar="HOST:VENV", help="the venv that works, e.g. root@ct129:/root/venv")
    n.add_argument("--target", required=True, metavar="HOST:VENV", help="the venv to bring it to")
    n.add_argument("--overlay", action="append", metavar="NAME",
                   help="a distribution to bring with what it needs (a closure), or a glob (default: sglang)")
    n.add_argument("--out", required=True, metavar="FILE", help="the manifest to write (never overwritten)")
    ssh_options(n)
    n.set_defaults(func=_cmd_init)
    i = sub.add_parser("inventory", help="print what a venv holds")
    i.add_argument("location", metavar="HOST:VENV|MANIFEST",
                   help="e.g. local:/root/venv_sglang or root@gpu-07:22:/root/venv, or a manifest (its target, "
                        "reached with its ssh settings)")
    i.add_argument("--json", action="store_true", help="print the probe's document (schema transplant.inventory/1; without --files each "
                        "distribution has record_summary {files, bytes} and record null)")
    i.add_argument("--hash", action="append", metavar="PATTERN", help="hash the files of these distributions")
    i.add_argument("--files", action="store_true",
                   help="look at every RECORD file on disk (exists, size, mode) and list each in --json; without "
                        "it, files and bytes are counted from RECORD alone, as fast as pip inspect")
    ssh_options(i)
    i.set_defaults(func=inventory_command)
    c = sub.add_parser("clone", help="copy a venv to another path or host and rewrite what names its old prefix")
    c.add_argument("source", metavar="SRC_HOST:VENV", help="the venv to clone, e.g. local:/srv/venv_base")
    c.add_argument("dest", metavar="DEST_HOST:VENV", help="where the clone goes (absent or an empty folder)")
    c.add_argument("--replace", action="store_true",
                   help="delete a venv (a folder holding pyvenv.cfg) already at the destination first")
    c.add_argument("--json", action="store_true", help="print the result (schema transplant.clone/1)")
    ssh_options(c)
    c.set_defaults(func=_cmd_clone)
    s = sub.add_parser("snapshot", help="keep the donor's overlay set on the controller, for when the donor is gone")
    s.add_argument("manifest", nargs="?", help="the manifest whose donor and overlay to capture")
    s.add_argument("--out", metavar="DIR", help="the snapshot store (default: the state folder's snapshots/); with "
                   "--list or --prune also a registry repository, oci://REGISTRY/REPO (--prune then takes tags)")
    s.add_argument("--list", action="store_true", help="list the snapshots in the store")
    s.add_argument("--prune", nargs="*", metavar="ID", help="remove these snapshots, then every stored file no "
                   "snapshot uses")
    s.add_argument("--push", metavar="oci://REGISTRY/REPO:TAG",
                   help="also push the snapshot to an OCI registry (one blob per distribution build)")
    s.add_argument("--ca", metavar="PEM", help="CA bundle for the registry (default: the system CAs)")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=_cmd_snapshot)
    st = sub.add_parser("status", help="what was applied to a venv, from where, when, and what drifted since")
    st.add_argument("location", metavar="HOST:VENV|MANIFEST",
                    help="e.g. root@gpu-07:/root/venv_sglang, or a manifest (its target, reached with its ssh settings)")
    st.add_argument("--json", action="store_true", help="print it as JSON (schema transplant.status/1)")
    ssh_options(st)
    st.set_defaults(func=_cmd_status)
    rc = sub.add_parser("recover", help="rebuild the last verified state on a new host: plan, apply, verify")
    rc.add_argument("--target", required=True, metavar="HOST[:VENV]",
                    help="the host to rebuild on (the venv defaults to the source's path)")
    rc.add_argument("--from", dest="source_host", metavar="HOST:VENV",
                    help="a venv whose history holds the state (its newest applied and verified transaction)")
    rc.add_argument("--snapshot", metavar="ID|PATH|oci://REGISTRY/REPO:TAG",
                    help="a snapshot (without --from or --snapshot: the last state this controller saw verified, "
                         "from its host or, when that is gone, its snapshot; else the newest snapshot in the store)")
    rc.add_argument("--ca", metavar="PEM", help="CA bundle for an oci:// snapshot's registry (default: the system CAs)")
    rc.add_argument("--out", metavar="DIR", help="the snapshot store (default: the state folder's snapshots/)")
    rc.add_argument("--yes", action="store_true", help="do not ask for confirmation before apply")
    rc.add_argument("--force", action="store_true",
                    help="go on despite error findings, or a source whose applied files drifted")
    ssh_options(rc)
    rc.set_defaults(func=_cmd_recover)
    d = sub.add_parser("demo", help="replay the seed story on loopback test hosts, then rebuild a host with the donor gone")
    d.add_argument("--workdir", help="where the demo keeps its hosts (default: a temporary folder)")
    d.add_argument("--keep", action="store_true",
                   help="leave the work folder with its manifests and venvs (the hosts are stopped either way)")
    d.set_defaults(func=_cmd_demo)
    g = sub.add_parser("config", help="show each default in effect and where it came from (flag, environment, "
                       "config file, default)")
    g.add_argument("--json", action="store_true", help="print them as JSON (schema transplant.config/1)")
    ssh_options(g)
    g.set_defaults(func=_cmd_config)
    m = sub.add_parser("completion", help="print or install the shell completion script (bash, zsh, fish)")
    m.add_argument("shell", nargs="?", choices=("bash", "zsh", "fish"), help="the shell to complete in")
    m.add_argument("--install", action="store_true",
                   help="write it where the shell finds it (bash: ~/.local/share/bash-completion/completions/; "
                        "fish: ~/.config/fish/completions/; zsh: ~/.zfunc/, which must be on fpath)")
    m.add_argument("--hosts", action="store_true", help=argparse.SUPPRESS)  # what the scripts ask at each <Tab>
    m.set_defaults(func=_cmd_completion)
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
    for at, (option, word) in enumerate(zip(argv, argv[1:])):
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
    for option, word in zip(argv, argv[1:]):
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
    if args.func is _cmd_completion:
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
    width, color = _output_style(config_error is None and args.func is not _cmd_completion)
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
        elif args.func is apply_command and not getattr(args, "resume", False) and not getattr(args, "rollback", False):
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
                    **({"color_system": None} if no_color else {}))


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
        os.dup2(devnull, sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured in tests)
        pass
    os.close(devnull)
    try:
        print("error: the output pipe closed before the command ended; its work may be unfinished",
              file=sys.__stderr__, flush=True)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_FAIL
