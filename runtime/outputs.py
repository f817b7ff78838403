"""Which of a model's outputs the loss is taken of: every floating tensor it returns, or the one ``--output`` names.

A model may return a tensor, or a dict, tuple, list or named tuple of them
(torchvision's segmentation models return ``{"out": …, "aux": …}``,
GoogLeNet its logits and two auxiliary logits). The rule, the same for the
split model (:meth:`runtime.apply.DistributedModel.loss`), the unsplit
reference of ``--verify`` and every pipeline stage:

* by default, the loss is the sum of the loss of every floating tensor
  output, each against the same target;
* ``--output KEY`` takes the loss of one part only: a dict's key, a named
  tuple's field, or a tuple's or list's index (``0``, ``-1``); the other
  outputs are computed and take no gradient.

The traced program's output node holds the same structure with layer nodes in
place of tensors (a named tuple as a call of its class), so the layer an
output comes from is found by walking both together (:func:`paired`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.fx import Node
from torch.fx.node import Argument

from cost_models.errors import PlanError
from runtime._values import leaves_of

__all__ = ["Everywhere", "check_output_key", "is_container", "output_loss", "paired", "select_nodes",
           "select_value"]


def is_container(node: Node) -> bool:
    """Whether ``node`` only packs values: a call of ``tuple``/``list`` or of a named tuple's class."""
    target = node.target
    return node.op == "call_function" and isinstance(target, type) and (
        target in (tuple, list) or (issubclass(target, tuple) and hasattr(target, "_fields")))


class Everywhere:
    """Stands for any value in :func:`paired` (each item of it is itself)."""

    def __getitem__(self, _key: object) -> Everywhere:
        return self

    def __iter__(self) -> Iterator[Everywhere]:
        while True:
            yield self


def paired(nodes: object, values: Any) -> Iterator[tuple[str, object]]:
    """``(node name, value)`` for each node leaf of ``nodes`` and the value at the same place in ``values`` (a
    model's output, anything it returns, or :class:`Everywhere`); a container node (:func:`is_container`) is looked
    through."""
    if isinstance(nodes, Node) and is_container(nodes):
        yield from paired(list(_packed(nodes)[0]), values)
    elif isinstance(nodes, Node):
        yield nodes.name, values
    elif isinstance(nodes, (tuple, list)):
        for node, value in zip(nodes, values):
            yield from paired(node, value)
    elif isinstance(nodes, dict):
        for key, node in nodes.items():
            yield from paired(node, values[key])


def select_value(value: object, key: str | None) -> object:
    """The part of a model's output ``value`` that ``key`` names (``None``: all of it).

    Raises:
        PlanError: ``key`` names no part of it (the parts it has are listed).
    """
    if key is None:
        return value
    if isinstance(value, dict) and key in value:
        return value[key]
    fields = getattr(value, "_fields", ()) if isinstance(value, tuple) else ()
    if key in fields:
        return getattr(value, key)
    if isinstance(value, (tuple, list)):
        index = _index(key, len(value))
        if index is not None:
            return value[index]
    raise PlanError(f"--output {key}: the model's output has no such part; it has {_parts(value)}")


def select_nodes(nodes: object, key: str | None) -> object:
    """:func:`select_value` on the traced program's output structure (layer nodes, container nodes)."""
    if key is None or not (isinstance(nodes, Node) and is_container(nodes)):
        return select_value(nodes, key)
    items, fields = _packed(nodes)
    if key in fields:
        return items[fields.index(key)]
    index = _index(key, len(items))
    if index is None:
        raise PlanError(f"--output {key}: the model's output has no such part; it has fields {', '.join(fields)} "
                        f"or indices 0…{len(items) - 1}" if fields else
                        f"--output {key}: the model's output has no such part; it has indices 0…{len(items) - 1}")
    return items[index]


def check_output_key(model: nn.Module, key: str | None, leaf_modules: Iterable[str] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None) -> None:
    """Refuse (``PlanError``, the parts named) a ``key`` naming no part of what ``model`` returns; ``None`` passes.

    ``shapes``: the global input shapes (a forward that checks its input's shape is traced for them)."""
    if key is None:
        return
    from cost_models.ir.tracing import symbolic_trace

    nodes = symbolic_trace(model, tuple(leaf_modules), shapes=shapes).graph.nodes
    output = next(node for node in nodes if node.op == "output")
    select_nodes(output.args[0], key)


def output_loss(output: object, target: torch.Tensor,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, *,
                key: str | None = None) -> torch.Tensor:
    """The unsplit model's loss as :meth:`runtime.apply.DistributedModel.loss` defines it: ``loss_fn`` summed
    over the floating tensors of ``output`` (of its part ``key``), each against ``target``."""
    loss_fn = loss_fn or nn.functional.cross_entropy
    floating = [leaf for leaf in leaves_of(select_value(output, key))
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]
    if not floating:
        raise PlanError(f"the model's output ({type(output).__name__}) holds no floating tensor to take a loss of")
    return sum((loss_fn(leaf, target) for leaf in floating[1:]), loss_fn(floating[0], target))


def _packed(node: Node) -> tuple[list[Argument], tuple[str, ...]]:
    """A container node's items, and its named tuple's fields (empty for a plain tuple or list)."""
    if node.target in (tuple, list):
        items = node.args[0]
        assert isinstance(items, (tuple, list)), f"'{node.name}' packs {type(items).__name__}"
        return list(items), ()
    fields = tuple(getattr(node.target, "_fields", ()))  # a named tuple's class (is_container)
    return [*node.args, *(node.kwargs[f] for f in fields[len(node.args):] if f in node.kwargs)], fields


def _index(key: str, length: int) -> int | None:
    try:
        index = int(key)
    except ValueError:
        return None
    return index if -length <= index < length else None


def _parts(value: object) -> str:
    if isinstance(value, dict):
        return "keys " + ", ".join(map(str, value))
    if isinstance(value, (tuple, list)):
        fields = getattr(value, "_fields", ())
        return (f"fields {', '.join(fields)} or " if fields else "") + f"indices 0…{len(value) - 1}"
    return "one tensor (no parts: leave --output out)"
