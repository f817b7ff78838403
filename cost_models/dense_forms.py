"""The two forms of a linear layer on channels-last values split by filters: Megatron-LM's column and row forms.

A linear layer on tokens ``(N, L, E)`` or a channels-last map ``(N, H, W, C)``
split ``c`` ways (``nn.Linear``; capability ``_view_rules.last_dim_refusal``)
runs in one of two forms, decided by how its input arrives:

* **column** (the default): its input read whole along the channels (an
  edge redistribution gathers it), this rank's filters, its output part
  ``k`` of the channels; backward sums the partial input gradients over the
  ``c`` group (one allreduce of the local input, whole in channels);
* **row** (Megatron-LM's second linear layer of a pair): when the producer
  holds the input in exactly the layer's layout (its channels split the same
  ``c`` ways, e.g. after a column-split linear layer and an element-wise
  activation), each rank multiplies its input channels by its columns of the
  weight, the partial sums are summed over the ``c`` group and each rank keeps
  its part ``k`` of the output channels (forward: an allreduce then a cut;
  backward: the cut's adjoint, an allreduce of the zero-padded gradients).

Both forms compute ``1/c`` of the layer's FLOPs and leave part ``k`` of the
output channels on rank ``k``: the rest of the plan does not see which ran.
The pair fc1 (column) → activation → fc2 (row) exchanges no activation
between them, and costs one allreduce of the output forward and one of the
input gradient backward, as Megatron-LM's.

Assumptions:
    * The form-dependent seconds are priced on the layer's input edge (the
      edge decides the form): the column form's input-gradient allreduce, or
      the row form's two allreduces of the local output, whole in channels.
      ``layer_cost`` leaves them out of the layer's own seconds.
    * The ``c`` group is ranks ``k · (h·w)`` apart (``cost_models.redistribution``'s
      row-major placement over ``(n, c, h, w)``).
    * The row form holds its input's local channels for backward; the memory
      model keeps the column form's (whole channels): an upper bound.
    * Only within a pipeline stage: an input arriving from another stage is
      received in the column form's placement (its input-gradient sum is not
      priced there: a stage crossing is priced as its transfer).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import TYPE_CHECKING, Any

from cost_models.cluster import Cluster
from cost_models.comm_cost import allreduce_s
from cost_models.ir.layer import Layer, as_layer
from cost_models.layout import Layout
from cost_models.profile import Profile

if TYPE_CHECKING:
    from cost_models.formats.plan import Plan
    from cost_models.ir.graph import LayerGraph

__all__ = ["channels_last_linear", "column_form_s", "form_s", "has_forms", "reads_in_row_form", "row_form",
           "row_form_s"]


def channels_last_linear(layer: Layer) -> bool:
    """An ``nn.Linear`` module reading tokens or a channels-last map (its channels last): it has both forms."""
    attrs, inputs = layer.attrs, layer.input_shapes or []
    if layer.kind != "linear" or len(inputs) != 1 or attrs.get("function_form"):
        return False
    orders = attrs.get("input_orders") or [""]
    return len(inputs[0]) in (3, 4) and len(orders[0]) == len(inputs[0]) and orders[0].endswith("c")


def has_forms(source: Layer, target: Layer, layout: Layout) -> bool:
    """Whether ``target`` under ``layout``, reading ``source``, runs one of the two forms (its edge prices it)."""
    return layout.c > 1 and channels_last_linear(target) and source.kind != "input"


def row_form(source: Layer, target: Layer, have: Layout, layout: Layout) -> bool:
    """Whether ``target`` under ``layout`` runs its row form, reading ``source``'s output held in ``have``."""
    return have == layout and has_forms(source, target, layout) and target.input_shapes[0][-1] >= layout.c


def reads_in_row_form(name: str, plan: Plan, graph: LayerGraph) -> bool:
    """Whether layer ``name`` of ``plan`` runs its row form: its one producer, in its stage, holds the input in
    the layer's own layout (as the cost model prices it on that edge)."""
    sources = list(graph.predecessors(name))
    if len(sources) != 1 or sources[0] not in plan.layers or name not in plan.layers:
        return False
    source, assigned = plan.layers[sources[0]], plan.layers[name]
    return source.stage == assigned.stage and row_form(graph.nodes[sources[0]], graph.nodes[name], source.layout,
                                                       assigned.layout)


def form_s(source: Layer | Mapping[str, Any], target: Layer | Mapping[str, Any], have: Layout, layout: Layout,
           profile: Profile,
           cluster: Cluster, itemsize: int) -> float:
    """Seconds of ``target``'s filter split that depend on its form (0 when it has no forms or ``c`` is 1)."""
    source, target = as_layer(source), as_layer(target)
    if not has_forms(source, target, layout):
        return 0.0
    if row_form(source, target, have, layout):
        return row_form_s(target, layout, profile, cluster, itemsize)
    return column_form_s(target, layout, profile, cluster, itemsize)


def column_form_s(target: Layer, layout: Layout, profile: Profile, cluster: Cluster,
                  itemsize: int) -> float:
    """The column form's input-gradient allreduce over the ``c`` group (its local input, whole in channels)."""
    order = target.attrs["input_orders"][0]
    elements = _local_elements(target.input_shapes[0], order, layout)
    return allreduce_s(profile, cluster, _channel_group(layout), itemsize * elements)


def row_form_s(target: Layer | Mapping[str, Any], layout: Layout, profile: Profile, cluster: Cluster,
               itemsize: int) -> float:
    """The row form's allreduces (forward the partial sums, backward the zero-padded gradients) of its local
    output, whole in channels."""
    target = as_layer(target)
    order = target.attrs["input_orders"][0]
    elements = _local_elements(target.output_shape, order, layout)
    return 2 * allreduce_s(profile, cluster, _channel_group(layout), itemsize * elements)


def _channel_group(layout: Layout) -> list[int]:
    return [index * layout.spatial for index in range(layout.c)]


def _local_elements(shape: list[int], order: str, layout: Layout) -> int:
    """Elements of a rank's box of ``shape`` (axes ``order``, channels last; ``.``: a dimension holding no axis,
    whole) under ``layout``, whole along the channels."""
    return prod(-(-extent // getattr(layout, axis, 1)) for extent, axis in zip(shape[:-1], order)) * shape[-1]
