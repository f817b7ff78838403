"""What a training loop asks of a :class:`runtime.apply.DistributedModel`: which box of each input to load, the
whole output, this rank's share of the loss (a mixin of the model, which holds the plan, the graph and ``_fetch``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from math import prod
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.fx import Node

from cost_models.errors import PlanError
from cost_models.layout import Layout
from runtime._values import Value, copies, geometry
from runtime.groups import block_of
from runtime.inputs import input_boxes
from runtime.outputs import Everywhere, paired, select_nodes, select_value
from runtime.placement import Placement, value_placement
from runtime.redistribute import replicated
from runtime.split_loss import LossGrid, Parts, Unsplittable, split_loss_share
from runtime.waiting import exchange

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from runtime.gradsync import GradientSync
    from runtime.groups import GroupCache

__all__ = ["DataHelpers"]

_WARNED: set[tuple[str, str]] = set()
"""The losses (name, why) this process said it takes of the gathered output."""


class DataHelpers:
    """Input boxes, the gathered output and the loss share of a distributed model (``runtime.apply``)."""

    # what the model holds (set by runtime.apply.DistributedModel)
    plan: Plan
    layer_graph: LayerGraph
    ranks: tuple[int, ...]
    member: int
    input_placements: tuple[Placement, ...]
    gradients: GradientSync
    groups: GroupCache
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The loss :meth:`loss` takes when it is given none (``parplan run --loss``, ``runtime.losses``)."""
    _unsplittable_losses: dict[int, str]
    """Why each loss function (by ``id``) cannot be kept split, for those that cannot (``_loss_share``)."""
    _output_node: Node
    _output_key: str | None
    _fetch: Callable[[Value, Placement], torch.Tensor]
    """This rank's box of a value in another placement (``DistributedModel._fetch``)."""

    @property
    def input_placement(self) -> Placement:
        """The placement of the model's (first) input: the one its first layer reads (loading it there is free)."""
        return self.input_placements[0]

    @property
    def output_placement(self) -> Placement:
        """The placement of the output :meth:`forward` returns."""
        return value_placement(self.plan.layers[self._output_name].layout, self.layer_graph.nodes[self._output_name])

    @property
    def _output_name(self) -> str:
        return self.output_name

    @property
    def output_key(self) -> str | None:
        """The part of the output the loss is taken of (``--output``, ``runtime.outputs``); ``None``: all of it."""
        return self._output_key

    @output_key.setter
    def output_key(self, key: str | None) -> None:
        select_nodes(self._output_node.args[0], key)  # a key naming no part is refused (PlanError, the parts named)
        self._output_key = key
        self.__dict__.pop("output_name", None)

    @cached_property
    def output_name(self) -> str:
        """The layer whose output the loss's target is shaped for: the model's first output tensor (the first
        one inside a returned (named) tuple, as torchvision's GoogLeNet returns its logits and auxiliaries), or
        the first of the part :attr:`output_key` names."""
        chosen = select_nodes(self._output_node.args[0], self._output_key)
        leaves = [name for name, _ in paired(chosen, Everywhere())]
        return next((name for name in leaves if name in self.layer_graph.nodes), self.layer_graph.graph["outputs"][0])

    def input_box(self) -> tuple[slice, ...]:
        """The slices of the global ``(N, C, H, W)`` batch (the first input) this rank must load."""
        return self.input_boxes()[0]

    def input_boxes(self) -> tuple[tuple[slice, ...], ...]:
        """The slices of each global input this rank must load, in the forward's argument order."""
        return input_boxes(self.input_placements, self.layer_graph.input_shapes, self.member)

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's box of a full global batch (the first input)."""
        return batch[self.input_box()].contiguous()

    def shard_inputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """This rank's box of each full global input, in argument order (what :meth:`forward` takes)."""
        return tuple(whole[box].contiguous() for whole, box in zip(inputs, self.input_boxes()))

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The whole output on every rank, from this rank's box of it (differentiable).

        Every rank must compute the same function of it — a loss taken whole, as the unsplit model takes it
        (a Dice loss) — and call ``backward`` on it: each rank's gradient is then its own box of the whole
        gradient (``runtime.redistribute.replicated``), and the summed parameter gradients are the unsplit
        model's. A gathered value used differently on different ranks (a loss on rank 0 only) loses the other
        ranks' part of the gradient; take such a loss with :meth:`loss` instead.
        """
        return self._gathered(local, self.output_placement, self._output_shape())

    def _output_shape(self) -> tuple[int, ...]:
        return tuple(self.layer_graph.nodes[self._output_name].output_shape)

    def loss_placement(self) -> Placement:
        """Where :meth:`loss` evaluates the loss: the output's placement with every channel (class) whole."""
        return Placement(self.output_placement.layout, "c", self.output_placement.order)

    def target_box(self, target_shape: Sequence[int], *, member: int | None = None) -> tuple[slice, ...]:
        """The slices of a global target (``(N,)`` labels, ``(N, H, W)`` maps — ``(N, D, H, W)`` of a volume — or
        the output's shape) this rank (or ``member``) needs."""
        shape, placement = self._output_shape(), self.loss_placement()
        box = placement.box(geometry(shape, placement), self.member if member is None else member)
        ranges = dict(zip(placement.order, box)) if placement.holds(shape) else {"n": box[0]}
        return tuple(slice(*ranges[axis]) if axis in ranges else slice(None)
                     for axis in self._target_axes(len(target_shape)))

    def _target_axes(self, ndim: int) -> str:
        """The axis each dimension of a target with ``ndim`` dimensions is split along (``.``: none)."""
        shape, placement = self._output_shape(), self.loss_placement()
        known = {5: {1: "n", 4: "ndhw", 5: "ncdhw"}, 3: {1: "n", 2: "nw", 3: "ncw"},
                 4: {1: "n", 2: "nc", 3: "nhw", 4: "nchw"}}
        if placement.holds(shape) and len(shape) in known and ndim in known[len(shape)]:
            return known[len(shape)][ndim]
        return "n" + "." * (ndim - 1)  # held flattened, (N, features): split by samples only

    def loss(self, local_output: object, local_target: torch.Tensor,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's share of the unsplit loss: the shares summed over the ranks are the loss, and their
        gradients its gradient.

        ``loss_fn(output, target)`` (default :attr:`loss_fn`, ``F.cross_entropy``) is the loss as written
        for the unsplit model — a mean of per-position terms (``cross_entropy``, ``mse_loss``, …), or one
        built from sums over the whole batch (MONAI's ``DiceLoss``, ``DiceCELoss``, ``TverskyLoss``,
        ``GeneralizedDiceLoss``, a Dice written by hand). It runs on this rank's box of the output and target,
        kept split (``runtime.split_loss``: sums over split dimensions are added up over the ranks, with their
        adjoint); a loss doing something that cannot be kept split (a softmax along a split dimension, a count
        taken from a tile's shape) is taken of the gathered output instead, with one warning naming the memory
        that costs. ``local_target`` is ``target[target_box(target.shape)]``.

        A model returning a dict, tuple or list (what :meth:`forward` returns): the loss is the sum of
        ``loss_fn`` over its floating tensor outputs (those of the part :attr:`output_key` names), each against
        the same target (:func:`runtime.outputs.output_loss`).
        """
        loss_fn = loss_fn or self.loss_fn
        shares = [self._loss_share(name, tensor, local_target, loss_fn) for name, tensor in self.outputs(local_output)]
        if not shares:
            raise PlanError("the model's output holds no floating tensor to take a loss of")
        return sum(shares[1:], shares[0])

    @property
    def losses_taken_whole(self) -> tuple[str, ...]:
        """Why each loss :meth:`loss` took of the gathered output could not be kept split (empty: none)."""
        return tuple(self._unsplittable_losses.values())

    def outputs(self, local_output: object) -> list[tuple[str, torch.Tensor]]:
        """The floating tensor outputs in ``local_output`` (what :meth:`forward` returns; of its part
        :attr:`output_key`), with their layer names."""
        local = select_value(local_output, self._output_key)
        if isinstance(local, torch.Tensor):
            return [(self._output_name, local)]
        return [(name, value) for name, value in paired(select_nodes(self._output_node.args[0], self._output_key),
                                                         local) if isinstance(value, torch.Tensor)
                and value.is_floating_point()]

    def _loss_share(self, name: str, local: torch.Tensor, local_target: torch.Tensor,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        shape = tuple(self.layer_graph.nodes[name].output_shape)
        if shape != self._output_shape():
            raise PlanError(f"output '{name}' has shape {shape} but the loss's target is for the first output "
                            f"'{self._output_name}' {self._output_shape()}; every floating output enters the loss "
                            f"against the same target, so give them one shape (or return only the first)")
        source = value_placement(self.plan.layers[name].layout, self.layer_graph.nodes[name])  # any stage's
        unsplittable = self._unsplittable_losses.get(id(loss_fn))
        if unsplittable is None:
            output = self._fetch(Value(local, source, shape), self.loss_placement())
            try:
                grid = self._loss_grid()
                return split_loss_share(loss_fn, output, local_target, self._loss_parts(output.dim(), grid),
                                        self._loss_parts(local_target.dim(), grid, target=True), grid)
            except Unsplittable as err:
                unsplittable = self._unsplittable_losses[id(loss_fn)] = err.what
                self._warn_gathered(loss_fn, unsplittable, shape, local.dtype)
        whole = loss_fn(self._gathered(local, source, shape), self._whole_target(local_target))
        # its value a 1/ranks share; its gradient the whole loss's, each rank's its own box (``replicated``)
        return whole - whole.detach() * (1 - 1 / len(self.ranks))

    def _warn_gathered(self, loss_fn: object, why: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
        if self.member == 0 and (name, why) not in _WARNED:  # once per process and loss
            _WARNED.add((name, why))
            size_mib = prod(shape) * dtype.itemsize / 2**20
            warnings.warn(f"the loss {name} is taken of the whole "
                          f"output gathered on every rank ({size_mib:.1f} MiB per rank): it cannot be kept split "
                          f"({why})", stacklevel=4)

    def _loss_parts(self, ndim: int, grid: LossGrid, *, target: bool = False) -> Parts:
        """How the ranks hold the loss placement's output (or a target with ``ndim`` dimensions)."""
        shape = self._output_shape()
        placement = self.loss_placement()
        axes = self._target_axes(ndim) if target else (
            placement.order if placement.holds(shape) else "n" + "." * (ndim - 1))
        extent = dict(zip(placement.order, shape)) if placement.holds(shape) else {"n": shape[0]}
        split = [axis in grid.parts and extent.get(axis, 1) > 1 for axis in axes]
        return Parts(tuple(frozenset(axis) if cut else frozenset() for axis, cut in zip(axes, split)),
                     tuple(extent[axis] if cut else -1 for axis, cut in zip(axes, split)))

    def _loss_grid(self) -> LossGrid:
        """The axes the loss placement splits, and the groups a loss's sums may be added over."""
        placement = self.loss_placement()
        parts = {axis: getattr(placement.layout, axis) for axis in "ndhw" if placement.keeps(axis)}
        groups = []
        for kind, axes in (("spatial", "dhw"), ("samples", "ndhw")):
            members = block_of(placement.layout, len(self.ranks), kind, self.member)
            groups.append((frozenset(parts) & frozenset(axes), self.groups.get(tuple(self.ranks[q] for q in members))))
        return LossGrid(parts, len(self.ranks), tuple(groups))

    def _gathered(self, local: torch.Tensor, source: Placement, shape: tuple[int, ...]) -> torch.Tensor:
        everything = Placement(Layout(), "nchw")
        cut = geometry(shape, source)
        return replicated(local, lambda tensor: self._fetch(Value(tensor, source, shape), everything), cut,
                          source.box(cut, self.member), copies(cut, source, len(self.ranks), self.member))

    def _whole_target(self, local: torch.Tensor) -> torch.Tensor:
        """The whole target from every rank's box of it (``local``: this rank's)."""
        members = block_of(self.loss_placement().layout, len(self.ranks), "samples", self.member)
        group = self.groups.get(tuple(self.ranks[q] for q in members))
        if group is None:
            return local
        parts = self._loss_parts(local.dim(), self._loss_grid(), target=True)
        whole_shape = [extent if axes else size for axes, extent, size in zip(parts.axes, parts.extents, local.shape)]
        boxes = [self.target_box(whole_shape, member=q) for q in members]
        return _gather_boxes(local, boxes, whole_shape, group)

    @staticmethod
    def global_value(share: torch.Tensor) -> float:
        """The sum over all ranks of a scalar share (e.g. :meth:`loss`), as a float."""
        summed = share.detach().clone().reshape(1)
        if dist.is_initialized():
            with exchange("the loss allreduce"):
                dist.all_reduce(summed)
        return float(summed.item())

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without summing them over ranks (see ``GradientSync.no_sync``)."""
        with self.gradients.no_sync():
            yield


def _gather_boxes(local: torch.Tensor, boxes: list[tuple[slice, ...]], shape: Sequence[int],
                  group: dist.ProcessGroup) -> torch.Tensor:
    """The whole tensor of ``shape`` from the box ``boxes[i]`` each member ``i`` of ``group`` holds (``local``:
    this rank's), padded to one size for ``all_gather``."""
    extents = [[len(range(*b.indices(size))) for b, size in zip(box, shape)] for box in boxes]
    largest = [max(sizes) for sizes in zip(*extents)]
    padded = local.new_zeros(largest)
    padded[tuple(slice(0, size) for size in local.shape)] = local
    received = [torch.empty_like(padded) for _ in boxes]
    with exchange("gathering the target for a loss taken whole"):
        dist.all_gather(received, padded.contiguous(), group=group)
    whole = local.new_empty(list(shape))
    for box, sizes, part in zip(boxes, extents, received):
        whole[box] = part[tuple(slice(0, size) for size in sizes)]
    return whole
