"""The ``parplan`` command line (DESIGN.md, "The command line").

Every command takes ``--json`` (one JSON document on stdout instead of
tables) and ``--debug`` (tracebacks). Exit codes: 0 success; 2 bad input,
with one line on stderr that says what was wrong and how to fix it; 1 any
other failure (a bug: the line asks for ``--debug``).

This is the only module of ``planner`` that may import torch, ``calibrate``
and ``runtime``, and it does so lazily inside the commands.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any, Callable, NoReturn, Sequence

from cost_models.errors import InputError

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``parplan`` command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    command = f"parplan {args.command}"
    try:
        return args.handler(args)
    except InputError as err:
        if args.debug:
            traceback.print_exc()
        print(f"{command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, not the user's doing: one line unless --debug
        if args.debug:
            traceback.print_exc()
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"{command}: internal error: {type(err).__name__}: {detail} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand and its options."""
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of tables")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    parser = _Parser(prog="parplan", description="Plan and run sample/spatial/channel/pipeline parallel training.")
    parser.add_argument("--version", action="version", version=f"parplan {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    _add_inspect(commands, common)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="torchvision:NAME, package.module:factory or path/to/file.py:factory")
    parser.add_argument("--input-shape", required=True, metavar="N,C,H,W", help="global input shape, e.g. 64,3,224,224")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "float64"),
                        help="element type of inputs and activations (default float32)")
    parser.add_argument("--leaf-module", action="append", default=[], metavar="NAME",
                        help="keep this module (qualified or class name) opaque to torch.fx; repeatable")


def _add_inspect(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser("inspect", parents=[common], help="show the traced layer table",
                                 description="Trace MODEL at the input shape and show its layers and totals.")
    _add_model_arguments(parser)
    parser.set_defaults(handler=_inspect)


def _trace_model(args: argparse.Namespace) -> tuple[Any, dict[str, float]]:
    """Parse the shape first (cheap), then load and trace the model; also returns the seconds each took."""
    from cost_models.graph import parse_input_shape

    shape = parse_input_shape(args.input_shape)
    started = time.perf_counter()
    import torch

    from cost_models.graph import trace
    from cost_models.model_spec import load_model

    model = load_model(args.model)
    loaded = time.perf_counter()
    graph = trace(model, shape, getattr(torch, args.dtype), leaf_modules=args.leaf_module)
    timing = {"load": round(loaded - started, 3), "trace": round(time.perf_counter() - loaded, 3)}
    return graph, timing


def _inspect(args: argparse.Namespace) -> int:
    graph, timing = _trace_model(args)
    document = {"model": args.model, **graph.to_dict(), "totals": graph.totals(),
                "unused_params": graph.graph["unused_params"], "timing_s": timing}
    if args.json:
        _print_json(document)
    else:
        from planner.report import print_layer_table

        print_layer_table(document)
    return 0


def _print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("parplan")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
