"""``transplant config`` (face): each default in effect and where it came from."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from transplant.cli.options import ssh_options

if TYPE_CHECKING:
    from rich.console import Console

    from transplant.controller.config_file import Config

__all__ = ["HELP", "add_arguments", "handle", "Effective", "effective", "config_command", "output_style"]

HELP = "show each default in effect and where it came from (flag, environment, config file, default)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` and the SSH options (whose defaults it shows)."""
    parser.add_argument("--json", action="store_true", help="print them as JSON (schema transplant.config/1)")
    ssh_options(parser)



@dataclass(frozen=True)
class Effective:
    """One setting in effect: ``key`` (the config file's name for it), ``value`` (as text; ``-``
    for none) and ``source``: ``default``, ``file``, ``environment (VAR)`` or ``flag (--option)``."""

    key: str
    value: str
    source: str


def output_style(config: Config, env: dict[str, str] | os._Environ[str] | None = None) -> dict[str, tuple[object, str]]:
    """``width`` (columns on a terminal; None: the terminal's) and ``color`` (bool), each with its
    source: ``COLUMNS`` then ``NO_COLOR`` (set, not empty) win over the file's ``output.width``
    and ``output.color``."""
    env = os.environ if env is None else env
    if env.get("COLUMNS", "").strip().isdigit():
        width: tuple[object, str] = (int(env["COLUMNS"]), "environment (COLUMNS)")
    elif config.get("output.width") is not None:
        width = (config.get("output.width"), "file")
    else:
        width = (None, "default")
    if env.get("NO_COLOR"):
        color: tuple[object, str] = (False, "environment (NO_COLOR)")
    elif config.get("output.color") is not None:
        color = (config.get("output.color"), "file")
    else:
        color = (True, "default")
    return {"width": width, "color": color}


def effective(args: argparse.Namespace, config: Config) -> list[Effective]:
    """Every setting of the config file as a command run now would use it (``args``: ``config``'s
    own ``--identity-file`` / ``--known-hosts``, which stand for any command's).

    :raises ConfigError: the file cannot be used. :raises RegistryError: a registry setting is
        refused (an insecure entry that is not loopback)."""
    from transplant.controller.state import state_dir_source
    from transplant.donor.oci import Settings

    state, state_from = state_dir_source()
    out = [Effective("state_dir", str(state), state_from)]
    settings, sources = Settings.with_sources(None, config)
    out += [Effective("registry.insecure", ",".join(settings.insecure) or "-", sources["insecure"]),
            Effective("registry.token_hosts", ",".join(settings.token_hosts) or "-", sources["token_hosts"]),
            Effective("registry.progress", f"{settings.progress[0]}/{settings.progress[1]:g}", sources["progress"])]
    for key, flag, default in (("identity_file", "--identity-file", "ssh-agent and ~/.ssh/id_*"),
                               ("known_hosts", "--known-hosts", "~/.ssh/known_hosts")):
        given = getattr(args, key, None)
        if given:
            out.append(Effective(f"ssh.{key}", str(Path(given).expanduser()), f"flag ({flag})"))
        elif config.get(f"ssh.{key}") is not None:
            out.append(Effective(f"ssh.{key}", str(config.get(f"ssh.{key}")), "file"))
        else:
            out.append(Effective(f"ssh.{key}", default, "default"))
    style = output_style(config)
    width, width_from = style["width"]
    out.append(Effective("output.width", "the terminal's" if width is None else str(width), width_from))
    color, color_from = style["color"]
    out.append(Effective("output.color", "true" if color else "false", color_from))
    return out


def config_command(args: argparse.Namespace, console: Console) -> int:
    """Print the config file's path (and whether it exists), then one row per setting: key,
    value, source; ``--json``: ``{"schema": "transplant.config/1", "file", "present", "settings":
    [{"key", "value", "source"}]}``. Exit 0; 1 when the file cannot be used."""
    import json

    from rich.table import Table
    from rich.text import Text

    from transplant.controller.config_file import load_config
    from transplant.exitcodes import EXIT_OK

    config = load_config()
    rows = effective(args, config)
    if args.json:
        print(json.dumps({"schema": "transplant.config/1", "file": str(config.path), "present": config.present,
                          "settings": [{"key": r.key, "value": r.value, "source": r.source} for r in rows]},
                         indent=2))
        return EXIT_OK
    console.print(Text(f"config file: {config.path}" + ("" if config.present else " (not present: built-in defaults)")),
                  highlight=False, soft_wrap=True)
    table = Table(title="settings in effect (flag, then environment, then file, then default)", title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", no_wrap=True)
    for r in rows:
        table.add_row(Text(r.key), Text(r.value), Text(r.source))
    console.print(table)
    return EXIT_OK


#: ``transplant config``'s handler, for the command table.
handle = config_command
