"""``parplan run``: check everything a user can get wrong before any rank starts, launch, report.

Order of checks (each a one-line error and exit code 2): the input shape, the
plan file (format, schema), the model (loads and traces; ``--output`` names a
part of what it returns), the plan against the model (fingerprint, layers,
layouts the runtime executes), the rank count against the plan's devices,
the backend against this machine (``parplan.cli.run_checks``). Then the
ranks run (``runtime.launch``); rank 0's measurement is written atomically
to ``--out`` and printed (a table, or the document with ``--json``).
``--verify`` failing its tolerance exits 1 after the report.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cost_models.errors import InputError
from parplan.cli.args import (
    OneLineParser,
    add_loss_argument,
    add_model_arguments,
    add_timeout_argument,
    add_trace_argument,
    amp_argument,
    compute_dtype,
    load_profile_argument,
    loss_target,
    non_negative_int,
    positive_float,
    positive_int,
    slowdowns,
)
from parplan.cli.ranks import JobRanks, add_node_arguments, check_placement, job_ranks
from parplan.cli.resume import defaults, resumed
from parplan.cli.run_checks import check_pipeline_flags, check_plan_fits, check_precision, check_recovery, layout_plan
from processes.cores import host_shared_cores

if TYPE_CHECKING:
    from torch import nn

    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from parplan.cli.args import Commands

__all__ = ["add_run", "backend_for"]


def add_run(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan run``."""
    parser = commands.add_parser(
        "run", parents=[common], help="train MODEL under a plan on R ranks and measure it",
        description="Execute PLAN on --nproc local ranks (torchrun's machinery; with --nnodes, this host's part of a "
                    "job of several), or as one of the ranks torchrun, srun or mpirun started; train --steps steps on "
                    "synthetic data and write the measurement JSON.")
    add_model_arguments(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--plan", metavar="PLAN.json", help="a parplan.plan/3 (or /2, /1) file made for this model and "
                       "input (with --resume and neither --plan nor --layout: the checkpoint's plan)")
    which.add_argument("--layout", metavar="L[,L…]", help="run without a plan file: every layer takes the first of "
                       "these layouts it can (e.g. h2,n1); n1 (whole) is always tried last")
    parser.add_argument("--nproc", type=positive_int, metavar="R",
                        help="ranks to start on this host (default: the plan's devices, over --nnodes; under torchrun, "
                             "srun or mpirun: theirs)")
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
    parser.add_argument("--lr", type=positive_float, help="SGD learning rate (default 0.01; with --resume: the "
                        "checkpoint's run's)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="weights and data seed (default 0)")
    parser.add_argument("--output", metavar="KEY",
                        help="a model returning a dict, tuple or named tuple: take the loss of this part only (a key, "
                             "field or index); default: the sum over every floating output")
    add_loss_argument(parser)
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
    add_trace_argument(parser, "rank 0's measured timeline of one more step (the PyTorch profiler's, each layer "
                               "in a range named as the prediction names it)")
    _add_recovery_arguments(parser)
    _add_pipeline_arguments(parser)
    add_node_arguments(parser)
    parser.set_defaults(handler=_run)


def _add_recovery_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failures and recovery")
    add_timeout_argument(group)
    group.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                       help="write a checkpoint after every N-th update (warm-up included) into --checkpoint-dir")
    group.add_argument("--checkpoint-dir", metavar="D", help="folder of the checkpoints (seen by every rank)")
    group.add_argument("--resume", action="store_true",
                       help="continue from the newest complete, intact checkpoint in --checkpoint-dir (another plan "
                            "works too); the flags --checkpoint-every, --order, --staleness, --lr and the plan not "
                            "given again are the checkpoint's run's")
    group.add_argument("--max-restarts", type=non_negative_int, default=0, metavar="R",
                       help="when a rank fails, start the group again up to R times, from the last checkpoint "
                            "(parplan's agent; under torchrun, give torchrun --max-restarts; not under mpirun or srun)")


def _add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    pipeline = parser.add_argument_group("pipelines")
    pipeline.add_argument("--stages", type=positive_int, default=1, metavar="K",
                          help="with --layout: cut the model into K stages of equal compute, R/K ranks each")
    pipeline.add_argument("--schedule", choices=("sync", "stale"), default="sync",
                          help="with --layout --stages: sync (GPipe/1F1B micro-batches) or stale (DSP); default sync")
    pipeline.add_argument("--micro-batches", type=positive_int, metavar="M",
                          help="with --layout --stages and sync: micro-batches (default: the divisor of the batch "
                               "nearest below 4K that leaves every batch-norm more than one value per channel)")
    pipeline.add_argument("--order", choices=("1f1b", "gpipe"),
                          help="order of a sync pipeline's micro-batches (default 1f1b)")
    pipeline.add_argument("--staleness", type=non_negative_int, metavar="S",
                          help="cap every stage's staleness of a stale pipeline at S (0: sequential, as sync M=1)")
    pipeline.add_argument("--slow-stage", action="append", default=[], metavar="K:FACTOR",
                          help="run stage K FACTOR times slower (a simulated straggler); repeatable")


def _run(args: argparse.Namespace) -> int:
    """The handler: check, launch, report."""
    import torch

    from cost_models.formats.jsonio import check_writable
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import parse_input_shapes
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from runtime.fault_injection import planned
    from runtime.launch import launch
    from runtime.options import RunOptions
    from runtime.outputs import check_output_key
    from runtime.preflight import SHAPE_FALLBACK, shape_fallbacks

    args.slow_stages = slowdowns(args.slow_stage)
    check_writable(args.out, "--out")
    check_writable(args.trace, "--trace")
    planned()  # a malformed PARPLAN_FAULT is bad input, refused here rather than in every rank
    shapes = parse_input_shapes(args.input_shape)
    manifest, notes = resumed(args)  # a --resume keeps the flags and the plan it does not give again
    defaults(args)
    if not (args.plan or args.layout or manifest):
        raise InputError("give --plan PLAN.json or --layout L (or --resume from a checkpoint, which keeps its plan)")
    plan = _read_plan(args.plan) if args.plan else None
    if plan is None and not args.layout and manifest is not None:
        plan = Plan.from_dict(manifest["plan"], f"the plan of the checkpoint in {manifest['folder']}")
    ranks = job_ranks(args, plan.used_devices if plan else None)
    if plan is not None:
        check_placement(plan, ranks, f"plan {args.plan}" if args.plan else "the checkpoint's plan")
    model = load_model(args.model)
    check_output_key(model, args.output, args.leaf_module, shapes=shapes)  # --output names a part of its output
    graph = trace(model, shapes, getattr(torch, args.dtype), leaf_modules=args.leaf_module,
                  amp=amp_argument(args.amp, args.dtype))
    if plan is not None and plan.dtype != args.dtype and plan.fingerprint != graph.fingerprint:
        plan = _in_dtype(plan, model, graph, args)  # a float32 plan rechecked in float64: the same layouts
    target = loss_target(args.loss, graph, args.dtype, args.output)  # a --loss that cannot run is bad input: exit 2
    whole: list[str] = []
    if plan is None:
        plan, whole = shape_fallbacks(model, layout_plan(graph, args, ranks.total), graph, args.leaf_module)
    check_plan_fits(args, plan, graph, ranks.total)
    check_pipeline_flags(args, plan)
    check_precision(args.amp, args.dtype, plan)
    check_recovery(args, plan, ranks.launcher)
    backend = backend_for(args.backend, ranks)
    for note in notes:  # what the resume kept, once the input is known good
        print(note, file=sys.stderr, flush=True)
    if args.layout and not args.plan:
        if whole:
            print(f"parplan run: note: {len(whole)} layer(s) run whole ({', '.join(whole[:3])}): {SHAPE_FALLBACK}",
                  file=sys.stderr, flush=True)
        for line in _layout_lines(graph, plan, args.layout):
            print(line, file=sys.stderr, flush=True)
    options = RunOptions(
        model=args.model, input_shape=tuple(shapes[0]), input_shapes=shapes, dtype=args.dtype,
        plan=_predicted(args, plan, graph, ranks).to_dict(),
        steps=args.steps, warmup=args.warmup, lr=args.lr, seed=args.seed, verify=args.verify,
        tolerance=args.tolerance or (1e-9 if args.dtype == "float64" else 1e-3),
        sync_batchnorm=args.sync_batchnorm, leaf_modules=tuple(args.leaf_module), data=args.data or "",
        threads=ranks.threads(args.threads), quiet=args.json,
        timeout_s=args.timeout_s, checkpoint_every=args.checkpoint_every or 0,
        checkpoint_dir=args.checkpoint_dir or "",
        resume=args.resume, graph=graph, output=args.output, order=args.order, staleness=args.staleness,
        per_layer=args.per_layer, slow_stages=tuple(sorted(args.slow_stages.items())),
        trace=os.path.abspath(args.trace) if args.trace else "", amp=args.amp or "", loss=args.loss, target=target)
    document = launch(options, ranks.here, backend, args.max_restarts, nodes=ranks.nodes)
    if document is None:  # a rank other than 0, or a host other than rank 0's: rank 0 reports
        return 0
    _report(document, args.out, args.json)
    verified = document.get("verify")
    return 1 if verified is not None and not verified["passed"] else 0


def _layout_lines(graph: LayerGraph, plan: Plan, text: str) -> list[str]:
    """What ``--layout`` split: a note with how many layers took it and why the others did not, or a warning
    when it split none of them (each runs whole on every rank)."""
    from cost_models.layout import Layout
    from parplan.cli.layouts import split_reason, split_summary

    layouts = [Layout.parse(part.strip()) for part in text.split(",") if part.strip()]
    split = [layout for layout in layouts if layout.ranks > 1]
    if not split:
        return []
    reason = split_reason(split_summary(graph, plan, split[0]), split[0])
    if any(assignment.layout.ranks > 1 for assignment in plan.layers.values()):
        return [f"parplan run: note: --layout {text}: {reason}"] if len(layouts) == 1 else []
    return [f"parplan run: warning: --layout {text} splits none of the model's layers: every layer runs whole on "
            f"every rank ({reason})"]


def _in_dtype(plan: Plan, model: nn.Module, graph: LayerGraph, args: argparse.Namespace) -> Plan:
    """``plan``, made for another ``--dtype``, for ``graph`` (traced in the run's): when the model traced in the
    plan's dtype is the model it was made for, the same layers take the same layouts — ``parplan run --plan P
    --dtype float64 --verify`` rechecks a float32 plan exactly. Otherwise ``plan`` as it is (refused after)."""
    from dataclasses import replace

    import torch

    from cost_models.ir.graph import parse_input_shapes
    from cost_models.ir.tracing import trace

    made = trace(model, parse_input_shapes(args.input_shape), getattr(torch, plan.dtype),
                 leaf_modules=args.leaf_module, amp=amp_argument(args.amp, plan.dtype))
    if made.fingerprint != plan.fingerprint:
        return plan
    print(f"parplan run: note: {args.plan or 'the plan'} was made for {plan.dtype}; running its layouts in "
          f"{args.dtype} (its prediction is {plan.dtype}'s)", file=sys.stderr, flush=True)
    return replace(plan, fingerprint=graph.fingerprint, dtype=args.dtype)


def _read_plan(path: str) -> Plan:
    from cost_models.formats.plan import load_plan

    return load_plan(path)


def _predicted(args: argparse.Namespace, plan: Plan, graph: LayerGraph, ranks: JobRanks) -> Plan:
    """The plan with its prediction replaced by ``--profile``'s (this machine's), when given."""
    if not args.profile:
        return plan
    from dataclasses import replace

    from cost_models.estimate import estimate

    profile = load_profile_argument(args.profile, compute_dtype(args.amp, args.dtype))
    result = estimate(graph, plan, profile, slowdown=args.slow_stages,
                      shared_cores=host_shared_cores(ranks.per_node, args.threads),
                      threads=ranks.threads(args.threads))
    return replace(plan, predicted=result.prediction())


def backend_for(requested: str | None, ranks: JobRanks) -> str:
    """The backend of the job: ``requested``, else nccl with GPUs, else gloo; refused when it cannot work."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = requested or ("nccl" if gpus >= 1 else "gloo")
    if backend == "nccl" and gpus < 1:
        raise InputError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
    if backend == "nccl" and gpus < ranks.per_node:  # a GPU per rank of a node (each node is one host)
        raise InputError(f"--backend nccl with {ranks.per_node} ranks on this host needs {ranks.per_node} GPUs, this "
                         f"machine has {gpus}")
    if backend == "mpi" and not dist.is_mpi_available():
        raise InputError("this torch was built without the MPI backend; use --backend gloo or nccl "
                         "(mpirun can still start the ranks)")
    return backend


def _report(document: Mapping[str, object], out: str | None, as_json: bool) -> None:
    from cost_models.formats.schema import check_document

    try:
        check_document(document, "parplan.measurement/1", "measurement-1", "the measurement", InputError)
    except InputError as err:  # our own output: a bug, not bad input
        raise RuntimeError(f"the measurement does not match its schema: {err}") from err
    from cost_models.formats.jsonio import emit_document
    from parplan.cli.report import print_measurement

    emit_document(document, out, as_json, print_measurement)
