"""What ``parplan run`` refuses before any rank starts: the plan against the model, pipeline and recovery flags.

Each check is one line and exit code 2 (``InputError``); ``layout_plan`` makes the plan of ``--layout``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cost_models.errors import InputError

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph

__all__ = ["check_pipeline_flags", "check_plan_fits", "check_precision", "check_recovery", "layout_plan"]


def layout_plan(graph: LayerGraph, args: argparse.Namespace, ranks: int) -> Plan:
    """The plan of ``--layout`` (cut into ``--stages`` of equal compute when more than one)."""
    from cost_models.uniform import balanced_starts, default_micro_batches, staged

    stages = args.stages
    if ranks % stages:
        raise InputError(f"--stages {stages} does not divide {ranks} ranks; give every stage the same number of ranks")
    plan = _uniform(graph, args.layout, ranks // stages)
    if stages == 1:
        return plan
    micro = args.micro_batches or default_micro_batches(plan, graph, stages)
    return staged(plan, graph, balanced_starts(graph, stages), args.schedule, micro)


def _uniform(graph: LayerGraph, text: str, devices: int) -> Plan:
    from cost_models.layout import Layout
    from parplan.cli.layouts import uniform_layout_plan

    layouts = [Layout.parse(part.strip()) for part in text.split(",") if part.strip()]
    wrong = [str(layout) for layout in layouts if devices % layout.ranks]
    if wrong:
        raise InputError(f"--layout {', '.join(wrong)} does not divide {devices} ranks; use layouts of n·c·h·w "
                         f"dividing {devices}")
    return uniform_layout_plan(graph, layouts, devices)


def check_plan_fits(args: argparse.Namespace, plan: Plan, graph: LayerGraph, ranks: int) -> None:
    from cost_models.ir.model_spec import load_model
    from runtime.preflight import check_plan, check_runnable

    check_plan(plan, graph, ranks, f"plan {args.plan}" if args.plan else "the --layout plan")
    check_runnable(load_model(args.model), plan, graph, args.leaf_module, sync_batchnorm=args.sync_batchnorm,
                   verify=args.verify)


def check_precision(amp: str | None, dtype: str, plan: Plan) -> None:
    """Refuse ``--amp`` with another dtype than float32, and on pipelines (not run under autocast yet)."""
    from runtime.precision import check_amp

    why = check_amp(amp or "", dtype)
    if why:
        raise InputError(why)
    if amp and plan.pipeline.pipelined:
        raise InputError(f"--amp runs single-stage plans only; this plan has {plan.pipeline} "
                         f"(make one with --max-stages 1, or drop --amp)")


def check_pipeline_flags(args: argparse.Namespace, plan: Plan) -> None:
    """Refuse pipeline flags the plan cannot take, and pipelines the runtime cannot run (``check_pipeline``)."""
    from runtime.pipeline.stage import check_pipeline

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
    if plan.pipeline.pipelined:
        check_pipeline(plan)


def check_recovery(args: argparse.Namespace, plan: Plan, launcher: str | None) -> None:
    """Refuse checkpoint and restart flags that cannot work together, and a --resume with nothing to resume."""
    directory = args.checkpoint_dir
    if (args.checkpoint_every or args.resume) and not directory:
        raise InputError("--checkpoint-every and --resume need --checkpoint-dir D (the folder of the checkpoints)")
    if directory and not (args.checkpoint_every or args.resume or args.max_restarts):
        raise InputError(f"--checkpoint-dir {directory} without --checkpoint-every N writes nothing; add it "
                         "(or --resume to continue from it)")
    if args.max_restarts and launcher == "torchrun":
        raise InputError("--max-restarts is torchrun's here: give torchrun --max-restarts R (each restart resumes "
                         "from --checkpoint-dir); drop it from parplan run")
    if args.max_restarts and launcher is not None:
        launched = "mpirun" if launcher == "mpi" else "srun"
        raise InputError(f"--max-restarts needs torchrun's agent (parplan run --nproc R); {launched} does not "
                         f"restart ranks — drop --max-restarts and rerun {launched} with --resume")
    if directory:
        _check_folder(directory, args.resume)
    if args.resume:
        _check_resumable(directory, plan, args.seed, args.warmup, args.steps)


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


def _check_resumable(directory: str, plan: Plan, seed: int, warmup: int, steps: int) -> None:
    """A complete, intact checkpoint of this model, input, dtype, seed and warm-up must be in ``directory``."""
    from parplan.cli.resume import newest_whole
    from runtime.checkpoint import check_compatible

    manifest = newest_whole(directory)
    if manifest is None:
        raise InputError(f"--resume: {directory} holds no complete checkpoint (no step-*/manifest.json); "
                         "run without --resume")
    check_compatible(manifest, {"plan": plan.to_dict(), "seed": seed, "warmup": warmup, "steps": steps})

