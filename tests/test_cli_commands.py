"""The command table of :mod:`transplant.cli.app`: each command's module declares its parser and
handler, and the parser offers exactly the table's commands."""

from __future__ import annotations

import argparse
import types

import pytest

from transplant.cli.app import COMMANDS, build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands: name -> its subparser."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_module_has_help_add_arguments_and_handle(name):
    module = COMMANDS[name]
    assert isinstance(module.HELP, str) and module.HELP.strip(), f"{module.__name__}.HELP"
    assert callable(module.add_arguments), f"{module.__name__}.add_arguments"
    assert callable(module.handle), f"{module.__name__}.handle"
    assert module.__name__ == f"transplant.cli.commands.{name}", "a command's module is named after it"


def test_the_parser_offers_exactly_the_tables_commands_in_its_order():
    parser = build_parser()
    assert list(_subcommands(parser)) == list(COMMANDS)
    for name, module in COMMANDS.items():
        args = parser.parse_args([name, *_required(name)])
        assert args.command == name and args.func is module.handle


def _required(name: str) -> list[str]:
    """Arguments that make ``transplant NAME ...`` parse (its required positionals and options)."""
    return {"plan": ["m.yaml"], "apply": ["m.yaml"], "rollback": ["m.yaml"], "history": ["m.yaml"],
            "verify": ["m.yaml"], "init": ["--donor", "local:/a", "--target", "local:/b", "--out", "m.yaml"],
            "inventory": ["local:/a"], "clone": ["local:/a", "local:/b"], "status": ["local:/a"],
            "recover": ["--target", "local"]}.get(name, [])


def test_a_module_added_to_a_copy_of_the_table_is_a_command_with_its_options(capsys):
    """The positive twin: a toy module in a copy of the table becomes a command, with its help
    line, its options and its handle; the table itself is left as it was."""
    calls = []
    toy = types.ModuleType("toy")
    toy.HELP = "a toy command for the table's test"
    toy.add_arguments = lambda parser: parser.add_argument("--colour", default="green")
    toy.handle = lambda args, console: calls.append(args.colour) or 0
    table = {**COMMANDS, "toy": toy}
    parser = build_parser(table)
    assert list(_subcommands(parser)) == [*COMMANDS, "toy"]
    args = parser.parse_args(["toy", "--colour", "blue"])
    assert args.command == "toy" and args.colour == "blue"
    assert args.func(args, None) == 0 and calls == ["blue"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "a toy command for the table's test" in capsys.readouterr().out
    assert "toy" not in COMMANDS and "toy" not in _subcommands(build_parser())
