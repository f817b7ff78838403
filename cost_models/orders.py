"""Which dimension of a 4-D value holds its samples, channels, rows and columns: the value's order.

PyTorch's convolutions read ``nchw``; channels-last blocks (ConvNeXt's
``x.permute(0, 2, 3, 1)``, a LayerNorm over the channels, ``nn.Linear`` as a
1×1 convolution, ``x.permute(0, 3, 1, 2)`` back) compute on ``nhwc``. A Layout
splits axes by name, wherever a value's order puts them: under ``h2`` the
rows of an ``nhwc`` value are its dimension 1. A permutation of a split value
is then a permuted box, not a redistribution. The tracer records each layer's
order (``attrs["order"]``) and its inputs' (``attrs["input_orders"]``) when
they are not ``nchw``; the capability predicate, the cost model and the
runtime's placements read them.

Rules (:func:`output_order`):
    * the model's inputs are ``nchw``;
    * a permutation of a 4-D value (``permute``, ``transpose``, ``swapaxes``,
      ``swapdims``, ``movedim``, ``moveaxis``) permutes its order;
    * layers that compute per element or along the last dimension only —
      activations, dropout, adds, products, identity, a LayerNorm or a linear
      layer — keep the order of their first 4-D input;
    * every other layer makes ``nchw``: what it computes, in PyTorch's layout
      (and the predicate splits it by channel or space only when its inputs
      are ``nchw`` too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from torch.fx import Node

__all__ = ["NCHW", "KEEPING_KINDS", "logical", "output_order", "permutation"]

NCHW = "nchw"
KEEPING_KINDS = frozenset({"activation", "dropout", "identity", "add", "mul", "elementwise", "norm", "linear"})
_PERMUTING = frozenset({"permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis"})


def output_order(node: Node, kind: str, input_orders: Sequence[str], rank: int) -> str:
    """The order of ``node``'s output (``rank`` dimensions) from its 4-D inputs' orders (:mod:`module rules`)."""
    if rank != 4:
        return NCHW
    first = input_orders[0] if input_orders else NCHW
    perm = permutation(node, rank)
    if perm is not None:
        return "".join(first[d] for d in perm)
    return first if kind in KEEPING_KINDS else NCHW


def permutation(node: Node, rank: int) -> list[int] | None:
    """The dimension permutation a ``permute``/``transpose``/``movedim`` call applies (``None``: not one, or
    dimensions not written as constants)."""
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name not in _PERMUTING or not node.args:
        return None
    args = list(node.args[1:]) + [value for key, value in node.kwargs.items() if key not in ("input",)]
    if name == "permute":
        dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        return _normalised(dims, rank)
    if len(args) != 2:
        return None
    first, second = args
    if name in ("movedim", "moveaxis"):
        return _moved(first, second, rank)
    pair = _normalised([first, second], rank)
    if pair is None:
        return None
    perm = list(range(rank))
    perm[pair[0]], perm[pair[1]] = pair[1], pair[0]
    return perm


def _moved(source: Any, destination: Any, rank: int) -> list[int] | None:
    sources = _normalised(source if isinstance(source, (list, tuple)) else [source], rank)
    targets = _normalised(destination if isinstance(destination, (list, tuple)) else [destination], rank)
    if sources is None or targets is None or len(sources) != len(targets):
        return None
    rest = iter(d for d in range(rank) if d not in sources)
    placed = dict(zip(targets, sources))
    return [placed[position] if position in placed else next(rest) for position in range(rank)]


def _normalised(dims: Any, rank: int) -> list[int] | None:
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return None
    return [d % rank for d in dims]


def logical(shape: Sequence[int], order: str) -> list[int]:
    """A 4-D ``shape`` of a value in ``order``, rearranged as ``(N, C, H, W)``."""
    return [int(shape[order.index(axis)]) for axis in NCHW]
