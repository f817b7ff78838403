"""``trace(model, input_shape) -> LayerGraph``: torch.fx tracing and fake-tensor shape propagation.

Steps: (1) symbolic tracing in training mode, with a tracer that remembers
which module it was inside, so a failure names it — the forward's optional
arguments after the input take their defaults, as ``model(x)`` does, and
``torch.as_tensor`` of a traced value is recorded as a call, ``value[key] = item`` as an
``operator.setitem``, and every in-place write a later layer reads through an alias made a value
(``cost_models.ir.functionalize``); (2) a fake copy of the
traced module (``FakeCopyMode``) interpreted on a fake input, recording each
node's output shape and element size — no activation or weight memory is
allocated; (3) assembly of the :class:`LayerGraph` with kinds, parameters,
FLOPs and edge bytes.

Python decisions on shapes (``if h % 32``, ``if x.ndim != 5``, ``len(x.shape)``, ``if kwargs``) take the
branch an input of the given shapes takes (``cost_models.ir.specialize``; recorded as
``graph.graph["specialized"]``, part of the fingerprint).

Fallback: when torch.fx fails inside a submodule (control flow on tensor
values, ``len`` of a tensor, ...), :func:`symbolic_trace` traces again with that
module kept opaque, until the trace succeeds (at most
``MAX_AUTOMATIC_LEAVES`` modules). The fallback is deterministic and lives in
the one trace the planner and the runtime share, so both see the same
layers. A failure in the root's own forward, or twice in one module, is a
:class:`TraceError` naming it. The modules made opaque, each with the
error that made it so, are ``graph.graph["opaque_modules"]`` (and the
traced module's ``meta``); their layers are ``other`` (``cost_models.ir.classify``).
The forward FLOPs of every opaque module layer (automatic or
``--leaf-module``) are counted by ``torch.utils.flop_counter`` on the fake
copy, stored per output element as ``attrs["flops_per_output"]``
(``cost_models.ir.flops``).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from math import prod
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeCopyMode, FakeTensorMode
from torch.fx import Graph, GraphModule, Interpreter, Node, Proxy, Tracer
from torch.fx.proxy import Attribute
from torch.fx.proxy import TraceError as FxTraceError
from torch.utils.flop_counter import FlopCounterMode

from cost_models.errors import InputError, TraceError
from cost_models.ir._held import held_together
from cost_models.ir._traced_attrs import (
    TensorMeta,
    record_amp,
    record_output_dtypes,
    record_pads,
    shape_attrs,
    with_orders,
)
from cost_models.ir.classify import TF_SAME, KindInfo, classify
from cost_models.ir.dtypes import run_dtype
from cost_models.ir.flops import layer_flops
from cost_models.ir.functionalize import functionalize
from cost_models.ir.graph import AMP_DTYPES, LayerGraph, compute_fingerprint, parse_input_shapes
from cost_models.ir.layer import Layer
from cost_models.ir.module_state import restored_attributes
from cost_models.ir.quiet_logs import quiet
from cost_models.ir.specialize import ShapeOracle, ValueDependent
from cost_models.ir.wrapped_forward import plain_root_forward

__all__ = ["MAX_AUTOMATIC_LEAVES", "build_layer_graph", "symbolic_trace", "trace"]

MAX_AUTOMATIC_LEAVES = 64
"""The most modules one trace keeps opaque automatically before it gives up."""



def build_layer_graph(
    model: nn.Module, input_shapes: tuple[tuple[int, ...], ...], dtype: torch.dtype | str | None,
    leaf_modules: tuple[str, ...], amp: str = ""
) -> LayerGraph:
    """Trace ``model`` and assemble its :class:`LayerGraph` (see :func:`trace`); one shape per model input.

    ``amp`` (``bf16``/``fp16``): shapes propagate under ``torch.autocast`` (CPU's casting lists), so each layer
    records the dtype it computes in (``dtype``) and its activations' bytes in it; ``dtype`` stays the
    weights'."""
    if not isinstance(model, nn.Module):
        raise InputError(f"expected a torch.nn.Module to trace, got {type(model).__name__}")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    modes = {module: module.training for module in model.modules()}
    model.train()
    try:
        traced = symbolic_trace(model, leaf_modules, shapes=input_shapes)
        fake_mode = FakeTensorMode()
        with FakeCopyMode(fake_mode):
            fake_traced = copy.deepcopy(traced)
        _cast_floating(fake_traced, dtype, fake_mode)
    finally:
        for module, training in modes.items():
            module.training = training
    opaque = [dict(entry) for entry in traced.meta["opaque_modules"]]
    names = frozenset(entry["module"] for entry in opaque)
    propagator = _FakePropagator(fake_traced, fake_mode, _opaque_layers(fake_traced, names))
    _check_arguments(traced, input_shapes)
    metas = propagator.propagate(input_shapes, dtype, amp)
    graph = _assemble(fake_traced, metas, propagator.flops, names, input_shapes, str(dtype).removeprefix("torch."),
                      specialized=traced.meta["specialized"])
    record_pads(graph, propagator.pads)
    record_output_dtypes(graph, propagator.dtypes)
    if amp:
        record_amp(graph, amp, propagator.dtypes)
    graph.graph["unused_params"] = sum(p.numel() for p in model.parameters()) - graph.totals()["params"]
    graph.graph["opaque_modules"] = opaque
    graph.graph["recomputed"] = list(traced.meta["recomputed"])
    return graph


def _check_arguments(traced: GraphModule, input_shapes: tuple[tuple[int, ...], ...]) -> None:
    """Refuse more input shapes than the forward has named arguments, or a required argument left without one
    (``*args`` and ``**kwargs`` take no input shape: they are traced empty)."""
    placeholders = [node for node in traced.graph.nodes
                    if node.op == "placeholder" and not str(node.target).startswith("*")]
    names = ", ".join(str(node.target) for node in placeholders)
    if len(input_shapes) > len(placeholders):
        raise InputError(f"{len(input_shapes)} input shapes were given but the model's forward takes "
                         f"{len(placeholders)} tensor argument(s) ({names}); give one --input-shape per argument")
    missing = [str(node.target) for node in placeholders[len(input_shapes):] if not node.args]
    if missing:
        raise InputError(f"the model's forward takes {len(placeholders)} tensor arguments ({names}) but "
                         f"{len(input_shapes)} input shape(s) were given; add --input-shape for {', '.join(missing)}, "
                         f"in argument order (every one batch first)")


def _opaque_layers(gm: GraphModule, automatic: frozenset[str]) -> frozenset[str]:
    """Nodes calling a module whose kind is ``other``, and Swin's window attention (one untraced function):
    opaque, their forward FLOPs counted on fake tensors."""
    return frozenset(node.name for node in gm.graph.nodes if (node.op == "call_module" and classify(
        node, gm, opaque=automatic).kind == "other") or (node.op == "call_function" and classify(
            node, gm, opaque=automatic).kind == "window_attention"))


def _cast_floating(module: nn.Module, dtype: torch.dtype, fake_mode: FakeTensorMode) -> None:
    """Give the fake copy's floating-point parameters and buffers the activations' dtype, complex ones its complex
    counterpart (``cost_models.ir.dtypes``)."""
    cast: dict[int, nn.Parameter] = {}  # tied weights stay tied
    with fake_mode:
        for sub in module.modules():
            for key, param in sub._parameters.items():
                if param is not None and run_dtype(param, dtype) != param.dtype:
                    if id(param) not in cast:
                        cast[id(param)] = nn.Parameter(param.detach().to(run_dtype(param, dtype)),
                                                       requires_grad=param.requires_grad)
                    sub._parameters[key] = cast[id(param)]
            for key, buffer in sub._buffers.items():
                if buffer is not None and run_dtype(buffer, dtype) != buffer.dtype:
                    sub._buffers[key] = buffer.to(run_dtype(buffer, dtype))


class _LocatingTracer(Tracer):
    """A tracer that knows which module it is inside and keeps chosen modules opaque.

    ``torch.as_tensor`` of a traced value is recorded as a call (torch.fx would fail inside it: MONAI
    returns ``torch.as_tensor(self.blocks(x))``); of anything else it runs as usual. ``torch.jit.isinstance``
    of a traced value and ``torch.Tensor``, and ``torch.is_tensor`` of one, are true, as of the tensor it stands for.
    """

    def __init__(self, leaf_modules: tuple[str, ...], shapes: tuple[tuple[int, ...], ...] | None = None) -> None:
        super().__init__()
        self.leaf_names = set(leaf_modules)
        self.stack: list[tuple[str, str]] = []
        self.recomputed: list[str] = []  # the torch.utils.checkpoint regions met, by module or function
        self.shapes = shapes  # the global input shapes Python decisions on shapes are taken for (None: refused)
        self.oracle: ShapeOracle | None = None
        self.evaluating = False  # while the oracle runs modules of its fake copy: plain calls, nothing recorded

    def to_bool(self, obj: Proxy) -> bool:
        """``if``/``and``/``not`` on a shape: the branch an input of the given shapes takes (``specialize``)."""
        return bool(self._decide(obj, "bool")) if self.shapes is not None else super().to_bool(obj)

    def iter(self, obj: Proxy) -> Iterator[Any]:
        """``for d in x.shape``: one traced item per element of the concrete sequence."""
        if self.shapes is None:
            return super().iter(obj)
        items = range(len(self._decide(obj, "iter")))
        return iter([self.create_proxy("call_function", operator.getitem, (obj, index), {}) for index in items])

    def length(self, obj: Proxy) -> int:
        """``len(x.shape)``, ``len(kwargs)``: the concrete length; of a tensor: refused (a split changes it)."""
        if self.shapes is None:
            raise RuntimeError("'len' is not supported in symbolic tracing by default")
        return len(self._decide(obj, "len"))

    def decided(self, obj: Proxy, read: str) -> Any:
        """``obj``'s value for the given shapes as Python reads it (``read``: bool, len, iter, int, float or
        array), recorded as a decision."""
        return self._decide(obj, read)

    def _decide(self, obj: Proxy, read: str) -> Any:
        return self._evaluated(lambda oracle: oracle.decide(obj.node, read))

    def _evaluated(self, ask: Callable[[ShapeOracle], Any]) -> Any:
        """``ask`` the oracle (built at the first question), its modules called plainly meanwhile."""
        if self.oracle is None:
            self.oracle = ShapeOracle(self.root, self.graph, self.shapes or ())
        self.evaluating = True
        try:
            return ask(self.oracle)
        finally:
            self.evaluating = False

    def concrete(self, obj: Proxy) -> Any:
        """``obj``'s value for the given shapes, not a decision (nothing recorded)."""
        return self._evaluated(lambda oracle: oracle.value(obj.node))

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        return attr_val if self.evaluating else super().getattr(attr, attr_val, parameter_proxy_cache)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> Graph:
        as_tensor, refine, is_tensor = torch.as_tensor, torch.jit.isinstance, torch.is_tensor

        def traced_as_tensor(data: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(data, Proxy):
                return data.tracer.create_proxy("call_function", as_tensor, (data, *args), kwargs)
            return as_tensor(data, *args, **kwargs)

        def traced_isinstance(obj: Any, target_type: Any) -> bool:
            """A traced value is a tensor (MONAI's ``torch.jit.isinstance(x, torch.Tensor)`` guards, which
            would otherwise skip the branch the model takes on a real input)."""
            if isinstance(obj, Proxy) and target_type is torch.Tensor:
                return True
            return refine(obj, target_type)

        def traced_is_tensor(obj: Any) -> bool:
            """``torch.is_tensor`` of a traced value is true (diffusers' ``if not torch.is_tensor(timesteps)``)."""
            return isinstance(obj, Proxy) or is_tensor(obj)

        torch.as_tensor, torch.jit.isinstance = traced_as_tensor, traced_isinstance
        torch.is_tensor = traced_is_tensor  # type: ignore[assignment]  # a Proxy is no Tensor to the type checker
        length = Proxy.__len__
        Proxy.__len__ = _proxy_length  # type: ignore[method-assign]  # also x.shape's lazy attribute proxy
        checkpointing = torch.utils.checkpoint
        impl = getattr(checkpointing, "_checkpoint_impl", None)  # torch ≥ 2.12; older torch: not detected
        if impl is not None:
            checkpointing._checkpoint_impl = self._traced_checkpoint
        try:
            with plain_root_forward(root), restored_attributes(root):
                graph = super().trace(root, concrete_args)
        finally:
            torch.as_tensor, torch.jit.isinstance, torch.is_tensor = as_tensor, refine, is_tensor
            Proxy.__len__ = length  # type: ignore[method-assign]
            if impl is not None:
                checkpointing._checkpoint_impl = impl
        if self.oracle is not None:
            _erase_decided(graph, self.oracle)
        return graph

    def _traced_checkpoint(self, function: Any, args: Any, kwargs: Any, **options: Any) -> Any:
        """``torch.utils.checkpoint``'s region, traced inline (as torch.fx does anyway) and remembered: the
        traced program keeps its activations (``graph.graph["recomputed"]``)."""
        name = self.path_of_module(function) if isinstance(function, nn.Module) else getattr(
            function, "__qualname__", type(function).__name__)
        where = self.stack[-1][0] if self.stack else ""
        region = name if isinstance(function, nn.Module) or not where else f"{name} in {where}"
        if region not in self.recomputed:
            self.recomputed.append(region)
        return function(*args, **kwargs)

    def proxy(self, node: Node) -> Proxy:
        return _WritableProxy(node, self)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names or type(m).__name__ in self.leaf_names:
            return True
        if f"{type(m).__module__}.{type(m).__qualname__}" in TF_SAME:
            return True  # a convolution or pooling whose padding reads the input's extent (cost_models.ir.classify)
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        if self.evaluating:
            return forward(*args, **kwargs)
        self.stack.append((self.path_of_module(m), type(m).__name__))
        result = super().call_module(m, forward, args, kwargs)
        self.stack.pop()
        return result


def _proxy_length(proxy: Proxy) -> int:
    tracer = proxy.tracer
    if isinstance(tracer, _LocatingTracer):
        return tracer.length(proxy)
    raise RuntimeError("'len' is not supported in symbolic tracing by default")


def _erase_decided(graph: Graph, oracle: ShapeOracle) -> None:
    """Drop the shape arithmetic only Python decisions read (``h % 32 != 0``): no layer computes it."""
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "call_method") and not node.users and node in oracle.values \
                and not isinstance(oracle.values[node], torch.Tensor) and node.target is not operator.setitem:
            graph.erase_node(node)


class _WritableProxy(Proxy):
    """A traced value that records ``value[key] = item`` (and so ``value[key] += item``) as an ``operator.setitem``
    call, made explicit by :func:`cost_models.ir.functionalize.functionalize`, where torch.fx fails."""

    def __setitem__(self, key: Any, item: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, item), {})

    def __int__(self) -> int:
        """``int(math.ceil(h / p) * p)``: a size made a Python number (MobileViT's patches) is its value for the
        given shapes, recorded as a decision; of a tensor's values: refused."""
        return int(self._number("int"))

    def __float__(self) -> float:
        return float(self._number("float"))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.array(x.shape[2:])`` (MONAI's SwinUNETR checks its input's size in numpy): sizes read into numpy
        are their values for the given shapes, recorded as a decision; a tensor's values: refused."""
        return np.asarray(self._number("array"), dtype=dtype)

    def __getattr__(self, name: str) -> Any:
        if name in ("__array_struct__", "__array_interface__"):  # not traced attributes: numpy asks __array__ next
            raise AttributeError(name)
        return _WritableAttribute(self, name)

    def _number(self, read: str) -> Any:
        tracer = self.tracer
        if isinstance(tracer, _LocatingTracer) and tracer.shapes is not None:
            return tracer.decided(self, read)
        raise TypeError(f"{read}() of a traced value: its value is known only for given input shapes")

    def __format__(self, spec: str) -> str:
        """A size in a message or a name (``f"got {h}x{w}"``) reads as its value for the given shapes."""
        tracer = self.tracer
        if isinstance(tracer, _LocatingTracer) and tracer.shapes is not None:
            value = tracer.concrete(self)
            if not isinstance(value, torch.Tensor):
                return format(value, spec)
        return super().__format__(spec)


class _WritableAttribute(Attribute, _WritableProxy):
    """``x.shape`` of a traced value, itself read as one (``np.array(x.shape)``, ``int(x.shape[0])``)."""


def symbolic_trace(model: nn.Module, leaf_modules: tuple[str, ...], *, inputs: int = 1,
                   shapes: Sequence[Sequence[int]] | None = None) -> GraphModule:
    """``torch.fx`` trace of ``model`` whose node names are the layer names of :func:`build_layer_graph`.

    ``inputs``: how many of the forward's positional arguments are tensor inputs (the first ``inputs``);
    the optional arguments after them take their defaults. ``shapes``: the global input shapes (then
    ``inputs`` is their count): Python decisions on shapes take the branch an input of these shapes takes
    (``cost_models.ir.specialize``), recorded as ``meta["specialized"]``; without them such a decision is a
    trace failure, as in torch.fx.

    A submodule torch.fx cannot trace is kept opaque and the model traced again (see the module docstring);
    the modules so kept are the result's ``meta["opaque_modules"]``: ``{module, class, reason}`` each.

    Raises:
        TraceError: The root's own forward fails, a module fails although kept opaque, or more than
            ``MAX_AUTOMATIC_LEAVES`` modules would be.
    """
    opaque: list[dict[str, str]] = []
    given = tuple(tuple(int(d) for d in shape) for shape in shapes) if shapes is not None else None
    inputs = len(given) if given is not None else inputs
    defaults = _optional_defaults(model, inputs)
    while True:
        tracer = _LocatingTracer((*leaf_modules, *(entry["module"] for entry in opaque)), given)
        try:
            graph = tracer.trace(model, concrete_args=defaults or None)
        except Exception as err:  # user model code: any failure is located, and kept opaque where it can be
            opaque.append(_opaque_entry(tracer, model, err, opaque))
            continue
        _drop_specialized(graph, inputs)
        traced = GraphModule(tracer.root, graph, type(model).__name__)
        if functionalize(traced.graph):
            traced.recompile()
        traced.meta["opaque_modules"] = opaque
        traced.meta["recomputed"] = tracer.recomputed
        traced.meta["specialized"] = [tuple(entry) for entry in tracer.oracle.decisions] if tracer.oracle else []
        return traced


_SPECIALIZED_TYPES = (bool, int, float, str, type(None))
_GUARDS = frozenset({"_assert_is_none", "_assert", "eq"})  # torch.fx's checks of a specialised argument


def _optional_defaults(model: nn.Module, inputs: int) -> dict[str, Any]:
    """The forward's optional arguments after the ``inputs`` inputs, at their defaults: parplan calls
    ``model(x)`` (``model(x, y)`` for two inputs).

    Traced as constants (``if mask is not None`` takes the branch ``model(x)`` takes), not as inputs.
    """
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())[inputs:]
    except (TypeError, ValueError):  # no signature to read (a C-implemented forward)
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in parameters if p.kind in kinds and type(p.default) in _SPECIALIZED_TYPES}


def _drop_specialized(graph: Graph, inputs: int) -> None:
    """Remove the placeholders of specialised arguments and the guards torch.fx checks them with.

    Only the first ``inputs`` placeholders (the model inputs) remain (the runtime feeds the first input to a
    placeholder kept after them); a specialised argument whose placeholder feeds anything but a guard is
    left as traced.
    """
    for placeholder in [node for node in graph.nodes if node.op == "placeholder"][inputs:]:
        reached = _reached_from(placeholder)
        if reached and all(node.op == "call_function" and getattr(node.target, "__name__", "") in _GUARDS
                           for node in reached):
            for node in reversed(reached):
                graph.erase_node(node)
            graph.erase_node(placeholder)


def _reached_from(start: Node) -> list[Node]:
    """Every node reading ``start``, directly or not, in graph order."""
    seen: dict[Node, None] = {}
    frontier = list(start.users)
    while frontier:
        node = frontier.pop()
        if node not in seen:
            seen[node] = None
            frontier.extend(node.users)
    order = {node: index for index, node in enumerate(start.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _opaque_entry(tracer: _LocatingTracer, model: nn.Module, err: Exception,
                  opaque: list[dict[str, str]]) -> dict[str, str]:
    """The module to keep opaque after ``err``; a :class:`TraceError` when there is none to keep."""
    where, cls = tracer.stack[-1] if tracer.stack else ("", type(model).__name__)
    reason = _first_line(err)
    if where and where not in tracer.leaf_names and len(opaque) < MAX_AUTOMATIC_LEAVES:
        return {"module": where, "class": cls, "reason": reason}
    kept = f" (kept opaque automatically before: {', '.join(e['module'] for e in opaque)})" if opaque else ""
    if not where and tracer.shapes is not None and _rejection(err):
        shape = " and ".join(",".join(str(d) for d in shape) for shape in tracer.shapes)
        raise TraceError(f"the model rejects input shape {shape}: {reason}; check --input-shape against what the "
                         f"model expects") from err
    if not where:
        raise TraceError(f"torch.fx cannot trace the forward of {cls}: {reason}{kept}; make its forward free of "
                         f"tensor-dependent Python control flow (the model itself cannot be kept opaque)") from err
    if where in tracer.leaf_names:
        raise TraceError(f"torch.fx cannot trace module '{where}' ({cls}) although it is kept opaque: {reason}"
                         f"{kept}; make its forward free of tensor-dependent Python control flow") from err
    raise TraceError(
        f"torch.fx cannot trace module '{where}' ({cls}): {reason}; {len(opaque)} modules were kept opaque "
        f"automatically already (at most {MAX_AUTOMATIC_LEAVES}); make its forward free of tensor-dependent "
        f"Python control flow, or keep an enclosing module opaque with --leaf-module"
    ) from err


def _rejection(err: Exception) -> bool:
    """The model's own refusal of its input (a ``ValueError`` or failed ``assert`` its forward raised), not
    torch.fx's or the shape oracle's."""
    return isinstance(err, (ValueError, AssertionError)) and not isinstance(err, (FxTraceError, ValueDependent))


class _FakePropagator(Interpreter):
    """Runs the traced module on fake tensors and records every node's output shapes."""

    def __init__(self, module: GraphModule, fake_mode: FakeTensorMode, counted: frozenset[str]) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.extra_traceback = False
        self.fake_mode = fake_mode
        self.counted = counted
        self.metas: dict[str, TensorMeta | None] = {}
        self.flops: dict[str, int] = {}  # forward FLOPs of the ``counted`` nodes (torch.utils.flop_counter)
        self.pads: dict[str, list[int]] = {}  # F.pad's amounts as the call received them (computed from shapes too)
        self.dtypes: dict[str, str] = {}  # each node's (first) output dtype

    def propagate(self, input_shapes: tuple[tuple[int, ...], ...], dtype: torch.dtype,
                  amp: str = "") -> dict[str, TensorMeta | None]:
        cast = torch.autocast("cpu", dtype=getattr(torch, AMP_DTYPES[amp])) if amp else contextlib.nullcontext()
        # fake tensors log a model's rejection of its input with a traceback: the trace reports it in one line
        with self.fake_mode, cast, quiet("torch._subclasses.fake_tensor", logging.CRITICAL):
            self.run(*(torch.empty(shape, dtype=dtype) for shape in input_shapes))
        return self.metas

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        shortcut = _batchnorm_output(self.fetch_attr(str(target)), args, kwargs)
        return super().call_module(target, args, kwargs) if shortcut is None else shortcut

    def run_node(self, n: Node) -> Any:
        if n.op == "call_function" and n.target is F.pad:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            amounts = args[1] if len(args) > 1 else kwargs.get("pad")
            if isinstance(amounts, (list, tuple)) and all(isinstance(v, int) for v in amounts):
                self.pads[n.name] = [int(v) for v in amounts]
        try:
            result = self._counted_run(n) if n.name in self.counted else super().run_node(n)
        except DataDependentOutputException as err:
            raise TraceError(
                f"layer '{n.name}' ({_node_label(n)}) needs tensor values ({err.func}), which shape propagation on "
                f"fake tensors cannot provide; make its control flow depend on shapes only"
            ) from err
        except Exception as err:  # the model rejected the input: say which layer and why
            raise TraceError(
                f"the model rejects input shape {_shape_text(self.metas)} at layer '{n.name}' "
                f"({_node_label(n)}): {_first_line(err)}; check --input-shape against what the model expects"
            ) from err
        self.metas[n.name] = _tensor_meta(result)
        first = result if isinstance(result, torch.Tensor) else next(
            (v for v in result if isinstance(v, torch.Tensor)), None) if isinstance(result, (tuple, list)) else None
        if first is not None:
            self.dtypes[n.name] = str(first.dtype).removeprefix("torch.")
        return result

    def _counted_run(self, n: Node) -> Any:
        with FlopCounterMode(display=False) as counter:
            result = super().run_node(n)
        self.flops[n.name] = int(counter.get_total_flops())
        return result


def _batchnorm_output(module: nn.Module, args: Any, kwargs: Any) -> torch.Tensor | None:
    """What a plain ``nn.BatchNorm2d`` returns for ``args`` — a tensor of its input's shape and dtype — when
    running it could neither fail nor return anything else; ``None`` otherwise (it is run).

    On fake tensors its kernel is a slow decomposition (half the time of tracing a DenseNet), and only the
    output's shape and element size are recorded. Anything unusual runs it: hooks, a subclass, keyword
    arguments, a non-contiguous or mismatched input, a cumulative average (``momentum=None`` reads a count),
    one value per channel in training (which it refuses).
    """
    if type(module) is not nn.BatchNorm2d or kwargs or len(args) != 1 or _hooked(module):
        return None
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_contiguous() or x.shape[1] != module.num_features:
        return None
    held = [t for t in (module.weight, module.bias, module.running_mean, module.running_var) if t is not None]
    if any(tuple(t.shape) != (module.num_features,) or t.dtype != x.dtype or t.device != x.device for t in held):
        return None
    batch_statistics = module.training or (module.running_mean is None and module.running_var is None)
    if module.momentum is None or (batch_statistics and x.shape[0] * x.shape[2] * x.shape[3] == 1):
        return None
    return torch.empty_like(x)


def _hooked(module: nn.Module) -> bool:
    """Whether calling ``module`` runs hooks (its own or global ones) besides its forward."""
    from torch.nn.modules import module as modules

    return bool(module._forward_hooks or module._forward_pre_hooks or modules._global_forward_hooks
                or modules._global_forward_pre_hooks or getattr(modules, "_global_forward_hooks_always_called", None))


def _tensor_meta(value: Any) -> TensorMeta | None:
    if isinstance(value, torch.Tensor):
        return [(tuple(int(d) for d in value.shape), value.element_size())]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return [(tuple(int(d) for d in v.shape), v.element_size()) for v in value]
    if isinstance(value, tuple) and len(value) > 1 and isinstance(value[0], torch.Tensor) \
            and all(v is None for v in value[1:]):
        return [(tuple(int(d) for d in value[0].shape), value[0].element_size())]  # (out, None): out
    return None


def _assemble(gm: GraphModule, metas: dict[str, TensorMeta | None], counted: dict[str, int],
              opaque: frozenset[str], input_shapes: tuple[tuple[int, ...], ...], dtype: str, *,
              specialized: Sequence[Sequence[str]]) -> LayerGraph:
    graph = LayerGraph(input_shape=list(input_shapes[0]), input_shapes=[list(shape) for shape in input_shapes],
                       dtype=dtype, outputs=[])
    if specialized:
        graph.graph["specialized"] = [list(entry) for entry in specialized]
    seen_params: set[int] = set()
    orders: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            graph.graph["outputs"] = [n.name for n in node.all_input_nodes if n.name in graph]
        elif node.op != "get_attr" and (meta := metas.get(node.name)) is not None:
            info = classify(node, gm, opaque=opaque)
            if counted.get(node.name):
                per_output = counted[node.name] / prod(meta[0][0])
                info = replace(info, attrs={**info.attrs, "flops_per_output": per_output})
            info = with_orders(node, info, meta, graph, orders)
            _add_layer(graph, gm, node, info, meta, seen_params)
    graph.graph["held_together"] = held_together(gm, graph)
    graph.graph["fingerprint"] = compute_fingerprint(graph)
    return graph


def _add_layer(graph: LayerGraph, gm: GraphModule, node: Node, info: KindInfo, meta: TensorMeta,
               seen: set[int]) -> None:
    inputs = [src.name for src in node.all_input_nodes if src.name in graph]
    params = _parameters_of(node, gm)
    owned = [p for p in params if id(p) not in seen]
    seen.update(id(p) for p in owned)
    weight = _weight_of(node, gm)
    has_weight = any(p.requires_grad for p in params)
    needs_input_grad = any(graph.nodes[src].requires_grad for src in inputs)
    attrs = {**info.attrs, **shape_attrs(graph, info.kind, info.attrs, inputs, weight is not None)}
    if weight is not None and info.kind in ("conv", "conv_transpose", "linear"):
        attrs["weight_shape"] = list(weight)
        if info.kind != "linear":
            attrs.setdefault("kernel_size", list(weight[2:]))
    output_shapes = [shape for shape, _ in meta]
    input_shapes = [list(graph.nodes[src].output_shape) for src in inputs]
    flops = layer_flops(info.kind, input_shapes, output_shapes[0], attrs,
                        needs_input_grad=needs_input_grad, has_weight=has_weight)
    graph.add_node(node.name, Layer(
        kind=info.kind, target=info.target, module=_owner(node),
        input_shapes=input_shapes,
        output_shape=list(output_shapes[0]) if len(meta) == 1 else [list(s) for s in output_shapes],
        weight_shape=list(weight) if weight is not None else None,
        params=sum(p.numel() for p in owned), param_bytes=sum(p.numel() * p.element_size() for p in owned),
        flops_fwd=flops.fwd, flops_bwd_data=flops.bwd_data, flops_bwd_weight=flops.bwd_weight, flops_bwd=flops.bwd,
        activation_bytes=sum(prod(shape) * size for shape, size in meta),
        aliases_input=info.aliases_input, requires_grad=has_weight or needs_input_grad,
        needs_input_grad=needs_input_grad, has_weight=has_weight, attrs=attrs,
    ))
    for src in dict.fromkeys(inputs):
        graph.add_edge(src, node.name, bytes=graph.nodes[src].activation_bytes, shape=graph.nodes[src].output_shape)


def _parameters_of(node: Node, gm: GraphModule) -> list[nn.Parameter]:
    if node.op == "call_module":
        return list(gm.get_submodule(str(node.target)).parameters())
    attrs = [src for src in node.all_input_nodes if src.op == "get_attr"]
    fetched = [_fetch(gm, str(src.target)) for src in attrs]
    return [value for value in fetched if isinstance(value, nn.Parameter)]


def _weight_of(node: Node, gm: GraphModule) -> tuple[int, ...] | None:
    if node.op == "call_module":
        weight = getattr(gm.get_submodule(str(node.target)), "weight", None)
        return tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
    for src in node.all_input_nodes:
        if src.op == "get_attr":
            value = _fetch(gm, str(src.target))
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                return tuple(value.shape)
    return None


def _fetch(gm: GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _owner(node: Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def _node_label(node: Node) -> str:
    return f"module {node.target}" if node.op == "call_module" else str(getattr(node.target, "__name__", node.target))


def _shape_text(metas: dict[str, TensorMeta | None]) -> str:
    first = next(iter(metas.values()), None)
    return ",".join(str(d) for d in first[0][0]) if first else "?"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__).rstrip(".")


def trace(model: Any, input_shape: Sequence[int] | Sequence[Sequence[int]], dtype: Any = None,
          leaf_modules: Iterable[str] = (), amp: str = "") -> LayerGraph:
    """Trace ``model`` at ``input_shape`` into a :class:`LayerGraph`.

    Args:
        model: An ``nn.Module``; traced in training mode (its modes are restored).
        input_shape: Global input shape ``(N, C, H, W)``; or, for a model taking several tensors, a sequence
            of shapes, one per positional argument of its forward in order (:func:`parse_input_shapes`).
        dtype: Element type of the input and activations, a ``torch.dtype`` or its name (default ``float32``).
        leaf_modules: Qualified names or class names of modules to keep opaque
            (not traced into), for modules torch.fx cannot trace.
        amp: ``bf16`` or ``fp16``: trace under ``torch.autocast`` (mixed precision; ``dtype`` is then the
            weights', each layer's own compute dtype is recorded).

    Raises:
        TraceError: torch.fx cannot trace a module (named), or the model rejects the input.
        InputError: The input shape is not four positive integers, or the shapes do not fit the forward.
    """
    if amp and amp not in AMP_DTYPES:
        raise InputError(f"amp {amp!r} is not a mixed precision parplan knows; use one of {', '.join(AMP_DTYPES)}")
    return build_layer_graph(model, parse_input_shapes(input_shape), dtype, tuple(leaf_modules), amp)
