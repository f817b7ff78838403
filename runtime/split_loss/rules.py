"""How each operation a loss applies to split tensors is kept split: one rule per kind of operation, registered
by the operation's name (as DTensor registers its sharding rules per op).

A rule runs the operation on this rank's boxes and says how the ranks hold the
result (:class:`values.Parts`). Elementwise operations keep their operands'
split; sums and means over split dimensions leave each rank a partial sum,
added up over the ranks only when something other than a linear operation
needs the total (:meth:`values.Tracker.complete`) — a mean's partial sum
scaled by the global count becomes the rank's share of the loss with no
communication at all. An operation with no rule, or used in a way its rule
cannot keep split (a softmax along a split dimension, a slice of one), raises
:class:`values.Unsplittable` and the loss is taken of the gathered output.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from math import prod
from typing import Any, NamedTuple

import torch
from torch.nn import functional as F

from runtime.split_loss.global_sum import global_extreme
from runtime.split_loss.values import LocalSize, Parts, Tracker, Unsplittable, uniform

__all__ = ["FACTORIES", "RULES", "Call", "completed", "factory", "merge", "op_name", "reduction_of", "tensors_in"]


class Call(NamedTuple):
    """One operation the loss applies: the function, its name (:func:`op_name`) and its arguments."""

    func: Callable[..., Any]
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self) -> Any:
        return self.func(*self.args, **self.kwargs)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """The argument at position ``index`` or keyword ``name``."""
        return self.args[index] if len(self.args) > index else self.kwargs.get(name, default)


Rule = Callable[[Tracker, Call], Any]
RULES: dict[str, Rule] = {}

_DUNDER = {"__add__": "add", "__radd__": "add", "__iadd__": "add_", "__sub__": "sub", "__rsub__": "rsub",
           "__isub__": "sub_", "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_", "__truediv__": "div",
           "__rtruediv__": "rdiv", "__itruediv__": "div_", "__pow__": "pow", "__rpow__": "rpow", "__ipow__": "pow_",
           "__neg__": "neg", "__pos__": "positive", "__abs__": "abs", "__eq__": "eq", "__ne__": "ne", "__lt__": "lt",
           "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__and__": "bitwise_and", "__or__": "bitwise_or",
           "__xor__": "bitwise_xor", "__invert__": "bitwise_not", "__rand__": "bitwise_and", "__ror__": "bitwise_or",
           "__floordiv__": "floor_divide", "__mod__": "remainder"}

FACTORIES = frozenset({"zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like"})
"""Functions making a tensor constant along every dimension (:func:`values.uniform`)."""


def op_name(func: Callable[..., Any]) -> str:
    """The name rules are registered by: ``sum`` for ``torch.sum`` and ``Tensor.sum``, ``add`` for ``+``,
    ``shape`` for reading ``Tensor.shape``."""
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property of Tensor (shape, ndim, T, …)
        return str(getattr(getattr(func, "__self__", None), "__name__", name))
    return _DUNDER.get(name, name)


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value`` (arguments: nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def _register(*names: str) -> Callable[[Rule], Rule]:
    def register(rule: Rule) -> Rule:
        for name in names:
            RULES[name] = rule
        return rule
    return register


def _parts(ev: Tracker, tensor: torch.Tensor) -> Parts:
    found = ev.parts(tensor)
    return found if found is not None else Parts(tuple(frozenset() for _ in tensor.shape), tuple(tensor.shape))


def completed(ev: Tracker, call: Call) -> Call:
    """``call`` with every partial operand added up (an in-place operation's own operand cannot be)."""
    def swap(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ev.complete(value)
        if isinstance(value, (tuple, list)):
            return type(value)(swap(item) for item in value)
        return value
    if call.name.endswith("_") and call.args and (p := ev.parts(call.args[0])) is not None and p.partial:
        raise Unsplittable(f"{call.name} writing into a partial sum")
    return call._replace(args=tuple(swap(a) for a in call.args),
                         kwargs={key: swap(value) for key, value in call.kwargs.items()})


def merge(ev: Tracker, shape: torch.Size, operands: list[torch.Tensor], what: str) -> Parts:
    """The parts of an elementwise result of ``shape`` from its (broadcast) operands'."""
    axes: list[frozenset[str]] = [frozenset() for _ in shape]
    extents = list(shape)
    partial: frozenset[str] = frozenset()
    for tensor in operands:
        parts = _parts(ev, tensor)
        partial |= parts.partial
        offset = len(shape) - len(parts.axes)
        for i, (dim_axes, extent) in enumerate(zip(parts.axes, parts.extents)):
            if dim_axes:
                if axes[offset + i] and axes[offset + i] != dim_axes:
                    raise Unsplittable(f"{what} of values split differently")
                axes[offset + i], extents[offset + i] = dim_axes, extent
    for tensor in operands:  # an ordinary operand along a split dimension must broadcast (or be constant)
        parts = _parts(ev, tensor)
        offset = len(shape) - len(parts.axes)
        for i, (dim_axes, size) in enumerate(zip(parts.axes, tensor.shape)):
            if axes[offset + i] and not dim_axes and size != 1 and not parts.uniform:
                raise Unsplittable(f"{what} of a split value with a whole one along a split dimension")
    return Parts(tuple(axes), tuple(extents), partial)


# -- elementwise -------------------------------------------------------------------------------------------------

_POINTWISE = ("add", "sub", "rsub", "mul", "div", "true_divide", "rdiv", "neg", "negative", "positive", "pow",
              "rpow", "float_power", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
              "square", "abs", "sign", "sigmoid", "tanh", "relu", "clamp", "clamp_min", "clamp_max", "clip", "where",
              "eq", "ne", "gt", "ge", "lt", "le", "maximum", "minimum", "fmax", "fmin", "logical_and", "logical_or",
              "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "isinf",
              "isnan", "isfinite", "nan_to_num", "reciprocal", "lerp", "addcmul", "addcdiv", "float", "double",
              "half", "bfloat16", "long", "int", "bool", "byte", "to", "type", "type_as", "clone", "contiguous",
              "detach", "masked_fill", "logsigmoid", "softplus", "xlogy", "floor", "ceil", "round", "trunc", "frac",
              "sin", "cos", "floor_divide", "remainder", "fmod", "erf", "silu", "elu", "leaky_relu", "hardtanh",
              "requires_grad_")
_LINEAR_ALONE = frozenset({"neg", "negative", "positive", "float", "double", "half", "bfloat16", "to", "type",
                           "clone", "contiguous", "detach", "requires_grad_"})


def _linear(ev: Tracker, call: Call, operands: list[torch.Tensor]) -> bool:
    """Whether the operation is linear in its partial operands, so it may act on partial sums."""
    parts = [_parts(ev, t) for t in operands]
    partial = [p for p in parts if p.partial]
    if not partial:
        return True
    sums = partial[0].partial
    if call.name in _LINEAR_ALONE:
        return len(operands) == 1 or call.name == "to"
    others_clear = all(not (p.partial or p.split & sums) for p in parts if not p.partial)
    if call.name in ("mul", "mul_"):
        return len(partial) == 1 and others_clear
    if call.name in ("div", "div_", "true_divide"):
        return len(partial) == 1 and bool(parts[0].partial) and others_clear
    if call.name in ("add", "sub", "add_", "sub_"):
        numbers = [a for a in call.args if isinstance(a, (int, float, complex)) and not isinstance(a, bool)]
        return not numbers and len(partial) == len(parts) and all(p.partial == sums for p in partial)
    return False


@_register(*_POINTWISE, *(name + "_" for name in _POINTWISE if not name.endswith("_")))
def pointwise(ev: Tracker, call: Call) -> Any:
    operands = list(tensors_in((call.args, call.kwargs)))
    if not _linear(ev, call, operands):
        call = completed(ev, call)
        operands = list(tensors_in((call.args, call.kwargs)))
    result = call.run()
    return ev.mark(result, merge(ev, result.shape, operands, call.name))


# -- reductions --------------------------------------------------------------------------------------------------

def _dims(call: Call, ndim: int) -> tuple[int, ...]:
    dim = call.arg(1, "dim", call.kwargs.get("axis"))
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(sorted(d % ndim for d in dims))


def _kept(parts: Parts, dims: tuple[int, ...], keepdim: bool) -> tuple[tuple[frozenset[str], ...], tuple[int, ...]]:
    axes = [(a if d not in dims else frozenset()) for d, a in enumerate(parts.axes) if d not in dims or keepdim]
    extents = [(e if d not in dims else 1) for d, e in enumerate(parts.extents) if d not in dims or keepdim]
    return tuple(axes), tuple(extents)


@_register("sum", "mean", "nansum", "nanmean")
def reduction(ev: Tracker, call: Call) -> torch.Tensor:
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    dims = _dims(call, tensor.dim())
    keepdim = bool(call.arg(2, "keepdim", False))
    dtype = call.kwargs.get("dtype")
    summed = (torch.nansum if call.name.startswith("nan") else torch.sum)(tensor, dim=dims, keepdim=keepdim,
                                                                          dtype=dtype)
    if call.name.endswith("mean"):
        if call.name == "nanmean" and parts.split:
            raise Unsplittable("nanmean over split dimensions (its count depends on the values)")
        summed = summed / prod(parts.extents[d] for d in dims)
    axes, extents = _kept(parts, dims, keepdim)
    reduced = frozenset().union(*(parts.axes[d] for d in dims))
    return ev.mark(summed, Parts(axes, extents, parts.partial | reduced))


@_register("amax", "amin", "max", "min", "any", "all")
def extreme(ev: Tracker, call: Call) -> Any:
    if call.name in ("max", "min") and len(list(tensors_in(call.args[:2]))) == 2:
        return pointwise(ev, call._replace(name="maximum" if call.name == "max" else "minimum"))
    call = completed(ev, call)
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    dims = _dims(call, tensor.dim())
    keepdim = bool(call.arg(2, "keepdim", False))
    reduced = frozenset().union(*(parts.axes[d] for d in dims))
    result = call.run()
    axes, extents = _kept(parts, dims, keepdim)
    if isinstance(result, tuple):  # max/min along a dimension: (values, indices)
        if reduced:
            raise Unsplittable(f"{call.name} along a split dimension with its indices")
        for item in result:
            ev.mark(item, Parts(axes, extents))
        return result
    if reduced:
        if tensor.requires_grad and torch.is_grad_enabled():
            raise Unsplittable(f"a gradient through {call.name} over split dimensions")
        replicated = frozenset(ev.grid.parts) - parts.split
        group, _ = ev.grid.group_for(reduced, replicated)
        largest = call.name in ("amax", "max", "any")
        result = global_extreme(result.to(torch.uint8), group, largest).bool() if call.name in ("any", "all") \
            else global_extreme(result, group, largest)
    return ev.mark(result, Parts(axes, extents))


@_register("softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp", "argmax", "argmin")
def along(ev: Tracker, call: Call) -> torch.Tensor:
    """An operation along one dimension, which must not be split."""
    call = completed(ev, call)
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    dim = call.arg(1, "dim")
    if dim is None:
        raise Unsplittable(f"{call.name} without a dimension on a split value")
    dim %= tensor.dim()
    if parts.axes[dim]:
        raise Unsplittable(f"{call.name} along a split dimension")
    result = call.run()
    if call.name in ("argmax", "argmin"):
        axes, extents = _kept(parts, (dim,), bool(call.arg(2, "keepdim", False)))
        return ev.mark(result, Parts(axes, extents))
    return ev.mark(result, Parts(parts.axes, parts.extents))


@_register("one_hot")
def one_hot(ev: Tracker, call: Call) -> torch.Tensor:
    classes = call.arg(1, "num_classes", -1)
    if classes < 0:
        raise Unsplittable("one_hot without num_classes on a split value (the class count would be the tile's)")
    parts = _parts(ev, call.args[0])
    return ev.mark(call.run(), Parts(parts.axes + (frozenset(),), parts.extents + (classes,)))


@_register("scatter", "scatter_", "scatter_add", "scatter_add_", "gather", "take_along_dim")
def scatter(ev: Tracker, call: Call) -> torch.Tensor:
    call = completed(ev, call)
    operands = list(tensors_in((call.args, call.kwargs)))
    dim = call.arg(1, "dim") % call.args[0].dim()
    if any(_parts(ev, t).axes[dim] for t in operands):
        raise Unsplittable(f"{call.name} along a split dimension")
    for tensor in operands[1:]:
        for d, (axes, size) in enumerate(zip(_parts(ev, tensor).axes, tensor.shape)):
            if axes and size != call.args[0].shape[d]:
                raise Unsplittable(f"{call.name} with an index smaller than its input along a split dimension")
    result = call.run()
    return ev.mark(result, merge(ev, result.shape, operands, call.name))


# -- indexing and shapes -----------------------------------------------------------------------------------------

def _key(key: Any, ndim: int) -> list[Any]:
    items = list(key) if isinstance(key, tuple) else [key]
    if any(isinstance(k, (torch.Tensor, list, bool)) or hasattr(k, "__array__") for k in items):
        raise Unsplittable("indexing a split value with a tensor or a list")
    consumed = sum(1 for k in items if k is not None and k is not Ellipsis)
    where = next((i for i, k in enumerate(items) if k is Ellipsis), None)
    if where is not None:
        items[where:where + 1] = [slice(None)] * (ndim - consumed)
    return items + [slice(None)] * (ndim - consumed - (0 if where is None else ndim - consumed))


@_register("__getitem__")
def getitem(ev: Tracker, call: Call) -> torch.Tensor:
    call = completed(ev, call)
    tensor, key = call.args[0], call.args[1]
    parts = _parts(ev, tensor)
    result = call.run()
    axes: list[frozenset[str]] = []
    extents: list[int] = []
    dim = 0
    for item in _key(key, tensor.dim()):
        if item is None:
            axes.append(frozenset())
            extents.append(1)
            continue
        split = parts.axes[dim]
        if split and item != slice(None):
            raise Unsplittable("a slice or an index of a split dimension")
        if not isinstance(item, int):
            axes.append(split)
            extents.append(parts.extents[dim] if split else result.shape[len(axes) - 1])
        dim += 1
    return ev.mark(result, Parts(tuple(axes), tuple(extents)))


@_register("__setitem__")
def setitem(ev: Tracker, call: Call) -> None:
    tensor, key, value = call.args
    parts = _parts(ev, tensor)
    if parts.partial or (isinstance(value, torch.Tensor) and (value.numel() != 1 or not _parts(ev, value).trivial)):
        raise Unsplittable("writing a tensor into part of a split value")
    if isinstance(key, torch.Tensor) and key.dim() == tensor.dim():  # a mask of the same shape
        merged = merge(ev, tensor.shape, [tensor, key], "a masked write")
        call.run()
        ev.mark(tensor, Parts(merged.axes, merged.extents))
        return None
    for dim, item in enumerate(_key(key, tensor.dim())[:tensor.dim()]):
        if parts.axes[dim] and item != slice(None):
            raise Unsplittable("writing into a slice of a split dimension")
    call.run()
    ev.mark(tensor, Parts(parts.axes, parts.extents))
    return None


def _groups(source: tuple[int, ...], target: tuple[int, ...],
            pinned: frozenset[int]) -> Iterator[tuple[list[int], list[int]]]:
    """The dimensions of ``source`` and ``target`` (shapes of equal size) a reshape maps onto each other, in
    minimal blocks of equal product; dimensions of size 1 are blocks of their own, but a ``pinned`` (split)
    one of size 1 here is paired with the next one of size 1 in ``target``."""
    i = j = 0
    while i < len(source) or j < len(target):
        if i in pinned and source[i] == 1 and j < len(target) and target[j] == 1:
            yield [i], [j]
            i, j = i + 1, j + 1
        elif i < len(source) and source[i] == 1 and i not in pinned:
            yield [i], []
            i += 1
        elif j < len(target) and target[j] == 1:
            yield [], [j]
            j += 1
        else:
            block_i, block_j = [i], [j]
            a, b = source[i], target[j]
            while a != b:
                if a < b:
                    i += 1
                    block_i.append(i)
                    a *= source[i]
                else:
                    j += 1
                    block_j.append(j)
                    b *= target[j]
            yield block_i, block_j
            i, j = i + 1, j + 1


@_register("unsqueeze")
def unsqueeze(ev: Tracker, call: Call) -> torch.Tensor:
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    dim = call.arg(1, "dim") % (tensor.dim() + 1)
    return ev.mark(call.run(), Parts(parts.axes[:dim] + (frozenset(),) + parts.axes[dim:],
                                     parts.extents[:dim] + (1,) + parts.extents[dim:], parts.partial))


@_register("squeeze")
def squeeze(ev: Tracker, call: Call) -> torch.Tensor:
    """Dimensions of size 1 removed: never a split one (its size is 1 on this rank only)."""
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    dim = call.arg(1, "dim")
    dims = range(tensor.dim()) if dim is None else [d % tensor.dim() for d in (
        dim if isinstance(dim, (tuple, list)) else (dim,))]
    if any(parts.axes[d] for d in dims if tensor.shape[d] == 1 or dim is not None):
        raise Unsplittable("squeeze of a split dimension")
    kept = [d for d in range(tensor.dim()) if d not in dims or tensor.shape[d] != 1]
    return ev.mark(call.run(), Parts(tuple(parts.axes[d] for d in kept), tuple(parts.extents[d] for d in kept),
                                     parts.partial))


@_register("view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "ravel")
def reshape(ev: Tracker, call: Call) -> torch.Tensor:
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    result = call.run()
    axes: list[frozenset[str]] = [frozenset() for _ in result.shape]
    extents = list(result.shape)
    pinned = frozenset(d for d, a in enumerate(parts.axes) if a)
    for block_i, block_j in _groups(tuple(tensor.shape), tuple(result.shape), pinned):
        split = frozenset().union(*(parts.axes[i] for i in block_i))
        if not split:
            continue
        if len(block_j) != 1:
            raise Unsplittable(f"{call.name} dividing a split dimension")
        axes[block_j[0]] = split
        extents[block_j[0]] = prod(parts.extents[i] for i in block_i)
    return ev.mark(result, Parts(tuple(axes), tuple(extents), parts.partial))


@_register("permute", "transpose", "swapaxes", "movedim", "moveaxis")
def permute(ev: Tracker, call: Call) -> torch.Tensor:
    tensor = call.args[0]
    parts = _parts(ev, tensor)
    order = list(range(tensor.dim()))
    if call.name == "permute":
        dims = call.args[1:] if len(call.args) > 2 or isinstance(call.arg(1, "dims"), int) else call.arg(1, "dims")
        order = [d % tensor.dim() for d in dims]
    elif call.name in ("transpose", "swapaxes"):
        a, b = call.arg(1, "dim0") % tensor.dim(), call.arg(2, "dim1") % tensor.dim()
        order[a], order[b] = order[b], order[a]
    else:  # movedim(source, destination)
        source, target = call.arg(1, "source"), call.arg(2, "destination")
        sources = [d % tensor.dim() for d in (source if isinstance(source, (tuple, list)) else (source,))]
        targets = [d % tensor.dim() for d in (target if isinstance(target, (tuple, list)) else (target,))]
        placed = dict(zip(targets, sources))
        rest = iter(d for d in range(tensor.dim()) if d not in sources)
        order = [placed[d] if d in placed else next(rest) for d in range(tensor.dim())]
    result = call.run()
    return ev.mark(result, Parts(tuple(parts.axes[d] for d in order), tuple(parts.extents[d] for d in order),
                                 parts.partial))


# -- what reads a value out --------------------------------------------------------------------------------------

@_register("shape", "size")
def shape(ev: Tracker, call: Call) -> Any:
    parts = _parts(ev, call.args[0])
    result = call.run()
    if isinstance(result, int):
        dim = call.arg(1, "dim") % len(parts.axes)
        return LocalSize(result) if parts.axes[dim] else result
    return torch.Size([LocalSize(size) if axes else size for size, axes in zip(result, parts.axes)])


@_register("numel", "__len__", "nelement")
def count(ev: Tracker, call: Call) -> int:
    parts = _parts(ev, call.args[0])
    if parts.split if call.name != "__len__" else (parts.axes and parts.axes[0]):
        raise Unsplittable(f"{call.name} of a split value (this rank's count, not the whole one)")
    return int(call.run())


@_register("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "__format__", "__repr__",
           "__str__", "__array__")
def read(ev: Tracker, call: Call) -> Any:
    if _parts(ev, call.args[0]).split:
        raise Unsplittable(f"{call.name} of a split value")
    return completed(ev, call).run()


# -- loss functions ----------------------------------------------------------------------------------------------

_ELEMENTWISE_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                       "binary_cross_entropy_with_logits", "soft_margin_loss")


@_register(*_ELEMENTWISE_LOSSES, "cross_entropy", "nll_loss")
def loss_function(ev: Tracker, call: Call) -> torch.Tensor:
    """A ``torch.nn.functional`` loss: taken per position (``reduction="none"``), then summed or averaged over
    the whole batch — a class-index cross-entropy's mean divided by the summed weights of the positions it
    counts (``weight``, ``ignore_index``), as PyTorch's is."""
    bound = inspect.signature(call.func).bind(*call.args, **call.kwargs)
    if bound.arguments.get("size_average") is not None or bound.arguments.get("reduce") is not None:
        raise Unsplittable(f"{call.name} with the deprecated size_average/reduce")
    reduction = bound.arguments.get("reduction", "mean")
    bound.arguments["reduction"] = "none"
    call = completed(ev, call._replace(args=bound.args, kwargs=bound.kwargs))
    source, target = call.args[0], call.args[1]
    per_position = call.run()
    classes = call.name in ("cross_entropy", "nll_loss")
    parts = _per_position(ev, source, target, per_position, classes)
    ev.mark(per_position, parts)
    if reduction == "none":
        return per_position
    total = reduction_of(ev, per_position, "sum")
    if reduction == "sum":
        return total
    if classes and not target.is_floating_point():
        return _weighted_mean(ev, call, total, parts)
    return ev.mark(total / prod(parts.extents), Parts((), (), _parts(ev, total).partial))


def _per_position(ev: Tracker, source: torch.Tensor, target: torch.Tensor, result: torch.Tensor,
                  classes: bool) -> Parts:
    if not classes:
        return merge(ev, result.shape, [source, target], "a loss")
    source_parts = _parts(ev, source)
    if source.dim() > 1 and source_parts.axes[1]:
        raise Unsplittable("a cross-entropy over split classes")
    without_classes = Parts(source_parts.axes[:1] + source_parts.axes[2:],
                            source_parts.extents[:1] + source_parts.extents[2:], source_parts.partial)
    target_parts = _parts(ev, target)
    if not target.is_floating_point() and target_parts.axes != without_classes.axes:
        raise Unsplittable("a cross-entropy whose target is split unlike its input")
    return without_classes


def reduction_of(ev: Tracker, tensor: torch.Tensor, name: str) -> torch.Tensor:
    """``tensor.sum()`` (``name`` ``"sum"``) or ``.mean()`` over everything, kept split."""
    return reduction(ev, Call(getattr(torch, name), name, (tensor,), {}))


def _weighted_mean(ev: Tracker, call: Call, total: torch.Tensor, parts: Parts) -> torch.Tensor:
    bound = inspect.signature(call.func).bind(*call.args, **call.kwargs)
    source, target = call.args[0], call.args[1]
    counted = F.nll_loss(-torch.ones_like(source.detach()), target, weight=bound.arguments.get("weight"),
                         ignore_index=bound.arguments.get("ignore_index", -100), reduction="none")
    ev.mark(counted, parts)
    weight = ev.complete(reduction_of(ev, counted, "sum"))
    return ev.mark(total / weight, Parts((), (), _parts(ev, total).partial))


def factory(ev: Tracker, call: Call) -> torch.Tensor:
    """A tensor made constant: ``*_like`` of a split value is split as it is; any other is :func:`uniform`."""
    result = call.run()
    source = call.args[0] if call.name.endswith("_like") else None
    parts = ev.parts(source) if isinstance(source, torch.Tensor) else None
    if parts is None:
        return ev.mark(result, uniform(result))
    return ev.mark(result, Parts(parts.axes, parts.extents, uniform=True))


@_register("dtype", "ndim", "dim", "device", "is_floating_point", "is_complex", "requires_grad", "is_cuda",
           "layout", "grad_fn", "stride", "is_contiguous", "element_size", "data_ptr", "storage_offset",
           "get_device", "is_leaf", "ndimension", "is_sparse", "is_quantized", "is_meta", "is_nested")
def metadata(ev: Tracker, call: Call) -> Any:
    """What a tensor is, not what it holds: the same on every rank."""
    del ev
    return call.run()
