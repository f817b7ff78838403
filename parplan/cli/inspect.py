"""``parplan inspect``: the traced layer table of a model at an input shape."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from parplan.cli.args import OneLineParser, add_model_arguments, print_json, trace_model

if TYPE_CHECKING:
    from parplan.cli.args import Commands

__all__ = ["add_inspect"]


def add_inspect(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan inspect``."""
    parser = commands.add_parser("inspect", parents=[common], help="show the traced layer table",
                                 description="Trace MODEL at the input shape and show its layers and totals.")
    add_model_arguments(parser)
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    graph, timing = trace_model(args)
    document = {"model": args.model, **graph.to_dict(), "totals": graph.totals(),
                "unused_params": graph.graph["unused_params"], "timing_s": timing}
    if args.json:
        print_json(document)
    else:
        from parplan.cli.report import print_layer_table

        print_layer_table(document)
    return 0
