"""``parplan plan``: the exact search for a model's per-layer layouts, pipeline stages and schedule."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from parplan.cli.args import (
    OneLineParser,
    add_model_arguments,
    add_search_arguments,
    add_trace_argument,
    check_out_dir,
    check_plot_path,
    cluster_for,
    compute_dtype,
    load_profile_argument,
    positive_int,
    print_json,
    search_settings,
    trace_model,
    write_predicted_trace,
)

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph
    from cost_models.profile import Profile
    from parplan.cli.args import Commands
    from planner.search import PlanResult

__all__ = ["add_plan", "search_plan"]


def add_plan(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan plan``."""
    parser = commands.add_parser("plan", parents=[common], help="search the best plan: layouts, stages, staleness",
                                 description="Find the per-layer layouts, pipeline stages and schedule with the least "
                                             "predicted time that fit in memory.")
    add_model_arguments(parser)
    parser.add_argument("--profile", required=True, metavar="PROFILE",
                        help="a profile JSON or a preset (v100, a100, h100)")
    parser.add_argument("--devices", required=True, type=positive_int, help="number of devices")
    parser.add_argument("--devices-per-node", type=positive_int, default=None, help="devices per node")
    add_search_arguments(parser)
    parser.add_argument("--table", action="store_true",
                        help="print the layout, stage, time and memory of every layer")
    parser.add_argument("--explain", action="store_true",
                        help="the per-layer table with each layer's runner-up layout and its extra cost")
    parser.add_argument("--plot", metavar="F.png", help="draw the plan along the model: each layer's layout, time and "
                        "memory, pipeline stages shaded (png, svg, pdf)")
    add_trace_argument(parser, "the plan's predicted timeline of one iteration")
    parser.add_argument("--out", required=True, metavar="PLAN.json", help="where to write the plan")
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    if args.trace:
        check_out_dir(args.trace, "--trace")
    if args.plot:
        check_plot_path(args.plot)
    profile = load_profile_argument(args.profile, compute_dtype(args.amp, args.dtype))
    cluster_for(args.profile, profile, args.devices, args.devices_per_node)  # a bad device count before tracing
    graph, _ = trace_model(args)
    from cost_models.formats.plan import save_plan

    result = search_plan(args, graph, profile)
    save_plan(result.plan, args.out)
    document = {**_plan_document(graph, result), "devices_given": args.devices}
    if args.trace:
        write_predicted_trace(args.trace, result.plan, result.estimate)
    if args.plot:
        from parplan.cli.plot import plot_plan

        plot_plan(document, args.plot)
    if args.json:
        print_json(document)
    else:
        from parplan.cli.report import print_plan_summary

        print_plan_summary(document, args.out, explain=args.explain, table=args.table)
    return 0


def search_plan(args: argparse.Namespace, graph: LayerGraph, profile: Profile | None = None) -> PlanResult:
    """``parplan plan``'s search for ``graph`` with the options in ``args`` (its parser's namespace): a PlanResult.

    ``parplan check`` plans through here too, with this parser's defaults. ``profile``: already loaded.
    """
    from parplan.cli.report import progress_bar
    from planner.search import plan_model

    if profile is None:
        profile = load_profile_argument(args.profile, compute_dtype(getattr(args, "amp", None), args.dtype))
    cluster = cluster_for(args.profile, profile, args.devices, args.devices_per_node)
    with progress_bar("stage search", enabled=not getattr(args, "json", True)) as progress:
        return plan_model(graph, profile, cluster, search_settings(args), model_spec=args.model, progress=progress)


def _staleness_why(result: PlanResult) -> str | None:
    """Why a stale plan's stages have their staleness (``cost_models.pipeline_cost.staleness_reason``)."""
    from cost_models.pipeline_cost import staleness_reason

    pipeline, stages = result.plan.pipeline, result.estimate.stages
    if pipeline.schedule != "stale" or pipeline.stages < 2:
        return None
    return staleness_reason([s.forward_s for s in stages], [s.backward_s for s in stages],
                            [s.transfer_s for s in stages[:-1]], [s.allreduce_s for s in stages], pipeline.staleness)


def _plan_document(graph: LayerGraph, result: PlanResult) -> dict[str, object]:
    from planner.space import decision_groups

    by_name = {layer.name: layer for layer in result.estimate.layers}
    rows = []
    for head, members in decision_groups(graph).items():
        found = [by_name[name] for name in members]
        runner = result.runner_ups.get(head)
        rows.append({"layer": head, "followers": list(members[1:]), "kind": found[0].kind, "stage": found[0].stage,
                     "layout": str(found[0].layout),
                     "time_s": sum(layer.cost.total_s + layer.redistribution_s for layer in found),
                     "memory_bytes": sum(layer.memory.resident_bytes for layer in found),
                     "runner_up": runner.option if runner else None,
                     "runner_up_extra_s": runner.extra_s if runner else None})
    return {**result.plan.to_dict(), "summary": result.plan.summary(), "candidates": result.candidates,
            "pruned": result.pruned, "search_s": result.search_s, "chosen_from": result.chosen_from,
            "skipped_configurations": result.skipped_configurations, "decisions": rows,
            "staleness_why": _staleness_why(result),
            "considered": [{"plan": c.summary, "iteration_s": c.iteration_s, "memory_bytes_max": c.memory_bytes_max,
                            "fits": c.fits} for c in result.considered],
            "baselines": [{"name": b.name, "devices": b.plan.cluster.devices, "iteration_s": b.estimate.iteration_s,
                           "memory_bytes_max": b.estimate.memory_bytes_max,
                           "speedup": b.estimate.iteration_s / result.estimate.iteration_s}
                          for b in result.baselines]}
