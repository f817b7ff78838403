"""The ``parplan`` command line: one module per command, the shared arguments (``args``), tables and progress
(``report``), figures (``plot``). ``main`` runs a command; ``python -m parplan`` and the console script call it."""

from parplan.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
