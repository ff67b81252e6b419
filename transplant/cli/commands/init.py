"""``transplant init --donor HOST:VENV --target HOST:VENV [--overlay NAME...] --out FILE`` (edge).

Probes both venvs (metadata and RECORDs, nothing hashed), drafts a manifest with
:func:`transplant.core.starting_manifest.draft`, then gathers what ``plan`` reads for that draft (the closure's
distributions hashed, the shared objects read with pyelftools) and drafts again with those ELF
facts, so the binary rules' hints (a CUDA 12 ``.so`` left beside a CUDA 13 torch, libtorch
symbols) are followed too. The manifest is written, commented, to ``--out``, which must not exist.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from transplant.cli.options import ssh_options
from transplant.errors import HostError, ProbeError, TransplantError
from transplant.exitcodes import EXIT_OK

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.core.hostspec import HostSpec
    from transplant.core.inventory import Inventory
    from transplant.core.starting_manifest import Draft
    from transplant.hosts.host import Host

__all__ = ["HELP", "add_arguments", "handle", "init_command"]


HELP = "probe a donor and a target and write a starting manifest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--donor``, ``--target``, ``--out`` (each required), ``--overlay`` and the SSH options."""
    parser.add_argument("--donor", required=True, metavar="HOST:VENV",
                        help="the venv that works, e.g. root@ct129:/root/venv")
    parser.add_argument("--target", required=True, metavar="HOST:VENV", help="the venv to bring it to")
    parser.add_argument("--overlay", action="append", metavar="NAME",
                        help="a distribution to bring with what it needs (a closure), or a glob (default: sglang)")
    parser.add_argument("--out", required=True, metavar="FILE", help="the manifest to write (never overwritten)")
    ssh_options(parser)


def handle(args: argparse.Namespace, console: Console) -> int:
    """``transplant init``: :func:`init_command` with ``HOST:VENV`` read by
    :func:`transplant.cli.session.parse_location`; returns 0 once the manifest is written."""
    from transplant.cli.locations import parse_location

    init_command(args, console, parse_location)
    return EXIT_OK


def init_command(args: argparse.Namespace, console: Console,
                 parse_location: Callable[[str], tuple[HostSpec, str]]) -> Draft:
    """Run ``transplant init`` as the module docstring says.

    :param args: ``donor``, ``target`` (``HOST:VENV``), ``overlay`` (names or globs, or None:
        ``sglang`` when the donor has it), ``out``, ``identity_file``, ``known_hosts``.
    :param parse_location: the CLI's ``HOST:VENV`` parser (raises its usage error).
    :returns: the draft written.
    :raises TransplantError: ``--out`` exists (nothing is probed), a name is not on the donor,
        a host cannot be reached (:class:`HostError`), or the file cannot be written.
    """
    from concurrent.futures import ThreadPoolExecutor

    from transplant.cli.progress import Shown
    from transplant.controller.output_file import check_output
    from transplant.core.manifest import parse_manifest
    from transplant.core.starting_manifest import Draft, draft, render
    from transplant.core.units import count
    from transplant.hosts.host import SSHOptions
    from transplant.hosts.connecting import connect
    from transplant.hosts.probing import take_inventory
    from transplant.pipeline.gather import gather

    out = Path(args.out)
    if out.exists() or out.is_symlink():
        raise TransplantError(f"{out}: already exists; init never overwrites a file",
                              hint="give another --out, or move the file away first")
    if not out.parent.is_dir():
        raise TransplantError(f"{out}: its folder {out.parent} does not exist", hint="create the folder first")
    check_output(out, option="--out", replace=False, hint="give --out a new file name in a folder you can write, "
                                                          "e.g. --out manifest.yaml")
    donor_spec, donor_venv = parse_location(args.donor)
    target_spec, target_venv = parse_location(args.target)
    options = SSHOptions.from_files(args.identity_file, args.known_hosts)
    donor_at = {"host": str(donor_spec), "venv": donor_venv}
    target_at = {"host": str(target_spec), "venv": target_venv}
    path = str(out)
    started = time.monotonic()
    with ExitStack() as stack:
        with console.status("connecting"):
            dhost = stack.enter_context(connect(donor_spec, options))
            thost = stack.enter_context(connect(target_spec, options))
        with console.status(f"reading {args.donor} and {args.target} (metadata and RECORDs)"):
            with ThreadPoolExecutor(max_workers=2) as pool:
                d = pool.submit(take_inventory, dhost, donor_venv)
                t = pool.submit(take_inventory, thost, target_venv)
                donor, target = d.result(), t.result()
        names = list(args.overlay or [])
        if not names:
            if "sglang" not in donor.latest():
                raise TransplantError(f"{args.donor} has no sglang; name what to bring",
                                      hint="give --overlay NAME (repeatable), e.g. --overlay vllm")
            names = ["sglang"]
        try:
            first = draft(donor, target, names, donor_at=donor_at, target_at=target_at, path=path)
        except ValueError as exc:
            raise TransplantError(str(exc), hint=f"see what the donor holds: transplant inventory {args.donor}") \
                from None
        manifest = parse_manifest(_with_ssh(first.data, args), path=path)
        status = console.status("gathering what plan reads for the draft")
        with status:
            facts = gather(manifest, dhost, thost, reporter=Shown(step=status.update))
        final = draft(facts.donor, facts.target, names, donor_at=donor_at, target_at=target_at, path=path,
                      donor_elf=facts.donor_elf, target_elf=facts.target_elf)
        candidates = [n for n in final.data["verify"]["imports"] if isinstance(n, str)]
        if candidates:
            with console.status(f"importing {count(len(candidates), 'name')} in the donor"):
                final = _checked_in_donor(final, dhost, donor_venv, candidates, facts.donor)
    data = _with_ssh(final.data, args)
    final = Draft(data=data, notes=final.notes, rounds=final.rounds, findings=final.findings)
    header = [f"written by transplant init on {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from "
              f"{args.donor} (donor) and {args.target} (target)",
              f"asked for: {', '.join(names)}; the plan's hints were followed for {first.rounds} + {count(final.rounds, 'round')}",
              "check it with: transplant plan " + path]
    text = render(final, header=header)
    parse_manifest(__import__("yaml").safe_load(text), path=path)  # what is written always parses
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise TransplantError(f"{out}: already exists; init never overwrites a file",
                              hint="give another --out, or move the file away first") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    left = [f for f in final.findings if f.severity == "error"]
    console.print(f"wrote {out} in {time.monotonic() - started:.0f} s: overlay {len(data['overlay'])} "
                  f"{'entry' if len(data['overlay']) == 1 else 'entries'}, "
                  f"remove {len(data.get('remove', []))}, verify imports {len(data['verify']['imports'])}",
                  highlight=False)
    for f in left:
        console.print(f"  still an error: [{f.code}] {f.message[:200]}", highlight=False, markup=False)
    for name, note in final.notes.get("imports", {}).items():
        console.print(f"  verify import {name}: needs: [gpu] ({note})", highlight=False, markup=False)
    for why in final.notes.get("server-args-left-out", {}).values():
        console.print(f"  left out of verify: server_args: {why}", highlight=False, markup=False)
    for name, error in final.notes.get("imports-left-out", {}).items():
        console.print(f"  left out of verify.imports: {name} fails in the donor itself: {error}", highlight=False,
                      markup=False)
    console.print(f"next: transplant plan {path}", highlight=False, markup=False)
    return final


#: How long the donor may take to import init's candidate names (one interpreter: torch once).
DONOR_IMPORTS_TIMEOUT = 300.0


def _checked_in_donor(final: Draft, host: Host, venv: str, names: list[str], donor: Inventory) -> Draft:
    """The draft with its candidate imports run in the donor's venv on the donor's host (one
    interpreter, so torch is imported once, within :data:`DONOR_IMPORTS_TIMEOUT`): only what
    imports there is proposed (see :func:`with_checked_imports`). When the donor cannot run them
    (a timeout, a broken interpreter) the draft is kept as it is."""
    from concurrent.futures import ThreadPoolExecutor

    from transplant.core.starting_manifest import with_checked_imports, with_checked_server_args
    from transplant.hosts.probing import run_script
    from transplant.verify.ladder import sort_donor_imports

    parser = (final.data.get("verify") or {}).get("server_args")
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="init-donor") as pool:
        parsed = pool.submit(_donor_parses, host, venv, parser) if parser else None
        try:
            report = run_script(host, venv, "stage_imports", names, timeout=DONOR_IMPORTS_TIMEOUT)
        except (HostError, ProbeError):
            report = None
        refused = parsed.result() if parsed is not None else None
    if refused:
        final = with_checked_server_args(final, refused)
    if report is None:
        return final
    passed, gpu, failed = sort_donor_imports(report, driver=donor.nvidia.available)
    return with_checked_imports(final, passed, gpu, failed)


def _donor_parses(host: Host, venv: str, parser: dict) -> str | None:
    """Why the donor's own parser refuses the proposed ``server_args`` (its judge's reason), or
    None when it parses them as expected, or could not be asked (then the proposal stays)."""
    import json

    from transplant.hosts.probing import run_script
    from transplant.verify.judges import judge_server_args

    wanted = {"attrs": sorted(parser["expect"]), "resolve": False}
    try:
        report = run_script(host, venv, "stage_server_args", [parser["entry"], json.dumps(wanted), *parser["args"]],
                            timeout=DONOR_IMPORTS_TIMEOUT)
    except (HostError, ProbeError):
        return None
    status, reason = judge_server_args(parser["expect"], report)
    return reason if status == "fail" else None


def _with_ssh(data: dict, args: argparse.Namespace) -> dict:
    # absolute: a manifest's relative paths are read against its own folder, not the folder init ran in
    ssh = {k: os.path.abspath(os.path.expanduser(v))
           for k, v in (("identity_file", args.identity_file), ("known_hosts", args.known_hosts)) if v}
    return {**data, **({"ssh": ssh} if ssh else {})}
