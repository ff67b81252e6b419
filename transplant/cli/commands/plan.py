"""``transplant plan`` (face): inventory both venvs and show, or save, what apply would change."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from transplant.cli.options import fleet_options

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HELP", "add_arguments", "handle", "plan_command"]

HELP = "inventory both venvs and show what apply would change"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``MANIFEST``, ``--json``, ``--out``, ``--detailed-exitcode`` and the fleet options."""
    parser.add_argument("manifest", help="the manifest (YAML; see manifests/REFERENCE.md)")
    parser.add_argument("--json", action="store_true", help="print the plan document (schema transplant.plan/1)")
    parser.add_argument("--out", help="save the plan as JSON for a later 'transplant apply FILE'")
    parser.add_argument("--detailed-exitcode", action="store_true",
                        help="exit 2 when there are changes (0 none, 3 blocked, 1 failed), as Terraform's")
    fleet_options(parser)



def plan_command(args: argparse.Namespace, console: Console) -> int:
    """Plan the manifest's target (or each ``--target``): print the plan, or its JSON, or save it
    (``--out``); returns 0 (planned), 2 (changes, with ``--detailed-exitcode``) or 3 (blocked).

    :raises TransplantError: a bad manifest or options, an unreachable host.
    """
    import os
    import sys
    from contextlib import ExitStack

    from transplant.cli.session import Session, refuse_inside_venvs, run_fleet_action, targets_of
    from transplant.controller.manifest_file import load_manifest
    from transplant.controller.plan_file import check_plan_destination, save_plan
    from transplant.core.plan import write_plan
    from transplant.errors import UsageError
    from transplant.exitcodes import EXIT_BLOCKED, EXIT_CHANGES, EXIT_OK
    from transplant.pipeline.memo import code_identity, memo_enabled

    if memo_enabled():  # a bad TRANSPLANT_PLAN_MEMO is refused before any host is opened or named
        code_identity()  # the memo key's costly part, computed while the hosts' probes start
    # a saved plan names its manifest by its absolute path, so its findings' hints must too: apply
    # plans again from that path and refuses a saved plan whose findings read otherwise
    manifest, targets = targets_of(args, load_manifest(os.path.abspath(args.manifest) if args.out else args.manifest))
    if len(targets) > 1:
        if args.out:
            raise UsageError("--out saves the plan of one target; drop it, or name one --target")
        return run_fleet_action("plan", args, console, manifest, targets)
    if args.out:
        check_plan_destination(args.out, manifest=manifest.path)
        refuse_inside_venvs(args.out, manifest)
    with ExitStack() as stack:
        session = Session(manifest, console, stack)
        pending = session.clone_pending()
        if pending and args.out:
            from transplant.cli.commands.clone import saved_plan_refusal
            raise saved_plan_refusal(manifest)
        plan = session.plan(memo=True)
        opened = session.donor()
    if pending:
        from transplant.cli.commands.clone import pending_note
        console.print(pending_note(manifest), markup=False, style="bold")
    if args.out:
        save_plan(plan, args.out, manifest=manifest.path)
    if args.json:
        # written as it is encoded, in large pieces: a plan of a large venv is tens of MB of text,
        # never held whole (json.dump's one write per token is slow on a redirected output)
        write_plan(plan, sys.stdout.write, {"donor_source": opened.to_dict()})
        sys.stdout.write("\n")
    else:
        from transplant.cli.render import print_plan  # (rich's tables: not loaded for --json)

        print_plan(console, plan)
        if args.out:
            console.print(f"plan saved to {args.out}; apply it with: transplant apply {args.out}", markup=False)
    if plan.blocking:
        return EXIT_BLOCKED
    changes = plan.has_changes or pending
    return EXIT_CHANGES if changes and getattr(args, "detailed_exitcode", False) else EXIT_OK


#: ``transplant plan``'s handler, for the command table.
handle = plan_command
