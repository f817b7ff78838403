"""``apply_plan``: run the user's own model under a Plan on torch.distributed, equal to the unsplit model.

The model is traced with torch.fx (the same tracer as ``parplan inspect``, so
node names are the plan's layer names) and its fingerprint is checked against
the plan's. :class:`DistributedModel` then interprets the traced graph on each
rank: every tensor value is this rank's box of the unsplit tensor in a
:class:`runtime.placement.Placement`; before a layer runs, each input is
redistributed to the placement the layer reads (``runtime.layers``), and the
layer computes its own box of the output under its Layout. Moved tensors are
kept for the other readers of the same value in the same forward pass.
Python values computed from shapes (``x.shape``, ``x.size(0)``) are the
unsplit program's, evaluated once from the traced shapes, and views with
written sizes take this rank's extent (``runtime.shapes``); random layers
draw keyed masks, the same on every rank as in the unsplit model
(``runtime.random_ops``, keys by :attr:`DistributedModel.draw_key`).
Layers computed from parameters and constants alone, and those made from
the batch's shapes but none of its values (``torch.arange(H)``), run whole on
every rank whatever the plan says (:func:`held_plan`); element-wise layers
read the part of such a tensor (of any tensor every rank holds whole) that
broadcasts onto their box, other layers their box of it. A call that makes no traced
tensor (a module returning ``(out, None)``) reads its tensor inputs where
they are when they split samples only, otherwise whole; the layers reading
its result move it to their own placement.

What changes on the user's model (in place, as FSDP does): the weights of
layers split by channel are replaced by this rank's slice of them (and
batch-norm's running statistics by their slice). Every other parameter stays
whole, and :class:`runtime.gradsync.GradientSync` sums each gradient over the
ranks that hold it at the end of backward.

Data helpers keep the training loop ordinary: :meth:`DistributedModel.input_box`
says which part of the global batch this rank must load (large samples are
never loaded whole; :meth:`~DistributedModel.input_boxes`: of each input, for a
model taking several tensors, ``forward(x, cond)``, which :meth:`forward` then
takes in the same order — ``runtime.inputs``), :meth:`~DistributedModel.shard`
cuts it from a full batch,
:meth:`~DistributedModel.gather` returns the whole output, and
:meth:`~DistributedModel.loss` gives this rank's share of the unsplit
(global-batch mean) loss — their sum over the ranks is the unsplit loss (for a
model returning a dict, tuple or list: summed over its floating outputs).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.fx import Node

from cost_models.dense_forms import reads_in_row_form
from cost_models.errors import PlanError
from cost_models.formats.plan import Plan
from cost_models.ir.tracing import symbolic_trace, trace
from cost_models.layout import Layout
from runtime._values import (
    Held,
    Value,
    call_node,
    from4d,
    geometry,
    in_geometry,
    last_reads,
    local_shape,
    plain,
    plain_args,
    reshape_and_cut,
    reshapes_whole,
    resolve,
    same_boxes,
)
from runtime.boxes import nd_box
from runtime.direct import runs_directly
from runtime.gradsync import GradientSync
from runtime.groups import GroupCache, gradient_group_ranks, group_ranks, this_rank, world_size
from runtime.inputs import input_names, input_placements, placeholder_inputs
from runtime.layer_times import LAYER_RANGE
from runtime.layers import HANDLERS, FunctionalForm, Site, functional_form, input_placement
from runtime.outputs import is_container, output_loss
from runtime.pipeline.nodes import nodes_of_stage, parameters_of
from runtime.placement import Placement, box_extent, broadcast_part
from runtime.preflight import check_plan, held_plan, refuse_shapes, refuse_sites
from runtime.random_ops import DrawKey, keyed_call, random_ops, switched_off
from runtime.redistribute import redistribute
from runtime.shapes import (
    ELEMENTWISE_KINDS,
    constant_nodes,
    local_call,
    module_attribute,
    static_nodes,
    static_values,
    tensor_names,
    view_form,
)
from runtime.slicing import slice_parameters
from runtime.training_io import DataHelpers
from runtime.waiting import at, place

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["DistributedModel", "apply_plan", "is_container", "local_shape", "output_loss"]


_T = TypeVar("_T")

_METADATA_METHODS = frozenset({"is_floating_point", "is_complex", "is_contiguous", "is_signed", "element_size",
                               "get_device", "type"})
"""Tensor methods that read what every box of a tensor shares (its dtype, device, layout), not its values."""


def apply_plan(model: nn.Module, plan: Plan, ranks: Sequence[int] | None = None, sync_batchnorm: bool = False,
               leaf_modules: Sequence[str] = (), graph: LayerGraph | None = None, timeout: timedelta | None = None, *,
               random_seed: int = 0, output: str | None = None) -> DistributedModel:
    """Prepare ``model`` to train under ``plan`` on ``ranks`` (default: every rank of the default group).

    Collective: every rank of the default process group must call it (it creates process groups).

    Args:
        model: The user's model, identically initialised on every rank; modified in place (sliced weights).
        plan: A single-stage plan made for this model at ``plan.input_shape``.
        ranks: The global ranks the plan's devices map to, in order.
        sync_batchnorm: Batch-norm statistics over the whole batch, as the unsplit model computes them
            (needed for a sample split to equal the unsplit model exactly). By default they are summed over
            the tiles of each group of samples only — the statistics of data parallelism, and what the cost
            model prices.
        leaf_modules: Modules the plan's tracing kept opaque (``--leaf-module``).
        graph: The model's ``LayerGraph`` at the plan's input shape and dtype, when the caller has traced it
            already (its fingerprint is still checked against the plan's).
        timeout: How long the process groups this creates may wait for a peer (default: torch's).
        random_seed: The seed of the random layers' keyed draws (``runtime.random_ops``): the same on every
            rank, and on the unsplit model they are compared with.
        output: The part of the model's output the loss is taken of (``--output``: a dict key, a named tuple
            field or an index; ``runtime.outputs``); ``None``: every floating output.

    Raises:
        PlanError: The plan was made for another model or input, has pipeline stages, needs another number of
            ranks, or asks for a split this runtime cannot execute (each named).
    """
    graph = graph if graph is not None else trace(model, plan.shapes, getattr(torch, plan.dtype), leaf_modules)
    world = tuple(ranks) if ranks is not None else tuple(range(world_size()))
    check_plan(plan, graph, len(world))
    if plan.pipeline.pipelined:
        raise PlanError(f"the plan has {plan.pipeline}; run it with runtime.pipeline.stage.apply_pipeline (parplan run "
                        f"does), or make one with --max-stages 1 (and no recomputation)")
    split = DistributedModel(model, plan, graph, world, sync_batchnorm, tuple(leaf_modules), timeout=timeout,
                             random_seed=random_seed)
    split.output_key = output
    return split


class DistributedModel(DataHelpers, nn.Module):
    """The user's model executing its plan on this rank (see the module docstring)."""

    def __init__(self, model: nn.Module, plan: Plan, graph: LayerGraph, ranks: tuple[int, ...], sync_batchnorm: bool,
                 leaf_modules: tuple[str, ...], stage_nodes: Collection[str] | None = None,
                 groups: GroupCache | None = None, timeout: timedelta | None = None, *, random_seed: int = 0) -> None:
        """Without ``stage_nodes``, the whole model; with them, one pipeline stage (``runtime.pipeline.stage``).

        ``groups``, when given, already holds every process group this model needs (a pipeline builds
        the groups of all its stages on every rank); otherwise they are built here, collectively, each
        waiting at most ``timeout`` for a peer.
        """
        super().__init__()
        self.model = model
        self.plan, self.layer_graph, self.ranks = plan, graph, ranks
        self.member = ranks.index(this_rank()) if dist.is_initialized() else 0
        program = symbolic_trace(model, leaf_modules, shapes=graph.input_shapes)
        nodes = list(program.graph.nodes)
        self._nodes = nodes if stage_nodes is None else nodes_of_stage(nodes, stage_nodes)
        self._drops = last_reads(self._nodes)  # values no later node reads: dropped as soon as they are read
        self._output_node = next(node for node in nodes if node.op == "output")
        self._output_key: str | None = None
        self.groups = groups if groups is not None else GroupCache(tuple(range(world_size())), timeout)
        self._unsplittable_losses: dict[int, str] = {}
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
        self.constants = constant_nodes(nodes, frozenset(graph.nodes))
        """Layers computed from parameters and constants alone: whole on every rank (``runtime.shapes``)."""
        self._all_nodes, self._sync_batchnorm = nodes, sync_batchnorm
        held = self._shaped(graph)
        self._inputs = placeholder_inputs(nodes, len(graph.input_shapes))  # placeholder -> the input it is fed
        self._reads_inputs = any(node.op == "placeholder" for node in self._nodes)
        self.random = random_ops(self._nodes, model)
        """This model's random ops (``runtime.random_ops``); the keyed ones draw by :attr:`draw_key`."""
        direct = stage_nodes is None and runs_directly(
            nodes, graph, {name: a.layout for name, a in held.layers.items()}, self.input_placements,
            ranks=len(ranks), member=self.member, sync_batchnorm=sync_batchnorm, random=self.random)
        self._program: tuple[nn.Module, ...] = (program,) if direct else ()
        """The traced program, when this plan runs it as written (``runtime.direct``); kept in a tuple so that its
        parameters (the model's own) are not registered twice."""
        self.random_seed = random_seed
        self.draw_key: DrawKey | None = None
        """The key of the next forwards' draws; ``None``: ``(random_seed, forwards run so far, 0)``."""
        self.switch_off_random = False
        """When set, switchable unkeyed random ops run in their evaluation form (``--verify``)."""
        self._forwards = 0
        self._key = DrawKey(random_seed, 0)
        owned = (lambda: parameters_of(self._nodes, model)) if stage_nodes is not None else model.parameters
        shared, self.slices = slice_parameters(self.sites.values(), self.member, model, owned)
        self.own_parameters: list[nn.Parameter] = list(owned())
        """The parameters this rank trains (the whole model's, or its stage's)."""
        if groups is None:
            self.groups.build(self.group_ranks())
            self.groups.build_gradients(gradient_group_ranks((site.layout for site in self.sites.values()), ranks))
        self.gradients = GradientSync({tuple(ranks[q] for q in members): params
                                       for members, params in shared.items()}, self.groups)
        self.gradients.install()
        self.layer_ranges = False
        """When set, each layer runs inside a profiler range ``parplan.layer:NAME`` (``runtime.layer_times``)."""

    def _shaped(self, graph: LayerGraph) -> Plan:
        """Set what depends on the inputs' shapes (``graph``, the model traced at them): each layer's site, where
        each input is loaded, the shape reads' values; returns the plan as held (``held_plan``).

        Raises:
            PlanError: A layer the plan splits cannot be split at these shapes.
        """
        nodes, plan, ranks = self._all_nodes, self.plan, self.ranks
        self.layer_graph = graph
        held = held_plan(plan, nodes, graph)
        self.sites = _sites(self._nodes, self.model, held, graph, self.member, ranks, self.groups, self._sync_batchnorm)
        placements = input_placements(nodes, {name: a.layout for name, a in held.layers.items()}, graph, len(ranks))
        self.input_placements: tuple[Placement, ...] = tuple(placements.values())
        """Where each model input is loaded, in argument order: where its first layer reads it (``runtime.inputs``)."""
        refuse_sites(self.sites.values())
        refuse_shapes(nodes, self.model, held, graph, len(ranks))
        self._static = static_values(static_nodes(nodes, tensor_names(graph)),
                                     lambda name: graph.nodes[name].output_shape, device=_device_of(self.model))
        """Shape reads and the values computed from them alone, as the unsplit program has them (``runtime.shapes``)."""
        return held

    def reshaped(self, graph: LayerGraph) -> DistributedModel:
        """This pipeline stage on inputs of other shapes (``graph``: the model traced at them — a pipeline's
        smaller micro-batch): its own layer geometry, and the same parameters (sliced once), gradient sums,
        process groups and random ops.

        Raises:
            PlanError: The model runs whole (not a stage), or a layer cannot be split at these shapes.
        """
        if self._program:
            raise PlanError("only a pipeline stage runs on several input shapes; trace the model at each instead")
        other = copy.copy(self)
        other._shaped(graph)
        return other

    # --- forward -------------------------------------------------------------------------------------------

    def forward(self, *inputs: torch.Tensor) -> object:
        """This rank's box of the output, from its box of each input (:meth:`input_boxes`), in argument order."""
        if self._program and not self.layer_ranges:
            self._check_inputs(inputs)
            self._forwards += 1
            self.gradients.where = place()
            return self._program[0](*inputs)
        return self.run_nodes({}, inputs)["(output)"]

    @property
    def runs_directly(self) -> bool:
        """Whether :meth:`forward` runs the traced program as written (``runtime.direct``): pure sample splits."""
        return bool(self._program)

    def run_nodes(self, env: dict[str, Any], inputs: Sequence[torch.Tensor] = (), key: DrawKey | None = None,
                  keep: Collection[str] = ()) -> dict[str, Any]:
        """Run this model's nodes on ``env`` (values by node name, :meth:`value` for received ones); returns it,
        holding the values named in ``keep`` and the output, each other value dropped after its last reader.

        The model's ``inputs`` (this rank's box of each, in argument order) are needed when the nodes
        include the placeholders; the output node's value is stored under ``"(output)"``. Random ops draw by
        ``key`` (default: :attr:`draw_key`).
        """
        if self._reads_inputs:
            self._check_inputs(inputs)
        self._key = key or self.draw_key or DrawKey(self.random_seed, self._forwards)
        self._forwards += 1
        self.gradients.where = place()  # backward may run on other threads (CUDA), outside the forward's labels
        for name, value in self._static.items():  # every stage has them: they depend on traced shapes only
            env.setdefault(name, value)
        for node, drops in zip(self._nodes, self._drops):
            self._run_node(node, env, inputs)
            for name in drops:
                if name not in keep:
                    env.pop(name, None)
        return env

    def _run_node(self, node: Node, env: dict[str, object], inputs: Sequence[torch.Tensor]) -> None:
        if node.name in self._static:
            return
        if node.op == "placeholder":
            index = self._inputs[node.name]
            env[node.name] = Value(inputs[index], self.input_placements[index], self.layer_graph.input_shapes[index])
        elif node.op == "get_attr":
            env[node.name] = module_attribute(self.model, str(node.target))
        elif node.op == "output":
            env["(output)"] = plain_args(node.args[0], env)
        elif self.layer_ranges and node.name in self.plan.layers:
            with torch.profiler.record_function(f"{LAYER_RANGE}{node.name}"), at(f"layer {node.name}"):
                env[node.name] = self._run(node, env)
        else:
            with at(f"layer {node.name}"):
                env[node.name] = self._run(node, env)

    def _check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        """Refuse another number of inputs than the model takes (naming them and this rank's boxes)."""
        shapes = self.layer_graph.input_shapes
        if len(inputs) != len(shapes):
            boxes = [tuple(s.stop - s.start for s in box) for box in self.input_boxes()]
            names = ", ".join(input_names(self._nodes, len(shapes)))
            raise PlanError(f"the model takes {len(shapes)} input(s) ({names}), this rank's boxes of them {boxes}, "
                            f"but it was given {len(inputs)}; pass each input's box (input_boxes()) in argument order")

    def value(self, name: str, tensor: torch.Tensor, placement: Placement) -> Value:
        """Wrap this rank's box ``tensor`` of the value ``name`` (under ``placement``) for :meth:`run_nodes`."""
        return Value(tensor, placement, self.layer_graph.nodes[name].output_shape)

    def _run(self, node: Node, env: dict[str, object]) -> object:
        if is_container(node):  # a (named) tuple of layers' values: each stays where its layer put it
            return call_node(node, self.model, *resolve(node, lambda n: env[n.name]))
        site = self.sites.get(node.name)
        if site is None:  # not a tensor layer (x.device, a call returning (out, None), …)
            return self._untraced(node, env)
        if any(isinstance(env[n.name], Held) for n in node.all_input_nodes):
            return self._from_held(node, site, env)
        value = self._layer(node, site, env)
        return plain(value) if node.name in self.constants else value  # whole on every rank: a plain tensor

    def _layer(self, node: Node, site: Site, env: dict[str, object]) -> object:
        op = self.random.get(node.name)
        if op is not None and (op.keyed or (op.switchable and self.switch_off_random)):
            return self._wrap(site, self._draw(node, site, env))
        inputs = [n for n in node.all_input_nodes if n.name in self.layer_graph]  # the trace's input_shapes
        inputs += [n for n in node.all_input_nodes if n not in inputs and isinstance(env[n.name], torch.Tensor)]
        if site.kind == "adaptive_avgpool":
            pooled = env[inputs[0].name]
            if isinstance(pooled, Value) and self._pools_tiles(site, pooled):
                return self._global_pool(site, pooled)
        form, read = view_form(node), env[node.all_input_nodes[0].name] if node.all_input_nodes else None
        if form in ("reshape", "expand") and not isinstance(read, Value):
            return self._wrap(site, self._cut_whole(node, site, env))  # a view of a parameter or constant
        if form == "reshape" and isinstance(read, Value) and reshapes_whole(read.placement, read.shape, site.placement,
                                                                             site.layer.output_shape):
            source = self._fetch(read, Placement(site.layout, "dhw"))  # every token (a split of them: gathered)
            return self._wrap(site, reshape_and_cut(source, site.layer.output_shape, site.placement, self.member))
        if form is not None:  # sizes written in the call: this rank's extent of the output (runtime.shapes)
            args, kwargs = resolve(node, self._operand(site, env, broadcast=False))
            extent = local_shape(site.layer.output_shape, site.placement, self.member)
            return self._wrap(site, local_call(node, form, args, kwargs, extent))

        def fetch(index: int, placement: Placement) -> torch.Tensor:
            value = env[inputs[index].name]
            assert isinstance(value, (Value, torch.Tensor)), f"'{site.name}' reads a {type(value).__name__}"
            return self._fetch(value, placement)

        call = functional_form(site, node.target)
        if call is not None:
            return self._wrap(site, self._functional_call(node, site, env, call))
        handler = HANDLERS.get(site.kind)
        out: object = handler(site, fetch) if handler is not None else None
        if out is None:
            out = call_node(node, self.model, *resolve(node, self._operand(site, env, site.kind in ELEMENTWISE_KINDS)))
        return self._wrap(site, out)

    def _untraced(self, node: Node, env: dict[str, object]) -> object:
        """A call that makes no traced tensor. Reading tensor metadata (``x.device``) or no tensor of the batch:
        plain Python on the local values. Otherwise its tensor inputs are read in one placement: theirs when
        they split samples only (the call must then treat dimension 0 as samples, as every layer under a
        sample split does), else whole on every rank — the unsplit call, exact whatever it computes."""
        split = [value for value in (env[n.name] for n in node.all_input_nodes) if isinstance(value, (Value, Held))]
        if not split or (node.op == "call_function" and node.target is getattr) or (
                node.op == "call_method" and node.target in _METADATA_METHODS):
            return call_node(node, self.model, *resolve(node, lambda n: plain(env[n.name])))
        held = {value.placement for value in split if isinstance(value, Held)}  # cannot move: the call takes
        placements = held or {value.placement for value in split}  # theirs, the tensors are fetched to it
        placement = next(iter(placements)) if len(placements) == 1 else Placement(Layout())
        if placement.layout.c * placement.layout.spatial > 1:
            placement = Placement(Layout())
        placement = Placement(placement.layout, placement.whole)  # samples only: no order (its results' ranks vary)
        return Held(call_node(node, self.model, *resolve(node, lambda n: self._held_input(node, env[n.name],
                                                                                           placement))), placement)

    def _held_input(self, node: Node, value: object, placement: Placement) -> object:
        if isinstance(value, Value):
            return self._fetch(value, placement)
        if isinstance(value, Held) and value.placement != placement:
            raise PlanError(f"'{node.name}' ({node.op} {node.target}) reads results of calls the trace did not shape "
                            f"computed under {value.placement} and {placement}; split their inputs alike")
        return plain(value)

    def _from_held(self, node: Node, site: Site, env: dict[str, object]) -> object:
        """A layer reading what an untraced call returned: computed in that placement, then moved to its own."""
        placement = next(value.placement for value in (env[n.name] for n in node.all_input_nodes)
                         if isinstance(value, Held))
        if site.kind in HANDLERS:
            raise PlanError(f"layer '{site.name}' ({site.kind}) reads what a call the trace did not shape returned; "
                            f"make that call return tensors only (or keep it inside a --leaf-module)")
        args, kwargs = resolve(node, lambda n: self._held_input(node, env[n.name], placement))
        form = view_form(node)
        if form is not None:  # sizes written in the call (mvitv2's x.reshape(B, H, W, C), H and W from its
            extent = local_shape(site.layer.output_shape, placement, self.member)  # attention): this rank's
            return self._wrap(site, self._fetch(Value(local_call(node, form, args, kwargs, extent), placement,
                                                       site.layer.output_shape), site.placement))
        out = call_node(node, self.model, args, kwargs)
        if not isinstance(out, torch.Tensor):
            return Held(out, placement)  # a tuple of tensors out of a nested result: still in that placement
        return self._wrap(site, self._fetch(Value(out, placement, site.layer.output_shape), site.placement))

    def _functional_call(self, node: Node, site: Site, env: dict[str, object], form: FunctionalForm) -> object:
        """``F.batch_norm`` (``F.group_norm``, ``F.conv2d``: ``form``) in the program: its statistics over the
        group (``runtime.layers``), its other arguments (filters) whole."""
        split = [n.name for n in node.all_input_nodes[1:] if isinstance(env[n.name], Value)]
        if split and site.layout.ranks > 1:
            raise PlanError(f"layer '{site.name}' ({site.kind} function, {site.layout}) takes statistics, weight or "
                            f"bias computed from the batch ({', '.join(split)}); split it by neither sample nor space")
        args, kwargs = resolve(node, self._operand(site, env, broadcast=False))
        out = form(site, args, kwargs)
        return out if out is not None else call_node(node, self.model, args, kwargs)

    def _cut_whole(self, node: Node, site: Site, env: dict[str, object]) -> torch.Tensor:
        """A view of a whole tensor with sizes from the batch's shapes: the whole view (the sizes are the unsplit
        program's), cut to this rank's box."""
        box = nd_box(site.layer.output_shape, site.placement, self.member)
        if box is None:
            dims = len(site.layer.output_shape)
            raise PlanError(f"layer '{site.name}' ({site.kind}, {site.layout}): its {dims}-D output cannot be split "
                            f"by channel; split it by sample only")
        whole = call_node(node, self.model, *resolve(node, lambda n: plain(env[n.name])))
        assert isinstance(whole, torch.Tensor), f"'{site.name}' ({site.kind}) made a {type(whole).__name__}"
        return whole[tuple(slice(start, stop) for start, stop in box)]

    def _operand(self, site: Site, env: dict[str, object], broadcast: bool) -> Callable[[Node], object]:
        """How the layer reads each input: a batch value in its input placement; a whole tensor (a parameter,
        a constant layer) whole, or — ``broadcast``: element-wise — its part broadcasting onto the output's box."""
        wanted = input_placement(site)
        box = nd_box(site.layer.output_shape, site.placement, self.member) if broadcast else None

        def value_of(node: Node) -> object:
            value = env[node.name]
            if box is not None and isinstance(value, Value) and value.placement.layout.ranks == 1:
                value = value.tensor  # whole on every rank (a layer made from shapes, …): as a whole operand
            if isinstance(value, Value):
                return self._fetch(value, wanted)
            if box is not None and isinstance(value, torch.Tensor) and value.dim() <= len(box):
                return broadcast_part(value, box)
            return value

        return value_of

    def _draw(self, node: Node, site: Site, env: dict[str, object]) -> torch.Tensor:
        """A random op's box of its output: keyed by the global indices of this rank's box, or switched off."""
        op, wanted = self.random[node.name], input_placement(site)
        args, kwargs = resolve(node, lambda n: self._fetch(env[n.name], wanted))
        if not op.keyed:
            return switched_off(op, site.module, args, kwargs)
        shape = site.layer.output_shape
        box = nd_box(shape, site.placement, self.member)
        if box is None:
            raise PlanError(f"random layer '{site.name}' ({op.form}) under {site.layout}: its {len(shape)}-D output "
                            f"{tuple(shape)} cannot be split by channel; split it by sample only")
        return keyed_call(op, site.module, args, kwargs, box=box, shape=shape, key=self._key,
                          training=self.model.training)

    def _wrap(self, site: Site, out: object) -> object:
        shape = site.layer.output_shape
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) and all(v is None for v in out[1:]) \
                and shape and not isinstance(shape[0], list):  # (out, None) (attention): out in the layer's box
            return (self._wrap(site, out[0]), *out[1:])  # its item reads it where it is (kept as a Value)
        if not isinstance(out, torch.Tensor):
            return out  # a tuple of tensors: kept whole (the plan gives such layers no split)
        placement = site.placement
        expected = box_extent(placement.box(geometry(shape, placement), self.member))
        if tuple(in_geometry(out, shape, placement).shape) != expected:
            raise PlanError(f"layer '{site.name}' ({site.kind}, {site.layout}) made a local tensor of shape "
                            f"{tuple(out.shape)} where its box is {expected}; this layer does not work on split "
                            f"tensors — give it a layout that splits by sample only")
        return Value(out, placement, shape)

    def _fetch(self, value: Value | _T, placement: Placement) -> torch.Tensor | _T:
        if not isinstance(value, Value):
            return value
        if placement.order != value.placement.order:  # a value is read in its own order (cost_models.ir.orders)
            placement = Placement(placement.layout, placement.whole, value.placement.order)
        cut = geometry(value.shape, value.placement)
        if same_boxes(cut, value.placement, placement, len(self.ranks)):
            return value.tensor
        if placement not in value.moved:
            moved = redistribute(in_geometry(value.tensor, value.shape, value.placement), cut, value.placement,
                                 placement, self.ranks)
            box = placement.box(cut, self.member)
            value.moved[placement] = moved if placement.holds(value.shape) else from4d(moved, value.shape, box)
        return value.moved[placement]

    def _pools_tiles(self, site: Site, value: Value) -> bool:
        out = site.layer.output_shape
        axes = value.placement.order[2:]
        return (len(out) in (3, 4, 5) and set(out[2:]) == {1}
                and value.placement.order in ("ncw", "nchw", "ncdhw") and len(out) == len(value.placement.order)
                and any(value.placement.keeps(axis) for axis in axes))  # tiles' sums over the spatial dims

    def _global_pool(self, site: Site, value: Value) -> object:
        from runtime.spatial import global_avg_pool2d

        layout = value.placement.layout
        tiles = Site(site.name, site.kind, layout, site.layer, None, self.member, self.ranks, self.groups, False)
        pooled = global_avg_pool2d(value.tensor, tuple(int(extent) for extent in value.shape[2:]),
                                   self.groups.get(tiles.block("spatial")))
        shape = site.layer.output_shape
        whole = value.placement.whole + "".join(set(value.placement.order[2:]) - set(value.placement.whole))
        held = Value(pooled, Placement(layout, "".join(sorted(whole)), value.placement.order), shape)
        return self._wrap(site, self._fetch(held, site.placement))

    # --- construction --------------------------------------------------------------------------------------

    def group_ranks(self) -> Iterator[tuple[int, ...]]:
        """The global ranks of every process group this model uses."""
        return group_ranks((site.layout for site in self.sites.values()), self.ranks)

def _sites(nodes: list[Node], model: nn.Module, plan: Plan, graph: LayerGraph, member: int, ranks: tuple[int, ...],
           groups: GroupCache, sync_batchnorm: bool) -> dict[str, Site]:
    sites = {}
    for node in nodes:
        if node.name in plan.layers:
            module = model.get_submodule(str(node.target)) if node.op == "call_module" else None
            sites[node.name] = Site(node.name, graph.nodes[node.name].kind, plan.layers[node.name].layout,
                                    graph.nodes[node.name], module, member, ranks, groups, sync_batchnorm,
                                    reads_in_row_form(node.name, plan, graph))
    return sites


def _device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s tensors live (its first parameter's or buffer's device; CPU when it has none): where
    this rank computes, what ``x.device`` reads on it (``runtime.shapes.static_values``)."""
    held = next(itertools.chain(model.parameters(), model.buffers()), None)
    return held.device if held is not None else torch.device("cpu")
