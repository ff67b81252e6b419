"""The commands of the command line (face), one module per command.

Each module holds ``HELP`` (its line in ``transplant --help``), ``add_arguments(parser)`` (its
options) and ``handle(args, console)`` (runs it; the exit code), and is named in
:data:`transplant.cli.app.COMMANDS`. ``fleet`` and ``registry`` are what commands share.
"""
