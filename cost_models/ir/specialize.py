"""Shape specialisation at trace time: Python control flow on shapes resolved for the given input shapes.

torch.fx refuses ``bool`` of a traced value, ``len`` of one and iterating one, so a forward that checks its
input (segmentation_models_pytorch's ``if h % output_stride != 0``, ``if x.ndim != 5:``, ``if kwargs:``)
could not be traced at all. The tracer (``cost_models.ir.tracing``) asks a :class:`ShapeOracle` instead:
it evaluates the traced value's ancestors — the graph recorded so far — on fake tensors of the global
input shapes (no memory, no arithmetic) and returns the concrete value, so the branch is the one the
unsplit model takes on an input of that shape. Each answer is a :class:`Specialization` naming the
user's file and line; the list enters the traced graph's fingerprint, so a plan made for one shape is
refused at another whose branches differ.

Assumptions: only values that are not tensors are specialised (sizes, ranks, shape arithmetic,
an empty ``**kwargs``) — the branch the unsplit model takes is what every split must compute, so a
branch on a global extent is right under any layout. A ``bool`` of a tensor (control flow on tensor
*values*) and ``len``/iteration of a tensor (its first extent, which a split would change) are refused,
naming the line. Sizes used as *values* stay traced nodes (the runtime reads them as global sizes).
"""

from __future__ import annotations

import copy
import os
import traceback
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from torch.fx import Graph, Node
from torch.fx.node import map_arg

from cost_models.ir.quiet_logs import quiet

__all__ = ["ShapeOracle", "Specialization", "ValueDependent", "user_location"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_IR_DIR = os.path.dirname(__file__)


class Specialization(NamedTuple):
    """One Python decision taken at trace time for the given input shapes: where, what, and its value."""

    where: str  # "file.py:123"
    code: str  # the line's source text
    value: str  # repr of the concrete value the decision read

    def __str__(self) -> str:
        return f"{self.where} ({self.code}) → {self.value}"


class ValueDependent(Exception):  # noqa: N818 (a refusal, named by what it refuses)
    """Control flow that reads a tensor's values (or a tensor's length, which a split changes)."""


def user_location() -> tuple[str, str]:
    """The innermost calling frame outside torch and this package: the model's ``file:line`` and its text."""
    for frame in reversed(traceback.extract_stack()):
        name = os.path.abspath(frame.filename)
        if not name.startswith((_TORCH_DIR, _IR_DIR)):
            return f"{_short(name)}:{frame.lineno}", (frame.line or "").strip()
    return "?", ""


def _short(path: str) -> str:
    """``site-packages/pkg/mod.py`` → ``pkg/mod.py``; other paths relative to the working directory if inside it."""
    marker = f"{os.sep}site-packages{os.sep}"
    if marker in path:
        return path.split(marker, 1)[1]
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


class ShapeOracle:
    """Evaluates nodes of a graph under construction on fake tensors of the given input shapes."""

    def __init__(self, root: nn.Module, graph: Graph, input_shapes: Sequence[Sequence[int]]) -> None:
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)  # constants the tracer adds to the root later
        with FakeCopyMode(self.fake_mode), quiet("torch.fx.proxy"):
            # module state never changes: running a module here is on a copy (proxies a forward stored on its
            # modules earlier in this trace are copied shallowly: torch.fx says so for each, to no purpose here)
            self.root = copy.deepcopy(root)
        self.real_root = root
        self.dtype = next((p.dtype for p in root.parameters() if p.is_floating_point()), torch.get_default_dtype())
        self.graph = graph
        self.input_shapes = [tuple(shape) for shape in input_shapes]
        self.values: dict[Node, Any] = {}
        self.decisions: list[Specialization] = []

    def value(self, node: Node) -> Any:
        """``node``'s concrete value for the input shapes (its ancestors evaluated once each, in graph order)."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        pending, needed = [node], set()
        while pending:
            current = pending.pop()
            if current not in self.values and current not in needed:
                needed.add(current)
                pending.extend(current.all_input_nodes)
        with self.fake_mode:
            for current in sorted(needed, key=order.__getitem__):
                self.values[current] = self._run(current, order)
        return self.values[node]

    def decide(self, node: Node, read: str) -> Any:
        """The concrete value of ``node`` for a Python decision (``read``: bool, len, iter, int, float or array,
        numpy's copy), recorded.

        Raises:
            ValueDependent: The decision reads a tensor (its values, or its length).
        """
        where, code = user_location()
        value = self.value(node)
        if isinstance(value, torch.Tensor):
            by_values = read in ("bool", "int", "float", "array")
            what = "tensor values" if by_values else f"a tensor's {read} (its first extent)"
            raise ValueDependent(f"Python control flow on {what} at {where} ({code}): only shapes can be "
                                 f"specialised at trace time")
        entry = Specialization(where, code, repr(_decided(value, read)))
        if entry not in self.decisions:
            self.decisions.append(entry)
        return value

    def _run(self, node: Node, order: dict[Node, int]) -> Any:
        args = map_arg(node.args, self.values.__getitem__)
        kwargs = map_arg(node.kwargs, self.values.__getitem__)
        if node.op == "placeholder":
            return self._placeholder(node, order)
        if node.op == "get_attr":
            return _fetch(self.root, str(node.target), _fetch(self.real_root, str(node.target), None))
        if node.op == "call_module":
            return self.root.get_submodule(str(node.target))(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], str(node.target))(*args[1:], **kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)  # type: ignore[operator]
        raise ValueDependent(f"cannot evaluate a {node.op} node at trace time")

    def _placeholder(self, node: Node, order: dict[Node, int]) -> Any:
        target = str(node.target)
        if target.startswith("**"):
            return {}
        if target.startswith("*"):
            return ()
        index = sum(1 for n in self.graph.nodes if n.op == "placeholder" and order[n] < order[node])
        if index < len(self.input_shapes):
            return torch.empty(self.input_shapes[index], dtype=self.dtype)  # the weights' type
        return node.args[0] if node.args else None


def _fetch(root: nn.Module, target: str, default: Any) -> Any:
    value: Any = root
    for part in target.split("."):
        if not hasattr(value, part):
            return default
        value = getattr(value, part)
    return value


def _decided(value: Any, read: str) -> Any:
    if read == "len":
        return len(value)
    if read in ("int", "float"):
        return int(value) if read == "int" else float(value)
    if read == "array":  # numpy's copy of a size or sizes
        return tuple(value) if isinstance(value, (tuple, list)) else value
    if read == "iter":  # the items: numbers as they are, a tensor by its shape (a grid's tuple of tensors)
        return tuple(f"tensor{tuple(item.shape)}" if isinstance(item, torch.Tensor) else item for item in value)
    return bool(value)
