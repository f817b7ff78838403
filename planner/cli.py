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
import os
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from cost_models.errors import InputError
from planner.cli_args import (OneLineParser, add_model_arguments, cluster_for, non_negative_int, positive_float,
                               positive_int, print_json)

__all__ = ["build_parser", "main", "search_plan"]

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``parplan`` command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    command = f"parplan {args.command}"
    try:
        _check_input_shapes(args)
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


def _check_input_shapes(args: argparse.Namespace) -> None:
    """Refuse malformed ``--input-shape`` values, or inputs of different batches, before a command does any work."""
    if getattr(args, "input_shape", None) is not None:
        from cost_models.graph import parse_input_shapes

        parse_input_shapes(args.input_shape)


def _failure(err: Exception) -> str:
    """One line for a failure that is not bad input: a rank that died or hung, or a bug (asks for --debug)."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if "runtime.launch" in sys.modules:  # only a run can have failed ranks (imported by then)
        from runtime.failures import RankFailure
        from runtime.launch import RankFailedError

        if isinstance(err, (RankFailure, RankFailedError)):
            return f"error: {detail}"
    return f"internal error: {type(err).__name__}: {detail} (rerun with --debug for the traceback)"


def _stop_mpi_job(code: int) -> int:
    """``code``; under mpirun with other ranks, first stop them all (``runtime.launch.abort_mpi_job``)."""
    if "mpi4py.MPI" in sys.modules:
        from runtime.launch import abort_mpi_job

        abort_mpi_job(code)
    return code


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand and its options."""
    common = OneLineParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of tables")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    parser = OneLineParser(prog="parplan", description="Plan and run sample/spatial/channel/pipeline parallel training.")
    parser.add_argument("--version", action="version", version=f"parplan {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser, metavar="COMMAND")
    _add_inspect(commands, common)
    _add_calibrate(commands, common)
    _add_profile(commands, common)
    _add_estimate(commands, common)
    _add_plan(commands, common)
    _add_run(commands, common)
    from planner.whatif_cli import add_whatif

    add_whatif(commands, common)
    from planner.validate_cli import add_validate

    add_validate(commands, common)
    from planner.checkpoint_cli import add_checkpoint

    add_checkpoint(commands, common)
    from planner.check_cli import add_check

    add_check(commands, common)
    return parser


def _add_inspect(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser("inspect", parents=[common], help="show the traced layer table",
                                 description="Trace MODEL at the input shape and show its layers and totals.")
    add_model_arguments(parser)
    parser.set_defaults(handler=_inspect)


def _add_calibrate(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser("calibrate", parents=[common], help="measure this machine into a profile",
                                 description="Time MODEL's local problems and the collectives, fit them, write a profile.")
    add_model_arguments(parser)
    parser.add_argument("--ranks", type=positive_int, default=1, help="ranks for timing collectives (default 1: none)")
    parser.add_argument("--devices", default=None, metavar="D1,D2,...",
                        help="device counts the planner may use (default: powers of two up to --ranks)")
    parser.add_argument("--budget-s", type=positive_float, default=120.0, help="wall-time bound in seconds (default 120)")
    parser.add_argument("--threads", type=positive_int, default=1, help="threads per rank while timing (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i] for the compute kernels (default cpu)")
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl", "mpi"),
                        help="collectives backend (default gloo on cpu, nccl on cuda)")
    parser.add_argument("--out", required=True, metavar="P.json", help="where to write the profile")
    parser.set_defaults(handler=_calibrate)


def _add_profile(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser("profile", help="inspect profiles")
    actions = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser, metavar="ACTION")
    show = actions.add_parser("show", parents=[common], help="device, fitted parameters and fit errors of a profile")
    show.add_argument("profile", metavar="PROFILE", help="a profile JSON path or a preset name (v100, a100, h100)")
    show.add_argument("--dtype", default="float32", help="dtype of a preset (default float32)")
    show.set_defaults(handler=_profile_show)


def _add_estimate(commands: Any, common: argparse.ArgumentParser) -> None:
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


def _add_run(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "run", parents=[common], help="train MODEL under a plan on R ranks and measure it",
        description="Execute PLAN on --nproc local ranks (torchrun's machinery), or on the ranks mpirun/srun started; "
                    "train --steps steps on synthetic data and write the measurement JSON.")
    add_model_arguments(parser)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--plan", metavar="PLAN.json", help="a parplan.plan/1 file made for this model and input")
    which.add_argument("--layout", metavar="L[,L…]", help="run without a plan file: every layer takes the first of "
                       "these layouts it can (e.g. h2,n1); n1 (whole) is always tried last")
    parser.add_argument("--nproc", type=positive_int, metavar="R",
                        help="ranks to start (default: the plan's devices; under mpirun: its ranks)")
    parser.add_argument("--steps", type=non_negative_int, default=10, metavar="S", help="measured steps (default 10)")
    parser.add_argument("--warmup", type=non_negative_int, default=2, metavar="W",
                        help="steps run before measuring (default 2)")
    parser.add_argument("--backend", choices=("gloo", "nccl", "mpi"), help="default: nccl with GPUs, else gloo")
    parser.add_argument("--out", metavar="MEAS.json", help="write the measurement here (atomically)")
    parser.add_argument("--profile", metavar="PROFILE",
                        help="predict this machine's step time with a profile (default: the plan's own prediction)")
    parser.add_argument("--verify", action="store_true",
                        help="first compare one step with the unsplit model; exit 1 if the error exceeds --tolerance")
    parser.add_argument("--tolerance", type=positive_float, metavar="X",
                        help="largest relative error --verify accepts (default 1e-3; 1e-9 in float64)")
    parser.add_argument("--lr", type=positive_float, default=0.01, help="SGD learning rate (default 0.01)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="weights and data seed (default 0)")
    parser.add_argument("--output", metavar="KEY",
                        help="a model returning a dict, tuple or named tuple: take the loss of this part only (a key, "
                             "field or index); default: the sum over every floating output")
    parser.add_argument("--sync-batchnorm", action="store_true",
                        help="batch-norm statistics over the whole batch, as the unsplit model (default: per group "
                             "of samples, as data parallelism; not priced by the cost model)")
    parser.add_argument("--data", metavar="module:function",
                        help="data factory: function(input_box, target_box, step) -> (input, target) of this rank; "
                             "with several inputs input_box is a tuple of boxes and input a tuple of tensors")
    parser.add_argument("--threads", type=positive_int, metavar="T",
                        help="CPU threads per rank (default: cores / ranks)")
    parser.add_argument("--per-layer", action="store_true",
                        help="after the timed steps, profile 3 more and report each layer's forward/backward seconds")
    _add_recovery_arguments(parser)
    pipeline = parser.add_argument_group("pipelines")
    pipeline.add_argument("--stages", type=positive_int, default=1, metavar="K",
                          help="with --layout: cut the model into K stages of equal compute, R/K ranks each")
    pipeline.add_argument("--schedule", choices=("sync", "stale"), default="sync",
                          help="with --layout --stages: sync (GPipe/1F1B micro-batches) or stale (DSP); default sync")
    pipeline.add_argument("--micro-batches", type=positive_int, metavar="M",
                          help="with --layout --stages and sync: micro-batches (default: the divisor of the batch "
                               "nearest below 4K)")
    pipeline.add_argument("--order", choices=("1f1b", "gpipe"), default="1f1b",
                          help="order of a sync pipeline's micro-batches (default 1f1b)")
    pipeline.add_argument("--staleness", type=non_negative_int, metavar="S",
                          help="cap every stage's staleness of a stale pipeline at S (0: sequential, as sync M=1)")
    pipeline.add_argument("--slow-stage", action="append", default=[], metavar="K:FACTOR",
                          help="run stage K FACTOR times slower (a simulated straggler); repeatable")
    parser.set_defaults(handler=_run)


def add_timeout_argument(parser: Any) -> None:
    """``--timeout-s``: how long any collective or point-to-point exchange of the ranks waits for a peer."""
    parser.add_argument("--timeout-s", type=positive_float, default=300.0, metavar="T",
                        help="a rank that waits T seconds for a peer (dead or hung) fails, naming where it waited, "
                             "and the others are stopped (default 300)")


def _add_recovery_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failures and recovery")
    add_timeout_argument(group)
    group.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                       help="write a checkpoint after every N-th update (warm-up included) into --checkpoint-dir")
    group.add_argument("--checkpoint-dir", metavar="D", help="folder of the checkpoints (seen by every rank)")
    group.add_argument("--resume", action="store_true",
                       help="continue from the newest complete checkpoint in --checkpoint-dir (another plan works too)")
    group.add_argument("--max-restarts", type=non_negative_int, default=0, metavar="R",
                       help="when a rank fails, start the group again up to R times, from the last checkpoint "
                            "(torchrun's agent; not under mpirun)")


def _run(args: argparse.Namespace) -> int:
    from planner.report import print_measurement
    from runtime.command import run_command

    def predict(graph: Any, plan: Any) -> Any:
        from cost_models.estimate import estimate
        from cost_models.plan import Prediction

        result = estimate(graph, plan, load_profile_argument(args.profile, args.dtype), slowdown=args.slow_stages,
                          shared_cores=host_shared_cores(args.nproc or plan.cluster.devices, args.threads))
        return Prediction(result.iteration_s, result.memory_bytes_max, dict(result.breakdown_s))

    args.slow_stages = _slowdowns(args.slow_stage)
    return run_command(args, predict if args.profile else None, print_measurement)


def host_shared_cores(ranks: int, threads: int | None) -> float | None:
    """How many of ``ranks`` local ranks (``threads`` each, default cores / ranks) can compute at once here.

    ``None`` when all can, and under MPI, whose ranks may span hosts (``planner.validate.shared_cores``).
    """
    from planner.validate import shared_cores
    from runtime.launch import started_by_mpi

    if started_by_mpi():
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return shared_cores(ranks, threads or max(1, (os.cpu_count() or 1) // ranks), cores)


def _slowdowns(items: list[str]) -> dict[int, float]:
    factors: dict[int, float] = {}
    for item in items:
        stage, _, factor = item.partition(":")
        try:
            factors[int(stage)] = float(factor)
        except ValueError:
            raise InputError(f"--slow-stage {item!r} is not K:FACTOR, e.g. 1:2.0") from None
        if factors[int(stage)] < 1.0 or int(stage) < 0:
            raise InputError(f"--slow-stage {item!r} needs a stage >= 0 and a factor >= 1")
    return factors


def _estimate(args: argparse.Namespace) -> int:
    from cost_models.plan import load_plan

    plan = load_plan(args.plan)  # a malformed plan is refused before the model is built
    graph, timing = _trace_model(args)
    plan = load_plan(args.plan, expected_fingerprint=graph.fingerprint)
    profile = load_profile_argument(args.profile, args.dtype)
    import torch

    from cost_models.estimate import estimate

    started = time.perf_counter()
    slow = _slowdowns(args.slow_stage)
    if any(stage >= plan.pipeline.stages for stage in slow):
        raise InputError(f"--slow-stage names stage {max(slow)}, but the plan has {plan.pipeline.stages} stages")
    result = estimate(graph, plan, profile, optimizer=args.optimizer, overlap=not args.no_overlap, slowdown=slow)
    document = _estimate_document(result, profile.compatibility_warnings(torch.__version__, graph.graph["dtype"]))
    document["timing_s"] = {**timing, "estimate": round(time.perf_counter() - started, 4)}
    if args.json:
        print_json(document)
    else:
        from planner.report import print_estimate

        print_estimate(document)
    return 0


def _estimate_document(result: Any, warnings: list[str]) -> dict[str, Any]:
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


def _add_plan(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser("plan", parents=[common], help="search the best plan: layouts, stages, staleness",
                                 description="Find the per-layer layouts, pipeline stages and schedule with the least "
                                             "predicted time that fit in memory.")
    add_model_arguments(parser)
    parser.add_argument("--profile", required=True, metavar="PROFILE", help="a profile JSON or a preset (v100, a100, h100)")
    parser.add_argument("--devices", required=True, type=positive_int, help="number of devices")
    parser.add_argument("--devices-per-node", type=positive_int, default=None, help="devices per node")
    parser.add_argument("--solver", default="cbc", choices=("cbc", "highs"), help="ILP solver (default cbc)")
    parser.add_argument("--time-limit-s", type=positive_float, default=None, help="ILP time limit in seconds")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"), help="optimizer state to count")
    parser.add_argument("--max-stages", type=positive_int, default=4, help="most pipeline stages to try (default 4)")
    parser.add_argument("--schedule", default="auto", choices=("sync", "stale", "auto"),
                        help="pipeline schedule: sync (GPipe), stale (DSP) or the faster (default auto)")
    parser.add_argument("--max-staleness", type=non_negative_int, default=None,
                        help="cap on a stage's staleness (0 = synchronous only; default: DSP's 2(K-1-k))")
    parser.add_argument("--explain", action="store_true", help="per layer, the runner-up layout and its extra cost")
    parser.add_argument("--out", required=True, metavar="PLAN.json", help="where to write the plan")
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise InputError(f"--out {args.out}: directory {out_dir} does not exist; create it first")
    profile = load_profile_argument(args.profile, args.dtype)
    cluster_for(args.profile, profile, args.devices, args.devices_per_node)  # a bad device count before tracing
    graph, _ = _trace_model(args)
    from cost_models.plan import save_plan

    result = search_plan(args, graph, profile)
    save_plan(result.plan, args.out)
    document = _plan_document(graph, result)
    if args.json:
        print_json(document)
    else:
        from planner.report import print_plan_summary

        print_plan_summary(document, args.out, explain=args.explain)
    return 0


def search_plan(args: argparse.Namespace, graph: Any, profile: Any = None) -> Any:
    """``parplan plan``'s search for ``graph`` with the options in ``args`` (its parser's namespace): a PlanResult.

    ``parplan check`` plans through here too, with this parser's defaults. ``profile``: already loaded.
    """
    from planner.search import plan_model

    profile = profile if profile is not None else load_profile_argument(args.profile, args.dtype)
    cluster = cluster_for(args.profile, profile, args.devices, args.devices_per_node)
    return plan_model(graph, profile, cluster, args.solver, args.time_limit_s, args.optimizer, args.model,
                      args.max_stages, args.schedule, args.max_staleness)


def _plan_document(graph: Any, result: Any) -> dict[str, Any]:
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
                     "runner_up": runner.option if runner else None, "runner_up_extra_s": runner.extra_s if runner else None})
    return {**result.plan.to_dict(), "summary": result.plan.summary(), "candidates": result.candidates,
            "pruned": result.pruned, "search_s": result.search_s, "chosen_from": result.chosen_from,
            "skipped_configurations": result.skipped_configurations, "decisions": rows,
            "considered": [{"plan": c.summary, "iteration_s": c.iteration_s, "memory_bytes_max": c.memory_bytes_max,
                            "fits": c.fits} for c in result.considered],
            "baselines": [{"name": b.name, "iteration_s": b.estimate.iteration_s,
                           "memory_bytes_max": b.estimate.memory_bytes_max,
                           "speedup": b.estimate.iteration_s / result.estimate.iteration_s}
                          for b in result.baselines]}


def _device_counts(text: str | None, ranks: int) -> tuple[int, ...]:
    if text is None:
        counts = [1]
        while counts[-1] * 2 <= ranks:
            counts.append(counts[-1] * 2)
        return tuple(sorted(set(counts) | {ranks}))
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise InputError(f"--devices {text!r} is not a comma-separated list of integers, e.g. 1,2,4") from None
    if not counts or min(counts) < 1:
        raise InputError(f"--devices {text!r} must list device counts >= 1, e.g. 1,2,4")
    return tuple(sorted(set(counts)))


def load_profile_argument(text: str, dtype: str = "float32") -> Any:
    """A PROFILE argument: a preset name or a profile file."""
    from calibrate.presets import preset_profile
    from cost_models.profile import load_profile

    if os.path.exists(text) or text.endswith(".json") or os.sep in text:
        return load_profile(text)
    return preset_profile(text, dtype)  # a preset, or one line naming the known ones


def _calibrate(args: argparse.Namespace) -> int:
    counts = _device_counts(args.devices, args.ranks)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise InputError(f"--out {args.out}: directory {out_dir} does not exist; create it first")
    graph, _ = _trace_model(args)
    from calibrate.session import CalibrationRequest, run_calibration
    from cost_models.profile import save_profile

    backend = args.backend or ("nccl" if args.device.startswith("cuda") else "gloo")
    request = CalibrationRequest(graph, counts, args.ranks, args.budget_s, args.threads, args.device, backend, args.model)
    from planner.report import calibration_progress

    with calibration_progress(enabled=not args.json) as progress:
        result = run_calibration(request, progress)
    if result is None:  # a rank other than 0 under torchrun/mpirun: rank 0 writes and reports
        return 0
    save_profile(result.profile, args.out)
    summary = {"profile": args.out, "fit": result.profile.to_dict()["fit"], "measured": result.measured,
               "left_to_fit": result.left_to_fit, "interrupted": result.interrupted, "notes": result.notes,
               "seconds": result.profile.meta["calibration_s"]}
    if args.json:
        print_json(summary)
    else:
        from planner.report import print_calibration_summary

        print_calibration_summary(summary)
    return 130 if result.interrupted else 0


def _profile_show(args: argparse.Namespace) -> int:
    profile = load_profile_argument(args.profile, args.dtype)
    document = profile.to_dict()
    shown = {"device": document["device"], "meta": document["meta"], "fit": document["fit"],
             "compute_fits": document["compute"]["fits"], "comm_fits": document["comm"]["fits"],
             "samples": {"compute": len(profile.compute_samples), "comm": len(profile.comm_samples)},
             "warnings": _profile_warnings(profile)}
    if args.json:
        print_json(shown)
    else:
        from planner.report import print_profile

        print_profile(shown)
    return 0


def _profile_warnings(profile: Any) -> list[str]:
    import torch

    return profile.compatibility_warnings(torch.__version__)


def _trace_model(args: argparse.Namespace) -> tuple[Any, dict[str, float]]:
    """Parse the shapes first (cheap), then load and trace the model; also returns the seconds each took."""
    from cost_models.graph import parse_input_shapes

    shape = parse_input_shapes(args.input_shape)
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
        print_json(document)
    else:
        from planner.report import print_layer_table

        print_layer_table(document)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("parplan")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
