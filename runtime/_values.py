"""The values ``runtime.apply`` interprets: this rank's box of a tensor and where it is held, and the shapes a
placement cuts boxes of (a 4-D or ordered value's own; any other value flattened to ``(N, features, 1, 1)``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Protocol, cast, overload

import torch
from torch import nn
from torch.fx import Node
from torch.fx.node import map_aggregate

from cost_models.redistribution import Box
from runtime.placement import Placement, box_extent

__all__ = ["Held", "Value", "call_node", "copies", "from4d", "geometry", "in_geometry", "last_reads", "leaves_of",
           "local_shape", "map_values", "plain", "plain_args", "reshape_and_cut", "reshapes_whole", "resolve",
           "same_boxes", "shape4", "to4d"]


class Value:
    """A tensor value of the forward pass: this rank's box, its placement and the unsplit shape."""

    __slots__ = ("tensor", "placement", "shape", "moved")

    def __init__(self, tensor: torch.Tensor, placement: Placement, shape: Sequence[int]) -> None:
        self.tensor, self.placement, self.shape = tensor, placement, tuple(shape)
        self.moved: dict[Placement, torch.Tensor] = {}


class Held:
    """What a call the trace did not shape returned (a tuple with ``None``, nested tuples): computed on the boxes
    of ``placement`` of its tensor inputs — a split by sample only, or every tensor whole."""

    __slots__ = ("value", "placement")

    def __init__(self, value: object, placement: Placement) -> None:
        self.value, self.placement = value, placement


def local_shape(shape: Sequence[int], placement: Placement, member: int) -> tuple[int, ...]:
    """The shape of member ``member``'s box of a value of global ``shape`` under ``placement`` (a scalar's: a
    scalar, held whole — its geometry's one element made it ``(1,)``, and a pipeline's received gradient of a
    scalar crossing, diffusers' ``VQModel`` commitment loss, then failed autograd's shape check)."""
    if not shape:
        return ()
    extent = box_extent(placement.box(geometry(shape, placement), member))
    if len(shape) == 4 or placement.holds(shape):
        return extent
    if len(shape) == 2:
        return extent[:2]
    return (extent[0], *(int(s) for s in shape[1:]))


def shape4(shape: Sequence[int]) -> tuple[int, int, int, int]:
    if len(shape) == 4:
        n, c, h, w = shape
        return int(n), int(c), int(h), int(w)
    if not shape:
        return (1, 1, 1, 1)
    features = 1
    for extent in shape[1:]:
        features *= int(extent)
    return (int(shape[0]), features, 1, 1)


def geometry(shape: Sequence[int], placement: Placement) -> tuple[int, ...]:
    """The shape ``placement`` cuts boxes of: ``shape`` itself when its order names its dimensions (every 4-D value,
    an ordered 5-D view), else the flattened ``(N, features, 1, 1)``."""
    return tuple(int(s) for s in shape) if placement.holds(shape) else shape4(shape)


def in_geometry(tensor: torch.Tensor, shape: Sequence[int], placement: Placement) -> torch.Tensor:
    return tensor if placement.holds(shape) else to4d(tensor)


def to4d(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 4:
        return tensor
    return tensor.reshape(tensor.shape[0] if tensor.dim() else 1, -1, 1, 1)


def from4d(tensor: torch.Tensor, shape: Sequence[int], box: Box) -> torch.Tensor:
    if len(shape) == 4:
        return tensor
    if len(shape) == 2:
        return tensor.reshape(box_extent(box)[:2])
    return tensor.reshape((box_extent(box)[0], *shape[1:]))


@lru_cache(maxsize=256)
def copies(shape: tuple[int, ...], placement: Placement, size: int, member: int) -> int:
    """How many members hold the same box as ``member`` (itself included)."""
    mine = placement.box(shape, member)
    return sum(placement.box(shape, q) == mine for q in range(size))


@lru_cache(maxsize=4096)
def same_boxes(shape: tuple[int, ...], first: Placement, second: Placement, size: int) -> bool:
    return all(first.box(shape, q) == second.box(shape, q) for q in range(size))


def reshapes_whole(source: Placement, source_shape: Sequence[int], placement: Placement, shape: Sequence[int]) -> bool:
    """Whether a reshape of a value of ``source_shape`` held under ``source`` into a map of ``shape`` split by rows
    or columns under ``placement`` reads a value holding no rows (tokens ``(N, C, H·W)``, their axis ``w`` or
    none: the capability predicate's reshape rule), read whole along the tokens, its samples the map's."""
    holds_space = source.holds(source_shape) and bool({"d", "h"} & set(source.order))  # a map (tokens: w only)
    same_samples = placement.layout.n == 1 or int(source_shape[0]) == int(shape[0])
    return (not holds_space and same_samples and placement.holds(shape)
            and (placement.keeps("h") or placement.keeps("w")))


def reshape_and_cut(tensor: torch.Tensor, shape: Sequence[int], placement: Placement, member: int) -> torch.Tensor:
    """``tensor`` — whole but for its samples — reshaped into the whole map of global ``shape``, then cut to the
    rows and columns of ``member``'s box under ``placement``."""
    samples = Placement(placement.layout, placement.whole + "dhw", placement.order)
    whole = tensor.reshape(local_shape(shape, samples, member))
    box = placement.box(tuple(int(extent) for extent in shape), member)
    return whole[tuple(slice(*box[i]) if axis in "dhw" else slice(None) for i, axis in enumerate(placement.order))]


# --- reading values for the program's calls ------------------------------------------------------------------

class _MapValues(Protocol):
    @overload
    def __call__(self, value: tuple[object, ...], fn: Callable[[object], object], /) -> tuple[object, ...]: ...

    @overload
    def __call__(self, value: Mapping[str, object], fn: Callable[[object], object], /) -> Mapping[str, object]: ...

    @overload
    def __call__(self, value: object, fn: Callable[[object], object], /) -> object: ...


map_values = cast(_MapValues, map_aggregate)
"""``torch.fx.node.map_aggregate`` on any values: ``fn`` of each leaf inside tuples, lists, dicts and slices, in
the same structure (a tuple stays a tuple, a dict a dict); torch annotates it for the fx arguments of a node only."""


def leaves_of(value: object) -> list[object]:
    """The leaves of ``value`` (inside its tuples, lists, dicts and slices), in order."""
    found: list[object] = []

    def keep(leaf: object) -> object:
        found.append(leaf)
        return leaf

    map_values(value, keep)
    return found


def plain(value: object) -> object:
    if isinstance(value, Held):
        return value.value
    if isinstance(value, (tuple, list)) and any(isinstance(item, Value) for item in value):
        return map_values(value, plain)  # a container node's value (:func:`is_container`)
    return value.tensor if isinstance(value, Value) else value


def plain_args(args: object, env: Mapping[str, object]) -> object:
    return map_values(args, lambda a: plain(env[a.name]) if isinstance(a, Node) else a)


def resolve(node: Node, value_of: Callable[[Node], object]) -> tuple[tuple[object, ...], Mapping[str, object]]:
    args = map_values(node.args, lambda a: value_of(a) if isinstance(a, Node) else a)
    kwargs = map_values(node.kwargs, lambda a: value_of(a) if isinstance(a, Node) else a)
    return args, kwargs


def last_reads(nodes: Sequence[Node]) -> list[tuple[str, ...]]:
    """Per node, the values it is the last of ``nodes`` to read (or makes, when none reads them): what an
    interpreter running ``nodes`` in order can drop once that node has run, freeing what autograd does not keep."""
    last: dict[str, int] = {}
    for index, node in enumerate(nodes):
        last[node.name] = index
        for source in node.all_input_nodes:
            last[source.name] = index
    after: list[list[str]] = [[] for _ in nodes]
    for name, index in last.items():
        after[index].append(name)
    return [tuple(names) for names in after]


def call_node(node: Node, model: nn.Module, args: Sequence[object], kwargs: Mapping[str, object]) -> object:
    if node.op == "call_module":
        return model.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_function":
        function = node.target
        assert callable(function), f"'{node.name}' calls {function!r}"
        return function(*args, **kwargs)
    self_arg, *rest = args
    return getattr(self_arg, str(node.target))(*rest, **kwargs)
