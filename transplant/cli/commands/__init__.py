"""The commands of the command line (face), one module per command."""
