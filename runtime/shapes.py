"""Values every rank computes as the unsplit program does — from shapes, from parameters — and ops taking sizes.

A traced program reads shapes (``x.shape``, ``x.size(0)``, ``x.shape[-2:]``,
``x.dim()``, ``len(x)``) and computes with them in Python. On a rank that
holds a box of each tensor, reading the local tensor's shape would give
another program than the unsplit one (``x.shape[2] == 32`` fails on a tile,
``x.shape[0]`` counts only this rank's samples). So shape reads are
*evaluated once, from the traced global shapes*, together with every
non-tensor node computed only from them (:func:`static_values`): every
rank sees the unsplit program's values, and no tensor is read.

Ops that turn such values into tensor sizes then need this rank's sizes:

* views with explicit sizes — ``reshape``/``view``/``unflatten``,
  ``expand``/``broadcast_to`` — and constant creations (``torch.zeros``,
  ``x.new_empty``, …) take their output's local box extent, which the trace
  knows (:func:`local_call`); a view is exact when this rank's box of its
  input and of its output are the same elements in the same order
  (``runtime.boxes.flat_runs``), an expansion when the non-broadcast dimensions keep
  their ranges;
* upsampling and adaptive pooling take output sizes of height and width
  only, which are whole unless the layer splits them, and then the layer's
  distributed form computes from the traced shapes.

Any other op given a shape-derived value is exact only when the value does
not depend on the extent of a split dimension: :func:`shape_refusals`
evaluates each value again from every rank's box shapes and refuses (names
the layer) an op whose value would differ, rather than computing something
wrong.

Tensors computed from parameters, buffers and constants alone — a relative
position bias gathered from its table, a bias concatenated from parameters, a
layer scale viewed as ``(C, 1, 1)`` — have no samples, rows or channels of the
batch: :func:`constant_nodes` finds them (no path from the model's input), and
every rank computes them whole, as the unsplit program does, whatever layout
the plan gives them. An element-wise layer reads the part of such an operand
that broadcasts onto its box (``runtime.placement.broadcast_part``); a view
of one with sizes from the batch's shapes (``table[i].view(T, T, -1)``,
``token.expand(n, -1, -1)``) is made whole (it is made from shapes, below);
any other layer reads it whole, which is exact only when the layer splits samples
alone, so :func:`shape_refusals` refuses it under a channel or spatial split.

Tensors made from the batch's shapes but from none of its values —
``torch.arange(H)`` of a height read from a shape, a positional encoding
built from it and repeated ``B`` times, ``token.expand(n, -1, -1)`` — are the
unsplit program's too (:func:`shape_made_nodes`): every rank computes them
whole (no op of theirs sees a box, so no shape-derived value of theirs is
ambiguous), and the layers reading them take their box of the whole tensor
as of any value of the batch (element-wise layers: the part broadcasting
onto their box).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch.fx import Node

from cost_models.capability.predicate import ANY_LAYOUT_KINDS, on_last_dims
from cost_models.layout import Layout
from runtime._values import leaves_of, map_values, reshapes_whole
from runtime.boxes import flat_runs, nd_box
from runtime.placement import value_placement

if TYPE_CHECKING:
    from cost_models.ir.graph import LayerGraph

__all__ = ["ELEMENTWISE_KINDS", "VIEW_FORMS", "constant_nodes", "local_call", "module_attribute", "shape_made_nodes",
           "local_reads_agree", "shape_refusals", "shape_refusals_by_layer", "static_nodes", "static_values",
           "view_form"]

_SHAPE_ATTRIBUTES = frozenset({"shape", "ndim"})
_SHAPE_METHODS = frozenset({"size", "dim", "ndimension", "numel"})
_METADATA_ATTRIBUTES = frozenset({"device", "dtype", "is_cuda", "layout"})
_DEVICE_READS = frozenset({"device", "is_cuda"})
"""What every box of a tensor shares: reading it does not make a tensor depend on the batch's values."""
_SPATIAL_SIZES = frozenset({"upsample", "adaptive_avgpool", "adaptive_maxpool", "pad"})
"""Kinds whose sizes computed from shapes are the unsplit program's, as their distributed forms take them (a
padding's amounts are recorded when traced: ``cost_models.ir.tracing``)."""

_RESHAPES = {("call_method", "reshape"), ("call_method", "view"), ("call_method", "unflatten"),
             ("call_function", torch.reshape)}
_EXPANDS = {("call_method", "expand"), ("call_function", torch.broadcast_to)}
_CREATIONS = {("call_function", torch.zeros), ("call_function", torch.ones), ("call_function", torch.empty),
              ("call_function", torch.full), ("call_method", "new_zeros"), ("call_method", "new_ones"),
              ("call_method", "new_empty"), ("call_method", "new_full")}
_MOVES = {("call_method", name) for name in ("permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis",
                                             "flatten", "squeeze", "unsqueeze", "contiguous")} | {
    ("call_function", op) for op in (torch.permute, torch.transpose, torch.swapaxes, torch.movedim, torch.flatten,
                                     torch.squeeze, torch.unsqueeze)}
"""Views without written sizes that move, merge or drop dimensions: run on the local box as written."""
VIEW_FORMS = ("reshape", "expand", "create")
"""What :func:`view_form` answers for an op whose sizes the runtime replaces with the local extent."""

ELEMENTWISE_KINDS = ANY_LAYOUT_KINDS - {"input"}
"""Kinds computed element by element (with broadcasting): they read their box of every operand."""

_UNKNOWN = object()  # a value that could not be evaluated from some rank's box shapes


def _key(node: Node) -> tuple[str, object]:
    return node.op, node.target


def view_form(node: Node) -> str | None:
    """``"reshape"``, ``"expand"`` or ``"create"`` for an op whose output sizes are written in its arguments."""
    key = _key(node)
    if key in _RESHAPES:
        dtype_view = any(isinstance(a, torch.dtype) for a in node.args[1:])  # x.view(torch.float16)
        return None if dtype_view else "reshape"
    if key in _EXPANDS:
        return "expand"
    return "create" if key in _CREATIONS else None


def is_shape_read(node: Node, tensors: Collection[str]) -> bool:
    """Whether ``node`` reads only the shape of one traced tensor (``x.shape``, ``x.size(1)``, ``len(x)``, …)."""
    if not node.args or not isinstance(node.args[0], Node) or node.args[0].name not in tensors:
        return False
    if node.op == "call_method":
        return str(node.target) in _SHAPE_METHODS
    if node.op == "call_function" and node.target is getattr:
        return len(node.args) == 2 and node.args[1] in _SHAPE_ATTRIBUTES
    return node.op == "call_function" and node.target is len


def is_device_read(node: Node, tensors: Collection[str]) -> bool:
    """Whether ``node`` reads where one traced tensor lives (``x.device``, ``x.is_cuda``): every tensor of a
    rank lives on its device, whichever stage made it."""
    return (node.op == "call_function" and node.target is getattr and len(node.args) == 2
            and isinstance(node.args[0], Node) and node.args[0].name in tensors and node.args[1] in _DEVICE_READS)


def static_nodes(nodes: Sequence[Node], tensors: Collection[str]) -> list[Node]:
    """The shape and device reads and every non-tensor node computed from them alone, in program order.

    ``tensors`` are the names of the traced single-tensor values (the layers and the input); a node that
    makes a tensor is never static.
    """
    static: list[Node] = []
    names: set[str] = set()
    for node in nodes:
        if node.name in tensors or node.op not in ("call_function", "call_method"):
            continue
        inputs = node.all_input_nodes
        if is_shape_read(node, tensors) or is_device_read(node, tensors) or (
                inputs and all(n.name in names for n in inputs)):
            static.append(node)
            names.add(node.name)
    return static


def constant_nodes(nodes: Sequence[Node], layers: Collection[str]) -> frozenset[str]:
    """The layers (names in ``layers``) computed from parameters, buffers and constants alone.

    A node depends on the batch when it is the placeholder or reads a node that does (shape reads of the
    input included); every other layer is a constant of the forward pass, the same on every rank.
    """
    carried: set[str] = set()
    constants: set[str] = set()
    for node in nodes:
        if node.op == "placeholder" or any(n.name in carried for n in node.all_input_nodes):
            carried.add(node.name)
        elif node.name in layers and node.op in ("call_function", "call_method", "call_module"):
            constants.add(node.name)
    return frozenset(constants)


def shape_made_nodes(nodes: Sequence[Node], layers: Collection[str], tensors: Collection[str]) -> frozenset[str]:
    """The layers (names in ``layers``) computed from the batch's shapes, parameters and constants, but from no
    value of the batch: ``torch.arange(H)`` of a height read from a shape, a positional encoding built from it,
    ``token.expand(n, -1, -1)``.

    Shape reads (:func:`static_nodes`) and reads of a tensor's device or dtype do not make what reads them
    depend on the batch here (every rank has the unsplit program's values); :func:`constant_nodes` are not
    included (they read no shape). Every rank computes these layers whole, as the unsplit program does.
    """
    free = {node.name for node in static_nodes(nodes, tensors)}
    carried: set[str] = set()
    made: set[str] = set()
    for node in nodes:
        if node.name in free or _reads_metadata(node):
            continue
        if node.op == "placeholder" or any(n.name in carried for n in node.all_input_nodes):
            carried.add(node.name)
        elif node.name in layers and node.op in ("call_function", "call_method", "call_module"):
            made.add(node.name)
    return frozenset(made) - constant_nodes(nodes, layers)


def _reads_metadata(node: Node) -> bool:
    return (node.op == "call_function" and node.target is getattr and len(node.args) == 2
            and node.args[1] in _METADATA_ATTRIBUTES)


def static_values(static: Sequence[Node], shape_of: Callable[[str], Sequence[int]], *,
                  device: torch.device | None = None) -> dict[str, object]:
    """Each static node's value when every tensor ``t`` it reads has the shape ``shape_of(t)`` and lives on
    ``device`` (``None``: the ``meta`` device, to compare values).

    Shapes are read from ``meta`` tensors (no memory); a node that fails on these shapes (an assertion on
    a tile's extent, …) gets a value no other compares equal to.
    """
    values: dict[str, object] = {}
    where = device or torch.device("meta")
    for node in static:
        def value_of(n: Node) -> object:
            return values[n.name] if n.name in values else torch.empty(tuple(shape_of(n.name)), device="meta")

        if node.op == "call_function" and node.target is getattr and node.args[1] in _DEVICE_READS:
            values[node.name] = where if node.args[1] == "device" else where.type == "cuda"
            continue

        args = map_values(node.args, lambda a: value_of(a) if isinstance(a, Node) else a)
        kwargs = map_values(node.kwargs, lambda a: value_of(a) if isinstance(a, Node) else a)
        if any(v is _UNKNOWN for v in leaves_of((args, kwargs))):
            values[node.name] = _UNKNOWN
            continue
        try:
            values[node.name] = _invoke(node, args, kwargs)
        except Exception:  # the user's program rejects these shapes: unknown, compared unequal
            values[node.name] = _UNKNOWN
    return values


def _invoke(node: Node, args: Sequence[object], kwargs: Mapping[str, object]) -> object:
    if node.op == "call_function":
        function = node.target
        assert callable(function), f"'{node.name}' calls {function!r}"
        return function(*args, **kwargs)
    self_arg, *rest = args
    return getattr(self_arg, str(node.target))(*rest, **kwargs)


def local_call(node: Node, form: str, args: Sequence[object], kwargs: Mapping[str, object],
               extent: Sequence[int]) -> torch.Tensor:
    """Run the op of ``node`` (a :func:`view_form`) on local values with its sizes replaced by ``extent``."""
    size = tuple(int(e) for e in extent)
    if form in ("reshape", "expand"):
        source = args[0]
        assert isinstance(source, torch.Tensor), f"'{node.name}' views a {type(source).__name__}"
        return source.reshape(size) if form == "reshape" else source.expand(size)
    fill = _fill_value(node, args, kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("size", "fill_value")}
    if node.op == "call_method":
        method = getattr(args[0], str(node.target))
        return method(size, fill, **kwargs) if fill is not None else method(size, **kwargs)
    create = node.target
    assert callable(create), f"'{node.name}' calls {create!r}"
    return create(size, fill, **kwargs) if fill is not None else create(size, **kwargs)


def _fill_value(node: Node, args: Sequence[object], kwargs: Mapping[str, object]) -> object:
    if str(getattr(node.target, "__name__", node.target)) not in ("full", "new_full"):
        return None
    if "fill_value" in kwargs:
        return kwargs["fill_value"]
    return args[2] if node.op == "call_method" else args[1]


def shape_refusals(nodes: Sequence[Node], graph: LayerGraph, layouts: Mapping[str, Layout], size: int,
                   whole_shape: Callable[[Node], Sequence[int] | None], *, localised: Collection[str] = ()
                   ) -> list[str]:
    """Why the ops of ``nodes`` cannot take the shape-derived values, sizes or whole operands they are given.

    (The module docstring.) Constant layers (:func:`constant_nodes`) and layers made from shapes
    (:func:`shape_made_nodes`) run whole, from the unsplit program's values, and are not checked.

    Args:
        nodes: The traced program's nodes (all of them: shape reads may precede a stage's nodes).
        graph: The LayerGraph: each tensor's global shape, each layer's kind.
        layouts: Each layer's layout (the plan's); a tensor is held as its producer's layout places it.
        size: Members of the group the layouts place values on.
        whole_shape: The shape of a value every rank holds whole (an attribute), ``None`` if unknown.
        localised: Further ops that take their output's local extent whatever sizes they are given
            (random creations, ``runtime.random_ops``).
    """
    refused = shape_refusals_by_layer(nodes, graph, layouts, size, whole_shape, localised=localised)
    return list(dict.fromkeys(reason for reasons in refused.values() for reason in reasons))


def shape_refusals_by_layer(nodes: Sequence[Node], graph: LayerGraph, layouts: Mapping[str, Layout], size: int,
                            whole_shape: Callable[[Node], Sequence[int] | None], *,
                            localised: Collection[str] = ()) -> dict[str, list[str]]:
    """:func:`shape_refusals` by the op refused (its node's name). An op the plan runs whole (``n1``) reads its
    inputs whole and the unsplit program's sizes: never ambiguous — a split refused here runs whole instead
    (``runtime.preflight.shape_fallbacks``)."""
    tensors = tensor_names(graph)
    static = static_nodes(nodes, tensors)
    names = {node.name for node in static}
    constants = constant_nodes(nodes, frozenset(graph.nodes))
    whole = constants | shape_made_nodes(nodes, frozenset(graph.nodes), tensors)
    exact = static_values(static, lambda name: graph.nodes[name].output_shape)
    local = [static_values(static, _local_shapes(graph, layouts, member)) for member in range(size)]
    refused: dict[str, list[str]] = {}
    for node in nodes:
        form = view_form(node)
        if node.name in names or node.name in whole:
            continue
        found: list[str] = []
        if node.name in layouts and form is None:
            found += _operand_refusal(node, graph, layouts[node.name], constants, whole_shape)
            found += _shape_made_operand_refusal(node, graph, layouts[node.name], whole - constants)
        if form in ("reshape", "expand") and node.name in layouts:  # sizes always localised: check the boxes
            found += _view_refusal(node, graph, layouts[node.name], size, constants)
        if _key(node) in _MOVES and node.name in layouts:  # run on the local box as written: check the boxes
            found += _moved_refusal(node, graph, layouts[node.name], size, exact)
        if not (form is not None or node.name in localised or not any(n.name in names for n in node.all_input_nodes)
                or (node.name in graph and graph.nodes[node.name].kind in _SPATIAL_SIZES)
                or (node.name in layouts and layouts[node.name].ranks == 1)):
            found += _ambiguity(node, names, exact, local)
        if found:
            refused[node.name] = found
    return refused


def _operand_refusal(node: Node, graph: LayerGraph, layout: Layout, constants: Collection[str],
                     whole_shape: Callable[[Node], Sequence[int] | None]) -> list[str]:
    """A layer that is not element-wise reads a whole parameter or constant: exact under a sample split only."""
    kind = graph.nodes[node.name].kind
    if layout.c * layout.spatial == 1 or kind in ELEMENTWISE_KINDS or kind == "batchnorm" or (
            kind == "conv" and layout.c == 1):  # F.conv2d by space: whole filters (runtime.layers.functional_conv)
        return []  # F.batch_norm takes its per-channel tensors whole (runtime.layers.functional_batch_norm)
    if on_last_dims(graph.nodes[node.name]):
        return []  # F.layer_norm, F.linear: their weights span the last dimensions, whole in every box
    if kind == "norm" and graph.nodes[node.name].attrs.get("norm") == "GroupNorm":
        return []  # F.group_norm: its per-channel weight and bias cut to the box's channels (runtime.layers)
    if kind == "window_attention" and layout.c == 1:
        return []  # Swin's: its projections and position bias whole on every tile (runtime.windows)
    for source in node.all_input_nodes:
        shape = graph.nodes[source.name].output_shape if source.name in constants else whole_shape(source)
        if shape is not None and _single(list(shape)) and _numel(shape) > 1:
            return [f"'{node.name}' ({_label(node)}) under {layout} reads '{source.name}' {tuple(shape)}, computed "
                    f"from parameters or constants, whole; only element-wise layers read their part of such a "
                    f"tensor — split this layer by sample only"]
    return []


def _shape_made_operand_refusal(node: Node, graph: LayerGraph, layout: Layout, made: Collection[str]) -> list[str]:
    """An opaque call (kind ``other``: ``torch.einsum``, …) under a split layout reading a tensor made from the
    batch's shapes alone (``torch.arange(H)``, a relative-position table indexed by it: MViTv2's attention): that
    tensor is whole on every rank and the call's form cannot say whether its first dimension holds samples to
    cut (``token.expand(n, …)``) or not (``arange(H)``), so the call runs whole."""
    if layout.ranks == 1 or graph.nodes[node.name].kind != "other":
        return []
    for source in node.all_input_nodes:
        if source.name in made and source.name in graph and _single(graph.nodes[source.name].output_shape):
            return [f"'{node.name}' ({_label(node)}) under {layout} reads '{source.name}' "
                    f"{tuple(graph.nodes[source.name].output_shape)}, made from the batch's shapes alone, whole; an "
                    f"opaque call cannot tell whether it holds samples — run this layer whole"]
    return []


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for extent in shape:
        total *= int(extent)
    return total


def tensor_names(graph: LayerGraph) -> frozenset[str]:
    """The traced values that are one tensor (layers and the input; not tuples of tensors)."""
    return frozenset(name for name in graph.nodes if _single(graph.nodes[name].output_shape))


def _single(shape: object) -> bool:
    return isinstance(shape, (list, tuple)) and all(isinstance(extent, int) for extent in shape)


def local_reads_agree(nodes: Sequence[Node], graph: LayerGraph, layouts: Mapping[str, Layout], member: int) -> bool:
    """Whether every shape read of the program gives on ``member``'s boxes what it gives on the unsplit tensors:
    then the program run as written on this member's boxes reads the unsplit program's values."""
    static = static_nodes(nodes, tensor_names(graph))
    exact = static_values(static, lambda name: graph.nodes[name].output_shape)
    local = static_values(static, _local_shapes(graph, layouts, member))
    return all(_equal(local[name], value) for name, value in exact.items())


def _local_shapes(graph: LayerGraph, layouts: Mapping[str, Layout], member: int) -> Callable[[str], tuple[int, ...]]:
    def shape_of(name: str) -> tuple[int, ...]:
        shape = graph.nodes[name].output_shape
        box = nd_box(shape, value_placement(layouts.get(name, Layout()), graph.nodes[name]), member)
        return tuple(shape) if box is None else tuple(stop - start for start, stop in box)

    return shape_of


def _ambiguity(node: Node, names: Collection[str], exact: Mapping[str, object],
               local: Sequence[Mapping[str, object]]) -> list[str]:
    for source in (n for n in node.all_input_nodes if n.name in names):
        for member, values in enumerate(local):
            if not _equal(values[source.name], exact[source.name]):
                mine = "an error" if values[source.name] is _UNKNOWN else repr(values[source.name])
                return [f"'{node.name}' ({_label(node)}) takes {exact[source.name]!r} computed from tensor shapes "
                        f"('{source.name}'), which depends on the extent of a split dimension (member {member}'s "
                        f"box gives {mine}); split the tensors whose shapes it reads only where that extent is not "
                        f"read, or write the sizes with reshape/view/expand, whose sizes the runtime localises"]
    return []


def _view_refusal(node: Node, graph: LayerGraph, layout: Layout, size: int, constants: Collection[str]) -> list[str]:
    source = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    if source is None or source.name not in graph or source.name in constants:
        return []  # a view of a whole tensor: the runtime makes it whole and keeps its box
    out_shape, in_shape = graph.nodes[node.name].output_shape, graph.nodes[source.name].output_shape
    if not _single(out_shape) or not _single(list(in_shape)):
        return [f"'{node.name}' ({_label(node)}) under {layout}: the shape of its input is unknown"]
    made, read = value_placement(layout, graph.nodes[node.name]), value_placement(layout, graph.nodes[source.name])
    if reshapes_whole(read, in_shape, made, out_shape):
        return []  # tokens reshaped into the whole map on every rank, each cutting its box (runtime.apply)
    for member in range(size):
        out_box, in_box = nd_box(out_shape, made, member), nd_box(in_shape, read, member)
        if in_box is None or out_box is None or not _consistent(node, in_shape, in_box, out_shape, out_box):
            return [f"'{node.name}' ({_label(node)} {tuple(in_shape)} → {tuple(out_shape)}) under {layout}: member "
                    f"{member}'s part of its input is not the part of its output it makes; give it a layout that "
                    f"keeps the dimensions it reshapes whole (e.g. split it by sample only)"]
    return []


def _moved_refusal(node: Node, graph: LayerGraph, layout: Layout, size: int, exact: Mapping[str, object]) -> list[str]:
    """A view run on this rank's box (a permutation, a flatten, …) is exact when it makes this rank's output box."""
    source = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    if layout.ranks == 1 or source is None or source.name not in graph or node.name not in graph:
        return []
    in_shape, out_shape = graph.nodes[source.name].output_shape, graph.nodes[node.name].output_shape
    if not (_single(in_shape) and _single(out_shape)):
        return []
    dims = _dimension_map(node, in_shape, exact)
    read, made = value_placement(layout, graph.nodes[source.name]), value_placement(layout, graph.nodes[node.name])
    for member in range(size):
        in_box, out_box = nd_box(in_shape, read, member), nd_box(out_shape, made, member)
        if in_box is None or out_box is None or dims is None or not _maps(dims, in_shape, in_box, out_shape,
                                                                          out_box):
            return [f"'{node.name}' ({_label(node)} {tuple(in_shape)} → {tuple(out_shape)}) under {layout}: member "
                    f"{member}'s part of its input does not become its part of the output; give it a layout that "
                    f"keeps the dimensions it moves whole (e.g. split it by sample only, where it keeps dimension 0)"]
    return []


def _dimension_map(node: Node, in_shape: Sequence[int], exact: Mapping[str, object]) -> list[int | None] | str | None:
    """Per output dimension, the input dimension it is (``None``: extent 1); ``"order"`` for a view that keeps
    the row-major order of the elements (a flatten, a squeeze); ``None`` when it cannot be told."""
    source = torch.empty(tuple(in_shape), device="meta")  # node.args[0]'s value

    def value_of(n: Node) -> object:
        return exact.get(n.name, _UNKNOWN) if n is not node.args[0] else source

    args = map_values(node.args, lambda a: value_of(a) if isinstance(a, Node) else a)
    kwargs = map_values(node.kwargs, lambda a: value_of(a) if isinstance(a, Node) else a)
    if any(v is _UNKNOWN for v in leaves_of((args, kwargs))):
        return None
    try:
        out = _invoke(node, args, kwargs)
    except Exception:  # not evaluable on meta tensors: cannot be told
        return None
    assert isinstance(out, torch.Tensor), f"'{node.name}' moves a tensor's dimensions"
    if out.is_contiguous():
        return "order"
    strides = {(stride, extent): dim for dim, (stride, extent) in
               enumerate(zip(source.stride(), source.shape)) if extent > 1}
    found = [None if extent == 1 else strides.get((stride, extent), -1) for stride, extent in
             zip(out.stride(), out.shape)]
    return None if -1 in found else found


def _maps(dims: list[int | None] | str, in_shape: Sequence[int], in_box: Sequence[tuple[int, int]],
          out_shape: Sequence[int], out_box: Sequence[tuple[int, int]]) -> bool:
    if isinstance(dims, str):  # "order"
        return flat_runs(in_shape, in_box) == flat_runs(out_shape, out_box)
    return all(source is None or out_box[dim] == in_box[source] for dim, source in enumerate(dims))


def _consistent(node: Node, in_shape: Sequence[int], in_box: Sequence[tuple[int, int]], out_shape: Sequence[int],
                out_box: Sequence[tuple[int, int]]) -> bool:
    if view_form(node) == "reshape":
        return flat_runs(in_shape, in_box) == flat_runs(out_shape, out_box)
    lead = len(out_shape) - len(in_shape)  # expand: dimensions align from the right
    return lead >= 0 and all(int(extent) == 1 or in_box[i] == out_box[lead + i] for i, extent in enumerate(in_shape))


def _equal(first: object, second: object) -> bool:
    if first is _UNKNOWN or second is _UNKNOWN:
        return False
    try:
        return bool(first == second)
    except Exception:  # values that cannot be compared are taken as different
        return False


def _label(node: Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    return str(getattr(node.target, "__qualname__", getattr(node.target, "__name__", node.target)))


def module_attribute(model: torch.nn.Module, target: str) -> object:
    """``model``'s attribute at the dotted ``target`` (a ``get_attr`` node's)."""
    value: object = model
    for part in target.split("."):
        value = getattr(value, part)
    return value
