"""``parplan run``: check everything a user can get wrong before any rank starts, launch, report.

Order of checks (each a one-line error and exit code 2): the input shape, the
plan file (format, schema), the model (loads and traces; ``--output`` names a
part of what it returns), the plan against
the model (fingerprint, layers, layouts the runtime executes), the rank count
against the plan's devices, the backend against this machine. Then the ranks
run (``runtime.launch``); rank 0's measurement is written atomically to
``--out`` and printed (a table, or the document with ``--json``). ``--verify``
failing its tolerance exits 1 after the report.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from cost_models.errors import InputError

__all__ = ["run_command"]

Predict = Callable[[Any, Any], Any]  # (graph, plan) -> Prediction for this machine (``--profile``)


def run_command(args: argparse.Namespace, predict: Predict | None, report: Callable[[dict[str, Any]], None]) -> int:
    """The ``parplan run`` handler (``planner.cli`` passes the profile's prediction and the table printer)."""
    import torch

    from cost_models.graph import parse_input_shapes, trace
    from cost_models.model_spec import load_model
    from runtime.launch import launch, started_by_mpi
    from runtime.outputs import check_output_key
    from runtime.train import RunOptions

    from cost_models.jsonio import check_writable
    from runtime.faults import planned

    check_writable(args.out, "--out")
    planned()  # a malformed PARPLAN_FAULT is bad input, refused here rather than in every rank
    shapes = parse_input_shapes(args.input_shape)
    plan = _read_plan(args) if args.plan else None
    model = load_model(args.model)
    check_output_key(model, args.output, args.leaf_module)  # --output names a part of its output
    graph = trace(model, shapes, getattr(torch, args.dtype), leaf_modules=args.leaf_module)
    mpi = started_by_mpi()
    nproc = args.nproc or (None if mpi else (plan.cluster.devices if plan else None))
    if nproc is None and not mpi:
        raise InputError("--layout needs --nproc R (how many ranks to start)")
    plan = plan if plan is not None else _layout_plan(graph, args, nproc or _mpi_size())
    _check_plan(args, plan, graph, nproc)
    _check_pipeline_flags(args, plan)
    _check_recovery(args, plan, mpi)
    backend = backend_for(args.backend, nproc or _mpi_size(), mpi)
    options = RunOptions(
        model=args.model, input_shape=shapes[0], input_shapes=shapes, dtype=args.dtype,  # type: ignore[arg-type]
        plan=_predicted(plan, graph, predict).to_dict(),
        steps=args.steps, warmup=args.warmup, lr=args.lr, seed=args.seed, verify=args.verify,
        tolerance=args.tolerance or (1e-9 if args.dtype == "float64" else 1e-3),
        sync_batchnorm=args.sync_batchnorm, leaf_modules=tuple(args.leaf_module), data=args.data or "",
        threads=args.threads or max(1, (os.cpu_count() or 1) // (nproc or _mpi_size())), quiet=args.json,
        timeout_s=args.timeout_s, checkpoint_every=args.checkpoint_every or 0, checkpoint_dir=args.checkpoint_dir or "",
        resume=args.resume, graph=graph, output=args.output,
        extra={"order": args.order, "staleness": args.staleness, "per_layer": getattr(args, "per_layer", False),
               "slow_stages": {str(k): v for k, v in args.slow_stages.items()}})
    document = launch(options, nproc, backend, args.max_restarts)
    if document is None:  # an MPI rank other than 0: rank 0 reports
        return 0
    _report(args, document, report)
    verified = document.get("verify")
    return 1 if verified is not None and not verified["passed"] else 0


def _read_plan(args: argparse.Namespace) -> Any:
    from cost_models.plan import load_plan

    return load_plan(args.plan)


def _layout_plan(graph: Any, args: argparse.Namespace, ranks: int) -> Any:
    """The plan of ``--layout`` (cut into ``--stages`` of equal compute when more than one)."""
    from cost_models.uniform import balanced_starts, staged

    stages = args.stages
    if ranks % stages:
        raise InputError(f"--stages {stages} does not divide {ranks} ranks; give every stage the same number of ranks")
    plan = _uniform(graph, args.layout, ranks // stages)
    if stages == 1:
        return plan
    batch = graph.input_shape[0]
    micro = args.micro_batches or max(m for m in range(1, min(batch, 4 * stages) + 1) if batch % m == 0)
    return staged(plan, graph, balanced_starts(graph, stages), args.schedule, micro)


def _uniform(graph: Any, text: str, devices: int) -> Any:
    from cost_models.cluster import Cluster, Link
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan

    layouts = [Layout.parse(part.strip()) for part in text.split(",") if part.strip()]
    wrong = [str(layout) for layout in layouts if devices % layout.ranks]
    if wrong:
        raise InputError(f"--layout {', '.join(wrong)} does not divide {devices} ranks; use layouts of n·c·h·w "
                         f"dividing {devices}")
    link = Link(0.0, 1e9)  # a container for the device count: this plan is not priced
    cluster = Cluster(devices=devices, devices_per_node=devices, memory_bytes=2**40, intra=link, inter=link,
                      name="this machine")
    return uniform_plan(graph, cluster, [*layouts, Layout()])


def _check_plan(args: argparse.Namespace, plan: Any, graph: Any, nproc: int | None) -> None:
    from cost_models.model_spec import load_model
    from runtime.preflight import check_plan, check_runnable

    check_plan(plan, graph, nproc or _mpi_size(), f"plan {args.plan}" if args.plan else "the --layout plan")
    check_runnable(load_model(args.model), plan, graph, args.leaf_module, sync_batchnorm=args.sync_batchnorm,
                   verify=args.verify)


def _check_pipeline_flags(args: argparse.Namespace, plan: Any) -> None:
    """Refuse pipeline flags the plan cannot take, and pipelines the runtime cannot run (``check_pipeline``)."""
    from runtime.pipeline import check_pipeline

    stages = plan.pipeline.stages
    if args.plan and (args.stages != 1 or args.schedule != "sync" or args.micro_batches):
        raise InputError("--stages, --schedule and --micro-batches shape a --layout plan; a plan file has its own "
                         "pipeline (make another with parplan plan)")
    wrong = [k for k in args.slow_stages if k >= stages]
    if wrong:
        raise InputError(f"--slow-stage names stage {wrong[0]} but the plan has {stages} stage(s) 0…{stages - 1}")
    if args.staleness is not None and plan.pipeline.schedule != "stale":
        raise InputError("--staleness caps a stale pipeline's staleness; this plan's schedule is "
                         f"{plan.pipeline.schedule} with {stages} stage(s)")
    if stages > 1:
        check_pipeline(plan)



def _check_recovery(args: argparse.Namespace, plan: Any, mpi: bool) -> None:
    """Refuse checkpoint and restart flags that cannot work together, and a --resume with nothing to resume."""
    directory = args.checkpoint_dir
    if (args.checkpoint_every or args.resume) and not directory:
        raise InputError("--checkpoint-every and --resume need --checkpoint-dir D (the folder of the checkpoints)")
    if directory and not (args.checkpoint_every or args.resume or args.max_restarts):
        raise InputError(f"--checkpoint-dir {directory} without --checkpoint-every N writes nothing; add it "
                         "(or --resume to continue from it)")
    if args.max_restarts and mpi:
        raise InputError("--max-restarts needs torchrun's agent (parplan run --nproc R); mpirun does not restart "
                         "ranks — drop --max-restarts and rerun mpirun with --resume")
    if directory:
        _check_folder(directory, args.resume)
    if args.resume:
        _check_resumable(directory, plan, args)


def _check_folder(directory: str, resume: bool) -> None:
    """A folder (or one that can be made) that holds no other run's checkpoints, unless resuming from them."""
    from pathlib import Path

    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--checkpoint-dir {directory} is a file, not a folder; give a folder")
    if not folder.exists() and not folder.parent.is_dir():
        raise InputError(f"--checkpoint-dir {directory}: its parent folder {folder.parent} does not exist; create it")
    earlier = sorted(p.name for p in folder.glob("step-*")) if folder.is_dir() else []
    if earlier and not resume:
        raise InputError(f"--checkpoint-dir {directory} already holds checkpoints ({earlier[-1]}, …) of another run; "
                         "add --resume to continue it, or give an empty folder")


def _check_resumable(directory: str, plan: Any, args: argparse.Namespace) -> None:
    """A complete, intact checkpoint of this model, input, dtype, seed and warm-up must be in ``directory``."""
    from runtime.checkpoint import check_compatible, check_sizes, latest

    manifest = latest(directory)
    if manifest is None:
        raise InputError(f"--resume: {directory} holds no complete checkpoint (no step-*/manifest.json); "
                         "run without --resume")
    check_compatible(manifest, {"plan": plan.to_dict(), "seed": args.seed, "warmup": args.warmup,
                                "steps": args.steps})
    check_sizes(manifest)


def backend_for(requested: str | None, ranks: int, mpi: bool) -> str:
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = requested or ("nccl" if gpus >= 1 else "gloo")
    if backend == "nccl" and gpus < 1:
        raise InputError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
    if backend == "nccl" and not mpi and gpus < ranks:  # under MPI the ranks may span hosts
        raise InputError(f"--backend nccl with {ranks} local ranks needs {ranks} GPUs, this machine has {gpus}")
    if backend == "mpi" and not dist.is_mpi_available():
        raise InputError("this torch was built without the MPI backend; use --backend gloo or nccl "
                         "(mpirun can still start the ranks)")
    return backend


def _predicted(plan: Any, graph: Any, predict: Predict | None) -> Any:
    """The plan with its prediction replaced by ``predict``'s (this machine's profile), when there is one."""
    if predict is None:
        return plan
    from dataclasses import replace

    return replace(plan, predicted=predict(graph, plan))


def _mpi_size() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_size())


def _report(args: argparse.Namespace, document: dict[str, Any], report: Callable[[dict[str, Any]], None]) -> None:
    from cost_models.schema import check_document

    try:
        check_document(document, "parplan.measurement/1", "measurement-1", "the measurement", InputError)
    except InputError as err:  # our own output: a bug, not bad input
        raise RuntimeError(f"the measurement does not match its schema: {err}") from err
    from cost_models.jsonio import emit_document

    emit_document(document, args.out, args.json, report)
