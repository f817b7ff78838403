"""The ``parplan`` command line (its reference: docs/commands.md): the parser and the exit codes.

Every command takes ``--json`` (one JSON document on stdout instead of
tables) and ``--debug`` (tracebacks). Exit codes: 0 success; 2 bad input,
with one line on stderr that says what was wrong and how to fix it; 1 any
other failure (a bug: the line asks for ``--debug``). Each command lives in
its own module of ``parplan.cli``, which registers it (``add_…``) and handles
it; models, torch and the runtime are imported inside the commands.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from cost_models.errors import InputError
from parplan.cli.args import OneLineParser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``parplan`` command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    command = f"parplan {args.command}"
    try:
        _check_input_shapes(getattr(args, "input_shape", None))
        return args.handler(args)
    except InputError as err:
        if args.debug:
            traceback.print_exc()
        print(f"{command}: error: {err}", file=sys.stderr)
        return _stop_mpi_job(2)
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return _stop_mpi_job(130)
    except Exception as err:
        if args.debug:
            traceback.print_exc()
        print(f"{command}: {_failure(err)}", file=sys.stderr)
        return _stop_mpi_job(1)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand and its options."""
    from parplan.cli import calibrate, check, checkpoint, estimate, inspect, plan, run, validate, whatif

    common = OneLineParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of tables")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    parser = OneLineParser(prog="parplan",
                           description="Plan and run sample/spatial/channel/pipeline parallel training.")
    parser.add_argument("--version", action="version", version=f"parplan {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser, metavar="COMMAND")
    for register in (inspect.add_inspect, calibrate.add_calibrate, calibrate.add_profile, estimate.add_estimate,
                     plan.add_plan, run.add_run, whatif.add_whatif, validate.add_validate, checkpoint.add_checkpoint,
                     check.add_check):
        register(commands, common)
    return parser


def _check_input_shapes(texts: list[str] | None) -> None:
    """Refuse malformed ``--input-shape`` values, or inputs of different batches, before a command does any work."""
    if texts is not None:
        from cost_models.ir.graph import parse_input_shapes

        parse_input_shapes(texts)


def _failure(err: Exception) -> str:
    """One line for a failure that is not bad input: a rank that died or hung, or a bug (asks for --debug)."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if "processes.rank_failures" in sys.modules:  # only commands that start ranks have failed ones (imported by then)
        from processes.rank_failures import RankFailedError, RankFailure

        if isinstance(err, (RankFailure, RankFailedError)):
            return f"error: {detail}"
    return f"internal error: {type(err).__name__}: {detail} (rerun with --debug for the traceback)"


def _stop_mpi_job(code: int) -> int:
    """``code``; under mpirun with other ranks, first stop them all (``runtime.launch.abort_mpi_job``)."""
    if "mpi4py.MPI" in sys.modules:
        from runtime.launch import abort_mpi_job

        abort_mpi_job(code)
    return code


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("parplan")
    except PackageNotFoundError:
        return "unknown"
