"""``apply_pipeline``: one pipeline stage of a Plan on this rank, running a schedule's events.

Stage ``k`` of ``K`` runs on the ``G_k`` global ranks after those of the
stages before it (``devices_per_stage``: stages may differ) and executes its
part of the traced model (``runtime.pipeline.cut``) as a
:class:`runtime.apply.DistributedModel` — itself split by sample, space or
channel over its ``G_k`` ranks. A value crossing a cut goes from the
producer's members, under the producer's placement, to every later stage
reading it, under that stage's wire placement (``runtime.pipeline.moves``: with
equal stages member ``q`` sends its box to member ``q``; otherwise each reader
gets the pieces of its box from the members holding them); the reader
redistributes it inside its own stage as any other input. Gradients of the
crossings go back the same way. Sends are non-blocking, receives wait.

Events (``runtime.pipeline.schedules``):

* ``F b`` receives the inputs of batch (micro-batch) ``b`` (the first stage
  loads the model's inputs — each of them, for a model taking several — and
  sends those a later stage reads, as it sends activations), runs the stage,
  sends its outputs; on the last stage it also evaluates the loss share. The
  ``sync`` schedule keeps the autograd graph; the ``stale`` one — and a stage
  the plan has recompute (``Pipeline.recompute``, activation checkpointing of
  the whole stage) — runs without it and stashes only the stage's inputs (and
  the key of its random draws, ``runtime.random_ops``, and the RNG state for
  unkeyed random ops, so that the recomputation draws the same masks again).
* ``B b`` receives (and sums) the gradients of the outputs of ``b``; a stage
  that stashed first recomputes the forward from the stashed input with the
  current weights (under ``sync`` the weights of the forward itself; under
  ``stale`` the newest: DSP's rule; batch-norm's running statistics are put
  back afterwards: the forward already counted them); then backward, and the
  input gradients go to the producers. Under ``sync`` every backward but the last of an
  iteration accumulates without summing over the stage's replicas.
* ``U`` steps the optimizer over this stage's parameters and clears them.

With ``M`` micro-batches each loss share is scaled by ``1/M`` — by its share of
the samples where ``M`` does not divide the batch (``cost_models.ir.micro_batches``:
two sizes one sample apart, each run at its own shapes by a
:meth:`runtime.apply.DistributedModel.reshaped` view of the one stage, sharing
its weights and gradient sums): one ``sync``
iteration equals the unsplit model accumulating the gradients of the same
``M`` micro-batches (batch-norm statistics are per micro-batch, as in GPipe;
with ``M = 1`` that is plain unsplit training).

The other stages' parameters are released on this rank (emptied), so a rank
holds only its stage's weights. Timing: each event's wall time, how long it
waited on receives, and — for ``slowdown`` > 1 (a simulated straggler) — an
added sleep of ``slowdown − 1`` times its own compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.fx.node import Argument, map_aggregate

from cost_models.capability.predicate import pipeline_refusal
from cost_models.errors import PlanError
from cost_models.formats.plan import Plan
from cost_models.ir.dtypes import COMPLEX_OF
from cost_models.ir.micro_batches import micro_batch_sizes, micro_batch_starts
from cost_models.ir.tracing import symbolic_trace, trace
from cost_models.redistribution import Box
from runtime._values import geometry
from runtime.apply import DistributedModel, local_shape
from runtime.groups import GroupCache, gradient_group_ranks, group_ranks
from runtime.inputs import Inputs, as_inputs
from runtime.pipeline.cut import StageCut, cut_stages
from runtime.pipeline.moves import CrossingMoves, crossing_moves, wire_placement
from runtime.pipeline.schedules import Event, EventKind
from runtime.pipeline.setup import activation_dtype, buffers_of, crossing_placements, refuse_shared_parameters
from runtime.pipeline.stash import InFlight, Stash, as_leaf, crossing_tensor, detached, operand, saved_stash
from runtime.placement import Placement, box_extent, box_view
from runtime.preflight import check_plan
from runtime.random_ops import DrawKey
from runtime.shapes import static_nodes, tensor_names
from runtime.slicing import release_others
from runtime.waiting import at, exchange, wait_all

if TYPE_CHECKING:
    from torch.distributed import Work

    from cost_models.ir.graph import LayerGraph

__all__ = ["EventRecord", "PipelineStage", "apply_pipeline", "check_pipeline", "value_dtype"]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_Setting = TypeVar("_Setting")


def apply_pipeline(model: nn.Module, plan: Plan, sync_batchnorm: bool = False, leaf_modules: Sequence[str] = (),
                   graph: LayerGraph | None = None, loss_fn: Loss | None = None, slowdown: float = 1.0,
                   timeout: timedelta | None = None, *, random_seed: int = 0) -> PipelineStage:
    """This rank's stage of ``plan`` on ``model`` (collective: every rank of the default group calls it).

    Args:
        model: The user's model, identically initialised on every rank; modified in place.
        plan: A plan with pipeline stages, made for this model at ``plan.input_shape``.
        sync_batchnorm: Batch-norm statistics over the whole micro-batch (see ``apply_plan``).
        leaf_modules: Modules the plan's tracing kept opaque.
        graph: The model's ``LayerGraph`` at the plan's input shape, when already traced.
        loss_fn: Mean-reduced loss of the output (default ``cross_entropy``).
        slowdown: Run this rank's events this many times slower (a straggler, ``--slow-stage``).
        timeout: How long the process groups this creates may wait for a peer (default: torch's).
        random_seed: The seed of the random layers' keyed draws (``runtime.random_ops``).

    Raises:
        PlanError: The plan does not match the model, the ranks or what the pipeline runtime executes.
    """
    graph = graph if graph is not None else trace(model, plan.shapes, getattr(torch, plan.dtype), leaf_modules)
    world = dist.get_world_size() if dist.is_initialized() else 1
    check_plan(plan, graph, world)
    check_pipeline(plan)
    batch = int(plan.input_shape[0])
    graphs = {}  # per micro-batch size (two, one apart, when the count does not divide the batch)
    for samples in dict.fromkeys(micro_batch_sizes(batch, plan.pipeline.micro_batches)):
        shapes = [(-(-shape[0] * samples // batch), *shape[1:]) for shape in plan.shapes]  # every input's
        graphs[samples] = graph if samples == batch else trace(model, shapes, getattr(torch, plan.dtype), leaf_modules)
    return PipelineStage(model, plan, graphs, sync_batchnorm, tuple(leaf_modules), loss_fn, slowdown, timeout,
                         random_seed=random_seed)


def check_pipeline(plan: Plan) -> None:
    """Refuse pipelines this runtime cannot execute (``cost_models.capability.predicate.pipeline_refusal``)."""
    why = pipeline_refusal(plan.pipeline, int(plan.input_shape[0]))
    if why is not None:
        raise PlanError(why)


@dataclass(frozen=True)
class EventRecord:
    """One executed event: when it started and ended (``perf_counter`` seconds) and how long it waited."""

    event: Event
    start_s: float
    end_s: float
    wait_s: float


class _OnEverySize(Generic[_Setting]):
    """A setting of :class:`PipelineStage`'s model, read from it and set on its view at every micro-batch size."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, stage: None, owner: type | None = None) -> _OnEverySize[_Setting]: ...

    @overload
    def __get__(self, stage: PipelineStage, owner: type | None = None) -> _Setting: ...

    def __get__(self, stage: PipelineStage | None, owner: type | None = None) -> _OnEverySize[_Setting] | _Setting:
        if stage is None:
            return self
        setting: _Setting = getattr(stage.model, self.name)
        return setting

    def __set__(self, stage: PipelineStage, value: _Setting) -> None:
        for part in stage._models.values():
            setattr(part, self.name, value)


class PipelineStage:
    """This rank's stage: its part of the model and the events of a schedule (module docstring)."""

    def __init__(self, model: nn.Module, plan: Plan, graphs: Mapping[int, LayerGraph], sync_batchnorm: bool,
                 leaf_modules: tuple[str, ...], loss_fn: Loss | None, slowdown: float, timeout: timedelta | None = None,
                 *, random_seed: int = 0) -> None:
        """``graphs``: the model traced at each micro-batch size (``cost_models.ir.micro_batches``), largest first."""
        largest, *others = graphs
        graph = graphs[largest]
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.plan, self.stages = plan, plan.pipeline.stages
        self.dtype = activation_dtype(model, plan)
        """What activations and gradients cross stages in: the model's (a float32 plan verified in float64)."""
        self.sizes = tuple(plan.pipeline.devices_per_stage)
        self.offsets = tuple(sum(self.sizes[:k]) for k in range(self.stages))
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.index = plan.pipeline.stage_of(rank)
        self.member = rank - self.offsets[self.index]
        nodes = list(symbolic_trace(model, leaf_modules, shapes=graph.input_shapes).graph.nodes)
        cuts = cut_stages(nodes, {name: a.stage for name, a in plan.layers.items()}, self.stages,
                          static=frozenset(node.name for node in static_nodes(nodes, tensor_names(graph))))
        self.cut: StageCut = cuts[self.index]
        refuse_shared_parameters(model, nodes, cuts)
        groups = GroupCache(tuple(range(world)), timeout)
        groups.build(r for k, cut in enumerate(cuts) for r in group_ranks(
            (plan.layers[n].layout for n in cut.nodes if n in plan.layers), self._stage_ranks(k)))
        groups.build_gradients(r for k, cut in enumerate(cuts) for r in gradient_group_ranks(
            (plan.layers[n].layout for n in cut.nodes if n in plan.layers), self._stage_ranks(k)))
        self.model = DistributedModel(model, plan, graph, self._stage_ranks(self.index), sync_batchnorm, leaf_modules,
                                      frozenset(self.cut.nodes), groups, random_seed=random_seed)
        self._models = {largest: self.model, **{size: self.model.reshaped(graphs[size]) for size in others}}
        """The stage at each micro-batch size: one set of parameters, the geometry of each shape."""
        batch, micro = int(plan.input_shape[0]), plan.pipeline.micro_batches
        self._sizes, self._starts = micro_batch_sizes(batch, micro), micro_batch_starts(batch, micro)
        self._buffers = buffers_of(self.cut.nodes, nodes, model)
        held = crossing_placements(nodes, cuts, plan, graph)  # as each crossing's producer holds it
        self._held = {c.name: held[c.name] for c in self.cut.sends}
        self.placements = {c.name: wire_placement(held[c.name], self.sizes[self.index]) for c in self.cut.receives}
        """Each value this stage receives, under its wire placement on this stage (``runtime.pipeline.moves``)."""
        self._outgoing = {(size, c.name, m): self._moves(part, c.name, held[c.name], c.producer, m, rank)
                          for size, part in self._models.items() for c in self.cut.sends for m in c.consumers}
        self._incoming = {(size, c.name): self._moves(part, c.name, held[c.name], c.producer, self.index, rank)
                          for size, part in self._models.items() for c in self.cut.receives}
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        self.slowdown = slowdown
        self.stale = plan.pipeline.schedule == "stale"
        self.recompute = self.stale or plan.pipeline.recomputes(self.index)
        """Whether a forward keeps only its inputs (stale, or recomputation) and the backward recomputes it."""
        self.losses: list[torch.Tensor] = []
        """The last stage's loss share of each batch forwarded, in order (not scaled by its share of the samples)."""
        self.keep_outputs = False
        self.outputs: dict[int, Argument] = {}
        """With ``keep_outputs``, the last stage's output box of each batch forwarded."""
        self._stash: dict[int, Stash] = {}
        self._ahead: dict[int, dict[str, torch.Tensor]] = {}  # batch -> crossings received before its forward
        self._sending: list[tuple[Work, torch.Tensor, int]] = []  # (request, tensor kept alive, peer)
        self._waited = 0.0
        self._runs = 0
        release_others(model, self.model.own_parameters)

    # --- public ----------------------------------------------------------------------------------------------

    @property
    def first(self) -> bool:
        """Whether this stage reads the model's input."""
        return self.index == 0

    @property
    def last(self) -> bool:
        """Whether this stage computes the output and the loss."""
        return self.index == self.stages - 1

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The buffers of this stage's layers (batch-norm statistics), as the model holds them."""
        return self._buffers

    layer_ranges: _OnEverySize[bool] = _OnEverySize()
    """Whether each layer runs in a profiler range (``DistributedModel.layer_ranges``)."""
    switch_off_random: _OnEverySize[bool] = _OnEverySize()
    """Whether switchable unkeyed random ops run in their evaluation form (``--verify``)."""
    output_key: _OnEverySize[str | None] = _OnEverySize()
    """The part of the output the last stage takes the loss of (``DistributedModel.output_key``)."""

    def model_for(self, batch: int) -> DistributedModel:
        """The stage at the size of (micro-)batch ``batch`` (under ``stale``: every batch is whole)."""
        return self._models[self.samples(batch)]

    def samples(self, batch: int) -> int:
        """The samples of (micro-)batch ``batch``: micro-batches may differ by one
        (``cost_models.ir.micro_batches``)."""
        return self._sizes[batch] if len(self._sizes) > 1 else self._sizes[0]

    def first_sample(self, batch: int) -> int:
        """The index in its global batch of (micro-)batch ``batch``'s first sample."""
        return self._starts[batch] if len(self._starts) > 1 else 0

    def loss_scale(self, batch: int) -> float:
        """What (micro-)batch ``batch``'s mean loss is scaled by: its share of the batch's samples (``1/M`` when
        the micro-batches are equal)."""
        return 1.0 / len(self._sizes) if len(set(self._sizes)) == 1 else self.samples(batch) / sum(self._sizes)

    def parameters(self) -> list[nn.Parameter]:
        """The parameters this rank trains (its stage's; channel-split ones sliced)."""
        return self.model.own_parameters

    def run(self, events: Sequence[Event], optimizer: torch.optim.Optimizer,
            data: Callable[[int], tuple[Inputs | None, torch.Tensor | None]],
            last_backward: int | None = None, keys: Callable[[int], DrawKey] | None = None,
            after_update: Callable[[int, list[EventRecord]], None] | None = None) -> list[EventRecord]:
        """Execute ``events``; ``data(b)`` gives this rank's input box (a tuple of them, one per input, for a model
        taking several) and target box of batch ``b``.

        ``last_backward``: under ``sync``, the batch whose backward ends the accumulation (sums gradients
        over the stage's replicas); every backward syncs when it is ``None``. ``keys(b)``: the key of batch
        ``b``'s random draws (default: ``(random_seed, runs before this one, b × micro-batch size)``).
        ``after_update(b, records)``: called after each update, ``b`` the batch whose backward it follows (a stale
        pipeline's checkpoints, ``runtime.pipeline.worker``).
        """
        keys = keys or self._default_keys()
        records: list[EventRecord] = []
        backwarded = -1
        for event in events:
            self._reap_sends()
            start, waited = time.perf_counter(), self._waited
            with at(f"micro-batch {event.batch}"), at(_PHASES[event.kind]):
                if event.kind == "F":
                    x, target = data(event.batch)
                    self.forward(event.batch, x, target, keys(event.batch))
                elif event.kind == "B":
                    self.backward(event.batch, sync=last_backward is None or event.batch == last_backward)
                else:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            end = time.perf_counter()
            end = self._straggle(event, start, end, self._waited - waited)
            records.append(EventRecord(event, start, end, self._waited - waited))
            backwarded = event.batch if event.kind == "B" else backwarded
            if event.kind == "U" and after_update is not None:
                after_update(backwarded, records)
        self.finish_sends()
        self._runs += 1
        return records

    def _default_keys(self) -> Callable[[int], DrawKey]:
        seed, run = self.model.random_seed, self._runs
        return lambda batch: DrawKey(seed, run, self.first_sample(batch))

    def forward(self, batch: int, x: Inputs | None = None, target: torch.Tensor | None = None,
                key: DrawKey | None = None) -> None:
        """Receive ``batch``'s inputs, run this stage on them, send its outputs (the ``F`` event).

        ``x``: the first stage's box of the model's input (a tuple of boxes for a model taking several).
        ``key``: the key of its random draws (default: as :meth:`run`'s for this run).
        """
        size, ahead = self.samples(batch), self._ahead.pop(batch, {})
        received = {c.name: ahead[c.name] if c.name in ahead else self._receive(size, c.name, c.producer, 2 * c.tag)
                    for c in self.cut.receives}
        inputs = as_inputs(x) if x is not None else ()
        stash = Stash(batch, self._models[size], received, inputs, target, key or self._default_keys()(batch),
                       torch.get_rng_state())
        with torch.set_grad_enabled(not self.recompute):
            self._compute(stash)
        for crossing in self.cut.sends:
            for consumer in crossing.consumers:
                moves = self._outgoing[size, crossing.name, consumer]
                self._send(stash.outputs[crossing.name], moves.box, moves.sends, consumer, 2 * crossing.tag)
        if self.last:
            assert stash.loss is not None, "the last stage's forward computes its loss"
            self.losses.append(stash.loss.detach() / self.loss_scale(batch))
        if self.recompute:
            stash.outputs, stash.loss = {}, None
        self._stash[batch] = stash

    def backward(self, batch: int, sync: bool = True) -> None:
        """Receive the gradients of ``batch``'s outputs, backward (after recomputing, if stale), send input
        gradients."""
        stash = self._stash.pop(batch)
        size = self.samples(batch)
        grads = {c.name: _summed(self._receive_gradient(size, c.name, consumer, 2 * c.tag + 1)
                                 for consumer in c.consumers)
                 for c in self.cut.sends}
        saved = self._recompute(stash) if self.recompute else []
        tensors: list[torch.Tensor | None] = [stash.outputs[name] for name in grads]
        tensors += [stash.loss] if self.last else []
        gradients: list[torch.Tensor | None] = [grads[name] for name in grads]
        gradients += [None] if self.last else []
        pairs = [(t, g) for t, g in zip(tensors, gradients) if t is not None and t.requires_grad]
        if pairs:
            with self.model.no_sync() if not sync else nullcontext():
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self._restore(saved)
        for crossing in self.cut.receives:
            leaf, moves = stash.inputs[crossing.name], self._incoming[size, crossing.name]
            self._send(leaf.grad if leaf.grad is not None else torch.zeros_like(leaf), moves.box, moves.receives,
                       crossing.producer, 2 * crossing.tag + 1)

    def receive_ahead(self, batches: Mapping[str, Sequence[int]]) -> None:
        """Receive now, per crossing, what its producer has already sent for these batches (not yet forwarded
        here); their forwards take it from here (``runtime.pipeline.worker``: a consistent cut of a stale pipeline)."""
        for crossing in self.cut.receives:
            for batch in batches.get(crossing.name, ()):
                self._ahead.setdefault(batch, {})[crossing.name] = self._receive(
                    self.samples(batch), crossing.name, crossing.producer, 2 * crossing.tag)

    def in_flight(self) -> InFlight:
        """The batches forwarded and not yet backwarded (their stashed inputs, draws' keys and RNG states; the
        last stage's losses of them) and the crossings received ahead, as tensors to save (batch numbers of
        this run)."""
        stashed = sorted(self._stash)
        return {"stash": {b: saved_stash(self._stash[b]) for b in stashed},
                "losses": [loss.cpu().clone() for loss in self.losses[len(self.losses) - len(stashed):]]
                if self.last and stashed else [],
                "ahead": {b: {n: t.detach().cpu().clone() for n, t in named.items()}
                          for b, named in self._ahead.items()}}

    def reinstall(self, saved: InFlight, shift: int = 0) -> None:
        """Take back the batches in flight :meth:`in_flight` saved, numbered ``shift`` lower in this run."""
        device = self._device()
        for batch, entry in saved["stash"].items():
            b = int(batch) - shift
            target = entry["target"]
            self._stash[b] = Stash(b, self.model_for(b), {n: as_leaf(t, device) for n, t in entry["inputs"].items()},
                                    tuple(t.to(device) for t in entry["x"]),
                                    None if target is None else target.to(device), DrawKey(*entry["key"]), entry["rng"])
        self.losses += [loss.to(device) for loss in saved["losses"]]
        for batch, named in saved["ahead"].items():
            self._ahead[int(batch) - shift] = {n: as_leaf(t, device) for n, t in named.items()}

    def finish_sends(self) -> None:
        """Wait until every posted send has completed."""
        wait_all([work for work, _, _ in self._sending], "the pipeline's sends to the neighbouring stages",
                 [peer for _, _, peer in self._sending])
        self._sending = []

    def input_box(self, batch: int = 0) -> tuple[slice, ...]:
        """The first stage's slices of (micro-)batch ``batch`` it loads (of the first input), within that batch."""
        return self.model_for(batch).input_box()

    def input_boxes(self, batch: int = 0) -> tuple[tuple[slice, ...], ...]:
        """The first stage's slices of each input of (micro-)batch ``batch`` it loads, in argument order, within
        that batch."""
        return self.model_for(batch).input_boxes()

    def target_box(self, target_shape: Sequence[int], batch: int = 0) -> tuple[slice, ...]:
        """The last stage's slices of (micro-)batch ``batch``'s target (of ``target_shape``)."""
        return self.model_for(batch).target_box(target_shape)

    # --- computing -------------------------------------------------------------------------------------------

    def _compute(self, stash: Stash) -> None:
        model = stash.model
        env: dict[str, Any] = {name: model.value(name, operand(leaf), self.placements[name])
                               for name, leaf in stash.inputs.items()}  # run_nodes' environment
        env = model.run_nodes(env, stash.x if self.first else (), stash.key, keep={c.name for c in self.cut.sends})
        stash.outputs = {c.name: crossing_tensor(env[c.name]) for c in self.cut.sends}
        if self.last and self.keep_outputs:
            self.outputs[stash.batch] = map_aggregate(env["(output)"], detached)
        if self.last:
            assert stash.target is not None, "the last stage loads the target of every batch it forwards"
            stash.loss = model.loss(env["(output)"], stash.target, self.loss_fn) * self.loss_scale(stash.batch)

    def _recompute(self, stash: Stash) -> list[torch.Tensor]:
        """Run the forward of ``stash`` again, with the RNG as it was; returns the buffers as they were before."""
        buffers = [buffer.detach().clone() for buffer in self._buffers]
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(stash.rng)
            self._compute(stash)
        return buffers

    def _restore(self, saved: list[torch.Tensor]) -> None:
        """Put the buffers back (after backward: batch-norm may have saved its statistics for it)."""
        with torch.no_grad():
            for buffer, value in zip(self._buffers, saved):
                buffer.copy_(value)

    # --- communication ---------------------------------------------------------------------------------------

    def _stage_ranks(self, stage: int) -> tuple[int, ...]:
        return tuple(range(self.offsets[stage], self.offsets[stage] + self.sizes[stage]))

    def _moves(self, model: DistributedModel, name: str, held: Placement, producer: int, consumer: int,
               rank: int) -> CrossingMoves:
        """This rank's part in moving crossing ``name`` (at ``model``'s shapes) from stage ``producer`` to stage
        ``consumer``."""
        shape = geometry(model.layer_graph.nodes[name].output_shape, held)
        return crossing_moves(shape, held, self._stage_ranks(producer), wire_placement(held, self.sizes[consumer]),
                              self._stage_ranks(consumer), rank)

    def _send(self, tensor: torch.Tensor, box: Box, pieces: Sequence[tuple[int, Box]], stage: int, tag: int) -> None:
        """Post the sends of ``pieces`` of ``tensor`` (this rank's ``box``, in its value's geometry) to stage
        ``stage``."""
        whole = tensor.detach().reshape(box_extent(box))
        for peer, piece in pieces:
            part = box_view(whole, box, piece).contiguous()
            with exchange(f"the pipeline send to stage {stage}", [peer]):
                self._sending.append((_posted(dist.isend(part, peer, tag=tag)), part, peer))

    def _receive(self, size: int, name: str, stage: int, tag: int) -> torch.Tensor:
        """This rank's box of crossing ``name`` of a batch of ``size`` samples, from the members of stage ``stage``
        that hold it."""
        moves = self._incoming[size, name]
        graph = self._models[size].layer_graph
        shape = local_shape(graph.nodes[name].output_shape, self.placements[name], self.member)
        buffer = self._gathered(moves.box, moves.receives, f"the activation of {name}", stage, tag,
                                value_dtype(graph, name, self.dtype)).reshape(shape)
        return buffer.requires_grad_(buffer.is_floating_point() or buffer.is_complex())

    def _receive_gradient(self, size: int, name: str, stage: int, tag: int) -> torch.Tensor:
        """The gradient of this rank's box of crossing ``name`` (of a batch of ``size`` samples) that stage
        ``stage`` sends back (its pieces summed)."""
        moves = self._outgoing[size, name, stage]
        graph = self._models[size].layer_graph
        shape = local_shape(graph.nodes[name].output_shape, self._held[name], self.member)
        return self._gathered(moves.box, moves.sends, f"the gradient of {name}", stage, tag,
                              value_dtype(graph, name, self.dtype)).reshape(shape)

    def _gathered(self, box: Box, pieces: Sequence[tuple[int, Box]], what: str, stage: int, tag: int,
                  dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``dtype`` covering ``box``, zero but where ``pieces`` arrive (each from its peer)."""
        started = time.perf_counter()
        whole = len(pieces) == 1 and pieces[0][1] == box  # one peer sends it all (equal stages): no copy
        result = (torch.empty if whole else torch.zeros)(box_extent(box), dtype=dtype, device=self._device())
        buffers = [result if whole else torch.empty(box_extent(piece), dtype=dtype, device=self._device())
                   for _, piece in pieces]
        with exchange(f"the pipeline receive of {what} from stage {stage}", [peer for peer, _ in pieces]):
            requests = [_posted(dist.irecv(buffer, peer, tag=tag)) for (peer, _), buffer in zip(pieces, buffers)]
            for request in requests:
                request.wait()
        if not whole:
            for (_, piece), buffer in zip(pieces, buffers):
                box_view(result, box, piece).add_(buffer)
        self._waited += time.perf_counter() - started
        return result

    def _reap_sends(self) -> None:
        completed = [sending[0].is_completed() for sending in self._sending]
        done = [sending for sending, finished in zip(self._sending, completed) if finished]
        wait_all([work for work, _, _ in done], "the pipeline's sends to the neighbouring stages",
                 [peer for _, _, peer in done])  # instant; raises if a send failed
        self._sending = [sending for sending, finished in zip(self._sending, completed) if not finished]

    def _device(self) -> torch.device:
        return next((p.device for p in self.model.model.parameters()), torch.device("cpu"))

    def _straggle(self, event: Event, start_s: float, end_s: float, waited_s: float) -> float:
        if self.slowdown <= 1.0 or event.kind == "U":
            return end_s
        time.sleep((self.slowdown - 1.0) * max(0.0, end_s - start_s - waited_s))
        return time.perf_counter()


_PHASES: dict[EventKind, str] = {"F": "forward", "B": "backward", "U": "update"}


def _summed(parts: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum(parts)`` of one or more tensors (a crossing has at least one consumer)."""
    total = sum(parts)
    assert isinstance(total, torch.Tensor), "a crossing value has at least one consumer"
    return total


def value_dtype(graph: LayerGraph, name: str, activations: torch.dtype) -> torch.dtype:
    """The dtype crossing ``name`` travels in: the complex counterpart of the ``activations`` dtype where
    tracing recorded a complex output (``attrs["output_dtype"]``), the recorded dtype of an integer or boolean
    output, else ``activations``."""
    recorded = graph.nodes[name].attrs.get("output_dtype") if name in graph else None
    if not recorded:
        return activations
    made = getattr(torch, recorded)
    return COMPLEX_OF.get(activations, made) if made.is_complex else made


def _posted(work: Work | None) -> Work:
    """A request of a point-to-point exchange posted on the default group (every rank is a member)."""
    assert work is not None, "every rank is a member of the default group"
    return work
