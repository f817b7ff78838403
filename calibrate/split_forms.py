"""The last phase of ``parplan calibrate --ranks R``: run the runtime's own split forms and fit what kernels miss.

Kernel and collective timings do not see what the runtime adds around them
when it splits a layer: batch-norm statistics summed over tiles, the
convolution as interior and border bands, halo copies, the gathering of a
channel split's input, the dispatch of each layer, ranks waiting for each
other. So calibration ends by training the model for a few steps under each
single-split plan on the R ranks — every layer split by samples (``nR``), by
channels (``cR``), by height (``hR``) and by width (``wR``), a layer that
cannot take the split taking ``nR`` or staying whole (``n1``) — timing every
layer (``--per-layer``), and fits the profile's corrections to those runs
(:func:`calibrate.refine.fit_corrections` with ``split_layers_only``): the
factors of split layers (keys ``kind·channel``, ``kind·spatial`` and their
pooled ``*·…``) in the proportions the per-layer times give, each class's
scaled so that the runs' whole steps are met, and the share of the allreduce
that does not hide. Factors of whole layers and seconds per step are not kept: timed per
layer under the profiler, a whole layer's time carries the profiler's cost
and the other rank's waits, and applied to pipeline stages they
overpredicted them by 44–54 % (resnet18 8×3×64×64, 2 ranks, 2026-12-03),
where without them the stages were within 6 %. A two-stage ``sync`` pipeline
among the forms, to fit seconds per pipeline event, was tried and left out:
fitted on 4 steps it swung from 2.0 to 6.8 ms per event between models and
put resnet18's pipelines 29–87 % over their measured time. The corrections
record the runs by plan summary (``fitted_on.runs``), so that
``parplan validate`` can tell the plans calibration ran from those it did not.

Assumptions: the forms run with calibration's threads per rank on this host
(a launcher's job does not run them); a form is run only when its predicted
time, twice over, fits in what is left of the budget; the runtime refuses a
form it cannot run (it is left out, and the notes say why).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cost_models.errors import InputError
from cost_models.layout import Layout

if TYPE_CHECKING:
    from torch import nn

    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from cost_models.profile import Profile
    from runtime.losses import TargetKind

__all__ = ["FORMS_SHARE", "FormsRequest", "run_forms"]

FORMS_SHARE = 0.35
"""Share of ``--budget-s`` kept for the forms when ``--ranks`` > 1."""
STEPS = 4
WARMUP = 2
START_S = 12.0  # starting the ranks: torch imported on each


@dataclass(frozen=True)
class FormsRequest:
    """What to run: the model (spec and loaded), its graph, the ranks and threads, the profile so far."""

    model_spec: str
    model: nn.Module
    graph: LayerGraph
    ranks: int
    threads: int
    backend: str
    leaf_modules: tuple[str, ...]
    deadline: float
    """``time.monotonic()`` by which the forms must be done."""
    timeout_s: float = 300.0
    """How long a rank of the forms' runs waits for a peer (``--timeout-s``)."""
    loss: str = ""
    """The loss the forms' runs train with (``--loss``, ``runtime.losses``); empty: cross-entropy."""
    target: TargetKind = "classes"
    """Which target it takes (``runtime.losses.target_kind``)."""


def run_forms(request: FormsRequest, profile: Profile) -> tuple[Profile, list[str]]:
    """``profile`` with corrections fitted to the forms' runs, and notes on what was left out."""
    from calibrate.refine import fit_corrections, observation

    plans, notes = _forms(request, profile)
    if not plans:
        return profile, notes + ["no split form ran: the profile has no corrections"]
    documents = _launch(request, plans)
    shared = _shared_cores(request)
    runs = [observation(plan.summary(), plan, document, shared) for plan, document in zip(plans, documents)]
    fitted = fit_corrections(request.graph, profile, runs, split_layers_only=True)
    corrections = replace(fitted, fitted_on={**fitted.fitted_on, "source": "calibrate", "steps": STEPS})
    return replace(profile, corrections=corrections), notes


def _forms(request: FormsRequest, profile: Profile) -> tuple[list[Plan], list[str]]:
    from cost_models.estimate import estimate
    from runtime.options import PER_LAYER_STEPS

    ranks = request.ranks
    notes: list[str] = []
    plans: list[Plan] = []
    seen: set[str] = set()
    left_s = request.deadline - time.monotonic() - START_S
    for form in (Layout(n=ranks), Layout(c=ranks), Layout(h=ranks), Layout(w=ranks)):
        try:
            plan = _form_plan(request, profile, form)
        except InputError as err:
            notes.append(f"form {form} not run: {err}")
            continue
        refused = _refusal(request, plan)
        cost_s = 2 * (WARMUP + STEPS + PER_LAYER_STEPS + 1) * estimate(request.graph, plan, profile).iteration_s
        if plan.summary() in seen:
            continue
        if refused or cost_s > left_s:
            notes.append(f"form {form} not run: {refused or 'out of budget'}")
            continue
        seen.add(plan.summary())
        plans.append(plan)
        left_s -= cost_s
    return plans, notes


def _form_plan(request: FormsRequest, profile: Profile, form: Layout) -> Plan:
    """Every layer under ``form``, else split by samples, else whole."""
    from cost_models.uniform import uniform_plan

    ranks = request.ranks
    return uniform_plan(request.graph, profile.cluster(ranks), [form, Layout(n=ranks), Layout()], request.model_spec)


def _refusal(request: FormsRequest, plan: Plan) -> str | None:
    from runtime.preflight import check_plan, check_runnable

    try:
        check_plan(plan, request.graph, request.ranks)
        check_runnable(request.model, plan, request.graph, list(request.leaf_modules))
    except InputError as err:
        return str(err)
    return None


def _launch(request: FormsRequest, plans: list[Plan]) -> list[dict[str, object]]:
    from cost_models.ir.graph import amp_of
    from runtime.launch import launch_many
    from runtime.options import RunOptions

    runs = [RunOptions(model=request.model_spec, input_shape=tuple(request.graph.input_shape),
                       input_shapes=request.graph.input_shapes, dtype=request.graph.graph["dtype"],
                       plan=plan.to_dict(), steps=STEPS, warmup=WARMUP, leaf_modules=request.leaf_modules,
                       threads=request.threads, quiet=True, graph=request.graph, per_layer=True,
                       amp=amp_of(request.graph), timeout_s=request.timeout_s, loss=request.loss,
                       target=request.target)
            for plan in plans]
    documents = launch_many(runs, request.ranks, request.backend)
    assert documents is not None  # a plain process, not an MPI rank
    return documents


def _shared_cores(request: FormsRequest) -> float | None:
    from processes.cores import host_shared_cores

    return host_shared_cores(request.ranks, request.threads)
