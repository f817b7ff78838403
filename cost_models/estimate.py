"""``estimate(graph, plan, profile)``: the predicted iteration time, per layer and per term, and peak memory.

Per layer (``layer_cost``): compute from the profile, exposed halo exchange,
batch-norm statistics, the input-gradient sum of a filter split, and its
weight-gradient allreduce. Per edge whose two layouts differ
(``cost_models.edges``): the redistribution forward and, for the
gradient, backward. Per pipeline stage: its forward and backward time per
micro-batch, the transfer to the next stage, and the part of its gradient
allreduce left after its last backward; the schedule (``pipeline_cost``) turns
those into the iteration time.

Assumptions:
    * The input batch is loaded directly in its first layers' layouts: edges
      from the input cost nothing.
    * A convolution or linear layer split by ``c`` reads its input with
      ``c = 1`` (every filter slice needs all input channels); other layers
      read their input in their own layout. A 2-D tensor (after flattening)
      carries only the ``n`` and ``c`` parts of a layout.
    * Within a stage, weight-gradient allreduces run on their own stream in
      reverse layer order, each starting when its layer's backward is done and
      the previous allreduce has finished; what runs past the stage's last
      backward is exposed. With ``overlap=False`` all of it is.
    * ``sync`` runs ``M`` micro-batches of ``⌈N/M⌉`` samples in 1F1B order (the
      runtime's default), so stage ``k`` of ``S`` holds the activations of
      ``min(M, S − k)`` micro-batches at once (GPipe's order, ``parplan run
      --order gpipe``, holds all ``M``); ``stale`` runs whole batches and stage
      ``k`` stashes ``staleness[k]`` extra copies of its input. A stage that
      recomputes (``Pipeline.recompute``) keeps only the inputs of those
      micro-batches and one micro-batch's activations at a time (during its
      backward), and its backward runs its forward again first.
    * Stage ``k`` occupies the ranks after those of stages ``0..k−1``; a stage
      wider than a node starts on a node boundary. Tensors crossing a cut
      (skip connections included) are sent across every boundary between
      their producer's and consumer's stages, each rank sending its local part.
    * ``shared_cores`` (ranks on one host sharing its cores: how many can
      compute at once, cores / threads per rank): the iteration takes at
      least the work all ranks need, ``Σ_k G_k · busy_k``, divided by it —
      ``busy_k`` is stage ``k``'s forward and backward seconds per iteration
      (its forward twice when stale: recomputation), its allreduce, its
      transfers (on CPUs communication is the cores' work too) and its
      optimizer step. One-stage
      plans on twice as many ranks as cores run at half speed; pipeline stages
      that wait give their cores to the others. ``Estimate.contention`` says how much the
      bound stretched the iteration.
    * Each stage steps its optimizer once per iteration after its last
      backward (``Profile.optimizer_step_s`` over the stage's local
      parameters); the iteration adds the slowest stage's step.
    * A refined profile (``cost_models.corrections``) adds its per-event
      seconds to each stage's forward and backward of a micro-batch, its
      per-step seconds once to the iteration, and exposes its fraction of the
      allreduce time the timeline hides.

A :class:`~cost_models.cost_memo.CostMemo` keeps what was computed per layer
signature and layout (local problem, cost terms) and per redistribution, so
that the plans of one search — and the planner's search space, which asks the
same questions — compute each once; it changes no value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from math import ceil, prod
from typing import TYPE_CHECKING

from cost_models.cluster import Cluster, stage_cluster
from cost_models.cost_memo import CostMemo
from cost_models.errors import InputError, PlanError
from cost_models.formats.plan import Plan, Prediction, check_plan_for_graph
from cost_models.ir.graph import layer_itemsize
from cost_models.ir.kinds import VIEW_KINDS
from cost_models.ir.layer import Layer
from cost_models.ir.micro_batches import micro_batch_nodes, micro_batch_sizes
from cost_models.layer_cost import LayerCost
from cost_models.layout import Layout
from cost_models.loss_cost import LossCost
from cost_models.memory import (
    WEIGHT_SPLIT_KINDS,
    LayerMemory,
    StepLayer,
    distinct_saved_bytes,
    parameter_tensors,
    stage_peak_bytes,
)
from cost_models.pipeline_cost import stale_iteration_s, sync_iteration_s
from cost_models.profile import Profile

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["CostMemo", "Estimate", "LayerEstimate", "StageEstimate", "crossing_bytes", "estimate", "restaled",
           "transfer_s"]

@dataclass(frozen=True)
class LayerEstimate:
    """One layer's stage, layout, cost terms (per micro-batch), incoming redistribution and memory."""

    name: str
    kind: str
    stage: int
    layout: Layout
    cost: LayerCost
    redistribution_s: float
    memory: LayerMemory
    saved_input_of: str = ""
    """Whose tensor the layer's kept input is: the layer whose output it reads as it is, else its own name."""


@dataclass(frozen=True)
class StageEstimate:
    """Per micro-batch: forward, backward, transfer to the next stage; allreduce total and exposed; memory."""

    forward_s: float
    backward_s: float
    transfer_s: float
    allreduce_s: float
    allreduce_exposed_s: float
    memory_bytes: int
    optimizer_s: float = 0.0
    """The optimizer's step over the stage's parameters, once per iteration."""


@dataclass(frozen=True)
class Estimate:
    """The iteration time, its breakdown per term, peak memory per rank, and the per-layer table."""

    iteration_s: float
    breakdown_s: Mapping[str, float]
    memory_bytes_max: int
    memory_bytes: Mapping[str, int]
    layers: tuple[LayerEstimate, ...]
    stages: tuple[StageEstimate, ...]
    contention: float = 1.0  # how much ranks sharing cores stretched the iteration (``shared_cores``)

    def prediction(self) -> Prediction:
        """What a plan file records of this estimate: iteration, peak memory, breakdown."""
        return Prediction(self.iteration_s, self.memory_bytes_max, dict(self.breakdown_s))

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``parplan estimate --json``): totals, breakdown, memory, stages and layers."""
        layers = [{"name": layer.name, "kind": layer.kind, "stage": layer.stage, "layout": str(layer.layout),
                   "compute_source": layer.cost.compute_source, "forward_s": layer.cost.forward_s,
                   "backward_s": layer.cost.backward_s, "backward_weight_s": layer.cost.backward_weight_s,
                   "halo_s": layer.cost.halo_s, "halo_exposed_s": layer.cost.halo_exposed_s,
                   "allreduce_s": layer.cost.allreduce_s, "norm_s": layer.cost.norm_s,
                   "channel_reduce_s": layer.cost.channel_reduce_s, "redistribution_s": layer.redistribution_s,
                   "memory_bytes": layer.memory.resident_bytes} for layer in self.layers]
        stages = [{"stage": index, "forward_s": stage.forward_s, "backward_s": stage.backward_s,
                   "transfer_s": stage.transfer_s, "allreduce_s": stage.allreduce_s,
                   "allreduce_exposed_s": stage.allreduce_exposed_s, "memory_bytes": stage.memory_bytes}
                  for index, stage in enumerate(self.stages)]
        return {"iteration_s": self.iteration_s, "breakdown_s": dict(self.breakdown_s), "stages": stages,
                "memory_bytes_max": self.memory_bytes_max, "memory_bytes": dict(self.memory_bytes),
                "contention": self.contention, "sources": self.sources(), "layers": layers}

    def sources(self) -> dict[str, int]:
        """How many layers' compute came from measured entries, the fit, both, or needed none."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.cost.compute_source] = counts.get(layer.cost.compute_source, 0) + 1
        return counts


@dataclass(frozen=True)
class _Context:
    graph: LayerGraph
    nodes: Mapping[str, Layer]
    plan: Plan
    profile: Profile
    dtype: str
    optimizer: str
    overlap: bool
    memo: CostMemo


def estimate(graph: LayerGraph, plan: Plan, profile: Profile, cluster: Cluster | None = None, optimizer: str = "sgd",
             overlap: bool = True, slowdown: Mapping[int, float] | None = None,
             shared_cores: float | None = None, *, memo: CostMemo | None = None,
             threads: int | None = None) -> Estimate:
    """Predict one training iteration of ``plan`` for the traced ``graph``.

    Args:
        slowdown: Optional straggler factors by stage index (``{1: 2.0}``: stage 1 runs at half speed).
        shared_cores: When all ranks share one host's cores: how many ranks can compute at once
            (cores / threads per rank); ``None``: every rank has its own device.
        memo: What other estimates of this profile and dtype computed (:class:`CostMemo`); a fresh one by default.
        threads: CPU threads per rank of the run (its kernels' workspace); ``None``: the profile's.

    Raises:
        PlanError: The plan does not fit the graph or a layout cannot split its layer.
    """
    cluster = cluster or plan.cluster
    if plan.fingerprint != graph.fingerprint:
        raise PlanError(f"plan was made for model fingerprint {plan.fingerprint}, this model traces to "
                        f"{graph.fingerprint}; make a new plan for this model and input shape")
    check_plan_for_graph(plan, graph)
    micro = plan.pipeline.micro_batches if plan.pipeline.schedule == "sync" else 1
    dtype = graph.graph["dtype"]
    memo = memo or CostMemo(profile, dtype, threads)
    memo.check(profile, dtype, threads)
    context = _Context(graph, _micro_batch_nodes(graph, micro), plan, profile, dtype,
                       optimizer, overlap, memo)
    clusters: dict[int, Cluster] = {}  # per stage, made when a layer of it is met
    layers = tuple(_layer_estimate(context, name, _cached_stage_cluster(clusters, cluster, plan,
                                                                        plan.layers[name].stage))
                   for name in graph.compute_layers())
    stages = tuple(_stage_estimate(context, layers, stage, cluster, micro, (slowdown or {}).get(stage, 1.0))
                   for stage in range(plan.pipeline.stages))
    stages, loss_s = _with_loss(context, stages)
    step_s = profile.corrections.step_overhead_s if profile.corrections else 0.0
    return _combine(layers, stages, plan, micro, step_s, shared_cores, loss_s)


def _with_loss(context: _Context, stages: tuple[StageEstimate, ...]) -> tuple[tuple[StageEstimate, ...], float]:
    """The stages, the last one with the training loss the graph records (``graph.graph["loss"]``,
    ``cost_models.loss_cost``) added, and the loss's seconds per micro-batch."""
    recorded = context.graph.graph.get("loss")
    name = context.graph.graph["outputs"][0]
    shape = context.nodes[name].output_shape or []
    if not recorded or not shape or isinstance(shape[0], list):
        return stages, 0.0
    loss = LossCost.from_dict(recorded).seconds(context.profile, context.plan.layers[name].layout, tuple(shape))
    last = stages[-1]
    return (*stages[:-1], replace(last, forward_s=last.forward_s + loss.forward_s,
                                  backward_s=last.backward_s + loss.backward_s,
                                  memory_bytes=last.memory_bytes + loss.held_bytes)), loss.forward_s + loss.backward_s


def restaled(graph: LayerGraph, plan: Plan, previous: Estimate, staleness_was: Sequence[int], profile: Profile,
             *, memo: CostMemo | None = None) -> Estimate:
    """:func:`estimate` of ``plan`` — a stale plan equal to the one ``previous`` priced (with the defaults: no
    straggler, no shared cores) but for its stages' staleness, ``staleness_was`` there — from ``previous``: the
    layers and stages are the same but for each stage's stashed inputs (``staleness × its input``), and the pace.

    Raises:
        PlanError: ``plan`` is not a stale pipeline of as many stages.
    """
    if plan.pipeline.schedule != "stale" or len(previous.stages) != plan.pipeline.stages:
        raise PlanError(f"restaled prices a stale plan of {len(previous.stages)} stages, got a "
                        f"{plan.pipeline.schedule} one of {plan.pipeline.stages}; use estimate")
    dtype = graph.graph["dtype"]
    context = _Context(graph, graph.nodes, plan, profile, dtype, "", True, memo or CostMemo(profile, dtype))
    stages = tuple(replace(stage, memory_bytes=stage.memory_bytes
                           + (now - was) * _boundary_bytes(context, k, into=True))
                   for k, (stage, now, was) in enumerate(zip(previous.stages, plan.pipeline.staleness, staleness_was)))
    step_s = profile.corrections.step_overhead_s if profile.corrections else 0.0
    return _combine(previous.layers, stages, plan, 1, step_s, None)


def _micro_batch_nodes(graph: LayerGraph, micro: int) -> Mapping[str, Layer]:
    """The layers on the largest of ``micro`` micro-batches (each is priced as it: ``cost_models.ir.micro_batches``)."""
    if micro == 1:
        return graph.nodes
    return micro_batch_nodes(graph, micro_batch_sizes(int(graph.input_shape[0]), micro)[0])


def _cached_stage_cluster(found: dict[int, Cluster], cluster: Cluster, plan: Plan, stage: int) -> Cluster:
    if stage not in found:
        found[stage] = _stage_cluster(cluster, plan, stage)
    return found[stage]


def _stage_cluster(cluster: Cluster, plan: Plan, stage: int) -> Cluster:
    devices = plan.pipeline.devices_per_stage[stage]
    try:
        return stage_cluster(cluster, devices)
    except InputError as err:
        raise PlanError(f"stage {stage} has {devices} devices, which are not whole nodes of "
                        f"{cluster.devices_per_node}: {err}") from err


def _layer_estimate(context: _Context, name: str, cluster: Cluster) -> LayerEstimate:
    node, assignment = context.nodes[name], context.plan.layers[name]
    devices = context.plan.pipeline.devices_per_stage[assignment.stage]
    signature = context.memo.signature(node)
    cost = context.memo.cost(name, signature, node, assignment.layout, devices, cluster, context.overlap)
    moved = sum(_edge_s(context, source, name, devices, cluster) for source in context.graph.predecessors(name))
    memory = context.memo.memory(signature, node, assignment.layout, context.optimizer)
    return LayerEstimate(name, node.kind, assignment.stage, assignment.layout, cost, moved, memory,
                         _saved_input_of(context, name, signature))


def _saved_input_of(context: _Context, name: str, signature: str) -> str:
    """The layer whose output ``name`` reads as it is (through views; same layout, same local size: no halo, no
    redistribution), or ``name`` itself when its input is a tensor of its own."""
    nodes, layers = context.nodes, context.plan.layers
    source = next(iter(context.graph.predecessors(name)), None)
    while source is not None and nodes[source].kind in VIEW_KINDS:
        source = next(iter(context.graph.predecessors(source)), None)
    if source is None or source not in layers or layers[source].layout != layers[name].layout \
            or layers[source].stage != layers[name].stage:
        return name
    kept = context.memo.memory(signature, nodes[name], layers[name].layout, context.optimizer).saved_input
    theirs = context.memo.problem(context.memo.signature(nodes[source]), nodes[source], layers[source].layout)
    if theirs is None or kept != prod(theirs.output_shape) * theirs.itemsize:
        return name
    return source


def _edge_s(context: _Context, source: str, target: str, devices: int, cluster: Cluster) -> float:
    plan, nodes = context.plan, context.nodes
    if plan.layers.get(source) is None or plan.layers[source].stage != plan.layers[target].stage:
        return 0.0  # the input is loaded in place; stage crossings are transfers
    return context.memo.edge_s(nodes[source], nodes[target], plan.layers[source].layout, plan.layers[target].layout,
                               devices, cluster)


def _stage_estimate(context: _Context, layers: tuple[LayerEstimate, ...], stage: int, cluster: Cluster,
                    micro: int, slowdown: float) -> StageEstimate:
    own = [layer for layer in layers if layer.stage == stage]
    shared = [layer.cost.halo_exposed_s / 2 + layer.cost.norm_s / 2 + layer.redistribution_s / 2 for layer in own]
    event_s = context.profile.corrections.event_overhead_s if context.profile.corrections else 0.0
    forward = slowdown * (event_s + sum(layer.cost.forward_s + extra for layer, extra in zip(own, shared)))
    backward = slowdown * (event_s + sum(layer.cost.backward_s + layer.cost.channel_reduce_s + extra
                                         for layer, extra in zip(own, shared)))
    allreduce, exposed = _allreduce_timeline(own, context.overlap)
    if context.profile.corrections is not None:  # measured runs hid less of it than the timeline says
        exposed += context.profile.corrections.allreduce_exposed_fraction * (allreduce - exposed)
    if context.plan.pipeline.recomputes(stage) and context.plan.pipeline.schedule == "sync":
        backward += forward - slowdown * event_s  # the forward again, before each backward
    memory = _stage_memory(context, own, stage, micro)
    tensors = sum(parameter_tensors(context.nodes[layer.name]) for layer in own)
    step_s = slowdown * context.profile.optimizer_step_s(context.optimizer, tensors,
                                                          sum(layer.memory.weights for layer in own))
    return StageEstimate(forward, backward, _transfer_s(context, stage, cluster), allreduce, exposed, memory, step_s)


def _stage_memory(context: _Context, own: Sequence[LayerEstimate], stage: int, micro: int) -> int:
    """Peak bytes per rank of ``stage``: the activations of its in-flight micro-batches (or, recomputing, of one
    and the inputs of all of them), plus a stale stage's stashed inputs."""
    in_flight, pipeline = _in_flight(context.plan, stage, micro), context.plan.pipeline
    layers = _step_layers(context, own, stage)
    if pipeline.recomputes(stage):
        memory = stage_peak_bytes(layers, 1) + in_flight * _boundary_bytes(context, stage, into=True)
    else:
        memory = stage_peak_bytes(layers, in_flight)
    return memory + pipeline.staleness[stage] * _boundary_bytes(context, stage, into=True)


def _step_layers(context: _Context, own: Sequence[LayerEstimate], stage: int) -> list[StepLayer]:
    """The stage's layers as its memory peak sees them (``cost_models.memory.stage_peak_bytes``)."""
    devices = context.plan.pipeline.devices_per_stage[stage]
    return [StepLayer(layer.name, layer.kind, layer.saved_input_of, layer.memory,
                      devices // (layer.layout.c if layer.kind in WEIGHT_SPLIT_KINDS else 1) > 1,
                      _received_bytes(context, layer)) for layer in own]


def _received_bytes(context: _Context, layer: LayerEstimate) -> int:
    """The local input a layer whose input is redistributed receives (0 when it reads its producer's layout)."""
    if layer.redistribution_s <= 0:
        return 0
    node = context.nodes[layer.name]
    problem = context.memo.problem(context.memo.signature(node), node, layer.layout)
    return 0 if problem is None else sum(prod(shape) for shape in problem.input_shapes) * problem.itemsize


def _in_flight(plan: Plan, stage: int, micro: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once: 1F1B's ``min(M, S − stage)``."""
    if plan.pipeline.schedule != "sync":
        return micro
    return min(micro, len(plan.pipeline.devices_per_stage) - stage)


def _allreduce_timeline(layers: list[LayerEstimate], overlap: bool) -> tuple[float, float]:
    total = sum(layer.cost.allreduce_s for layer in layers)
    if not overlap:
        return total, total
    clock = comm_free = 0.0
    for layer in reversed(layers):
        clock += layer.cost.backward_s
        if layer.cost.allreduce_s:
            comm_free = max(comm_free, clock) + layer.cost.allreduce_s
    return total, max(0.0, comm_free - clock)


def _boundary_bytes(context: _Context, stage: int, into: bool) -> int:
    """Bytes one rank sends across the cut after ``stage`` (or receives across the cut before it, ``into``)."""
    plan, total = context.plan, 0
    cut = stage - 1 if into else stage
    if cut >= plan.pipeline.stages - 1:
        return 0
    for source, target in context.graph.edges:
        if source not in plan.layers:  # the model input: stage 0 receives it (and DSP stashes it)
            crosses = cut < 0 and target in plan.layers and plan.layers[target].stage == 0
            layout = plan.layers[target].layout if target in plan.layers else Layout()
        else:
            crosses = target in plan.layers and plan.layers[source].stage <= cut < plan.layers[target].stage
            layout = plan.layers[source].layout
        if crosses:
            total += crossing_bytes(context.nodes[source], layout.ranks, context.dtype)
    return total


def crossing_bytes(node: Layer, ranks: int, dtype: str) -> int:
    """Bytes one rank sends of the output of ``node`` (split over ``ranks``) to the next pipeline stage."""
    return ceil(_elements(node.output_shape) / ranks) * layer_itemsize(node, dtype)


def transfer_s(profile: Profile, level: str, nbytes: int) -> float:
    """Seconds of one stage-to-stage transfer of ``nbytes`` per rank over link ``level``."""
    return profile.comm_time_s("sendrecv", level, 2, nbytes) if nbytes else 0.0


def _elements(shape: Sequence[int]) -> int:
    """Elements of a tensor shape, or of all the tensors of a tuple output (``[[…], […]]``)."""
    if shape and isinstance(shape[0], list):
        return sum(_elements(part) for part in shape)
    elements = 1
    for extent in shape:
        elements *= extent
    return elements


def _transfer_s(context: _Context, stage: int, cluster: Cluster) -> float:
    nbytes = _boundary_bytes(context, stage, into=False)
    if not nbytes:
        return 0.0
    first = sum(context.plan.pipeline.devices_per_stage[:stage])
    after = first + context.plan.pipeline.devices_per_stage[stage]
    level = "inter" if cluster.node_of(first) != cluster.node_of(min(after, cluster.devices - 1)) else "intra"
    return transfer_s(context.profile, level, nbytes)


def _combine(layers: tuple[LayerEstimate, ...], stages: tuple[StageEstimate, ...], plan: Plan, micro: int,
             step_s: float, shared_cores: float | None, loss_s: float = 0.0) -> Estimate:
    forward, backward = [s.forward_s for s in stages], [s.backward_s for s in stages]
    transfer = [s.transfer_s for s in stages[:-1]]
    if plan.pipeline.schedule == "stale" and len(stages) > 1:
        iteration = stale_iteration_s(forward, backward, transfer, [s.allreduce_s for s in stages],
                                      plan.pipeline.staleness)
    else:
        iteration = sync_iteration_s(forward, backward, transfer, micro, [s.allreduce_exposed_s for s in stages])
    iteration += max((s.optimizer_s for s in stages), default=0.0)
    contention = _contention(stages, plan, micro, iteration, shared_cores)
    iteration = iteration * contention + step_s
    breakdown = {
        "compute_fwd": micro * sum(layer.cost.forward_s for layer in layers),
        "compute_bwd": micro * sum(layer.cost.backward_s for layer in layers),
        "halo": micro * sum(layer.cost.halo_s for layer in layers),
        "halo_exposed": micro * sum(layer.cost.halo_exposed_s for layer in layers),
        "norm_stats": micro * sum(layer.cost.norm_s for layer in layers),
        "channel_reduce": micro * sum(layer.cost.channel_reduce_s for layer in layers),
        "redistribution": micro * sum(layer.redistribution_s for layer in layers),
        "transfer": micro * 2 * sum(transfer),
        "allreduce": sum(s.allreduce_s for s in stages),
        "allreduce_exposed": max((s.allreduce_exposed_s for s in stages), default=0.0),
        "optimizer": max((s.optimizer_s for s in stages), default=0.0),
        **({"recompute": micro * sum(_recomputed_s(layers, k) for k in range(len(stages))
                                     if plan.pipeline.recomputes(k))}
           if plan.pipeline.recompute and plan.pipeline.schedule == "sync" else {}),
        **({"step_overhead": step_s} if step_s else {}),
        **({"loss": micro * loss_s} if loss_s else {}),
    }
    worst = max(range(len(stages)), key=lambda k: stages[k].memory_bytes)
    own = [layer for layer in layers if layer.stage == worst]
    memory = {term: sum(getattr(layer.memory, term) for layer in own) for term in ("weights", "gradients", "optimizer")}
    memory["saved"] = _in_flight(plan, worst, micro) * distinct_saved_bytes(
        [StepLayer(layer.name, layer.kind, layer.saved_input_of, layer.memory, False) for layer in own])
    # the peak is not the terms' sum (gradients and kept activations are not all alive at once): what it holds
    # beyond them, if anything, is transients and stashes
    memory["transient_and_stash"] = max(0, stages[worst].memory_bytes - sum(memory.values()))
    return Estimate(iteration, breakdown, stages[worst].memory_bytes, memory, layers, stages, contention)


def _recomputed_s(layers: Sequence[LayerEstimate], stage: int) -> float:
    """The forward compute a recomputing stage runs again per micro-batch."""
    return sum(layer.cost.forward_s for layer in layers if layer.stage == stage)


def _contention(stages: tuple[StageEstimate, ...], plan: Plan, micro: int, iteration_s: float,
                shared_cores: float | None) -> float:
    """How much ranks sharing ``shared_cores`` stretch ``iteration_s`` (at least 1; module docstring)."""
    if shared_cores is None or iteration_s <= 0:
        return 1.0
    stale = plan.pipeline.schedule == "stale" and len(stages) > 1
    passes = 1 if stale else micro
    busy = [(2 * s.forward_s + s.backward_s if stale else micro * (s.forward_s + s.backward_s))
            + s.allreduce_s + 2 * passes * s.transfer_s + s.optimizer_s for s in stages]
    demand_s = sum(devices * seconds for devices, seconds in zip(plan.pipeline.devices_per_stage, busy))
    return max(1.0, demand_s / shared_cores / iteration_s)
