"""What every ``parplan`` command's front end shares: the parser, argument types, the model options, JSON out.

Each module of ``parplan.cli`` builds its command from these, so that a usage
error reads the same in every command (one line, exit 2) and ``--model``,
``--input-shape`` and PROFILE mean the same everywhere. Torch is imported
only inside :func:`trace_model`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from cost_models.errors import InputError

if TYPE_CHECKING:
    from typing import TypeAlias

    from cost_models.cluster import Cluster
    from cost_models.estimate import Estimate
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from cost_models.profile import Profile
    from planner.settings import SearchSettings
    from runtime.losses import TargetKind

__all__ = ["OneLineParser", "add_loss_argument", "add_model_arguments", "add_search_arguments",
           "add_timeout_argument", "add_trace_argument", "amp_argument", "check_out_dir", "check_plot_path",
           "cluster_for", "compute_dtype", "int_at_least", "load_profile_argument", "loss_target", "non_negative_int",
           "positive_float", "positive_int", "print_json", "search_settings", "slowdowns", "trace_model",
           "write_predicted_trace"]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[OneLineParser]
    """The ``parplan`` subcommands each module's ``add_…`` registers its command on."""


def add_model_arguments(parser: argparse.ArgumentParser, *, amp: bool = True) -> None:
    """``--model``, ``--input-shape``, ``--dtype``, ``--leaf-module`` and (with ``amp``) ``--amp``."""
    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="torchvision:NAME, package.module:factory or path/to/file.py:factory")
    parser.add_argument("--input-shape", required=True, action="append", metavar="N,C,H,W",
                        help="global input shape: N,C,H,W images (e.g. 64,3,224,224), N,C,D,H,W volumes (e.g. "
                             "4,4,128,128,128; split by depth too) or N,C,L sequences (their length split as w); "
                             "repeatable: a model whose forward takes several "
                             "tensors gets one per positional argument, in order, each batch first (e.g. "
                             "--input-shape 64,3,224,224 --input-shape 64,16)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "float64"),
                        help="element type of inputs and activations (default float32)")
    parser.add_argument("--leaf-module", action="append", default=[], metavar="NAME",
                        help="keep this module (qualified or class name) opaque to torch.fx; repeatable")
    if amp:
        parser.add_argument("--amp", choices=("bf16", "fp16"),
                            help="mixed precision: the forward under torch.autocast in bfloat16 or float16 (fp16 with "
                                 "a loss scaler), float32 weights; priced with each layer's autocast dtype (calibrate "
                                 "with the same --amp); plans are single-stage (pipelines do not run under autocast)")


def add_loss_argument(parser: argparse._ActionsContainer) -> None:
    """``--loss``: the loss a run trains and verifies with (``runtime.losses``)."""
    parser.add_argument("--loss", metavar="LOSS", default="",
                        help="the loss to train with: ce (cross-entropy, the default), mse, l1, dice, or "
                             "module:name / path/to/file.py:name of a function (output, target) -> scalar "
                             "(a class: built with no arguments)")


def loss_target(spec: str, graph: LayerGraph, dtype: str, output: str | None = None) -> TargetKind:
    """Which target ``--loss`` takes of the model's (first) output (``runtime.losses.target_kind``), its cost
    recorded on ``graph`` for the estimate (``graph.graph["loss"]``, ``cost_models.loss_cost``; none for the
    default cross-entropy); a loss that cannot be resolved or takes none is bad input (``InputError``), and so is
    a scalar the model returns besides its output when ``output`` (``--output``) does not pick a part."""
    import torch

    from runtime.losses import loss_cost, target_kind

    shape = graph.nodes[graph.graph["outputs"][0]].output_shape or []
    scalars = [name for name in graph.graph["outputs"][1:] if graph.nodes[name].output_shape == []]
    if scalars and not output and len(shape) >= 1:
        first = graph.graph["outputs"][0]
        raise InputError(f"the model returns the scalar {scalars[0]!r} besides its output {first!r} {tuple(shape)} "
                         f"(a loss term it computes itself?): every floating output enters the loss against one "
                         f"target; give --output KEY, the part of its output to train on")
    if len(shape) < 2 or isinstance(shape[0], list):
        if spec:
            raise InputError(f"--loss {spec!r}: the model's output {shape} is not (N, C, …); only the default "
                             f"cross-entropy takes it")
        return "classes"
    kind = target_kind(spec, tuple(shape), getattr(torch, dtype))
    if spec:
        graph.graph["loss"] = loss_cost(spec, tuple(shape), getattr(torch, dtype), kind).to_dict()
    return kind


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's options (``planner.settings.SearchSettings``), the same in plan, what-if and validate."""
    group = parser.add_argument_group("search")
    group.add_argument("--max-stages", type=positive_int, default=16,
                       help="most pipeline stages to try (default 16; each stage whole nodes or a part of one)")
    group.add_argument("--schedule", default="auto", choices=("sync", "stale", "auto"),
                       help="pipeline schedule: sync (GPipe), stale (DSP) or the faster (default auto)")
    group.add_argument("--max-staleness", type=non_negative_int, default=None,
                       help="cap on a stage's staleness (0 = synchronous only; default: DSP's 2(K-1-k))")
    group.add_argument("--solver", default="cbc", choices=("cbc", "highs"), help="ILP solver (default cbc)")
    group.add_argument("--time-limit-s", type=positive_float, default=None, help="ILP time limit in seconds")
    group.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"),
                       help="optimizer whose state the memory model counts (default sgd)")


def search_settings(args: argparse.Namespace) -> SearchSettings:
    """The ``SearchSettings`` of :func:`add_search_arguments`' options."""
    from planner.settings import SearchSettings

    stages = 1 if getattr(args, "amp", None) else args.max_stages  # pipelines do not run under autocast
    return SearchSettings(max_stages=stages, schedule=args.schedule, max_staleness=args.max_staleness,
                          solver=args.solver, time_limit_s=args.time_limit_s, optimizer=args.optimizer)


def positive_int(text: str) -> int:
    return int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return int_at_least(text, 0)


def int_at_least(text: str, minimum: int) -> int:
    """``text`` as an integer of at least ``minimum``; else argparse's one-line type error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def cluster_for(text: str, profile: Profile, devices: int, per_node: int | None) -> Cluster:
    """The cluster a plan is made for: PROFILE ``text``'s (a preset's nodes and links, or a measured profile's)."""
    from parplan.api import cluster

    return cluster(text if not os.path.exists(text) else profile, devices, devices_per_node=per_node)


def print_json(document: object) -> None:
    """``document`` on stdout, indented, UTF-8 kept."""
    json.dump(document, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


def add_timeout_argument(parser: argparse._ActionsContainer) -> None:
    """``--timeout-s``: how long any collective or point-to-point exchange of the ranks waits for a peer."""
    parser.add_argument("--timeout-s", type=positive_float, default=300.0, metavar="T",
                        help="a rank that waits T seconds for a peer (dead or hung) fails, naming where it waited, "
                             "and the others are stopped (default 300)")


def load_profile_argument(text: str, dtype: str = "float32") -> Profile:
    """A PROFILE argument: a preset name or a profile file (``parplan.load_profile``)."""
    from parplan.api import load_profile

    return load_profile(text, dtype=dtype)


def check_out_dir(path: str, flag: str = "--out") -> None:
    """Refuse an output path whose folder does not exist, before any work."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"{flag} {path}: directory {folder} does not exist; create it first")


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str, flag: str = "--plot") -> None:
    """Refuse a figure path in a missing folder, or with a suffix matplotlib is not asked to write."""
    check_out_dir(path, flag)
    if not path.lower().endswith(PLOT_SUFFIXES):
        raise InputError(f"{flag} {path}: the figure is written as {', '.join(PLOT_SUFFIXES)} by suffix; "
                         f"name the file e.g. figure.png")


def add_trace_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--trace F.json``: where to write a Chrome trace (Perfetto, chrome://tracing) of ``what``."""
    parser.add_argument("--trace", metavar="F.json",
                        help=f"write {what} as a Chrome trace (open in Perfetto or chrome://tracing)")


def write_predicted_trace(path: str, plan: Plan, result: Estimate) -> None:
    """The predicted timeline of ``plan`` (``result``: its Estimate) at ``path``, atomically."""
    from cost_models.formats.jsonio import write_json_atomic
    from cost_models.formats.timeline import predicted_trace

    write_json_atomic(path, predicted_trace(plan, result))


def trace_model(args: argparse.Namespace) -> tuple[LayerGraph, dict[str, float]]:
    """Parse the shapes first (cheap), then load and trace the model; also returns the seconds each took."""
    from cost_models.ir.graph import parse_input_shapes

    shape = parse_input_shapes(args.input_shape)
    started = time.perf_counter()
    import torch

    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace

    model = load_model(args.model)
    loaded = time.perf_counter()
    graph = trace(model, shape, getattr(torch, args.dtype), leaf_modules=args.leaf_module,
                  amp=amp_argument(getattr(args, "amp", None), args.dtype))
    timing = {"load": round(loaded - started, 3), "trace": round(time.perf_counter() - loaded, 3)}
    if graph.graph.get("recomputed"):
        print(f"parplan: warning: {recomputation_warning(graph.graph['recomputed'])}", file=sys.stderr)
    return graph, timing


def recomputation_warning(regions: Sequence[str]) -> str:
    """One line on the ``torch.utils.checkpoint`` regions tracing went through (``graph.graph["recomputed"]``)."""
    return (f"torch.utils.checkpoint in {', '.join(regions)} is traced through: parplan runs and prices those "
            f"layers without recomputation, every activation kept (memory as without checkpointing)")


def amp_argument(amp: str | None, dtype: str) -> str:
    """``--amp`` (``""`` without it), refused in one line with a ``--dtype`` other than float32."""
    from runtime.precision import check_amp

    amp = amp or ""
    why = check_amp(amp, dtype)
    if why:
        raise InputError(why)
    return amp


def compute_dtype(amp: str | None, dtype: str) -> str:
    """The dtype the model's kernels compute in: ``--amp``'s, else ``--dtype`` (a preset's rates follow it)."""
    from cost_models.ir.graph import AMP_DTYPES

    return AMP_DTYPES[amp] if amp else dtype


def slowdowns(items: list[str]) -> dict[int, float]:
    """``--slow-stage K:FACTOR`` values as ``{stage: factor}``."""
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
