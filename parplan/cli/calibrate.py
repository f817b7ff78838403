"""``parplan calibrate`` (time this machine into a profile) and ``parplan profile show``.

``--timeout-s`` is ``parplan run``'s: every group of the ranks that time
collectives (and of the split forms' runs) waits at most that long for a
peer, and a rank that fails is reported in one line (exit 1). For tests,
``PARPLAN_FAULT=KIND:RANK:STEP`` (``runtime.fault_injection``) strikes rank ``RANK`` at
the start of collective measurement ``STEP`` (1-based); the split forms,
being ``parplan run``'s training, count their steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from cost_models.errors import InputError
from parplan.cli.args import (
    OneLineParser,
    add_loss_argument,
    add_model_arguments,
    add_timeout_argument,
    check_out_dir,
    load_profile_argument,
    loss_target,
    positive_float,
    positive_int,
    print_json,
    trace_model,
)

if TYPE_CHECKING:
    from calibrate.session import CalibrationResult
    from cost_models.ir.graph import LayerGraph
    from parplan.cli.args import Commands
    from parplan.cli.report import CalibrationSummary

__all__ = ["add_calibrate", "add_profile"]


def add_calibrate(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan calibrate``."""
    parser = commands.add_parser("calibrate", parents=[common], help="measure this machine into a profile",
                                 description="Time MODEL's local problems and the collectives, fit them, write a "
                                             "profile.")
    add_model_arguments(parser)
    parser.add_argument("--ranks", type=positive_int, default=1, help="ranks for timing collectives (default 1: none)")
    parser.add_argument("--devices", default=None, metavar="D1,D2,...",
                        help="device counts the planner may use (default: powers of two up to --ranks)")
    parser.add_argument("--budget-s", type=positive_float, default=120.0,
                        help="wall-time bound in seconds (default 120)")
    parser.add_argument("--threads", type=positive_int, default=1, help="threads per rank while timing (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i] for the compute kernels (default cpu)")
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl", "mpi"),
                        help="collectives backend (default gloo on cpu, nccl on cuda)")
    parser.add_argument("--no-forms", action="store_true",
                        help="with --ranks > 1, do not end by training the model under its single-split plans "
                             "(nR, cR, hR, wR) to fit what the runtime adds to the kernels")
    add_timeout_argument(parser)
    add_loss_argument(parser)
    parser.add_argument("--out", required=True, metavar="P.json", help="where to write the profile")
    parser.set_defaults(handler=_calibrate)


def add_profile(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan profile show``."""
    parser = commands.add_parser("profile", help="inspect profiles")
    actions = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser, metavar="ACTION")
    show = actions.add_parser("show", parents=[common], help="device, fitted parameters and fit errors of a profile")
    show.add_argument("profile", metavar="PROFILE", help="a profile JSON path or a preset name (v100, a100, h100)")
    show.add_argument("--dtype", default="float32", help="dtype of a preset (default float32)")
    show.set_defaults(handler=_profile_show)


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


def _strike_fault(rank: int, measurement: int) -> None:
    """``PARPLAN_FAULT`` at the start of measurement ``measurement`` (in the ranks: module-level, pickled)."""
    from runtime.fault_injection import planned, strike

    strike(planned(), rank, measurement)


def _calibrate(args: argparse.Namespace) -> int:
    from runtime.fault_injection import planned

    counts = _device_counts(args.devices, args.ranks)
    check_out_dir(args.out)
    planned()  # a malformed PARPLAN_FAULT is bad input, refused here rather than in every rank
    graph, _ = trace_model(args)
    loss_target(args.loss, graph, args.dtype)  # a --loss the model's output cannot take: exit 2, before any rank
    from calibrate.comm_ranks import in_existing_group
    from calibrate.session import CalibrationRequest, run_calibration
    from calibrate.split_forms import FORMS_SHARE
    from cost_models.profile import save_profile
    from parplan.cli.report import calibration_progress

    started = time.monotonic()
    forms = args.ranks > 1 and not args.no_forms and not in_existing_group()
    backend = args.backend or ("nccl" if args.device.startswith("cuda") else "gloo")
    request = CalibrationRequest(graph, counts, args.ranks, args.budget_s * (1 - FORMS_SHARE if forms else 1),
                                 args.threads, args.device, backend, args.model, timeout_s=args.timeout_s,
                                 before_measurement=_strike_fault)
    with calibration_progress(enabled=not args.json) as progress:
        result = run_calibration(request, progress)
    if result is None:  # a rank other than 0 under torchrun/mpirun: rank 0 writes and reports
        return 0
    if forms and not result.interrupted:
        result = _with_forms(args, graph, backend, result, started)
    save_profile(result.profile, args.out)
    summary: CalibrationSummary = {
        "profile": args.out, "fit": result.profile.to_dict()["fit"], "measured": result.measured,
        "left_to_fit": result.left_to_fit, "interrupted": result.interrupted, "notes": result.notes,
        "seconds": result.profile.meta["calibration_s"]}
    if args.json:
        print_json(summary)
    else:
        from parplan.cli.report import print_calibration_summary

        print_calibration_summary(summary)
    return 130 if result.interrupted else 0


def _with_forms(args: argparse.Namespace, graph: LayerGraph, backend: str, result: CalibrationResult,
                started: float) -> CalibrationResult:
    """The calibration result with the forms' corrections (``calibrate.split_forms``)."""
    from dataclasses import replace

    from calibrate.split_forms import FormsRequest, run_forms
    from cost_models.ir.model_spec import load_model

    if not args.json:
        print("running the split forms (nR, cR, hR, wR) on the ranks", file=sys.stderr, flush=True)
    request = FormsRequest(args.model, load_model(args.model), graph, args.ranks, args.threads, backend,
                           tuple(args.leaf_module), started + args.budget_s - 1.0, args.timeout_s, args.loss,
                           loss_target(args.loss, graph, args.dtype))
    profile, notes = run_forms(request, result.profile)
    meta = {**profile.meta, "calibration_s": round(time.monotonic() - started, 3),
            "notes": [*profile.meta.get("notes", []), *notes]}
    return replace(result, profile=replace(profile, meta=meta), notes=[*result.notes, *notes])


def _profile_show(args: argparse.Namespace) -> int:
    import torch

    profile = load_profile_argument(args.profile, args.dtype)
    document = profile.to_dict()
    shown = {"device": document["device"], "meta": document["meta"], "fit": document["fit"],
             "compute_fits": document["compute"]["fits"], "comm_fits": document["comm"]["fits"],
             "samples": {"compute": len(profile.compute_samples), "comm": len(profile.comm_samples)},
             "warnings": profile.compatibility_warnings(torch.__version__)}
    if args.json:
        print_json(shown)
    else:
        from parplan.cli.report import print_profile

        print_profile(shown)
    return 0
