"""``parplan estimate``: a plan's predicted time per layer and term, and its memory, for a model and profile."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from cost_models.errors import InputError
from parplan.cli.args import (
    OneLineParser,
    add_model_arguments,
    add_trace_argument,
    compute_dtype,
    load_profile_argument,
    print_json,
    slowdowns,
    trace_model,
    write_predicted_trace,
)

if TYPE_CHECKING:
    from cost_models.estimate import Estimate
    from parplan.cli.args import Commands

__all__ = ["add_estimate", "estimate_document"]


def add_estimate(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan estimate``."""
    parser = commands.add_parser("estimate", parents=[common], help="predict a plan's time and memory",
                                 description="Price PLAN for MODEL with PROFILE: time per layer and term, memory.")
    add_model_arguments(parser)
    parser.add_argument("--plan", required=True, metavar="PLAN.json",
                        help="a parplan.plan/3 (or /2, /1) file (hand-written is fine)")
    parser.add_argument("--profile", required=True, metavar="PROFILE",
                        help="a profile JSON or a preset (v100, a100, h100)")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"),
                        help="optimizer state to count")
    parser.add_argument("--no-overlap", action="store_true",
                        help="model no overlap of halo exchange and gradient allreduce with compute")
    parser.add_argument("--slow-stage", action="append", default=[], metavar="K:FACTOR",
                        help="model stage K running FACTOR times slower (a straggler); repeatable")
    add_trace_argument(parser, "the predicted timeline of one iteration (per stage: layers, allreduces, transfers)")
    parser.set_defaults(handler=_estimate)


def _estimate(args: argparse.Namespace) -> int:
    from cost_models.formats.jsonio import check_writable
    from cost_models.formats.plan import load_plan

    check_writable(args.trace, "--trace")
    plan = load_plan(args.plan)  # a malformed plan is refused before the model is built
    graph, timing = trace_model(args)
    plan = load_plan(args.plan, expected_fingerprint=graph.fingerprint)
    profile = load_profile_argument(args.profile, compute_dtype(args.amp, args.dtype))
    import torch

    from cost_models.estimate import estimate

    started = time.perf_counter()
    slow = slowdowns(args.slow_stage)
    if any(stage >= plan.pipeline.stages for stage in slow):
        raise InputError(f"--slow-stage names stage {max(slow)}, but the plan has {plan.pipeline.stages} stages")
    result = estimate(graph, plan, profile, optimizer=args.optimizer, overlap=not args.no_overlap, slowdown=slow)
    document = estimate_document(result, profile.compatibility_warnings(torch.__version__, graph.graph["dtype"],
                                                                             graph.graph.get("amp", "")))
    document["timing_s"] = {**timing, "estimate": round(time.perf_counter() - started, 4)}
    if args.trace:
        write_predicted_trace(args.trace, plan, result)
    if args.json:
        print_json(document)
    else:
        from parplan.cli.report import print_estimate

        print_estimate(document)
    return 0


def estimate_document(result: Estimate, warnings: list[str]) -> dict[str, object]:
    """The JSON document of an Estimate (``Estimate.to_dict``) and ``warnings``."""
    return {**result.to_dict(), "warnings": warnings}
