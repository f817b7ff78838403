"""``Layer``: one traced layer of a ``LayerGraph``, a frozen value the graph holds by node id.

Tracing (``cost_models.ir.tracing``) makes one per tensor-producing fx node;
the cost models, the capability predicate, the planner and the runtime read
its fields by name (``layer.kind``, ``layer.output_shape``). A changed layer
is a new value (:func:`dataclasses.replace`, ``LayerGraph.replace_layer``).

Shapes are lists of ints, as the graph's JSON form writes them; a layer with
several output tensors (``x.chunk(2)``) has a list of shapes as its
``output_shape``. ``attrs`` holds the kind's own
hyper-parameters (kernel, stride, padding, dim, scale, orders, …), which
differ from kind to kind (``cost_models.ir.classify`` and
``cost_models.ir._traced_attrs`` document them).

A ``Layer`` also reads as a read-only mapping of its fields
(``layer.kind``, ``dict(layer)``), the form a graph node had before it
was typed; the library itself reads attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from cost_models.ir.kinds import LayerKind

__all__ = ["LAYER_FIELDS", "Layer", "as_layer"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=True)
class Layer(Mapping[str, Any]):
    """One traced layer: what it is, its shapes, its weights and its FLOPs."""

    kind: LayerKind
    """``conv``, ``linear``, ``batchnorm``, ``add``, … (``cost_models.ir.kinds``); ``input`` for a model input."""
    target: str = ""
    """What the node calls: a module class or a function name."""
    module: str = ""
    """Qualified name of the module it belongs to (``""`` at top level)."""
    input_shapes: list[list[Any]] = field(default_factory=list)
    """Shapes of its tensor inputs, in argument order (an input read from a layer with several output tensors:
    that layer's list of shapes)."""
    output_shape: list[Any] = field(default_factory=list)
    """Shape of its output (a list of ints); a list of shapes for a layer with several output tensors."""
    weight_shape: list[int] | None = None
    """Shape of its weight, or ``None``."""
    params: int = 0
    """Number of parameters it owns (shared ones counted once, at their first layer)."""
    param_bytes: int = 0
    """Their size in bytes."""
    flops_fwd: int = 0
    """Forward FLOPs (``cost_models.ir.flops``)."""
    flops_bwd_data: int = 0
    """Backward FLOPs of its input's gradient."""
    flops_bwd_weight: int = 0
    """Backward FLOPs of its weight's gradient."""
    flops_bwd: int = 0
    """Backward FLOPs in all."""
    activation_bytes: int = 0
    """Bytes of its output tensor(s)."""
    aliases_input: bool = False
    """Its output is a view of (or written into) its input."""
    requires_grad: bool = False
    """Its output needs a gradient in backward."""
    needs_input_grad: bool = True
    """Backward must produce its input's gradient (false before the first weights; assumed where not given)."""
    has_weight: bool = False
    """It has trainable weights (a weight gradient is computed)."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """Its kind's hyper-parameters: kernel, stride, padding, dilation, groups, dim, orders, …"""
    dtype: str | None = None
    """Under mixed precision only: the dtype it computes in and outputs, where that is not the weights'."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, ``dtype`` only where set."""
        return {name: getattr(self, name) for name in self}

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> Layer:
        """A layer from its JSON form (:meth:`to_dict`); a field it does not know is refused by name."""
        unknown = sorted(set(values) - set(LAYER_FIELDS))
        if unknown:
            raise ValueError(f"unknown layer field(s) {unknown}; a layer has {', '.join(LAYER_FIELDS)}")
        given = dict(values)
        given.setdefault("has_weight", given.get("weight_shape") is not None)  # a weight not said untrained: trained
        return cls(**given)

    def __getitem__(self, key: str) -> Any:
        if key not in LAYER_FIELDS or (key == "dtype" and self.dtype is None):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(name for name in LAYER_FIELDS if name != "dtype" or self.dtype is not None)

    def __len__(self) -> int:
        return len(LAYER_FIELDS) - (self.dtype is None)

    def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        """Its fields with ``other``'s over them, as ``dict | dict`` merges (a variant to make a layer of)."""
        return {**self, **other}


LAYER_FIELDS: tuple[str, ...] = tuple(spec.name for spec in fields(Layer))
"""The fields of a :class:`Layer`, in the order its JSON form writes them."""


def as_layer(value: Layer | Mapping[str, Any]) -> Layer:
    """``value`` as a :class:`Layer`: a layer as it is; a mapping of a layer's fields (its JSON form, or a variant
    written as ``{**layer, "attrs": …}``) made into one."""
    return value if isinstance(value, Layer) else Layer.from_fields(value)
