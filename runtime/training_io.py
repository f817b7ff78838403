"""What a training loop asks of a :class:`runtime.apply.DistributedModel`: which box of each input to load, the
whole output, this rank's share of the loss (a mixin of the model, which holds the plan, the graph and ``_fetch``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.fx import Node

from cost_models.errors import PlanError
from cost_models.layout import Layout
from runtime._values import Value, copies, geometry
from runtime.inputs import input_boxes
from runtime.outputs import Everywhere, paired, select_nodes, select_value
from runtime.placement import Placement, value_placement
from runtime.redistribute import replicated
from runtime.waiting import exchange

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph
    from runtime.gradsync import GradientSync

__all__ = ["DataHelpers"]


class DataHelpers:
    """Input boxes, the gathered output and the loss share of a distributed model (``runtime.apply``)."""

    # what the model holds (set by runtime.apply.DistributedModel)
    plan: Plan
    layer_graph: LayerGraph
    ranks: tuple[int, ...]
    member: int
    input_placements: tuple[Placement, ...]
    gradients: GradientSync
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
        source, shape = self.output_placement, self._output_shape()
        everything = Placement(Layout(), "nchw")
        cut = geometry(shape, source)
        return replicated(local, lambda tensor: self._fetch(Value(tensor, source, shape), everything), cut,
                          source.box(cut, self.member), copies(cut, source, len(self.ranks), self.member))

    def _output_shape(self) -> tuple[int, ...]:
        return tuple(self.layer_graph.nodes[self._output_name].output_shape)

    def loss_placement(self) -> Placement:
        """Where :meth:`loss` evaluates the loss: the output's placement with every channel (class) whole."""
        return Placement(self.output_placement.layout, "c", self.output_placement.order)

    def target_box(self, target_shape: Sequence[int]) -> tuple[slice, ...]:
        """The slices of a global target (``(N,)`` labels, ``(N, H, W)`` maps — ``(N, D, H, W)`` of a volume — or
        the output's shape) this rank needs."""
        shape, placement = self._output_shape(), self.loss_placement()
        box = [slice(start, stop) for start, stop in placement.box(geometry(shape, placement), self.member)]
        if len(shape) == 5 and placement.holds(shape):  # a volume's segmentation: maps are (N, D, H, W)
            n, c, d, h, w = box
            return {1: (n,), 4: (n, d, h, w), 5: (n, c, d, h, w)}.get(len(target_shape),
                                                                      (n,) + (slice(None),) * (len(target_shape) - 1))
        if len(shape) == 3 and placement.holds(shape):  # a sequence's labels per position are (N, L)
            n, c, w = box
            return {1: (n,), 2: (n, w), 3: (n, c, w)}[len(target_shape)]
        n, c, h, w = box if len(box) == 4 else (box[0], box[1], slice(None), slice(None))
        if len(shape) != 4:  # held flattened, (N, features): split by samples only
            return (n,) + (slice(None),) * (len(target_shape) - 1)
        return {1: (n,), 2: (n, c), 3: (n, h, w), 4: (n, c, h, w)}[len(target_shape)]

    def loss(self, local_output: object, local_target: torch.Tensor,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's share of the unsplit loss; the shares summed over the ranks give the unsplit loss.

        ``loss_fn`` (default ``F.cross_entropy``) must be a mean over the output's positions (samples, or
        samples and pixels) of a per-position term — ``cross_entropy``, ``mse_loss``, ``l1_loss``, … with the
        default ``reduction="mean"``. ``local_target`` is ``target[target_box(target.shape)]``.

        A model returning a dict, tuple or list (what :meth:`forward` returns): the loss is the sum of
        ``loss_fn`` over its floating tensor outputs (those of the part :attr:`output_key` names), each against
        the same target (:func:`runtime.outputs.output_loss`).
        """
        loss_fn = loss_fn or nn.functional.cross_entropy
        shares = [self._loss_share(name, tensor, local_target, loss_fn) for name, tensor in self.outputs(local_output)]
        if not shares:
            raise PlanError("the model's output holds no floating tensor to take a loss of")
        return sum(shares[1:], shares[0])

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
        placement = self.loss_placement()
        source = value_placement(self.plan.layers[name].layout, self.layer_graph.nodes[name])  # any stage's
        output = self._fetch(Value(local, source, shape), placement)
        held = copies(geometry(shape, placement), placement, len(self.ranks), self.member)
        total = 1
        for extent in shape:
            total *= extent
        return loss_fn(output, local_target) * (output.numel() / total / held)

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
