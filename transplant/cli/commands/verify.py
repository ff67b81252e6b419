"""The ``verify`` command (face): with a manifest or a bare ``HOST:VENV``, the ladder, and its reports."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transplant.cli.options import fleet_options, ssh_options
from transplant.errors import TransplantError, UsageError
from transplant.exitcodes import EXIT_BLOCKED, EXIT_OK

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.core.manifest import Manifest, VerifySettings
    from transplant.donor.sources import DonorSource, Opened
    from transplant.hosts.host import Host
    from transplant.verify.early import Started
    from transplant.verify.runner import DonorRun

# What the command runs (the pipeline, the ladder's runner, the donor sources, the renderers) is
# imported where it is used, after the imports process has started (transplant.verify.early): its
# half second of loading then overlaps that process instead of coming before it.

__all__ = ["HELP", "add_arguments", "handle", "verify_command", "parse_imports", "is_location"]


HELP = "prove the target venv works: the verify ladder, interpreter to a served request"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``MANIFEST|HOST:VENV``, ``--json``, ``--junit``, ``--strict``, ``--imports``,
    ``--clear-jit-caches``, the SSH options and the fleet options."""
    parser.add_argument("manifest", metavar="MANIFEST|HOST:VENV",
                        help="the manifest whose target and verify settings to use, or a venv (local:/srv/venv) to "
                             "check without one")
    parser.add_argument("--json", action="store_true", help="print the results (schema transplant.verify/3)")
    parser.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE")
    parser.add_argument("--strict", action="store_true",
                        help="fail every stage and item that could not be checked here (no driver, no GPU, no torch, "
                             "fails identically in the donor): for GPU hosts where everything must run")
    parser.add_argument("--imports", metavar="NAMES", help="comma-separated import names (without a manifest: the "
                        "distributions providing them are checked too)")
    parser.add_argument("--clear-jit-caches", nargs="?", const="", default=None, metavar="NAMES",
                        help="list the triton, flashinfer and torch-inductor cache folders of the target's user (they "
                             "are outside the venv, shared by the user's other venvs: nothing is removed); "
                             "--clear-jit-caches=triton,flashinfer,torch-inductor (or =all) removes the ones named")
    ssh_options(parser, what=", for HOST:VENV")
    fleet_options(parser)




def donor_runner(source: DonorSource, settings: VerifySettings) -> DonorRun | None:
    """A :data:`transplant.verify.runner.DonorRun` for the donor: on a host, the host script runs
    in the donor's venv with the manifest's verify environment (a request's ``paths`` made
    absolute there and its ``prefix`` reported); a snapshot answers from the donor's verify
    results recorded when it was taken (:mod:`transplant.verify.recorded`), or None when it holds
    none (then nothing failing in the target is compared with the donor)."""
    from transplant.hosts.probing import run_script

    snap, live, venv = source.snapshot, source.live, source.venv
    if snap is not None:
        from transplant.verify import recorded

        return recorded.recorded_runner(snap.donor_verify, snap.id) if recorded.has_record(snap.donor_verify) else None
    if live is None:
        return None

    def run(script: str, args: list, request: Mapping[str, Any] | None) -> Mapping[str, Any]:
        root = venv.rstrip("/")
        if request is not None and "paths" in request:
            request = {**request, "paths": [f"{root}/{p}" for p in request["paths"]]}
        report = run_script(live, venv, script, args, request=request, env=dict(settings.env),
                            timeout=settings.timeout)
        return {**report, "prefix": root}

    return run


def donor_said(source: DonorSource) -> str | None:
    """The line verify prints when its donor is a snapshot: whether the donor's recorded verify
    results stand in for it, and their age; None for a donor on a host."""
    snap = source.snapshot
    if snap is None:
        return None
    from transplant.verify import recorded

    return recorded.summary(snap.donor_verify, snap.id, snap.created)


def parse_imports(text: str | None) -> tuple[str, ...]:
    """``"torch, sglang.srt"`` -> ``("torch", "sglang.srt")``.

    :raises TransplantError: a name that is not a dotted identifier.
    """
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    for name in names:
        if not all(p.isidentifier() for p in name.split(".")):
            raise TransplantError(f"--imports: {name!r} is not an import name",
                                  hint="write e.g. --imports torch,sglang,sglang.srt.server_args")
    return names


def parse_clear(value: object) -> tuple[tuple[str, ...], bool]:
    """``--clear-jit-caches[=NAMES]`` -> (the cache names to remove, whether the option was given).

    ``None`` / ``False`` (not given) -> ``((), False)``; ``""`` (given bare: list the folders,
    remove nothing) -> ``((), True)``; ``"triton,flashinfer"`` -> those names; ``"all"`` -> every
    name of :data:`transplant.verify.runner.JIT_CACHES`.

    :raises UsageError: a name that is none of those.
    """
    if value is None or value is False:
        return (), False
    from transplant.verify.runner import JIT_CACHES

    names = tuple(dict.fromkeys(n.strip() for n in str(value).split(",") if n.strip()))
    unknown = [n for n in names if n not in JIT_CACHES and n != "all"]
    if unknown:  # refused before "all" is looked at: a misspelt name beside it removes nothing either
        raise UsageError(f"--clear-jit-caches: {', '.join(map(repr, unknown))} is not a JIT cache; the caches are "
                         f"{', '.join(JIT_CACHES)} (or all), e.g. --clear-jit-caches=triton,torch-inductor")
    if "all" in names:
        return JIT_CACHES, True
    return names, True


def _clear_line(caches: list, names: tuple[str, ...], again: str) -> str:
    """What ``--clear-jit-caches`` did, in one line: removed, refused, and the user-wide folders
    listed but not named (with the option that removes those holding files; an empty folder is
    named as empty, with nothing to remove)."""
    from transplant.core.units import count, human_bytes

    existing = [c for c in caches if c.get("exists")]
    if not existing:
        return "--clear-jit-caches: no JIT cache folder exists (" + ", ".join(c["path"] for c in caches) + \
            "); nothing was removed"
    removed = [c["path"] for c in existing if c.get("removed")]
    refused = [f"{c['path']} ({c['error']})" for c in existing if c["name"] in names and not c.get("removed")]
    listed = [c for c in existing if c["name"] not in names]
    line = "--clear-jit-caches removed " + (", ".join(removed) if removed else "nothing")
    if refused:
        line += "; left in place: " + ", ".join(refused)
    holding = [c for c in listed if c.get("files") or c.get("bytes")]
    if holding:
        line += ("; not removed, outside the target venv (the user's, shared by its other venvs): "
                 + ", ".join(f"{c['name']} {c['path']} ({count(c['files'], 'file')}, {human_bytes(c['bytes'])})" for c in holding)
                 + f"; to remove {'it' if len(holding) == 1 else 'them'}: {again} --clear-jit-caches="
                 + ",".join(c["name"] for c in holding))
    empty = [c for c in listed if c not in holding]
    if empty:
        line += "; empty, nothing to remove: " + ", ".join(f"{c['name']} {c['path']}" for c in empty)
    return line + "; nothing else was touched"


def _check_junit(path: str) -> None:
    """Refuse a ``--junit`` destination before verify runs (see
    :func:`transplant.controller.output_file.check_output`)."""
    from transplant.controller.output_file import check_output

    target = Path(path)
    if target.is_dir() or (target.exists() and not target.is_file()):
        raise TransplantError(f"--junit {path}: not a regular file", hint="name a file, e.g. --junit verify.xml")
    if not target.resolve().parent.is_dir():
        raise TransplantError(f"--junit {path}: its folder does not exist", hint="create the folder first")
    check_output(path, option="--junit", replace=True, hint="name a file in a folder you can write, e.g. --junit "
                                                            "verify.xml")


def is_location(text: str) -> bool:
    """Whether a ``verify`` argument is ``HOST:VENV`` (it holds ``:/`` and names no file) rather than a manifest."""
    return ":/" in text and not os.path.exists(text)


def _verify_one(args: argparse.Namespace, console: Console, *, session_class: Callable[..., Any] | None,
                   parse_location: Callable[[str], tuple[Any, str]], manifest: Manifest | None = None) -> int:
    """Run ``transplant verify``; returns 0 when no stage failed, 3 when one did.

    ``args.manifest`` is a manifest file, or ``HOST:VENV`` (recognised by ``:/``, with no such
    file) to verify a venv without one: then ``--imports`` names what to check, the
    distributions providing those names are the ones whose shared objects are loaded, and
    there is no donor (every unmet requirement counts). With a manifest the donor source is the
    manifest's (a host, a snapshot, or the first fallback that works), and the result is recorded
    in the target's history and, when it passes, in the controller's verified log (see
    :func:`transplant.recover.provenance.record_verified`).

    :param manifest: an already loaded manifest (``apply --verify``, ``recover``); None reads
        ``args.manifest``. Options missing from ``args`` (``--junit``, ``--imports``...) count as
        not given.

    :raises TransplantError: bad manifest or option, unreachable target.
    """
    from transplant.core.manifest import VerifySettings
    from transplant.hosts.host import SSHOptions
    from transplant.hosts.connecting import connect
    from transplant.verify.early import start_imports

    junit = getattr(args, "junit", None)
    strict = bool(getattr(args, "strict", False))
    clearing, clear = parse_clear(getattr(args, "clear_jit_caches", None))
    extra = parse_imports(getattr(args, "imports", None))
    if junit:
        _check_junit(junit)
    source = getattr(args, "manifest", None) or ""
    started: Started | None = None
    with ExitStack() as stack:
        if manifest is None and is_location(source):
            if not extra:
                raise UsageError(f"verify {source}: without a manifest, --imports must name what to check",
                                      hint=f"write e.g. transplant verify {source} --imports torch,sglang")
            spec, venv = parse_location(source)
            options = SSHOptions.from_files(args.identity_file, args.known_hosts)
            with console.status(f"connecting to {spec}"):
                target: Host = stack.enter_context(connect(spec, options))
            settings = VerifySettings(imports=extra)
            started = start_imports(settings, target, venv)  # before loading the rest of the controller
            if started is not None:
                stack.callback(started.close)  # ended when the ladder does not take it (an error before it)
            label, donor, donor_run = f"{spec}:{venv}", None, None
        else:
            from transplant.controller.manifest_file import load_manifest

            if manifest is None:
                manifest = load_manifest(source)
            assert session_class is not None, "a manifest needs the session class"
            session = session_class(manifest, console, stack)
            target, venv, label = session.host("target"), manifest.target.venv, str(manifest.target)
            settings = manifest.verify
            if extra:
                settings = dataclasses.replace(settings, imports=tuple(dict.fromkeys(settings.imports + extra)))
            started = start_imports(settings, target, venv)  # while the donor is opened (no overlay only)
            if started is not None:
                stack.callback(started.close)
            from transplant.verify.runner import donor_reader
            try:
                opened: Opened | None = session.donor()
            except TransplantError as exc:
                console.print(f"the donor cannot be reached ({exc.message}); requirements are checked without it",
                              style="yellow", highlight=False, markup=False)
                opened = None

            def read_donor():
                if opened is None:
                    raise TransplantError("the donor cannot be reached")
                return opened.source.inventory(hash_patterns=(), record=False)

            donor = donor_reader(read_donor)
            donor_run = donor_runner(opened.source, settings) if opened is not None else None
            said = donor_said(opened.source) if opened is not None else None
            if said:
                console.print(said, highlight=False, markup=False)
        from transplant.cli.progress import StagesShown
        from transplant.pipeline import verify_target

        with console.status("verifying") as status:  # a manifest's target records the verdict
            results, _ = verify_target(settings, target, venv, ssh=session.ssh if manifest is not None else None,
                                       record=manifest is not None, donor_inventory=donor,
                                       reporter=StagesShown(status.update, "verify"),
                                       clear_jit_caches=clearing, donor_run=donor_run, started=started,
                                       manifest=manifest is not None, strict=strict)
    from transplant.cli.render import stages_table, verify_json, verify_junit
    from transplant.verify.judges import overall_ok

    if junit:
        try:
            Path(junit).write_text(verify_junit(results, label))
        except OSError as exc:
            raise TransplantError(f"--junit {junit}: could not write it: {exc.strerror or exc}",
                                  hint="name a file in a folder you can write to") from None
    if getattr(args, "json", False):
        print(verify_json(results, label, strict=strict))
    else:
        from transplant.verify.verdict import verdict_line

        console.print(stages_table(results, f"verify {label}"))
        console.print(verdict_line(results, strict_mode=strict), markup=False, highlight=False,
                      style="bold red" if not overall_ok(results) else "bold green")
    if clear:
        jit = next((r for r in results if r.name == "jit-caches"), None)
        caches = jit.details.get("caches", []) if jit else []
        again = "transplant verify " + (shlex.quote(source) + (" --imports " + ",".join(extra) if extra else "")
                                        if source else shlex.quote(str(getattr(manifest, "path", "MANIFEST"))))
        console.print(_clear_line(caches, clearing, again), markup=False, highlight=False)
    if junit:
        console.print(f"JUnit XML written to {junit}", markup=False, highlight=False)
    return EXIT_OK if overall_ok(results) else EXIT_BLOCKED


def verify_command(args: argparse.Namespace, console: Console, manifest: Manifest | None = None) -> int:
    """``transplant verify MANIFEST|HOST:VENV``: one target (:func:`_verify_one`), or every target of a fleet;
    returns 0 when no stage failed, 3 when one did. Ctrl-C ends the stages' host scripts at once
    (:func:`transplant.hosts.connecting.interrupt_stops_commands`), not when each reaches its timeout."""
    from transplant.hosts.connecting import interrupt_stops_commands

    with interrupt_stops_commands():
        return _verify_command(args, console, manifest)


def _verify_command(args: argparse.Namespace, console: Console, manifest: Manifest | None) -> int:
    """:func:`verify_command`'s work."""
    from transplant.cli.locations import parse_location

    if manifest is None and is_location(args.manifest):  # the rest of the controller loads once the imports started
        return _verify_one(args, console, session_class=None, parse_location=parse_location)
    from transplant.cli.session import Session, run_fleet_action, targets_of
    from transplant.controller.manifest_file import load_manifest

    if manifest is None:
        from transplant.cli.locations import refuse_bare_venv_path

        refuse_bare_venv_path(args.manifest, "verify")
        manifest, targets = targets_of(args, load_manifest(args.manifest))
        if len(targets) > 1:
            if getattr(args, "junit", None) or parse_clear(getattr(args, "clear_jit_caches", None))[1]:
                raise UsageError("--junit and --clear-jit-caches act on one target; name it with --target")
            return run_fleet_action("verify", args, console, manifest, targets)
    return _verify_one(args, console, session_class=Session, parse_location=parse_location, manifest=manifest)


#: ``transplant verify``'s handler, for the command table.
handle = verify_command
