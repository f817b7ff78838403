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
    * a permutation of an ordered value (``permute``, ``transpose``,
      ``swapaxes``, ``swapdims``, ``movedim``, ``moveaxis``) permutes its order;
    * a reshape keeps the axes of the leading and trailing dimensions it keeps,
      and the dimensions between hold ``.`` (parts of axes: ShuffleNet's
      ``(N, C, H, W) → (N, groups, C/groups, H, W)`` is ``n..hw``), or ``c``
      when one dimension merges channels back (:func:`reshaped`); a value
      other than 4-D with no row or column axis has no order (its features,
      flattened, are its channels); a 4-D reshape of a 2-D or 3-D value with no
      order whose first dimension it does not keep (points ``(N·H·W, C)`` made a
      grid again; not a vector made filters ``(C_out, C_in, 1, 1)``)
      is ``n...``, its axes unnamed (``nchw`` would read its ``(N, H, W, C)`` wrongly);
    * the pieces of a cut (``x.split(w, dim=-1)``) keep the order of the value
      cut, and an item of them (``pieces[i]``) its piece's;
    * a stack of values in one order holds a ``.`` at its new dimension, and a
      reduction (``x.sum(1)``) drops the dimensions it reduces (:func:`reduced`);
    * layers that compute per element or along the last dimension only —
      activations, dropout, adds, products, identity, a LayerNorm or a linear
      layer — keep the order of their first 4-D input, and a concatenation
      the order of its inputs when they share one;
    * an opaque layer (kind ``other``) reading a value in another order makes
      ``n...`` (:func:`unknown_order`): its samples, nothing else named — and
      so do the layers computing on that (a reshape keeps it unnamed);
    * a 5-D model input is a volume (``ncdhw``), and so is what a 3-D
      convolution, pooling, norm, upsampling or padding makes (``VOLUME_MAKERS``);
      any other 5-D value has no order (flattened), unless a rule above names it;
    * every other layer makes ``nchw``: what it computes, in PyTorch's layout
      (and the predicate splits it by channel or space only when its inputs
      are ``nchw`` too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import Node

__all__ = ["NCDHW", "NCHW", "NCW", "SEQUENCE_KINDS", "VOLUME_MAKERS", "KEEPING_KINDS", "default_order", "logical",
           "output_order", "permutation", "piece_order", "reduced", "reshaped", "sequence_layer", "stacked",
           "unknown_order", "unnamed"]

NCHW = "nchw"
NCDHW = "ncdhw"
NCW = "ncw"
VOLUME_MAKERS = frozenset({"conv", "conv_transpose", "maxpool", "avgpool", "adaptive_avgpool", "adaptive_maxpool",
                           "upsample", "batchnorm", "norm", "pad"})
"""Kinds whose 5-D output is a volume ``(N, C, D, H, W)`` (PyTorch's 3-D convolutions, pooling, norms, …)."""
SEQUENCE_KINDS = frozenset({"conv", "conv_transpose", "maxpool", "avgpool", "adaptive_avgpool", "upsample",
                            "batchnorm"})
_SEQUENCE_NORMS = frozenset({"GroupNorm", "InstanceNorm1d"})
KEEPING_KINDS = frozenset({"activation", "dropout", "identity", "add", "mul", "elementwise", "norm", "linear"})
_PERMUTING = frozenset({"permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis"})


def default_order(rank: int) -> str:
    """The order of a value no rule gives one: ``nchw`` for 4-D values, none (``""``) for others (their features,
    flattened, are the channels of ``runtime.placement``); a volume's ``ncdhw`` comes from the rules of
    :func:`output_order` (a 5-D input, what volume layers make)."""
    return NCHW if rank == 4 else ""


def output_order(node: Node, kind: str, source: tuple[str, Sequence[int]] | None, shape: Sequence[int]) -> str:
    """The order of ``node``'s output of ``shape`` from ``source``, its first input's order and shape (module rules)."""
    rank = len(shape)
    if source is not None and not source[0] and kind in ("view", "flatten") and rank == 4 and \
            1 < len(source[1]) < rank and list(source[1][:1]) != list(shape[:1]):
        return "n..."  # a grid made of points (physicsnemo's (N·H·W, C) → (N, H, W, C)): which axis is which, unknown
    if source is None or not source[0]:
        return NCDHW if rank == 5 and kind in VOLUME_MAKERS | {"input"} else default_order(rank)
    order, source_shape = source
    perm = permutation(node, len(order))
    if perm is not None and len(perm) == rank:
        return "".join(order[d] for d in perm)
    if kind in ("view", "flatten") and list(source_shape) != list(shape):
        made = reshaped(order, source_shape, shape)
        return made or (unknown_order(order, source_shape, shape) if unnamed(order) else default_order(rank))
    if kind == "other" and order == "nhwc" and _merges_patches(node):
        return order  # Swin's patch merging: (N, H, W, C) to (N, H/2, W/2, 4C)
    if kind == "other" and order != default_order(len(order)):
        return unknown_order(order, source_shape, shape)
    if kind in KEEPING_KINDS | {"view", "cat"} and len(order) == rank:
        return order
    if kind in ("attention", "window_attention", "getitem") and list(source_shape) == list(shape) and \
            len(order) == rank:
        return order  # attention answers each query token; an item of its (out, None) is out
    return NCDHW if rank == 5 and kind in VOLUME_MAKERS else default_order(rank)


def _merges_patches(node: Node) -> bool:
    """torchvision's Swin ``_patch_merging_pad`` (``cost_models.ir.classify``: ``patch_merging``)."""
    target = node.target
    return node.op == "call_function" and getattr(target, "__name__", "") == "_patch_merging_pad" and \
        getattr(target, "__module__", "") == "torchvision.models.swin_transformer"


def sequence_layer(kind: str, attrs: dict[str, Any], shape: Sequence[int],
                   sources: Sequence[tuple[str, str, Sequence[int]]]) -> bool:
    """Whether a layer making a 3-D value computes on ``(N, C, L)`` sequences — a 1-D convolution, pooling,
    batch-, group- or instance-norm, upsampling — reading one (the model's input, or a value in order ``ncw``):
    its value is then ``ncw``, its length the ``w`` axis. ``sources``: each input's kind, order and shape."""
    if len(shape) != 3 or not (kind in SEQUENCE_KINDS or (kind == "norm" and attrs.get("norm") in _SEQUENCE_NORMS)):
        return False
    first = next(((source, order) for source, order, made in sources if len(made) == 3), None)
    return first is not None and (first[1] == NCW or first[0] == "input")


def unnamed(order: str) -> bool:
    """Whether ``order`` names no axis but the samples (``n...``: what an opaque layer made, :func:`unknown_order`)."""
    return bool(order) and set(order) <= {"n", "."}


def unknown_order(order: str, source: Sequence[int], shape: Sequence[int]) -> str:
    """The order of what an opaque layer (kind ``other``) makes of a value in a non-default ``order``: nothing says
    which axis its dimensions hold (torchvision's Swin pads and merges an ``nhwc`` value in one untraced call and
    returns ``nhwc``; another call could return ``nchw``), so only its samples stay named, where the call keeps
    them first (``n...``; ``""`` for a result other than 4-D: its features, flattened, are its channels), and a
    4-D result is never taken for ``nchw``. A value whose order holds no sample axis makes one with none (``...``)."""
    rank = len(shape)
    samples = order[:1] == "n" and len(source) > 0 and rank > 0 and source[0] == shape[0]
    if samples:
        return "n" + "." * (rank - 1) if rank == 4 else default_order(rank)
    return "." * rank  # dimension 0 merged the samples with more (B·W rows into an LSTM): no sample axis


def piece_order(attrs: dict[str, Any], source: tuple[str, Sequence[int]] | None,
                shapes: Sequence[Sequence[int]]) -> str:
    """The order of each piece of a cut (``x.split(w, dim=-1)``, ``attrs["pieces_along"]``) of a value of order
    ``source[0]``: that order, when it names an axis other than ``nchw``'s and every piece keeps its rank; ``""``
    (the default orders) otherwise. The tuple item ``pieces[i]`` then holds it too."""
    if "pieces_along" not in attrs or source is None or not source[0]:
        return ""
    order = source[0]
    if attrs.get("pieces_drop") and len(order) == len(source[1]):  # unbind: the pieces lose the dimension cut
        dim = attrs["pieces_along"] % len(order)
        order = order[:dim] + order[dim + 1:]
    kept = all(len(shape) == len(order) for shape in shapes)
    return order if kept and order != default_order(len(order)) else ""


def stacked(order: str, dim: int, rank: int) -> str:
    """The order of ``torch.stack`` of values in ``order`` along a new dimension ``dim`` (not before the samples):
    a ``.`` there (skresnet's and resnest's branches); ``""`` when ``dim`` is 0."""
    dim = dim % rank if rank else 0
    return order[:dim] + "." + order[dim:] if 0 < dim and rank == len(order) + 1 else ""


def reduced(order: str, dims: Sequence[int], keepdim: bool) -> str:
    """The order of a reduction of a value in ``order`` over ``dims``: those dimensions gone (``.`` when kept); a
    single ``.`` left among the samples, rows and columns is the channels (the radix sum of a split attention)."""
    rank = len(order)
    gone = {dim % rank for dim in dims} if rank else set()
    result = "".join("." if i in gone else axis for i, axis in enumerate(order) if keepdim or i not in gone)
    if len(result) == 4 and result.count(".") == 1 and set(result) == {"n", "h", "w", "."}:
        result = result.replace(".", "c")
    return result if {"d", "h", "w"} & set(result) or unnamed(order) else ""


def reshaped(order: str, source: Sequence[int], target: Sequence[int]) -> str | None:
    """The order of a row-major reshape of a value of ``order`` from ``source`` to ``target``: the leading and
    trailing dimensions it keeps keep their axes; the dimensions between become ``.`` (a part of an axis, or
    several), a single one of them ``c`` when it merges only channels (ShuffleNet's channel shuffle splits the
    channels into ``(groups, C/groups)`` and merges them back). ``None`` when no row or column axis is left."""
    lead = 0
    while lead < min(len(source), len(target)) and source[lead] == target[lead]:
        lead += 1
    trail = 0
    while trail < min(len(source), len(target)) - lead and source[-1 - trail] == target[-1 - trail]:
        trail += 1
    merged = [axis for axis in order[lead:len(order) - trail] if axis != "."]
    middle_count = len(target) - lead - trail
    if middle_count == 1 and trail == 0 and merged in (["h", "w"], ["d", "h", "w"]) and "c" in order[:lead]:
        return order[:lead] + "w"  # a map's positions flattened, row-major, into tokens: the token axis is w
    middle = "c" if middle_count == 1 and merged in ([], ["c"]) else "." * middle_count
    result = order[:lead] + middle + order[len(order) - trail:]
    if middle == "c" and ("c" in order[:lead] + order[len(order) - trail:] or len(result) != 4) and \
            result != "nwc":  # (heads' features merged back into tokens' embedding: timm's attention)
        result = order[:lead] + "." + order[len(order) - trail:]
    return result if {"d", "h", "w"} & set(result) else None


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


def _moved(source: object, destination: object, rank: int) -> list[int] | None:
    sources = _normalised(source if isinstance(source, (list, tuple)) else [source], rank)
    targets = _normalised(destination if isinstance(destination, (list, tuple)) else [destination], rank)
    if sources is None or targets is None or len(sources) != len(targets):
        return None
    rest = iter(d for d in range(rank) if d not in sources)
    placed = dict(zip(targets, sources))
    return [placed[position] if position in placed else next(rest) for position in range(rank)]


def _normalised(dims: object, rank: int) -> list[int] | None:
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return None
    return [d % rank for d in dims]


def logical(shape: Sequence[int], order: str) -> list[int]:
    """A ``shape`` of a value in ``order``, as ``(N, C, H, W)`` (``(N, C, D, H, W)`` when it holds a depth axis):
    an axis it does not hold has extent 1, and the channels are every dimension that holds no sample, slice, row
    or column axis."""
    if (order == NCHW and len(shape) == 4) or (order == NCDHW and len(shape) == 5):  # the usual case: as it is
        return [int(extent) for extent in shape]
    extents = {axis: int(extent) for axis, extent in zip(order, shape)}
    channels = 1
    for axis, extent in zip(order, shape):
        channels *= int(extent) if axis in "c." else 1
    spatial = [extents.get(axis, 1) for axis in ("dhw" if "d" in order else "hw")]
    return [extents.get("n", 1), channels, *spatial]
