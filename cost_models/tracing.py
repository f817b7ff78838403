"""torch.fx tracing and fake-tensor shape propagation behind :func:`cost_models.graph.trace`.

Steps: (1) symbolic tracing in training mode, with a tracer that remembers
which module it was inside, so a failure names it; (2) a fake copy of the
traced module (``FakeCopyMode``) interpreted on a fake input, recording each
node's output shape and element size — no activation or weight memory is
allocated; (3) assembly of the :class:`LayerGraph` with kinds, parameters,
FLOPs and edge bytes.
"""

from __future__ import annotations

import copy
from math import prod
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeCopyMode, FakeTensorMode
from torch.fx import GraphModule, Interpreter, Node, Tracer

from cost_models.errors import InputError, TraceError
from cost_models.flops import layer_flops
from cost_models.graph import LayerGraph, compute_fingerprint
from cost_models.layer_kinds import classify

__all__ = ["build_layer_graph", "symbolic_trace"]

# node name -> list of (shape, itemsize) for each tensor it produced; None for non-tensor results.
TensorMeta = list[tuple[tuple[int, ...], int]]


def build_layer_graph(
    model: nn.Module, input_shape: tuple[int, ...], dtype: torch.dtype | str | None, leaf_modules: tuple[str, ...]
) -> LayerGraph:
    """Trace ``model`` and assemble its :class:`LayerGraph` (see ``graph.trace``)."""
    if not isinstance(model, nn.Module):
        raise InputError(f"expected a torch.nn.Module to trace, got {type(model).__name__}")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    modes = {module: module.training for module in model.modules()}
    model.train()
    try:
        traced = symbolic_trace(model, leaf_modules)
        fake_mode = FakeTensorMode()
        with FakeCopyMode(fake_mode):
            fake_traced = copy.deepcopy(traced)
        _cast_floating(fake_traced, dtype, fake_mode)
    finally:
        for module, training in modes.items():
            module.training = training
    metas = _FakePropagator(fake_traced, fake_mode).propagate(input_shape, dtype)
    graph = _assemble(fake_traced, metas, input_shape, str(dtype).removeprefix("torch."))
    graph.graph["unused_params"] = sum(p.numel() for p in model.parameters()) - graph.totals()["params"]
    return graph


def _cast_floating(module: nn.Module, dtype: torch.dtype, fake_mode: FakeTensorMode) -> None:
    """Give the fake copy's floating-point parameters and buffers the activations' dtype."""
    cast: dict[int, nn.Parameter] = {}  # tied weights stay tied
    with fake_mode:
        for sub in module.modules():
            for key, param in sub._parameters.items():
                if param is not None and param.is_floating_point() and param.dtype != dtype:
                    if id(param) not in cast:
                        cast[id(param)] = nn.Parameter(param.detach().to(dtype), requires_grad=param.requires_grad)
                    sub._parameters[key] = cast[id(param)]
            for key, buffer in sub._buffers.items():
                if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                    sub._buffers[key] = buffer.to(dtype)


class _LocatingTracer(Tracer):
    """A tracer that knows which module it is inside and keeps chosen modules opaque."""

    def __init__(self, leaf_modules: tuple[str, ...]) -> None:
        super().__init__()
        self.leaf_names = set(leaf_modules)
        self.stack: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names or type(m).__name__ in self.leaf_names:
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        self.stack.append((self.path_of_module(m), type(m).__name__))
        result = super().call_module(m, forward, args, kwargs)
        self.stack.pop()
        return result


def symbolic_trace(model: nn.Module, leaf_modules: tuple[str, ...]) -> GraphModule:
    """``torch.fx`` trace of ``model`` whose node names are the layer names of :func:`build_layer_graph`."""
    tracer = _LocatingTracer(leaf_modules)
    try:
        graph = tracer.trace(model)
    except Exception as err:  # user model code: any failure is reported with its location
        where, cls = tracer.stack[-1] if tracer.stack else ("", type(model).__name__)
        place = f"module '{where}' ({cls})" if where else f"the forward of {cls}"
        raise TraceError(
            f"torch.fx cannot trace {place}: {_first_line(err)}; make its forward free of tensor-dependent "
            f"Python control flow, or keep it opaque with --leaf-module {where or cls}"
        ) from err
    return GraphModule(tracer.root, graph, type(model).__name__)


class _FakePropagator(Interpreter):
    """Runs the traced module on fake tensors and records every node's output shapes."""

    def __init__(self, module: GraphModule, fake_mode: FakeTensorMode) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.extra_traceback = False
        self.fake_mode = fake_mode
        self.metas: dict[str, TensorMeta | None] = {}

    def propagate(self, input_shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, TensorMeta | None]:
        with self.fake_mode:
            self.run(torch.empty(input_shape, dtype=dtype))
        return self.metas

    def run_node(self, n: Node) -> Any:
        try:
            result = super().run_node(n)
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
        return result


def _tensor_meta(value: Any) -> TensorMeta | None:
    if isinstance(value, torch.Tensor):
        return [(tuple(int(d) for d in value.shape), value.element_size())]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return [(tuple(int(d) for d in v.shape), v.element_size()) for v in value]
    return None


def _assemble(gm: GraphModule, metas: dict[str, TensorMeta | None], input_shape: tuple[int, ...], dtype: str) -> LayerGraph:
    graph = LayerGraph(input_shape=list(input_shape), dtype=dtype, outputs=[])
    seen_params: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "output":
            graph.graph["outputs"] = [n.name for n in node.all_input_nodes if n.name in graph]
        elif node.op != "get_attr" and metas.get(node.name) is not None:
            _add_layer(graph, gm, node, metas[node.name], seen_params)  # type: ignore[arg-type]
    graph.graph["fingerprint"] = compute_fingerprint(graph)
    return graph


def _add_layer(graph: LayerGraph, gm: GraphModule, node: Node, meta: TensorMeta, seen: set[int]) -> None:
    info = classify(node, gm)
    inputs = [src.name for src in node.all_input_nodes if src.name in graph]
    params = _parameters_of(node, gm)
    owned = [p for p in params if id(p) not in seen]
    seen.update(id(p) for p in owned)
    weight = _weight_of(node, gm)
    has_weight = any(p.requires_grad for p in params)
    needs_input_grad = any(graph.nodes[src]["requires_grad"] for src in inputs)
    attrs = dict(info.attrs)
    if weight is not None and info.kind in ("conv", "conv_transpose", "linear"):
        attrs["weight_shape"] = list(weight)
        if info.kind != "linear":
            attrs.setdefault("kernel_size", list(weight[2:]))
    output_shapes = [shape for shape, _ in meta]
    input_shapes = [list(graph.nodes[src]["output_shape"]) for src in inputs]
    flops = layer_flops(info.kind, input_shapes, output_shapes[0], attrs,
                        needs_input_grad=needs_input_grad, has_weight=has_weight)
    graph.add_node(
        node.name, kind=info.kind, target=info.target, module=_owner(node),
        input_shapes=input_shapes,
        output_shape=list(output_shapes[0]) if len(meta) == 1 else [list(s) for s in output_shapes],
        weight_shape=list(weight) if weight is not None else None,
        params=sum(p.numel() for p in owned), param_bytes=sum(p.numel() * p.element_size() for p in owned),
        flops_fwd=flops.fwd, flops_bwd_data=flops.bwd_data, flops_bwd_weight=flops.bwd_weight, flops_bwd=flops.bwd,
        activation_bytes=sum(prod(shape) * size for shape, size in meta),
        aliases_input=info.aliases_input, requires_grad=has_weight or needs_input_grad,
        needs_input_grad=needs_input_grad, has_weight=has_weight, attrs=attrs,
    )
    for src in dict.fromkeys(inputs):
        graph.add_edge(src, node.name, bytes=graph.nodes[src]["activation_bytes"], shape=graph.nodes[src]["output_shape"])


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
