"""``parplan estimate``: a plan's predicted time per layer and term, and its memory, for a model and profile."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cost_models.errors import InputError
from parplan.cli.args import add_model_arguments, load_profile_argument, print_json, slowdowns, trace_model

__all__ = ["add_estimate", "estimate_document"]


def add_estimate(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``parplan estimate``."""
    parser = commands.add_parser("estimate", parents=[common], help="predict a plan's time and memory",
                                 description="Price PLAN for MODEL with PROFILE: time per layer and term, memory.")
    add_model_arguments(parser)
    parser.add_argument("--plan", required=True, metavar="PLAN.json", help="a parplan.plan/1 file (hand-written is fine)")
    parser.add_argument("--profile", required=True, metavar="PROFILE", help="a profile JSON or a preset (v100, a100, h100)")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"), help="optimizer state to count")
    parser.add_argument("--no-overlap", action="store_true",
                        help="model no overlap of halo exchange and gradient allreduce with compute")
    parser.add_argument("--slow-stage", action="append", default=[], metavar="K:FACTOR",
                        help="model stage K running FACTOR times slower (a straggler); repeatable")
    parser.set_defaults(handler=_estimate)


def _estimate(args: argparse.Namespace) -> int:
    from cost_models.plan import load_plan

    plan = load_plan(args.plan)  # a malformed plan is refused before the model is built
    graph, timing = trace_model(args)
    plan = load_plan(args.plan, expected_fingerprint=graph.fingerprint)
    profile = load_profile_argument(args.profile, args.dtype)
    import torch

    from cost_models.estimate import estimate

    started = time.perf_counter()
    slow = slowdowns(args.slow_stage)
    if any(stage >= plan.pipeline.stages for stage in slow):
        raise InputError(f"--slow-stage names stage {max(slow)}, but the plan has {plan.pipeline.stages} stages")
    result = estimate(graph, plan, profile, optimizer=args.optimizer, overlap=not args.no_overlap, slowdown=slow)
    document = estimate_document(result, profile.compatibility_warnings(torch.__version__, graph.graph["dtype"]))
    document["timing_s"] = {**timing, "estimate": round(time.perf_counter() - started, 4)}
    if args.json:
        print_json(document)
    else:
        from parplan.cli.report import print_estimate

        print_estimate(document)
    return 0


def estimate_document(result: Any, warnings: list[str]) -> dict[str, Any]:
    """The JSON document of an Estimate: totals, breakdown, stages and layers, and ``warnings``."""
    layers = [{"name": layer.name, "kind": layer.kind, "stage": layer.stage, "layout": str(layer.layout),
               "compute_source": layer.cost.compute_source, "forward_s": layer.cost.forward_s,
               "backward_s": layer.cost.backward_s, "halo_s": layer.cost.halo_s,
               "halo_exposed_s": layer.cost.halo_exposed_s, "allreduce_s": layer.cost.allreduce_s,
               "norm_s": layer.cost.norm_s, "channel_reduce_s": layer.cost.channel_reduce_s,
               "redistribution_s": layer.redistribution_s,
               "memory_bytes": layer.memory.resident_bytes} for layer in result.layers]
    stages = [{"stage": index, "forward_s": stage.forward_s, "backward_s": stage.backward_s,
               "transfer_s": stage.transfer_s, "allreduce_s": stage.allreduce_s,
               "allreduce_exposed_s": stage.allreduce_exposed_s, "memory_bytes": stage.memory_bytes}
              for index, stage in enumerate(result.stages)]
    return {"iteration_s": result.iteration_s, "breakdown_s": dict(result.breakdown_s), "stages": stages,
            "memory_bytes_max": result.memory_bytes_max, "memory_bytes": dict(result.memory_bytes),
            "sources": result.sources(), "layers": layers, "warnings": warnings}
