"""In-place writes made explicit in the traced graph: a write into a view becomes a value the later readers read.

torch.fx records ``y[:, :4].mul_(2)`` as a ``getitem`` and a ``mul_`` whose result nobody reads, while the
layers after it read ``y``: the graph has no edge from the write to them. Run unsplit, the write lands in
``y``'s storage and the model is right; run by parts (a tile of ``y`` on each rank, its channels gathered, a
pipeline cut after the write), the view is another tensor and the write is lost — a wrong result, silently.

:func:`functionalize` rewrites each in-place write whose *written value* — the first value up its chain of
views (``getitem``, ``narrow``, ``select``, ``view``, ``transpose``, ``chunk``, …) — or any view of it is read
after the write, by anything but the write's own result, into one node ::

    written = write_into(base, steps, write)   # clone(base), replay the views, apply the write in place

and gives every later reader of ``base`` the new value, every later reader of a view of it
``view_of_write(written, steps)`` — PyTorch's functionalization (``torch._functorch``'s
``FunctionalTensor``) done on the fx graph, so the planner and the runtime, which share the trace, both see
the edge. The replay repeats the model's own calls on a clone with the base's strides, so a call that
copies instead of viewing (``reshape`` of a non-contiguous value) copies again and the base stays as the
model leaves it. Writes whose written value nobody reads later (``torch.empty(…).normal_()``, an in-place
activation of a fresh value) are left as traced: the value flows through their result.

Left as traced: writes into parameters and buffers (``get_attr``: a running statistic kept by hand, updated
in place on purpose) and the random in-place draws the runtime keys itself (``bernoulli_``, ``normal_``, …).

Both helpers are ``other`` layers (``cost_models.ir.classify``): they run whole, or by samples where their
steps leave dimension 0 alone (:func:`selects_samples`).
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import torch
from torch import nn
from torch.fx import Graph, Node
from torch.fx.node import Argument, _get_qualified_name

__all__ = ["Step", "Write", "functionalize", "selects_samples", "view_of_write", "write_into"]

_VIEW_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "narrow", "select", "transpose", "permute", "unsqueeze",
    "squeeze", "expand", "expand_as", "t", "movedim", "moveaxis", "swapaxes", "swapdims", "unflatten", "flatten",
    "chunk", "split", "tensor_split", "unbind", "diagonal", "unfold", "contiguous", "detach", "as_strided",
    "real", "imag", "view_as_real", "view_as_complex",
})
"""Tensor methods whose result may share the storage of their receiver (or, returning several, of its parts)."""

_VIEW_FUNCTIONS = frozenset({
    "_operator.getitem", "torch.narrow", "torch.select", "torch.transpose", "torch.permute", "torch.unsqueeze",
    "torch.squeeze", "torch.reshape", "torch.flatten", "torch.movedim", "torch.moveaxis", "torch.swapaxes",
    "torch.swapdims", "torch.t", "torch.unflatten", "torch.chunk", "torch.split", "torch.tensor_split",
    "torch.unbind", "torch.diagonal", "torch.real", "torch.imag", "torch.view_as_real", "torch.view_as_complex",
    "torch.functional.split",
})
"""The same as functions of their first argument, by qualified name."""

_NOT_WRITES = frozenset({
    "requires_grad_", "share_memory_", "retain_grad_", "bernoulli_", "uniform_", "normal_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "random_",
})
"""Methods ending in ``_`` that write no value a reader sees through an alias here: autograd flags, and the
random draws ``runtime.random_ops`` keys itself."""


class Step(NamedTuple):
    """One call of a chain of views, without its first argument (the value it is called on)."""

    call: str  # "method" or "function"
    target: str  # a method name, or a function's qualified name
    args: tuple[Argument, ...]
    kwargs: dict[str, Argument]


class Write(NamedTuple):
    """The in-place call, without its first argument (the view it writes into)."""

    call: str  # "method", "function", "setitem" (``view[args[0]] = args[1]``) or "module" (``args[0](view)``)
    target: str
    args: tuple[Argument, ...]
    kwargs: dict[str, Argument]


def write_into(base: Any, steps: tuple[Step, ...], write: Write) -> Any:
    """``base`` after ``write`` into its view ``steps``: a clone written, ``base`` itself untouched."""
    written = _cloned(base)
    _apply(view_of_write(written, steps), write)
    return written


def view_of_write(value: Any, steps: tuple[Step, ...]) -> Any:
    """The view ``steps`` of ``value`` (the model's own calls, repeated)."""
    for step in steps:
        args = (value, *step.args)
        value = getattr(value, step.target)(*step.args, **step.kwargs) if step.call == "method" else \
            _function(step.target)(*args, **step.kwargs)
    return value


def _cloned(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_cloned(item) for item in value)
    return value


def _apply(view: Any, write: Write) -> None:
    if write.call == "method":
        getattr(view, write.target)(*write.args, **write.kwargs)
    elif write.call == "setitem":
        view[write.args[0]] = write.args[1]
    elif write.call == "module":
        module = write.args[0]
        assert isinstance(module, nn.Module)
        module(view, *write.args[1:], **write.kwargs)
    else:
        _function(write.target)(view, *write.args, **write.kwargs)


def _function(qualified: str) -> Callable[..., Any]:
    """The function a qualified name names (``torch.narrow``, ``_operator.getitem``, ``torch.Tensor.add_``)."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return cast(Callable[..., Any], value)
    raise ValueError(f"no function is named {qualified!r}")


def functionalize(graph: Graph) -> int:
    """Rewrite every in-place write some later reader sees through an alias (module docstring); how many."""
    rewritten = 0
    for node in list(graph.nodes):  # a rewrite erases only its write and views before it (never writes)
        target = _written(node)
        if target is not None and _rewrite(graph, node, target):
            rewritten += 1
    return rewritten


def _written(node: Node) -> Node | None:
    """The value ``node`` writes into in place, when it is a write (its first argument)."""
    first = node.args[0] if node.args else None
    if not isinstance(first, Node):
        return None
    if node.op == "call_method":
        name = str(node.target)
        return first if name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES else None
    if node.op == "call_function":
        if node.target is operator.setitem:
            return first
        name = getattr(node.target, "__name__", "")
        return first if node.kwargs.get("inplace") is True or (name.endswith("_") and not name.startswith(
            "_") and name not in _NOT_WRITES) else None
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target)) if node.graph.owning_module else None
        return first if module is not None and getattr(module, "inplace", False) is True else None
    return None


def _rewrite(graph: Graph, write: Node, target: Node) -> bool:
    """Replace ``write`` (into ``target``) by a :func:`write_into` node when a later node reads what it wrote;
    whether it did."""
    base, steps = _chain(target)
    if base.op == "get_attr":
        return False
    order = {node: index for index, node in enumerate(graph.nodes)}
    views = {view: chain for view, chain in _views(base) if order[view] < order[write]}  # later ones read these
    views[write] = steps  # the write's result: the view it wrote (``None`` for ``setitem``, never read)
    later = [(user, view) for view in views for user in view.users
             if order[user] > order[write] and user is not write]
    if all(view is write for _, view in later):
        return False  # only the write's result is read on: the new value flows through it
    with graph.inserting_before(write):
        written = graph.call_function(write_into, (base, steps, _write_of(graph, write)))
    replays: dict[Node, Node] = {}
    for user, view in later:
        replay = written if not views[view] else replays.get(view) or _replay(graph, written, views[view])
        replays[view] = replay
        user.replace_input_with(view, replay)
    graph.erase_node(write)
    _drop_unread(target)
    return True


def _replay(graph: Graph, written: Node, steps: tuple[Step, ...]) -> Node:
    with graph.inserting_after(written):
        return graph.call_function(view_of_write, (written, steps))


def _write_of(graph: Graph, node: Node) -> Write:
    rest, kwargs = tuple(node.args[1:]), dict(node.kwargs)
    if node.op == "call_method":
        return Write("method", str(node.target), rest, kwargs)
    if node.target is operator.setitem:
        return Write("setitem", "", rest, kwargs)
    if node.op == "call_module":
        with graph.inserting_before(node):
            module = graph.get_attr(str(node.target))
        return Write("module", str(node.target), (module, *rest), kwargs)
    return Write("function", _get_qualified_name(node.target), rest, kwargs)  # type: ignore[arg-type]


def _chain(value: Node) -> tuple[Node, tuple[Step, ...]]:
    """The first value up ``value``'s chain of views, and the steps from it down to ``value``."""
    steps: list[Step] = []
    while (step := _step_of(value)) is not None or _is_replay(value):
        if _is_replay(value):
            steps[:0] = _steps_of(value)
            value = value.args[0]  # type: ignore[assignment]
            continue
        assert step is not None
        steps.insert(0, step)
        value = value.args[0]  # type: ignore[assignment]
    return value, tuple(steps)


def _views(base: Node) -> Iterator[tuple[Node, tuple[Step, ...]]]:
    """``base`` and every value viewing it (through view calls and replays), each with its steps."""
    frontier: list[tuple[Node, tuple[Step, ...]]] = [(base, ())]
    while frontier:
        node, steps = frontier.pop()
        yield node, steps
        for user in node.users:
            if user.args and user.args[0] is node:
                if (step := _step_of(user)) is not None:
                    frontier.append((user, (*steps, step)))
                elif _is_replay(user):
                    frontier.append((user, (*steps, *_steps_of(user))))


def _step_of(node: Node) -> Step | None:
    """The view call ``node`` makes of its first argument, or ``None`` when it is not one."""
    if not node.args or not isinstance(node.args[0], Node):
        return None
    rest, kwargs = tuple(node.args[1:]), dict(node.kwargs)
    if node.op == "call_method" and str(node.target) in _VIEW_METHODS:
        return Step("method", str(node.target), rest, kwargs)
    if node.op == "call_function" and callable(node.target):
        name = _get_qualified_name(node.target)
        if name in _VIEW_FUNCTIONS:
            return Step("function", name, rest, kwargs)
    return None


def _steps_of(node: Node) -> tuple[Step, ...]:
    """The steps a :func:`write_into` or :func:`view_of_write` node was made with."""
    return cast(tuple[Step, ...], node.args[1])


def _is_replay(node: Node) -> bool:
    return node.op == "call_function" and node.target is view_of_write


def _drop_unread(node: Node) -> None:
    """Erase ``node`` and the views above it that nothing reads any more (the write's own chain)."""
    while node.op in ("call_method", "call_function") and not node.users and _step_of(node) is not None:
        above = node.args[0]
        node.graph.erase_node(node)
        if not isinstance(above, Node):
            return
        node = above


def selects_samples(node: Node) -> bool:
    """Whether a :func:`write_into` or :func:`view_of_write` node's steps or write may index, move or mix
    dimension 0 (the samples): such a layer cannot run on a rank's own samples. Conservative: a step this
    cannot read (a reshape, a negative dimension, an index tensor) counts as one that does."""
    steps = _steps_of(node)
    parts = False  # the value is a tuple of parts (after ``chunk``): an int index picks one, not a sample
    for step in steps:
        name = step.target.rsplit(".", 1)[-1]
        if not (parts and name == "getitem" and isinstance(step.args[0], int)) and not _keeps_samples(step):
            return True
        parts = name in _PARTS
    if node.target is view_of_write:
        return False
    write = node.args[2]
    assert isinstance(write, Write)
    if write.call == "setitem":
        return not _key_keeps_samples(write.args[0])
    return write.target in _INDEXING_WRITES or write.target.rsplit(".", 1)[-1] in _INDEXING_WRITES


_INDEXING_WRITES = frozenset({"index_put_", "index_fill_", "index_add_", "index_copy_", "index_reduce_",
                              "scatter_", "scatter_add_", "scatter_reduce_", "masked_scatter_", "put_",
                              "set_", "resize_", "resize_as_", "transpose_", "t_", "squeeze_", "unsqueeze_",
                              "as_strided_", "swapaxes_", "swapdims_"})
"""Writes that place values by index or reshape their receiver: they may move samples."""

_POSITIONAL = frozenset({"contiguous", "detach", "real", "imag", "view_as_real"})
_DIM_CALLS = {"narrow": 0, "select": 0, "unsqueeze": 0, "squeeze": 0, "movedim": None, "moveaxis": None,
              "transpose": None, "swapaxes": None, "swapdims": None, "unflatten": 0, "flatten": 0,
              "chunk": 1, "split": 1, "tensor_split": 1, "unbind": 0, "unfold": 0}
"""The position of the dimension argument of calls that index or move one dimension (``None``: two
dimensions, both must be past 0)."""


_PARTS = frozenset({"chunk", "split", "tensor_split", "unbind"})


def _keeps_samples(step: Step) -> bool:
    name, args, kwargs = step.target.rsplit(".", 1)[-1], step.args, step.kwargs
    if name == "getitem":
        return _key_keeps_samples(args[0])
    if name in _POSITIONAL:
        return True
    if name not in _DIM_CALLS:
        return False
    if name == "squeeze" and not args and "dim" not in kwargs:
        return False  # squeezes dimension 0 when there is one sample
    position = _DIM_CALLS[name]
    dims = [kwargs.get("dim", args[position] if position < len(args) else _DEFAULT_DIM.get(name))] \
        if position is not None else [*args[:2], *kwargs.values()]
    return all(isinstance(dim, int) and dim > 0 for dim in dims)


_DEFAULT_DIM = {"chunk": 0, "split": 0, "tensor_split": 0, "flatten": 0, "squeeze": 0, "unbind": 0}


def _key_keeps_samples(key: Argument) -> bool:
    """An index leaves dimension 0 whole: its first entry is ``:`` or ``...``, and none before it adds one."""
    first = key[0] if isinstance(key, tuple) and key else key
    return first is Ellipsis or (isinstance(first, slice) and first == slice(None))
