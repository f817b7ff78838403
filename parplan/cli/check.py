"""``parplan check``: what parplan can plan and run for a model — trace, plan, verify under the common layouts.

The checks, in order (docs/commands.md):

* ``trace`` — the model traced at the input shape (``cost_models.ir.tracing.trace``);
* ``plan D`` — for each device count of ``--devices`` (one node), the default
  search of ``parplan plan`` (pipelines on; ``parplan.api.plan`` with
  ``parplan plan``'s defaults);
* ``verify plan D`` — ``--verify`` of that plan on ``D`` ranks;
* ``verify L`` — for each layout of ``--layouts``, ``--verify`` of the plan
  ``parplan run --layout L`` runs (each layer its first of ``L, n1`` that it can
  take) on as many ranks as ``L`` has.

A verify check first runs the pre-flight of ``parplan run`` in this process
(``runtime.preflight.check_plan``, ``check_runnable``, ``runtime.pipeline.stage.check_pipeline``);
then one ``--verify`` run (``steps=0``, ``warmup=0``) on a persistent pool of
ranks (``runtime.rank_pool``: started once per rank count, afresh after a
failure), with the traced graph passed to the ranks. Each check ends as

* ``pass``;
* ``refused`` — refused before any rank started (a ``PlanError``/``InputError``
  of the pre-flight, or the planner's own ``InputError``): ``reason`` is its line;
* ``fail`` — a verify error above the tolerance, a rank's exception or death,
  a timeout (``--timeout-s`` per check: "timed out after T s"), or an
  internal error; ``reason`` says which, in one line. A float32 verify above
  its tolerance is run again in float64 (tolerance 1e-9): if that passes the
  split equals the unsplit model and float32 rounding was the gap, so the check
  passes, its reason saying so (``detail.float64``); if it fails too, the split
  differs and the check fails.

A layout check that passes also says how many layers took the layout, and why
the others kept a copy of their output (``cost_models.capability.predicate``'s reason):
``detail.whole[]``, each marked ``cannot_split`` when no split of that layer
exists at all (its output too small for the layout, no height and width, a
tile narrower than its window, softmax or concatenation along the split
dimension) rather than a split this runtime lacks.

:func:`check_model` is the one implementation; ``benchmarks/model_zoo.py`` (the
model-coverage suite) calls it too. Exit codes: 0 when no check failed, 1 when
one did, 2 for bad input (the model does not build, a malformed option).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from cost_models.errors import InputError, TraceError
from cost_models.layout import Layout
from parplan.cli.layouts import cannot_split, layout_plan, split_reason, split_summary

if TYPE_CHECKING:
    from types import FrameType

    from torch import nn

    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from parplan.cli.args import Commands, OneLineParser
    from runtime.options import RunOptions
    from runtime.rank_pool import RankPools

__all__ = ["DEFAULT_DEVICES", "DEFAULT_LAYOUTS", "Check", "CheckReport", "CheckRequest", "CheckTimeout",
           "add_check", "cannot_split", "check_command", "check_model", "layout_plan", "split_summary"]

FORMAT = "parplan.check/1"
DEFAULT_DEVICES = (2, 4)
DEFAULT_LAYOUTS = ("n2", "h2", "w2", "c2", "h2·w2")
RESULTS = ("pass", "refused", "fail")


class CheckTimeout(Exception):
    """A check ran past its ``--timeout-s`` in this process (tracing, planning or the pre-flight)."""


@dataclass(frozen=True)
class CheckRequest:
    """What to check: the model, its input, the device counts to plan for and the layouts to verify."""

    model: str
    input_shape: tuple[int, ...]
    dtype: str = "float32"
    devices: tuple[int, ...] = DEFAULT_DEVICES
    layouts: tuple[Layout, ...] = tuple(Layout.parse(text) for text in DEFAULT_LAYOUTS)
    profile: str = "v100"
    timeout_s: float = 300.0
    leaf_modules: tuple[str, ...] = ()
    tolerance: float | None = None  # default: parplan run's (1e-3; 1e-9 in float64)
    budget_s: float | None = None  # all checks of the model together (the suite's cap); None: no cap
    verify_dtype: str | None = None  # the verify runs' dtype (float64: exact); None: ``dtype``
    input_shapes: tuple[tuple[int, ...], ...] = ()  # every input's, for a model taking several; () = input_shape
    output: str | None = None  # the part of the model's output the loss is taken of (--output); None: every one
    loss: str = ""  # the loss verified with (--loss, runtime.losses); empty: cross-entropy

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Every model input's shape, in argument order."""
        return self.input_shapes or (tuple(self.input_shape),)

    @property
    def verify_tolerance(self) -> float:
        return self.tolerance or (1e-9 if self.verify_as == "float64" else 1e-3)

    @property
    def verify_as(self) -> str:
        """The dtype the verify runs compute in (the plans are made for ``dtype``)."""
        return self.verify_dtype or self.dtype


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``check`` is trace / plan / verify; ``layout`` the layout verified (``plan``: the
    planned one; ``None`` for trace and plan); ``devices`` the device or rank count."""

    name: str
    check: str
    layout: str | None
    devices: int | None
    result: str
    reason: str
    seconds: float
    detail: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "check": self.check, "layout": self.layout, "devices": self.devices,
                "result": self.result, "reason": self.reason, "seconds": round(self.seconds, 3),
                "detail": dict(self.detail)}


@dataclass(frozen=True)
class CheckReport:
    """Every check of one model."""

    model: str
    input_shape: tuple[int, ...]
    dtype: str
    checks: tuple[Check, ...]
    seconds: float

    @property
    def failed(self) -> bool:
        return any(check.result == "fail" for check in self.checks)

    @property
    def counts(self) -> dict[str, int]:
        """How many checks passed, were refused and failed (``RESULTS``' order)."""
        return {result: sum(c.result == result for c in self.checks) for result in RESULTS}

    def to_dict(self) -> dict[str, object]:
        return {"format": FORMAT, "model": self.model, "input_shape": list(self.input_shape), "dtype": self.dtype,
                "checks": [check.to_dict() for check in self.checks], "counts": self.counts,
                "seconds": round(self.seconds, 3)}


OnCheck = Callable[[Check], None]


def check_model(request: CheckRequest, pools: RankPools, on_check: OnCheck | None = None) -> CheckReport:
    """Trace, plan and verify ``request.model`` (see the module docstring); ``pools`` is a ``RankPools``.

    With ``request.budget_s`` every check's timeout is cut to what is left of it, and a check that would start
    with less than ``_LEAST_S`` left fails as timed out without running.

    Raises:
        InputError: The model does not build (its spec, its factory).
    """
    from cost_models.ir.model_spec import load_model
    from runtime.outputs import check_output_key

    started = time.perf_counter()
    ends = started + request.budget_s if request.budget_s else float("inf")
    checks: list[Check] = []

    def record(check: Check) -> Check:
        checks.append(check)
        if on_check is not None:
            on_check(check)
        return check

    model = load_model(request.model)
    check_output_key(model, request.output, request.leaf_modules, shapes=request.shapes)  # bad input: exit 2
    graph, traced = _trace_check(_within(request, ends), model)
    record(traced)
    if graph is not None:
        from parplan.cli.args import loss_target

        loss_target(request.loss, graph, request.verify_as, request.output)  # a loss its output cannot take: exit 2
        for devices in request.devices:
            name = f"plan {devices}"
            plan, planned = ((None, spent) if (spent := _spent(request, ends, name, "plan", None, devices))
                             else _plan_check(_within(request, ends), graph, devices))
            if record(planned).result == "pass":
                assert plan is not None, "a plan check that passed has its plan"
                name = f"verify plan {devices}"
                record(_spent(request, ends, name, "verify", "plan", devices) or _verify_check(
                    _within(request, ends), model, graph, plan, pools, name, "plan", planned.reason))
        for layout in request.layouts:
            name = f"verify {layout}"
            record(_spent(request, ends, name, "verify", str(layout), layout.ranks)
                   or _layout_check(_within(request, ends), model, graph, layout, pools))
    return CheckReport(request.model, request.input_shape, request.dtype, tuple(checks),
                       time.perf_counter() - started)


_LEAST_S = 5.0
"""A check with less than this left of the model's budget is not started (it fails as timed out)."""


def _within(request: CheckRequest, ends: float) -> CheckRequest:
    """``request`` with its per-check timeout cut to what is left of the model's budget (at least 1 s)."""
    left = ends - time.perf_counter()
    return request if left >= request.timeout_s else replace(request, timeout_s=max(1.0, left))


def _spent(request: CheckRequest, ends: float, name: str, kind: str, layout: str | None,
           devices: int) -> Check | None:
    """A failed check when the model's budget is (nearly) used up, else ``None``: the check runs."""
    if ends - time.perf_counter() >= _LEAST_S:
        return None
    return Check(name, kind, layout, devices, "fail",
                 f"timed out: the model's {request.budget_s:.0f} s were used up before this check", 0.0)


def _trace_check(request: CheckRequest, model: nn.Module) -> tuple[LayerGraph | None, Check]:
    from cost_models.ir.tracing import trace

    started = time.perf_counter()
    try:
        with deadline(request.timeout_s):
            graph = trace(model, request.shapes, request.dtype, request.leaf_modules)
    except Exception as err:
        return None, Check("trace", "trace", None, None, "fail", _failure_reason(err, request.timeout_s),
                           time.perf_counter() - started)
    layers, totals = graph.compute_layers(), graph.totals()
    dense = sum(float(graph.nodes[name].flops_fwd) for name in layers
                if graph.nodes[name].kind in ("conv", "conv_transpose"))
    return graph, Check("trace", "trace", None, None, "pass", f"{len(layers)} layers", time.perf_counter() - started,
                        {"layers": len(layers), "fingerprint": graph.fingerprint, "params": totals.get("params"),
                         "flops_fwd": totals.get("flops_fwd"),
                         "conv_flops_share": round(dense / totals["flops_fwd"], 4) if totals.get("flops_fwd") else 0.0})


def _plan_check(request: CheckRequest, graph: LayerGraph, devices: int) -> tuple[Plan | None, Check]:
    from parplan.api import plan
    from parplan.cli.report import progress_bar

    name, started = f"plan {devices}", time.perf_counter()
    try:
        with deadline(request.timeout_s):
            with progress_bar("stage search", enabled=True) as progress:  # parplan plan's defaults
                result = plan(graph, profile=request.profile, devices=devices, model_spec=request.model,
                              progress=progress)
    except InputError as err:
        return None, Check(name, "plan", None, devices, "refused", _first_line(err), time.perf_counter() - started)
    except Exception as err:
        return None, Check(name, "plan", None, devices, "fail", _failure_reason(err, request.timeout_s),
                           time.perf_counter() - started)
    summary = result.plan.summary()
    return result.plan, Check(name, "plan", None, devices, "pass", summary, time.perf_counter() - started,
                              {"plan": summary, "predicted_iteration_s": result.estimate.iteration_s,
                               "search_s": result.search_s, "stages": result.plan.pipeline.stages,
                               "schedule": result.plan.pipeline.schedule})


def _layout_check(request: CheckRequest, model: nn.Module, graph: LayerGraph, layout: Layout,
                  pools: RankPools) -> Check:
    from runtime.preflight import SHAPE_FALLBACK, shape_fallbacks

    name, started = f"verify {layout}", time.perf_counter()
    try:
        with deadline(request.timeout_s):
            plan, whole = shape_fallbacks(model, layout_plan(graph, layout, request.model), graph,
                                          request.leaf_modules)
            summary = split_summary(graph, plan, layout, {name: SHAPE_FALLBACK for name in whole})
    except InputError as err:
        return Check(name, "verify", str(layout), layout.ranks, "refused", _first_line(err),
                     time.perf_counter() - started)
    except Exception as err:
        return Check(name, "verify", str(layout), layout.ranks, "fail", _failure_reason(err, request.timeout_s),
                     time.perf_counter() - started)
    check = _verify_check(request, model, graph, plan, pools, name, str(layout), split_reason(summary, layout))
    return replace(check, detail={**check.detail, **summary})


def _verify_check(request: CheckRequest, model: nn.Module, graph: LayerGraph, plan: Plan, pools: RankPools,
                  name: str, layout: str, passed: str) -> Check:
    """The pre-flight of ``parplan run`` here, then one ``--verify`` run on the pool; ``passed`` is the pass reason."""
    ranks, started = plan.used_devices, time.perf_counter()

    def done(result: str, reason: str, detail: Mapping[str, object] | None = None) -> Check:
        return Check(name, "verify", layout, ranks, result, reason, time.perf_counter() - started, detail or {})

    try:
        with deadline(request.timeout_s):
            preflight(model, plan, graph, ranks, request.leaf_modules)
    except InputError as err:
        return done("refused", _first_line(err))
    except Exception as err:
        return done("fail", _failure_reason(err, request.timeout_s))
    left_s = max(1.0, request.timeout_s - (time.perf_counter() - started))
    outcome = pools.run(ranks, _run_options(request, plan, graph, ranks, left_s), timeout_s=left_s)
    if not outcome.ok:
        return done("fail", outcome.error, {"pool": outcome.status, "pool_start_s": round(outcome.start_s, 2)})
    assert outcome.document is not None, "an ok task carries rank 0's measurement"
    verified = outcome.document["verify"]
    errors = {key: value for key, value in verified.items()
              if key.endswith("_err") or key == "worst_parameter_on_rank0"}
    errors["pool_start_s"] = round(outcome.start_s, 2)
    from runtime.verify import float64_verdict

    wide = verified.get("float64")  # the run's own float64 recheck of a narrower verify that failed
    if wide is not None:
        errors["float64"] = wide
    if verified["passed"] and wide is None:
        return done("pass", passed, errors)
    if verified["passed"]:  # exact in float64: the float32 gap is rounding
        return done("pass", f"{passed}; float32 {verified['grad_max_rel_err']:.1e} above tolerance, "
                            f"{float64_verdict(wide)}", errors)
    reason = (f"verify error above tolerance {verified['tolerance']:g}: output {verified['output_max_rel_err']:.2e}, "
              f"gradient {verified['grad_max_rel_err']:.2e}, loss {verified.get('loss_rel_err', 0.0):.2e} "
              f"({verified.get('worst_parameter_on_rank0') or 'no parameter'})")
    return done("fail", reason + (f"; {float64_verdict(wide)}" if wide is not None else ""), errors)


def preflight(model: nn.Module, plan: Plan, graph: LayerGraph, ranks: int, leaf_modules: Sequence[str] = ()) -> None:
    """``parplan run --verify``'s checks of a plan before any rank starts (plan, layers, pipeline).

    Raises:
        PlanError: What ``parplan run`` would refuse, in its words.
    """
    from runtime.pipeline.stage import check_pipeline
    from runtime.preflight import check_plan, check_runnable

    check_plan(plan, graph, ranks, "the plan")
    check_runnable(model, plan, graph, leaf_modules, sync_batchnorm=False, verify=True)
    if plan.pipeline.pipelined:
        check_pipeline(plan)


def _run_options(request: CheckRequest, plan: Plan, graph: LayerGraph, ranks: int, timeout_s: float) -> RunOptions:
    from parplan.cli.args import loss_target
    from runtime.options import RunOptions

    target = loss_target(request.loss, graph, request.verify_as, request.output)
    return RunOptions(model=request.model, loss=request.loss, target=target, input_shape=tuple(request.input_shape),
                      input_shapes=request.shapes, dtype=request.verify_as,
                      plan=plan.to_dict(), steps=0, warmup=0, verify=True, tolerance=request.verify_tolerance,
                      leaf_modules=tuple(request.leaf_modules), threads=max(1, (os.cpu_count() or 1) // ranks),
                      quiet=True, timeout_s=timeout_s, graph=graph, output=request.output, reuse_reference=True)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`CheckTimeout` in this (main) thread after ``seconds``; elsewhere no limit (signals need it)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise CheckTimeout(f"timed out after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _failure_reason(err: BaseException, timeout_s: float) -> str:
    if isinstance(err, CheckTimeout):
        return f"timed out after {timeout_s:.0f} s"
    if isinstance(err, TraceError):
        return _first_line(err)
    from runtime.rank_pool import one_line

    return f"internal error: {one_line(err)}"


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def add_check(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan check``."""
    from parplan.cli.args import add_loss_argument, add_model_arguments, positive_float

    parser = commands.add_parser(
        "check", parents=[common], help="what parplan can plan and run for a model",
        description="Trace MODEL, plan it on each device count and verify each plan and each layout against the "
                    "unsplit model; each check passes, is refused before any rank starts, or fails.")
    add_model_arguments(parser, amp=False)
    parser.add_argument("--devices", default=",".join(map(str, DEFAULT_DEVICES)), metavar="D,D,…",
                        help="device counts to plan for, one node (default 2,4)")
    parser.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS), metavar="L,L,…",
                        help="layouts to verify, each on as many ranks as it has (default n2,h2,w2,c2,h2·w2; "
                             "'' for none)")
    parser.add_argument("--profile", default="v100", metavar="PROFILE",
                        help="profile or preset the plans are made for (default v100)")
    parser.add_argument("--verify-dtype", choices=("float32", "float16", "bfloat16", "float64"),
                        help="dtype the verify runs compute in (default --dtype); float64 checks the plans made for "
                             "--dtype exactly")
    parser.add_argument("--tolerance", type=positive_float, metavar="X",
                        help="largest relative error a verify accepts (default 1e-3; 1e-9 when verifying in "
                             "float64)")
    parser.add_argument("--timeout-s", type=positive_float, default=300.0, metavar="T",
                        help="seconds per check (tracing, planning, a verify run); a check that runs longer fails "
                             "as timed out (default 300)")
    parser.add_argument("--output", metavar="KEY",
                        help="a model returning a dict, tuple or named tuple: verify the loss of this part only (a "
                             "key, field or index); default: the sum over every floating output")
    add_loss_argument(parser)
    parser.set_defaults(handler=check_command)


def check_command(args: argparse.Namespace) -> int:
    """The handler: read the options (bad input exits 2), run every check, report; 1 when one failed."""
    request = _request(args)
    from runtime.rank_pool import RankPools

    printer = None if args.json else _print_check
    with RankPools(group_timeout_s=request.timeout_s) as pools:
        report = check_model(request, pools, printer)
    if args.json:
        from parplan.cli.args import print_json

        print_json(report.to_dict())
    else:
        counts = report.counts
        print(f"{request.model} at {','.join(map(str, request.input_shape))}: {counts['pass']} passed, "
              f"{counts['refused']} refused, {counts['fail']} failed in {report.seconds:.1f} s")
    return 1 if report.failed else 0


def _request(args: argparse.Namespace) -> CheckRequest:
    from cost_models.ir.graph import parse_input_shapes
    from parplan.cli.args import load_profile_argument
    from parplan.cli.whatif import parse_devices
    from runtime.losses import resolve_loss

    shapes = parse_input_shapes(args.input_shape)
    devices = tuple(parse_devices(args.devices)) if args.devices.strip() else ()
    layouts = tuple(Layout.parse(text) for text in args.layouts.split(",") if text.strip())
    load_profile_argument(args.profile, args.dtype)  # an unknown profile is bad input, before any work
    resolve_loss(args.loss)  # so is a --loss naming nothing
    return CheckRequest(args.model, shapes[0], args.dtype, devices, layouts, args.profile,
                        args.timeout_s, tuple(args.leaf_module), args.tolerance, verify_dtype=args.verify_dtype,
                        input_shapes=shapes, output=args.output, loss=args.loss)


def _print_check(check: Check) -> None:
    print(f"{check.name:<18} {check.result:<8} {check.seconds:6.1f} s  {check.reason}", flush=True)
    sys.stdout.flush()
