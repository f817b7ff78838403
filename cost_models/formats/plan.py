"""The answer parplan gives: per layer a Layout and a stage, the pipeline, and how it was found.

A :class:`Plan` is saved as versioned JSON (``"format": "parplan.plan/3"``),
validated on load against ``schemas/plan-3.schema.json``, and written
atomically; a ``parplan.plan/2`` file (written before stages could recompute)
still reads, every stage keeping its activations, and so does a
``parplan.plan/1`` one (written before layouts split depth), its layouts with
``d = 1``; a newer version is refused with both versions named. It records the
fingerprint of the traced model it was made for;
:func:`load_plan` refuses a plan whose fingerprint differs from the model it is
applied to, naming both. A plan for a model taking several tensors also
records every input's shape (``model.input_shapes``, in argument order); a
single-input plan is written without it, as it always was.

Consistency rules checked on construction (:meth:`Plan.__post_init__`):
    * ``pipeline.stages`` equals the lengths of ``devices_per_stage``,
      ``staleness`` and ``recompute`` (or ``recompute`` is empty: none);
      every layer's stage is below it;
    * the stages use at most the cluster's devices;
    * a ``sync`` schedule has zero staleness everywhere;
    * each layer's ``Layout.ranks`` divides its stage's device count (the
      remaining factor holds copies computing the same thing);
    * ``input_shapes``, when recorded, has several shapes, the first one
      ``input_shape``, every one of the same batch.
:func:`check_plan_for_graph` adds the checks that need the model: every layer
has an assignment, no unknown names, and each layout fits its layer's tensor.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cost_models.cluster import Cluster
from cost_models.errors import PlanError
from cost_models.formats.jsonio import read_json, write_json_atomic
from cost_models.formats.schema import check_versioned
from cost_models.ir.orders import NCHW, logical
from cost_models.layout import Layout

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = [
    "PLAN_FORMAT", "LayerAssignment", "Pipeline", "Plan", "Prediction", "Schedule", "SolverInfo",
    "check_plan_for_graph", "load_plan", "recorded_shapes", "save_plan",
]

Schedule = Literal["sync", "stale"]
"""A pipeline's schedule: synchronous micro-batches, or DSP's stale weights without a flush."""

PLAN_FORMAT = "parplan.plan/3"
READABLE_FORMATS = {PLAN_FORMAT: "plan-3", "parplan.plan/2": "plan-2", "parplan.plan/1": "plan-1"}
"""Plan formats this code reads, newest first: ``/2`` predates recomputation (no stage recomputes), ``/1`` the
depth split (its layouts read as ``d = 1``)."""


@dataclass(frozen=True)
class LayerAssignment:
    """Where one layer runs: its Layout and its pipeline stage."""

    layout: Layout
    stage: int = 0

    def __str__(self) -> str:
        return f"{self.layout}@{self.stage}"


@dataclass(frozen=True)
class Pipeline:
    """Stages, the devices each one gets, the schedule and the staleness of each stage."""

    stages: int = 1
    """How many pipeline stages (1: no pipeline)."""
    devices_per_stage: tuple[int, ...] = (1,)
    """The devices of each stage; stages take consecutive ranks."""
    schedule: Schedule = "sync"
    """``sync``: micro-batches, one update per batch (GPipe, 1F1B); ``stale``: DSP, no flush (``staleness``)."""
    micro_batches: int = 1
    """Micro-batches of a ``sync`` pipeline's batch."""
    staleness: tuple[int, ...] = (0,)
    """Per stage, how many updates a batch's backward may lag its forward (``stale``; 0 for ``sync``)."""
    recompute: tuple[bool, ...] = ()
    """Per stage, whether it keeps only its inputs and recomputes its forward before each backward (empty: none;
    all-false flags are held as empty, so equal pipelines compare equal)."""

    def __post_init__(self) -> None:
        if not any(self.recompute):
            object.__setattr__(self, "recompute", ())

    @property
    def pipelined(self) -> bool:
        """Whether the plan runs under the pipeline runtime (``runtime.pipeline.stage``): several stages, or one that
        recomputes its forward."""
        return self.stages > 1 or bool(self.recompute)

    def recomputes(self, stage: int) -> bool:
        """Whether ``stage`` recomputes its forward before each backward instead of keeping its activations."""
        return bool(self.recompute) and self.recompute[stage]

    def stage_of(self, rank: int) -> int:
        """The stage global rank ``rank`` runs: stages take consecutive ranks, ``devices_per_stage`` each, in order."""
        first = 0
        for stage, devices in enumerate(self.devices_per_stage):
            if rank < first + devices:
                return stage
            first += devices
        raise PlanError(f"rank {rank} is past the pipeline's {first} devices "
                        f"({list(self.devices_per_stage)} per stage)")

    def __str__(self) -> str:
        if self.stages == 1:
            return "1 stage" + (", recompute" if self.recomputes(0) else "")
        tail = f"sync M={self.micro_batches}" if self.schedule == "sync" else f"stale≤{max(self.staleness)}"
        again = [str(k) for k in range(self.stages) if self.recomputes(k)]
        return f"{self.stages} stages {tail}" + (f", recompute {','.join(again)}" if again else "")


@dataclass(frozen=True)
class Prediction:
    """What the cost model predicts for the plan."""

    iteration_s: float
    memory_bytes_max: int
    breakdown_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SolverInfo:
    """How the plan was found: solver, its status, objective, optimality gap and time."""

    name: str
    status: str
    seconds: float
    objective: float | None = None
    gap: float | None = None


@dataclass(frozen=True)
class Plan:
    """Per-layer layouts and stages for one model at one input shape on one cluster."""

    fingerprint: str
    input_shape: tuple[int, ...]
    dtype: str
    cluster: Cluster
    layers: Mapping[str, LayerAssignment]
    pipeline: Pipeline = Pipeline()
    predicted: Prediction | None = None
    solver: SolverInfo | None = None
    model_spec: str = ""
    created: str = ""
    input_shapes: tuple[tuple[int, ...], ...] = ()
    """Every input's shape for a model taking several (:func:`recorded_shapes`); empty: one, ``input_shape``."""

    def __post_init__(self) -> None:
        _check_pipeline(self.pipeline, self.cluster)
        _check_input_shapes(self.input_shape, self.input_shapes)
        for name, assignment in self.layers.items():
            _check_assignment(name, assignment, self.pipeline)

    @property
    def used_devices(self) -> int:
        """The devices the plan runs on: its stages' (the rest of the cluster's idle), the ranks to start."""
        return sum(self.pipeline.devices_per_stage)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Every model input's global shape, in the forward's argument order."""
        return self.input_shapes or (tuple(self.input_shape),)

    def summary(self) -> str:
        """One line: the distinct layouts by frequency and the pipeline, e.g. ``n4·h2 (52), n8 (3); 1 stage``."""
        counts: dict[str, int] = {}
        for assignment in self.layers.values():
            counts[str(assignment.layout)] = counts.get(str(assignment.layout), 0) + 1
        layouts = ", ".join(f"{text} ({n})" for text, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"{layouts}; {self.pipeline}"

    def to_dict(self) -> dict[str, object]:
        """The ``parplan.plan/3`` JSON document."""
        return {
            "format": PLAN_FORMAT,
            "model": {"spec": self.model_spec, "fingerprint": self.fingerprint,
                      "input_shape": list(self.input_shape), "dtype": self.dtype,
                      **({"input_shapes": [list(shape) for shape in self.input_shapes]} if self.input_shapes else {})},
            "cluster": self.cluster.to_dict(),
            "layers": [{"name": name, "layout": a.layout.to_dict(), "stage": a.stage}
                       for name, a in self.layers.items()],
            "pipeline": {"schedule": self.pipeline.schedule, "stages": self.pipeline.stages,
                         "micro_batches": self.pipeline.micro_batches,
                         "devices_per_stage": list(self.pipeline.devices_per_stage),
                         "staleness": list(self.pipeline.staleness),
                         "recompute": [self.pipeline.recomputes(k) for k in range(self.pipeline.stages)]},
            "predicted": None if self.predicted is None else {
                "iteration_s": self.predicted.iteration_s, "memory_bytes_max": self.predicted.memory_bytes_max,
                "breakdown_s": dict(self.predicted.breakdown_s)},
            "solver": None if self.solver is None else {
                "name": self.solver.name, "status": self.solver.status, "objective": self.solver.objective,
                "gap": self.solver.gap, "seconds": self.solver.seconds},
            "created": self.created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], source: str = "plan") -> Plan:
        """Validate a ``parplan.plan/3`` (or ``/2``, ``/1``) document (format, schema, consistency) and build the
        Plan."""
        check_versioned(document, READABLE_FORMATS, source, PlanError)
        names = [layer["name"] for layer in document["layers"]]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise PlanError(f"{source} assigns layers {repeated[:5]} more than once; keep one entry per layer")
        pipeline, predicted, solver = document["pipeline"], document.get("predicted"), document.get("solver")
        try:
            return cls(
                fingerprint=document["model"]["fingerprint"],
                input_shape=tuple(document["model"]["input_shape"]),
                dtype=document["model"]["dtype"],
                cluster=Cluster.from_dict(document["cluster"]),
                layers={layer["name"]: LayerAssignment(Layout.from_dict(layer["layout"]), layer["stage"])
                        for layer in document["layers"]},
                pipeline=Pipeline(pipeline["stages"], tuple(pipeline["devices_per_stage"]), pipeline["schedule"],
                                  pipeline["micro_batches"], tuple(pipeline["staleness"]),
                                  tuple(pipeline.get("recompute", ()))),
                predicted=None if predicted is None else Prediction(
                    predicted["iteration_s"], predicted["memory_bytes_max"], predicted.get("breakdown_s", {})),
                solver=None if solver is None else SolverInfo(
                    solver["name"], solver["status"], solver["seconds"], solver.get("objective"), solver.get("gap")),
                model_spec=document["model"].get("spec", ""),
                created=document.get("created", ""),
                input_shapes=tuple(tuple(shape) for shape in document["model"].get("input_shapes", ())),
            )
        except PlanError as err:
            raise PlanError(f"{source}: {err}") from err
        except ValueError as err:  # InputError from Cluster/Layout validation
            raise PlanError(f"{source}: {err}") from err


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write ``plan`` as ``parplan.plan/3`` JSON, atomically."""
    write_json_atomic(path, plan.to_dict())


def load_plan(path: str | os.PathLike[str], expected_fingerprint: str | None = None) -> Plan:
    """Read and validate a plan file.

    Args:
        path: The JSON file.
        expected_fingerprint: The fingerprint of the model the plan will be
            applied to; a different one in the file is refused.

    Raises:
        InputError: Missing file or invalid JSON.
        PlanError: Wrong format version, schema violation, inconsistency, or
            fingerprint mismatch (both fingerprints named).
    """
    plan = Plan.from_dict(read_json(path, "plan"), source=str(path))
    if expected_fingerprint is not None and plan.fingerprint != expected_fingerprint:
        raise PlanError(
            f"plan {path} was made for model fingerprint {plan.fingerprint} (input "
            f"{' and '.join(_shape(shape) for shape in plan.shapes)}), "
            f"but this model traces to {expected_fingerprint}; make a new plan for this model and input shape"
        )
    return plan


def check_plan_for_graph(plan: Plan, graph: LayerGraph) -> None:
    """Refuse a plan that does not cover exactly the graph's layers or whose layouts do not fit them.

    Args:
        plan: The plan.
        graph: The :class:`~cost_models.ir.graph.LayerGraph` it is applied to.
    """
    order = graph.compute_layers()
    layers = set(order)
    missing, unknown = sorted(layers - set(plan.layers)), sorted(set(plan.layers) - set(graph.nodes))
    if missing:
        raise PlanError(f"plan has no layout for {len(missing)} layers of the model, e.g. {missing[:3]}; re-plan")
    if unknown:
        raise PlanError(f"plan names {len(unknown)} layers the model does not have, e.g. {unknown[:3]}; re-plan")
    for name in order:  # execution order: the first offending layer is named
        layout, shape = plan.layers[name].layout, graph.nodes[name].output_shape
        axes = graph.nodes[name].attrs.get("order") or NCHW
        if len(shape) == 4 and not isinstance(shape[0], list) and not layout.fits(tuple(logical(shape, axes))):
            raise PlanError(f"layout {layout} of layer '{name}' splits its output {tuple(shape)} into empty parts")


def recorded_shapes(shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """What a plan records of a model's input shapes (``Plan.input_shapes``): every one when there are
    several, none for a single input (whose plan is written as it always was)."""
    return tuple(tuple(int(e) for e in shape) for shape in shapes) if len(shapes) > 1 else ()


def _check_input_shapes(first: Sequence[int], shapes: Sequence[Sequence[int]]) -> None:
    if not shapes:
        return
    if len(shapes) < 2 or tuple(shapes[0]) != tuple(first):
        raise PlanError(f"input_shapes {[list(s) for s in shapes]} must list two or more shapes, the first equal to "
                        f"input_shape {list(first)}; write input_shapes only for a model taking several tensors")
    wrong = [list(shape) for shape in shapes if not shape or shape[0] != first[0]]
    if wrong:
        raise PlanError(f"input_shapes {wrong[0]} has another batch than input_shape {list(first)}; every input's "
                        f"first extent is the batch {first[0]}")


def _check_pipeline(pipeline: Pipeline, cluster: Cluster) -> None:
    if pipeline.schedule not in ("sync", "stale"):
        raise PlanError(f"pipeline schedule {pipeline.schedule!r} is unknown; use 'sync' or 'stale'")
    if not (pipeline.stages == len(pipeline.devices_per_stage) == len(pipeline.staleness)) or (
            pipeline.recompute and len(pipeline.recompute) != pipeline.stages):
        raise PlanError(
            f"pipeline has {pipeline.stages} stages but {len(pipeline.devices_per_stage)} device counts, "
            f"{len(pipeline.staleness)} staleness values and {len(pipeline.recompute)} recompute flags; give one of "
            f"each per stage (recompute may be empty)"
        )
    if sum(pipeline.devices_per_stage) > cluster.devices:
        raise PlanError(
            f"pipeline stages use {sum(pipeline.devices_per_stage)} devices but the cluster has {cluster.devices}"
        )
    if pipeline.schedule == "sync" and any(pipeline.staleness):
        raise PlanError(f"a 'sync' pipeline has no staleness, got {list(pipeline.staleness)}; use schedule 'stale'")


def _check_assignment(name: str, assignment: LayerAssignment, pipeline: Pipeline) -> None:
    if not 0 <= assignment.stage < pipeline.stages:
        raise PlanError(f"layer '{name}' is on stage {assignment.stage}, but the pipeline has {pipeline.stages} stages")
    devices = pipeline.devices_per_stage[assignment.stage]
    if devices % assignment.layout.ranks:
        raise PlanError(
            f"layer '{name}' has layout {assignment.layout} on {assignment.layout.ranks} ranks, which does not "
            f"divide the {devices} devices of stage {assignment.stage}"
        )


def _shape(shape: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in shape)
