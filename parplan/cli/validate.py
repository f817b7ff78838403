"""``parplan validate``: run the planner's top plans and the baselines, compare each with its prediction.

Order: the input shape, the profile and the model are checked (bad input
exits 2 before any rank starts); the candidates are chosen
(``planner.candidates``: top K distinct plans, then pure sample, pure spatial
and a pipeline; then the plan of each of ``--layouts``, as ``parplan run
--layout`` runs it), each checked against what the runtime executes (refused ones
are named and left out); one launch of ``--nproc`` ranks runs them all in
turn, in ``--rounds`` interleaved rounds (``runtime.launch.launch_many``:
``--warmup`` steps, then the round's share of ``--steps`` timed steps; in
the last round with ``--per-layer`` or ``--refine`` three profiled steps
more); the report compares predicted and measured medians
(``planner.validate``). Predictions are for this host: when the ranks want
more threads than it has cores, the iteration takes at least the compute of
all ranks over the cores (``cost_models.estimate``, ``shared_cores``). ``--refine P.json`` fits corrections to the runs
(``calibrate.refine``), writes the refined profile atomically and reports the
error before and after on runs left out of each fit.

The document (``--json``, ``--out``) is ``parplan.validation/1``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cost_models.errors import InputError

if TYPE_CHECKING:
    from torch import nn

    from calibrate.refine import Observation
    from cost_models.cluster import Cluster
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from cost_models.profile import Profile
    from parplan.cli.args import Commands, OneLineParser
    from parplan.cli.ranks import JobRanks
    from planner.candidates import Candidate, Refusal
    from runtime.options import RunOptions

__all__ = ["FORMAT", "add_validate"]

FORMAT = "parplan.validation/1"


def add_validate(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan validate`` on the subcommand parsers."""
    from parplan.cli.args import (
        add_loss_argument,
        add_model_arguments,
        add_search_arguments,
        add_timeout_argument,
        non_negative_int,
        positive_float,
        positive_int,
    )

    parser = commands.add_parser("validate", parents=[common], help="run the top plans and compare with predictions",
                                 description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    add_loss_argument(parser)
    parser.add_argument("--profile", required=True, metavar="PROFILE",
                        help="profile of this machine (parplan calibrate), whose predictions are validated")
    parser.add_argument("--nproc", type=positive_int, metavar="R",
                        help="ranks to run every plan on (under torchrun, srun or mpirun: theirs)")
    parser.add_argument("--plans", type=positive_int, default=6, metavar="K",
                        help="the planner's top K distinct plans (default 6); the baselines come on top")
    parser.add_argument("--steps", type=positive_int, default=10, help="timed steps per plan (default 10)")
    parser.add_argument("--warmup", type=non_negative_int, default=2,
                        help="untimed steps before each round of a plan (default 2)")
    parser.add_argument("--rounds", type=positive_int, default=2,
                        help="run the plans in this many interleaved rounds (the order reversed every other round), "
                             "the steps shared among them, so drift of the machine hits every plan alike "
                             "(default 2)")
    parser.add_argument("--layouts", default="", metavar="L,L,…",
                        help="also run the plan of each layout, as parplan run --layout L runs it (every layer its "
                             "first of L, n1 it can take), on --nproc ranks (L's ranks; default: none)")
    parser.add_argument("--min-gap", type=positive_float, default=0.03, metavar="X",
                        help="least relative difference of predicted times between top plans (default 0.03)")
    parser.add_argument("--per-layer", action="store_true",
                        help="also time every layer (profiler) and compare per layer kind and split")
    parser.add_argument("--refine", metavar="P.json",
                        help="fit corrections to the runs and write the refined profile here")
    parser.add_argument("--out", metavar="REPORT.json", help="write the report here (atomically)")
    parser.add_argument("--trace-dir", metavar="D", help="write each plan's predicted and measured timelines here "
                        "(Chrome traces NAME.predicted.json and NAME.measured.json; the folder must exist)")
    parser.add_argument("--threads", type=positive_int, metavar="T", help="CPU threads per rank (default: cores/ranks)")
    add_timeout_argument(parser)
    parser.add_argument("--backend", choices=("gloo", "nccl", "mpi"), help="default: nccl with GPUs, else gloo")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="weights and data seed (default 0)")
    add_search_arguments(parser)
    parser.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    from cost_models.formats.jsonio import check_writable
    from parplan.cli.args import compute_dtype, load_profile_argument, loss_target
    from parplan.cli.ranks import job_ranks
    from parplan.cli.report import print_validation
    from processes.cores import host_shared_cores

    check_writable(args.out, "--out")
    check_writable(args.refine, "--refine")
    if args.trace_dir and not os.path.isdir(args.trace_dir):
        raise InputError(f"--trace-dir {args.trace_dir} is not a folder; create it first")
    profile = load_profile_argument(args.profile, compute_dtype(args.amp, args.dtype))
    graph, model = _traced(args)
    args.target = loss_target(args.loss, graph, args.dtype)  # a --loss the model's output cannot take: exit 2
    args.ranks = job_ranks(args, None, missing="give --nproc R (the ranks to run every plan on)")
    args.nproc = args.ranks.total
    args.shared_cores = host_shared_cores(args.ranks.per_node, _threads(args.ranks, args.threads))
    candidates, left_out = _candidates(args, graph, model, profile)
    if not args.json:
        print(f"running {len(candidates)} plans on {args.nproc} ranks: {args.steps} timed steps each in "
              f"{min(args.rounds, args.steps)} interleaved round(s), {args.warmup} warm-up steps per round",
              file=sys.stderr, flush=True)
    if args.trace_dir:
        from parplan.cli.args import write_predicted_trace

        for candidate in candidates:
            write_predicted_trace(_trace_path(args.trace_dir, candidate, "predicted"), candidate.plan,
                                  candidate.estimate)
    documents = _measure(args, candidates, graph)
    if documents is None:  # an MPI rank other than 0
        return 0
    from cost_models.formats.jsonio import emit_document

    emit_document(_report(args, graph, profile, candidates, documents, left_out), args.out, args.json,
                  print_validation)
    return 0


def _trace_path(folder: str, candidate: Candidate, kind: str) -> str:
    """``D/NAME.KIND.json`` of ``--trace-dir D`` for a candidate (its name in letters, digits and dashes)."""
    import re

    return os.path.join(os.path.abspath(folder), f"{re.sub(r'[^A-Za-z0-9]+', '-', candidate.name).strip('-')}"
                                                 f".{kind}.json")


def _threads(ranks: JobRanks, threads: int | None) -> int:
    """CPU threads per rank: ``--threads``, else this host's cores over its ranks."""
    return ranks.threads(threads)


def _traced(args: argparse.Namespace) -> tuple[LayerGraph, nn.Module]:
    from cost_models.ir.graph import parse_input_shapes
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from parplan.cli.args import amp_argument

    shape = parse_input_shapes(args.input_shape)
    model = load_model(args.model)
    return trace(model, shape, args.dtype, leaf_modules=args.leaf_module, amp=amp_argument(args.amp, args.dtype)), model


def _candidates(args: argparse.Namespace, graph: LayerGraph, model: nn.Module,
                profile: Profile) -> tuple[list[Candidate], list[str]]:
    from parplan.cli.args import cluster_for, search_settings
    from planner.candidates import validation_candidates
    from runtime.pipeline.stage import check_pipeline
    from runtime.preflight import check_plan, check_runnable

    def refusal(plan: Plan) -> str | None:
        try:
            check_plan(plan, graph, args.nproc)
            check_runnable(model, plan, graph, args.leaf_module)
            if plan.pipeline.pipelined:
                check_pipeline(plan)
        except InputError as err:
            return str(err)
        return None

    cluster = cluster_for(args.profile, profile, args.nproc, args.ranks.per_node if args.ranks.spans_nodes else None)
    found, left_out = validation_candidates(graph, profile, cluster, args.plans, search_settings(args),
                                            model_spec=args.model, min_gap=args.min_gap, refusal=refusal,
                                            shared_cores=args.shared_cores)
    return found + _layout_candidates(args, graph, profile, cluster, refusal, left_out), left_out


def _layout_candidates(args: argparse.Namespace, graph: LayerGraph, profile: Profile, cluster: Cluster,
                       refusal: Refusal, left_out: list[str]) -> list[Candidate]:
    """The plans of ``--layouts`` (``parplan run --layout``'s), priced; a refused one is named in ``left_out``."""
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan
    from planner.candidates import Candidate
    from planner.search import priced

    found = []
    for text in (part.strip() for part in args.layouts.split(",") if part.strip()):
        layout = Layout.parse(text)
        if layout.ranks != args.nproc:
            raise InputError(f"--layouts {text} splits into {layout.ranks} parts, not the {args.nproc} ranks of "
                             f"--nproc; give layouts of {args.nproc} ranks")
        plan = uniform_plan(graph, cluster, [layout, Layout()], model_spec=args.model)
        reason = refusal(plan)
        if reason is not None:
            left_out.append(f"layout {layout}: {reason}")
            continue
        baseline = priced(f"layout {layout}", plan, profile, graph, args.optimizer, args.shared_cores)
        found.append(Candidate(baseline.name, "baseline", baseline.plan, baseline.estimate))
    return found


def _measure(args: argparse.Namespace, candidates: list[Candidate], graph: LayerGraph) -> list[dict[str, Any]] | None:
    """Each candidate's measurement, its rounds' steps merged (``--rounds``); ``None`` on MPI ranks but 0."""
    from parplan.cli.run import backend_for
    from runtime.launch import launch_many
    from runtime.options import RunOptions

    threads = _threads(args.ranks, args.threads)
    per_layer = bool(args.per_layer or args.refine)
    rounds = min(args.rounds, args.steps)
    order = [(r, i) for r in range(rounds)
             for i in (range(len(candidates)) if r % 2 == 0 else reversed(range(len(candidates))))]
    runs = [RunOptions(model=args.model, input_shape=tuple(graph.input_shape),
                       input_shapes=graph.input_shapes,
                       dtype=args.dtype, plan=candidates[i].plan.to_dict(), steps=_share(args.steps, rounds, r),
                       warmup=args.warmup, seed=args.seed, leaf_modules=tuple(args.leaf_module), threads=threads,
                       quiet=True, timeout_s=args.timeout_s, graph=graph, per_layer=per_layer and r == rounds - 1,
                       amp=args.amp or "", loss=args.loss, target=args.target,
                       trace=_trace_path(args.trace_dir, candidates[i], "measured")
                       if args.trace_dir and r == rounds - 1 else "")
            for r, i in order]
    backend = backend_for(args.backend, args.ranks)
    with _progress(runs, enabled=not args.json and args.ranks.launcher is None) as told:
        documents = launch_many([replace(run, progress_file=told) for run in runs], args.ranks.here, backend)
    if documents is None:
        return None
    return [_merged([d for (_, i), d in zip(order, documents) if i == index]) for index in range(len(candidates))]


@contextmanager
def _progress(runs: list[RunOptions], enabled: bool) -> Iterator[str]:
    """A progress bar over ``runs`` fed by the file rank 0 appends a line to after each (yields its path)."""
    import tempfile
    import threading

    from parplan.cli.report import progress_bar

    if not enabled:
        yield ""
        return
    with tempfile.TemporaryDirectory(prefix="parplan-validate-") as folder, \
            progress_bar("running plans", enabled=True) as bar:
        path, stop = os.path.join(folder, "done"), threading.Event()

        def watch() -> None:
            while not stop.wait(0.5):
                bar(_lines(path), len(runs))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield path
        finally:
            stop.set()
            watcher.join()


def _lines(path: str) -> int:
    try:
        with open(path) as told:
            return sum(1 for _ in told)
    except OSError:
        return 0


def _share(steps: int, rounds: int, index: int) -> int:
    """Round ``index``'s share of ``steps`` (the first rounds take the remainder)."""
    return steps // rounds + (1 if index < steps % rounds else 0)


def _merged(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement of a plan from its rounds: all timed steps, their median, the last round's extras."""
    import statistics

    merged = dict(documents[-1])
    merged["per_step_s"] = [s for d in documents for s in d["per_step_s"]]
    merged["loss"] = [v for d in documents for v in d["loss"]]
    merged["steps"] = len(merged["per_step_s"])
    merged["iteration_s"] = statistics.median(merged["per_step_s"])
    merged["memory_bytes_max"] = max(d["memory_bytes_max"] for d in documents)
    return merged


def _report(args: argparse.Namespace, graph: LayerGraph, profile: Profile, candidates: list[Candidate],
            documents: list[dict[str, Any]], left_out: list[str]) -> dict[str, object]:
    from calibrate.refine import observation
    from planner.validate import accuracy

    runs = [observation(c.name, c.plan, d, args.shared_cores) for c, d in zip(candidates, documents)]
    predicted = [c.estimate.iteration_s for c in candidates]
    measured = [run.measured_s for run in runs]
    report: dict[str, object] = {
        "format": FORMAT, "model": {"spec": args.model, "input_shape": list(graph.input_shape), "dtype": args.dtype,
                                     **({"amp": args.amp} if args.amp else {})},
        "profile": args.profile, "nproc": args.nproc, "steps": args.steps, "warmup": args.warmup,
        "rounds": min(args.rounds, args.steps), "shared_cores": args.shared_cores,
        "machine": documents[0]["machine"], "backend": documents[0]["backend"],
        "plans": [_plan_row(c, d) for c, d in zip(candidates, documents)],
        **accuracy(predicted, measured).to_dict(),
        "best_measured": candidates[min(range(len(runs)), key=lambda i: measured[i])].name,
        "left_out": left_out,
        **_held_out(profile, candidates, predicted, measured),
    }
    if args.per_layer or args.refine:
        report["per_layer"] = _per_key(graph, profile, runs, args.optimizer)
    if args.refine:
        report["refine"] = _refine(graph, profile, runs, predicted, args.optimizer, args.refine)
    return report


def _held_out(profile: Profile, candidates: list[Candidate], predicted: list[float],
              measured: list[float]) -> dict[str, object]:
    """Which plans ``parplan calibrate`` ran to fit the profile's corrections, and the accuracy on the others."""
    from planner.validate import unseen_accuracy

    corrections = profile.corrections
    if corrections is None or corrections.fitted_on.get("source") != "calibrate":
        return {}
    ran = set(corrections.fitted_on.get("runs", ()))
    seen = [c.plan.summary() in ran for c in candidates]
    figures: dict[str, object] = {"calibration_runs": [c.name for c, s in zip(candidates, seen) if s]}
    unseen = unseen_accuracy(seen, predicted, measured)
    return figures if unseen is None else {**figures, "unseen": unseen.to_dict()}


def _memory(candidate: Candidate, document: Mapping[str, Any]) -> dict[str, object]:
    """The measured peak of live tensors per rank (``runtime.memory_peak``) beside the plan's predicted peak."""
    measured = document.get("memory")
    if not measured:
        return {}
    predicted = candidate.estimate.memory_bytes_max
    return {"peak_bytes": measured["peak_bytes"], "predicted_memory_bytes": predicted,
            "memory_signed_err": (predicted - measured["peak_bytes"]) / measured["peak_bytes"]}


def _plan_row(candidate: Candidate, document: Mapping[str, Any]) -> dict[str, object]:
    predicted, measured = candidate.estimate.iteration_s, document["iteration_s"]
    steps = sorted(document["per_step_s"])
    return {"name": candidate.name, "role": candidate.role, "summary": candidate.plan.summary(),
            "predicted_s": predicted, "measured_s": measured, "rel_err": abs(predicted - measured) / measured,
            "signed_err": (predicted - measured) / measured,
            "measured_iqr_s": steps[(3 * len(steps)) // 4] - steps[len(steps) // 4],
            "memory_bytes_max": document["memory_bytes_max"], **_memory(candidate, document),
            "plan": candidate.plan.to_dict(),
            **({"layers": document["layers"]} if "layers" in document else {})}


def _per_key(graph: LayerGraph, profile: Profile, runs: list[Observation], optimizer: str) -> list[dict[str, object]]:
    """Per layer key (kind and split) over all runs: predicted and measured seconds per batch, their ratio."""
    from calibrate.refine import local_s
    from cost_models.corrections import layer_key

    sums: dict[str, list[float]] = {}
    for run in runs:
        if run.layers_s is None:
            continue
        predicted = run.estimate(graph, profile, optimizer)
        for layer in predicted.layers:
            if layer.name in run.layers_s:
                entry = sums.setdefault(layer_key(layer.kind, layer.layout), [0, 0.0, 0.0])
                entry[0] += 1
                entry[1] += predicted.contention * local_s(layer, run.plan, redistribution=True)
                entry[2] += run.layers_s[layer.name]
    return [{"key": key, "layers": int(n), "predicted_s": p, "measured_s": m, "ratio": m / p if p else None}
            for key, (n, p, m) in sorted(sums.items(), key=lambda item: -item[1][2])]


def _refine(graph: LayerGraph, profile: Profile, runs: list[Observation], predicted: list[float], optimizer: str,
            path: str) -> dict[str, object]:
    from calibrate.refine import fit_corrections, held_out_predictions
    from cost_models.profile import save_profile
    from planner.validate import accuracy

    measured = [run.measured_s for run in runs]
    corrections = fit_corrections(graph, profile, runs, optimizer)
    save_profile(replace(profile, corrections=corrections), path)
    after = held_out_predictions(graph, profile, runs, optimizer)
    first_after = min(range(len(after)), key=lambda i: after[i])  # the plan the refined model ranks first
    return {"profile": path, "corrections": corrections.to_dict(), "method": "leave-one-out",
            "before": accuracy(predicted, measured).to_dict(),
            "after": accuracy(after, measured, first_after).to_dict(),
            "held_out_predicted_s": after, "first_choice_after": runs[first_after].name}
