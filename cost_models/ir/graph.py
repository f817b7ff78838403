"""The traced model, a :class:`LayerGraph` (``cost_models.ir.tracing.trace`` makes one).

A :class:`LayerGraph` is a ``networkx.DiGraph`` whose nodes are the model's
layers in execution (topological) order, keyed by their torch.fx node name
(``layer1_0_conv1``, ``add_3``); ``graph.nodes[name]`` is that layer, a frozen
:class:`~cost_models.ir.layer.Layer` (kind, module, shapes, weights, FLOPs,
attributes, dtype).

Edges ``(producer, consumer)`` carry ``bytes`` (the tensor passed) and
``shape``. ``graph.graph`` holds ``input_shape`` (the first input's),
``input_shapes`` (every input's, in the order of the forward's positional
arguments; one ``kind == "input"`` node each), ``dtype`` (the weights'),
``amp`` (under mixed precision: ``bfloat16`` or ``float16``, the autocast
dtype), ``outputs`` and ``fingerprint``: a stable hash of everything above, so
a plan made for one model and input shape is refused on another.

Shapes come from torch.fx shape propagation on fake tensors, so a batch of
2048×2048 images costs no memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import networkx as nx

from cost_models.errors import InputError
from cost_models.ir.layer import Layer

__all__ = ["AMP_DTYPES", "LayerGraph", "amp_of", "compute_fingerprint", "dtype_itemsize", "layer_dtype",
           "layer_itemsize", "parse_input_shape", "parse_input_shapes"]

AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""Mixed precision's names (``--amp``) and the dtype autocast computes in."""

GRAPH_FORMAT = "parplan.graph/1"
_ITEMSIZE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
_FINGERPRINT_NODE_KEYS = (
    "kind", "target", "input_shapes", "output_shape", "weight_shape", "params", "attrs",
)


class LayerGraph(nx.DiGraph):
    """A traced model: layers as nodes in execution order (each a :class:`Layer`), tensors as edges."""

    def add_node(self, node_for_adding: str, layer: Layer | None = None, /, **fields: Any) -> None:
        """Add (or replace) layer ``node_for_adding``: a :class:`Layer`, or its fields as keywords."""
        made = layer if layer is not None else Layer(**fields)
        if fields and layer is not None:
            raise TypeError(f"layer {node_for_adding!r}: give a Layer or its fields, not both")
        super().add_node(node_for_adding)
        self._node[node_for_adding] = made

    def replace_layer(self, name: str, **changes: Any) -> Layer:
        """Layer ``name`` with ``changes`` (its other fields kept), stored in its place and returned."""
        from dataclasses import replace

        changed = replace(self.nodes[name], **changes)
        self._node[name] = changed
        return changed

    def copy(self, as_view: bool = False) -> LayerGraph:
        """A copy sharing the (frozen) layers; edges and graph attributes copied as ``networkx`` copies them."""
        if as_view:
            view: LayerGraph = super().copy(as_view=True)
            return view
        graph = type(self)()
        graph.graph.update(self.graph)
        for name, layer in self.nodes(data=True):
            graph.add_node(name, layer)
        graph.add_edges_from((u, v, dict(data)) for u, successors in self._adj.items()
                             for v, data in successors.items())
        return graph

    def layers(self) -> list[str]:
        """Layer names in execution order (the order tracing inserted them)."""
        return list(self.nodes)

    def compute_layers(self) -> list[str]:
        """Layers other than the input placeholders."""
        return [name for name, data in self.nodes(data=True) if data.kind != "input"]

    def batch_layers(self) -> set[str]:
        """The layers computed from the model's inputs (the others compute from parameters and constants alone:
        a weight standardisation, a positional table)."""
        size = (self.number_of_nodes(), self.number_of_edges())
        known = self.__dict__.get("_batch_layers")
        if known is None or known[0] != size:  # computed once (a traced graph does not change)
            inputs = [name for name, data in self.nodes(data=True) if data.kind == "input"]
            self.__dict__["_batch_layers"] = (size, frozenset(set(inputs).union(*(nx.descendants(self, name)
                                                                               for name in inputs))))
        return set(self.__dict__["_batch_layers"][1])

    @property
    def fingerprint(self) -> str:
        """The fingerprint stored at trace time (``sha256:…``)."""
        return str(self.graph["fingerprint"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The global shape of the model's first input (the ``N,C,H,W`` one)."""
        return tuple(self.graph["input_shape"])

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The global shape of every model input, in the order of the forward's positional arguments."""
        return tuple(tuple(shape) for shape in self.graph.get("input_shapes", [self.graph["input_shape"]]))

    def inputs(self) -> list[str]:
        """The input nodes' names, in argument order (one per input shape)."""
        return [name for name, data in self.nodes(data=True) if data.kind == "input"]

    def totals(self) -> dict[str, int]:
        """Sums over layers: parameters, FLOPs, activation bytes (aliasing outputs excluded)."""
        layers: list[Layer] = [self.nodes[name] for name in self.nodes]
        return {
            "layers": sum(1 for layer in layers if layer.kind != "input"),
            "params": sum(layer.params for layer in layers),
            "param_bytes": sum(layer.param_bytes for layer in layers),
            "flops_fwd": sum(layer.flops_fwd for layer in layers),
            "flops_bwd": sum(layer.flops_bwd for layer in layers),
            "activation_bytes": sum(layer.activation_bytes for layer in layers if not layer.aliases_input),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON form: graph attributes, layers (with their names) and edges."""
        return {
            "format": GRAPH_FORMAT,
            **{key: self.graph[key] for key in ("input_shape", "dtype", "outputs", "fingerprint")},
            "input_shapes": [list(shape) for shape in self.input_shapes],
            "opaque_modules": self.graph.get("opaque_modules", []),
            "held_together": self.graph.get("held_together", []),
            **({"amp": self.graph["amp"]} if self.graph.get("amp") else {}),
            **({"specialized": self.graph["specialized"]} if self.graph.get("specialized") else {}),
            "layers": [{"name": name, **_jsonable_fields(self.nodes[name].to_dict())} for name in self.nodes],
            "edges": [{"src": u, "dst": v, **_jsonable_fields(self.edges[u, v])}  # inputs in argument order
                      for v in self.nodes for u in self.predecessors(v)],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerGraph:
        """Inverse of :meth:`to_dict` (shapes come back as lists)."""
        graph = cls()
        graph.graph.update({key: data[key] for key in ("input_shape", "dtype", "outputs", "fingerprint")})
        graph.graph["input_shapes"] = [list(shape) for shape in data.get("input_shapes", [data["input_shape"]])]
        graph.graph["opaque_modules"] = list(data.get("opaque_modules", []))
        graph.graph["held_together"] = [list(span) for span in data.get("held_together", [])]
        if data.get("amp"):
            graph.graph["amp"] = data["amp"]
        if data.get("specialized"):
            graph.graph["specialized"] = [list(entry) for entry in data["specialized"]]
        for layer in data["layers"]:
            fields = {key: value for key, value in layer.items() if key != "name"}
            graph.add_node(layer["name"], Layer.from_fields(fields))
        for edge in data["edges"]:
            graph.add_edge(edge["src"], edge["dst"], **{k: v for k, v in edge.items() if k not in ("src", "dst")})
        return graph


def amp_of(graph: nx.DiGraph) -> str:
    """The ``--amp`` a graph was traced under (``bf16``, ``fp16``), ``""`` for none."""
    names = {dtype: name for name, dtype in AMP_DTYPES.items()}
    return names[graph.graph["amp"]] if graph.graph.get("amp") else ""


def layer_dtype(layer: Layer, dtype: str) -> str:
    """The dtype ``layer`` computes in and outputs: its own under mixed precision, else ``dtype`` (the graph's)."""
    return layer.dtype or dtype


def layer_itemsize(layer: Layer, dtype: str) -> int:
    """Bytes per element of ``layer``'s activations (:func:`layer_dtype`)."""
    return dtype_itemsize(layer_dtype(layer, dtype))


def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a floating-point dtype name (``float32`` → 4)."""
    if dtype not in _ITEMSIZE_BYTES:
        raise InputError(f"dtype {dtype!r} is not one parplan plans for; use {', '.join(_ITEMSIZE_BYTES)}")
    return _ITEMSIZE_BYTES[dtype]


def compute_fingerprint(graph: nx.DiGraph) -> str:
    """A stable hash of a traced graph: layers, their shapes and attributes, edges, input shape(s), dtype,
    the Python decisions tracing took for those shapes (``specialized``, when there were any).

    Independent of Python's hash seed, the process and the machine; two traces
    of the same model class at the same input shape and dtype agree. The
    shapes of a second and later inputs enter only when there are several, so
    a single-input model hashes as it always has.
    """
    shapes = [list(shape) for shape in graph.graph.get("input_shapes", [graph.graph["input_shape"]])]
    canonical = {
        "input_shape": list(graph.graph["input_shape"]),
        **({"input_shapes": shapes} if len(shapes) > 1 else {}),
        "dtype": graph.graph["dtype"],
        **({"amp": graph.graph["amp"]} if graph.graph.get("amp") else {}),
        **({"specialized": graph.graph["specialized"]} if graph.graph.get("specialized") else {}),
        "layers": [[name, [_jsonable(getattr(graph.nodes[name], k)) for k in _FINGERPRINT_NODE_KEYS]]
                   for name in graph.nodes],
        "edges": sorted([u, v] for u, v in graph.edges),
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def parse_input_shape(text: str | Sequence[int]) -> tuple[int, ...]:
    """Read the first input's shape (or a sequence of ints): ``N,C,H,W`` images, ``N,C,D,H,W`` volumes or
    ``N,C,L`` sequences, refusing anything else.

    Raises:
        InputError: Not three to five comma-separated positive integers.
    """
    shape = _integers(text, "write it as N,C,H,W, e.g. 8,3,224,224")
    if not 3 <= len(shape) <= 5:
        raise InputError(
            f"input shape {text!r} has {len(shape)} dimensions; parplan plans CNNs on N,C,H,W images (e.g. "
            f"8,3,224,224), N,C,D,H,W volumes (e.g. 2,4,64,64,64) or N,C,L sequences (e.g. 8,1,4096)"
        )
    if any(extent < 1 for extent in shape):
        raise InputError(f"input shape {text!r} has a non-positive extent; every extent must be >= 1")
    return shape


def parse_input_shapes(texts: str | Sequence[int] | Sequence[str | Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Read the model's input shapes, one per ``forward`` positional argument, in order.

    The first is ``N,C,H,W`` (:func:`parse_input_shape`); later ones are any number (at least one) of
    positive extents whose first is the batch ``N`` of the first (``4,16`` for a ``(N, D)`` condition).

    Raises:
        InputError: A shape that is not such a list, or a batch extent other than the first input's
            (both shapes named).
    """
    items: list[str | Sequence[int]]
    if isinstance(texts, str):
        items = [texts]
    elif texts and not isinstance(texts[0], (str, Sequence)):
        items = [cast(Sequence[int], texts)]  # one shape given as a sequence of ints
    else:
        items = list(cast(Sequence[str | Sequence[int]], texts))
    if not items:
        raise InputError("no input shape given; give --input-shape N,C,H,W (repeat it for each further input)")
    first = parse_input_shape(items[0])
    shapes: list[tuple[int, ...]] = [first, *(_later_shape(item) for item in items[1:])]
    for item, shape in zip(items[1:], shapes[1:]):
        _check_batch(items[0], first, item, shape)
    return tuple(shapes)


def _later_shape(text: str | Sequence[int]) -> tuple[int, ...]:
    """A second or later input's shape: at least one positive extent."""
    shape = _integers(text, "write it as comma-separated extents, batch first, e.g. 8,16")
    if not shape or any(extent < 1 for extent in shape):
        raise InputError(f"input shape {text!r} needs one or more positive extents, the batch first, e.g. 8,16")
    return shape


def _check_batch(first_text: str | Sequence[int], first: Sequence[int], text: str | Sequence[int],
                 shape: Sequence[int]) -> None:
    if shape[0] != first[0]:
        raise InputError(f"input shape {_shape_text(text)} has batch {shape[0]} but the first input "
                         f"{_shape_text(first_text)} has batch {first[0]}; every input's first extent is the batch N "
                         f"of the first, e.g. {','.join(map(str, (first[0], *shape[1:])))}")


def _shape_text(value: str | Sequence[int]) -> str:
    return value if isinstance(value, str) else ",".join(str(v) for v in value)


def _integers(text: str | Sequence[int], hint: str) -> tuple[int, ...]:
    parts: Iterable[object] = text.replace("x", ",").split(",") if isinstance(text, str) else text
    try:
        return tuple(int(str(p).strip()) for p in parts)
    except ValueError as err:
        raise InputError(f"input shape {text!r} is not a list of integers; {hint}") from err


def _jsonable_fields(fields: Mapping[str, object]) -> dict[str, object]:
    return {str(key): _jsonable(value) for key, value in fields.items()}


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
