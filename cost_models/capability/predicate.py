"""What the runtime can execute: the one predicate the planner's candidates and the runtime's pre-flight share.

:func:`layer_refusal` answers "can layer L execute under layout X" from the
traced layer alone (its ``LayerGraph`` node: kind, attributes, shapes), so
the planner can ask it without the model, and ``parplan run`` asks it before
any rank starts. :func:`pipeline_refusal` does the same for a plan's
pipeline, and :func:`plan_refusals` for a whole plan. A layout the predicate
refuses is never a candidate (``cost_models.local_problem`` returns no local
problem for it, and the planner's space drops it), and a plan with one is
refused by the runtime, naming the layer and why.

Rules (each is what the runtime, ``runtime.layers``, implements):
    * Any layout splits element-wise layers (activations, dropout, adds,
      products) and the input; an operand computed from parameters alone (a
      layer scale, a positional parameter) is read in the part that
      broadcasts onto the layer's box. A per-channel ``PReLU`` weight is not
      sliced: such an activation takes no channel split. Every other layer
      under a layout that splits only samples runs the user's own module or
      function on its samples; a view there keeps each part of the samples
      where it is (a permutation keeps dimension 0, a reshape maps sample
      part ``k`` onto part ``k`` of its first dimension).
    * Layers computed from parameters and constants alone (no path from the
      input: a relative position bias, a concatenated bias) run whole on
      every rank whatever their layout; the runtime's pre-flight finds them
      in the traced program (``runtime.shapes.constant_nodes``), which a
      LayerGraph node alone does not tell.
    * A channel split (``c``) needs a distributed form: convolution,
      transposed convolution and linear layers split their filters;
      batch-norm, group-norm and instance-norm modules (a part's groups may
      straddle its bounds), pooling, upsampling, padding, flattening, views and
      concatenation (not along the channels) split channels. Linear layers
      split filters of 2-D ``(N, features)`` tensors and of channels-last
      4-D values (their input read whole along the channels), and every
      split tensor is 2-D or 4-D.
    * A height/width split needs a distributed form: convolution (halo
      exchange; any padding: zeros, explicit, ``'same'`` — an even kernel's
      asymmetric one too — or ``'valid'``, and the reflect, replicate and
      circular modes, whose tiles gather their padded rows from themselves
      and their (ring) neighbours: ``cost_models.borders``), ``F.pad`` in any
      mode, pooling (explicit padding, ``ceil_mode`` too, no
      returned indices, average pooling without a divisor override), adaptive
      average pooling (each output tile reads its windows' rows), transposed
      convolution, nearest/bilinear upsampling
      by an integer scale without ``align_corners``, batch-norm, group-norm and
      instance-norm modules, softmax over
      the channels, concatenation not along a split dimension. A slice of a
      tensor made of slices only (``x[:, a:b]``, ghostnet's and rexnet's)
      takes any layout that splits no dimension it slices. Every tile is
      at least as wide as the halo it sends (``cost_models.halo``), and a
      layer reading tiles of its input (convolution, pooling, transposed
      convolution) has at least one row (column) of its input per tile;
      upsampling and adaptive pooling read an input with fewer rows than
      tiles whole (deeplabv3's pooled branch: 1×1 upsampled to the map).
    * A volume ``(N, C, D, H, W)`` splits by depth as by height and width, its
      halos exchanged along each split axis, for the kinds whose forms the
      runtime runs on tiles of any rank (``cost_models.capability.volumes``);
      a 4-D value has no depth to split.
    * A 4-D value whose dimensions hold its axes in another order than
      ``nchw`` (``cost_models.ir.orders``: ConvNeXt's channels-last blocks) is
      split by axis wherever its order puts them: a permutation of a 4-D
      value takes any layout (its box is permuted); element-wise layers read
      such values in one order; a LayerNorm over its last dimensions, and a
      linear layer on a channels-last value, run per position under any
      layout that splits none of the dimensions they read whole (an
      ``nn.Linear`` module splits its filters under ``c``); any other
      layer reading such a value splits it by sample only. Pixel shuffle and
      unshuffle split by channel and space when every part of the coarse side,
      scaled, is the part of the fine side.
    * A transformer's tokens ``(N, L, E)`` (order ``nwc``: patches flattened
      and transposed, ``cost_models.ir.orders``) split by token as ``w`` (``t``)
      and by embedding as ``c``, under the rules above: element-wise layers,
      LayerNorm (not by ``c``) and linear layers (per token; their filters by
      ``c``). Attention (kind ``attention``) splits by sample where its
      query holds the samples in dimension 0; an ``nn.MultiheadAttention``
      attending to itself without a mask or dropout also by token, each
      rank's queries attending to every token (keys and values read whole
      along ``w``), and by whole heads (``c``). A
      concatenation of tokens with a class token (axes not named) splits by
      sample only.
    * Convolution and linear layers split by channel or space, and batch-norm
      by channel, only as modules (a function call has no module whose
      weights can be sliced) — but ``F.conv2d`` with filters computed from
      parameters alone (a weight standardisation) splits by space;
      ``F.batch_norm`` sums its statistics over tiles and samples as the
      module does (its statistics, weight and bias given whole).
    * Batch-norm in training needs more than one value per channel in the
      group its statistics are summed over: the samples of its part of the
      batch (of a micro-batch in a pipeline) times every position of them —
      or the whole batch when synchronised. PyTorch refuses one value.
    * Every part of the output holds at least one element; a layer with
      several output tensors is kept whole — unless it cuts a tensor into
      pieces along a dimension the layout does not split and is read by its
      items only (``left, right = x.chunk(2, dim=1)`` under ``h2``), each
      item then in its layout (:func:`piece_layout_refusal`) — and no
      pipeline cut separates it from a layer reading it (a pipeline sends one tensor per value:
      :func:`crosses_as_tuple`), nor the calls of one module that holds
      parameters (:func:`shared_modules`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from math import prod
from typing import TYPE_CHECKING, Any

from cost_models.capability import channels
from cost_models.capability.attention import attention_refusal
from cost_models.capability.registry import CHANNEL_RULES
from cost_models.capability.spatial import spatial_refusal
from cost_models.capability.views import (
    identity_item,
    last_dim_refusal,
    on_last_dims,
    order_refusal,
    permutes,
    reduction_refusal,
    reshape_refusal,
    sample_dim_refusal,
    sample_view_refusal,
    stacks_or_reduces,
)
from cost_models.capability.volumes import volume_refusal, volume_refusal_applies
from cost_models.capability.windows import merging_refusal, window_refusal
from cost_models.ir.layer import Layer, as_layer
from cost_models.ir.micro_batches import micro_batch_nodes, micro_batch_sizes
from cost_models.ir.orders import default_order, logical
from cost_models.layout import Layout

if TYPE_CHECKING:
    from cost_models.formats.plan import LayerAssignment, Pipeline, Plan
    from cost_models.ir.graph import LayerGraph

__all__ = ["ANY_LAYOUT_KINDS", "CHANNEL_KINDS", "SPATIAL_KINDS", "crosses_as_tuple", "inherent", "layer_refusal",
           "on_last_dims", "piece_layout_refusal", "pipeline_refusal", "plan_refusals", "shared_layout_refusal",
           "shared_module_refusal", "shared_modules", "uncuttable_after"]

_FAMILIES = (channels,)  # modules whose rules register on import and that nothing else here names

ANY_LAYOUT_KINDS = frozenset({"activation", "dropout", "identity", "add", "mul", "elementwise", "input"})
SPATIAL_KINDS = frozenset({"conv", "conv_transpose", "maxpool", "avgpool", "adaptive_avgpool", "upsample", "batchnorm",
                           "cat", "softmax", "pad", "norm", "pixel_shuffle"})
CHANNEL_KINDS = frozenset({"conv", "conv_transpose", "linear", "batchnorm", "maxpool", "avgpool", "upsample",
                           "adaptive_avgpool", "adaptive_maxpool", "softmax", "flatten", "view", "cat", "pad",
                           "pixel_shuffle", "norm"})
_MODULE_ONLY = frozenset({"conv", "conv_transpose", "linear", "batchnorm"})


def layer_refusal(layer: Layer | Mapping[str, Any], layout: Layout, *, sync_batchnorm: bool = False,
                  micro_batches: int = 1) -> str | None:
    """Why the runtime cannot execute ``layer`` (a LayerGraph node, or a mapping of its fields) under ``layout``;
    ``None`` when it can.

    Args:
        sync_batchnorm: Batch-norm statistics over the whole batch (``--sync-batchnorm``, ``--verify``).
        micro_batches: The batch is cut into this many micro-batches (a pipeline's), each normalised alone.
    """
    layer = as_layer(layer)
    kind, output = layer.kind, layer.output_shape
    if kind == "input":
        return None
    if not output or isinstance(output[0], list):
        return None if layout.ranks == 1 else _pieces_refusal(layer, layout)
    if layout.ranks > 1 and any(shape and isinstance(shape[0], list) for shape in layer.input_shapes):
        if kind != "getitem":
            return "it reads a layer with several output tensors other than by its items, so that layer is kept whole"
        order = layer.attrs.get("order") or default_order(len(output))
        return _ordered_fit_refusal(output, order, layout)  # a piece, in the layout of the layer that cut it
    order = layer.attrs.get("order") or default_order(len(output))
    return (_ordered_fit_refusal(output, order, layout) or order_refusal(layer, layout) or _kind_refusal(layer, layout)
            or _batchnorm_refusal(layer, layout, sync_batchnorm, micro_batches))


def _pieces_refusal(layer: Layer, layout: Layout) -> str | None:
    """A layer with several output tensors: a cut into pieces along a dimension the layout does not split
    (``x.chunk(2, dim=1)`` under ``h2``), read by its items only, gives each rank its part of every piece."""
    attrs, inputs = layer.attrs, layer.input_shapes
    shape = inputs[0] if inputs else []
    if "pieces_along" not in attrs or not attrs.get("items_only") or not shape or isinstance(shape[0], list):
        unfit = next((why for piece in layer.output_shape if piece and not isinstance(piece[0], list)
                      and (why := _fit_refusal(piece, layout, flat=True))), None)
        return unfit or "a layer with several output tensors is kept whole"  # (N, classes) logits have no h, w
    order = attrs.get("piece_order") or default_order(len(shape))
    dim = attrs["pieces_along"] % len(shape)
    cut = (attrs.get("input_orders") or [""])[0] if attrs.get("pieces_drop") else order  # the value cut's order
    if attrs.get("pieces_drop") and len(cut) != len(shape):
        return "it unbinds a value whose axes are not named (its pieces' boxes are unknown): kept whole"
    if _dim_split(layout, dim, len(shape)) if len(cut) != len(shape) else getattr(layout, cut[dim], 1) > 1:
        return f"it cuts dimension {dim} into pieces, which {layout} splits"
    return next((why for piece in layer.output_shape if (why := _ordered_fit_refusal(piece, order, layout))), None)


def piece_layout_refusal(graph: LayerGraph, layers: Mapping[str, LayerAssignment]) -> str | None:
    """Why a plan's ``pieces[i]`` cannot run: it must take the layout of the layer that cut the pieces (its
    value is that layer's local piece); ``None`` when every item does."""
    for name, assignment in layers.items():
        if name not in graph or graph.nodes[name].kind != "getitem":
            continue
        for source in graph.predecessors(name):
            produced = graph.nodes[source].output_shape
            if source in layers and produced and isinstance(produced[0], list) and \
                    layers[source].layout != assignment.layout:
                return (f"'{name}' (getitem, {assignment.layout}) reads a piece of '{source}' "
                        f"({layers[source].layout}): an item takes the layout of the layer that made it")
    return None


def _fit_refusal(shape: list[int], layout: Layout, flat: bool = False) -> str | None:
    """Why ``layout`` cannot split ``shape`` into non-empty parts; ``flat``: a value held flattened (a 5-D one
    that is no volume), which splits by sample only."""
    if len(shape) == 5 and not flat:
        small = [f"{extent} {name}" for extent, parts, name in zip(shape, layout.parts(), ("samples", "channels",
                 "slices", "rows", "columns")) if parts > 1 and extent < parts]
        return f"its output {tuple(shape)} has only {', '.join(small)} for {layout}" if small else None
    if len(shape) == 4:
        if layout.d > 1:
            return f"its output {tuple(shape)} is an image: it has no depth to split ({layout})"
        small = [f"{extent} {name}" for extent, parts, name in zip(shape, layout.parts_of(4), ("samples", "channels",
                 "rows", "columns")) if parts > 1 and extent < parts]
        return f"its output {tuple(shape)} has only {', '.join(small)} for {layout}" if small else None
    if layout.spatial > 1:
        return f"a {len(shape)}-D tensor {tuple(shape)} has no depth, height or width to split"
    if layout.c > 1 and len(shape) != 2:
        return f"only 2-D (N, features), 4-D (N, C, H, W) and 5-D tensors split by channel, not {tuple(shape)}"
    if (layout.n > 1 and shape[0] < layout.n) or (layout.c > 1 and shape[1] < layout.c):
        return f"its output {tuple(shape)} has fewer elements than the {layout} parts"
    return None


def _ordered_fit_refusal(shape: list[int], order: str, layout: Layout) -> str | None:
    """:func:`_fit_refusal` of a value whose dimensions hold the axes ``order`` names (a 4-D one, or a reshape's)."""
    if len(order) != len(shape):
        return _fit_refusal(shape, layout, flat=True)
    missing = [axis for axis in "ncdhw" if getattr(layout, axis) > 1 and axis not in order]
    if missing:
        return f"its {len(shape)}-D value {tuple(shape)} ({order}) has no {'/'.join(missing)} axis to split"
    return _fit_refusal(logical(shape, order), layout)


def _kind_refusal(layer: Layer, layout: Layout) -> str | None:
    kind, attrs = layer.kind, layer.attrs
    spatial = layout.spatial > 1
    if volume_refusal_applies(layer, layout) and (why := volume_refusal(layer, layout)):
        return why
    if permutes(layer):
        return sample_view_refusal(layer, layout) if layout.n > 1 else None
    if kind == "view" and spatial and layout.c == 1 and layer.input_shapes:
        return reshape_refusal(layer, layout) or (sample_view_refusal(layer, layout) if layout.n > 1 else None)
    if on_last_dims(layer):
        return last_dim_refusal(layer, layout)
    if kind == "activation" and layout.c > 1 and prod(layer.weight_shape or [1]) > 1:
        return f"a per-channel activation weight {tuple(layer.weight_shape or ())} is not sliced by channel"
    if kind in ANY_LAYOUT_KINDS or identity_item(layer):
        return None
    if kind == "window_attention":
        return window_refusal(layer, layout)
    if attrs.get("patch_merging"):
        return merging_refusal(layer, layout)
    if kind == "attention" and ((why := attention_refusal(layer, layout)) or layout.c * layout.spatial > 1):
        return why  # (split by heads or tokens: its own rules alone)
    if stacks_or_reduces(layer):
        return reduction_refusal(layer, layout) or (sample_dim_refusal(layer) if layout.n > 1 else None)
    if kind == "getitem" and "sliced_dims" in attrs:
        return _slice_refusal(attrs["sliced_dims"], layout)
    if layout.c > 1 and kind not in CHANNEL_KINDS:
        return f"{_noun(kind)} cannot be split by channel"
    if spatial and kind not in SPATIAL_KINDS:
        return f"{_noun(kind)} cannot be split by height or width"
    if attrs.get("function_form") and kind in _MODULE_ONLY and (layout.c > 1 or (spatial and kind != "batchnorm"
                                                                                  and not _tiled_function(layer))):
        return f"{kind} is a function call; only its module form (nn.Conv2d, nn.Linear, …) splits by channel or space"
    if kind == "cat" and _ordered_dim_split(layout, attrs.get("dim", 0), layer):
        return f"concatenation along a split dimension (dim {attrs.get('dim', 0)})"
    if kind in ("view", "flatten") and layout.n > 1 and (moved := sample_view_refusal(layer, layout)):
        return moved
    if kind not in ("view", "flatten") and layout.n > 1 and (moved := sample_dim_refusal(layer)):
        return moved
    if kind == "linear" and layout.c > 1 and any(len(s) != 2 for s in layer.input_shapes):
        return "a linear layer splits its filters on 2-D (N, features) inputs only"
    if spatial:
        return spatial_refusal(layer, layout)
    return CHANNEL_RULES.refusal(layer, layout) if layout.c > 1 else None  # the kind's own (registry)


def _tiled_function(layer: Layer) -> bool:
    """``F.conv2d(x, w, …)`` with filters computed from parameters alone (a weight standardisation) convolves
    tiles as the module does (its call's own filters, whole on every rank)."""
    attrs = layer.attrs
    return layer.kind == "conv" and "kernel_size" in attrs and attrs.get("weight_from_batch") is False


def _slice_refusal(sliced: list[int], layout: Layout) -> str | None:
    """``x[:, a:b, …]`` computes on every part what it computes on the whole when it slices no split dimension."""
    cut = sorted({dim for dim, parts in enumerate(layout.parts_of(4)) if parts > 1} & set(sliced))
    return f"it slices dimension {cut[0]}, which {layout} splits" if cut else None


def _noun(kind: str) -> str:
    if kind == "other":
        return "an opaque layer (a call or module parplan has no split form of)"
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} layer"


def _batchnorm_refusal(layer: Layer, layout: Layout, sync_batchnorm: bool, micro_batches: int) -> str | None:
    if layer.kind == "other" and layer.attrs.get("batch_norms") and sync_batchnorm and layout.n > 1:
        return (f"an opaque module holding {layer.attrs['batch_norms']} batch-norm layer(s) cannot synchronise "
                f"their statistics over a sample split (--sync-batchnorm, --verify); keep it whole, or trace into it")
    if layer.kind != "batchnorm" or layer.attrs.get("training") is False:
        return None
    shape = layer.input_shapes[0]
    batch = max(1, shape[0] // max(1, micro_batches))
    samples = batch if sync_batchnorm else batch // layout.n  # the smallest part of the batch
    positions = 1
    for extent in shape[2:]:
        positions *= extent
    if samples * positions > 1:
        return None
    fewer = f", use fewer micro-batches than {micro_batches} (--micro-batches)" if micro_batches > 1 else ""
    return (f"batch-norm statistics over {samples * positions} value per channel ({samples} sample(s) × "
            f"{positions} position(s)), which PyTorch refuses in training; split fewer samples here{fewer} or "
            f"synchronise batch-norm (--sync-batchnorm)")


_NO_ROWS = re.compile(r"value \([\d, ]+\) \(([ncdhw.]+)\) has no ([dhw/]+) axis to split")
_INHERENT = ("has only", "has no height and width", "has no depth, height or width", "has no depth to split",
             "summing over the batch", "fewer elements than", "too fine for", "reading padding only",
             "cannot split an extent", "along a split dimension", "softmax across tiles",
             "softmax over the split channel", "from parameters and constants alone")


def inherent(reason: str) -> bool:
    """Whether a refusal is the layer's own nature (no runtime could split it so), not a missing distributed form.

    Concatenation or softmax along the split dimension, a tensor too small for the parts or without height and
    width — a value naming some spatial axes lacks the others (tokens and sequences: ``w`` alone) —, a tile
    narrower than a window: a split there needs a redistribution first, which the planner prices as another
    layout. Everything else — a view that moves the split dimension, whose box a runtime could track, and a
    layer with several output tensors included — is something this runtime does not implement yet.
    """
    if any(marker in reason for marker in _INHERENT):
        return True
    rows = _NO_ROWS.search(reason)  # "its 3-D value (…) (nwc) has no h axis to split": tokens have no rows
    return rows is not None and bool(set(rows[1]) & set("dhw")) and set(rows[2].split("/")) <= set("dhw")


def pipeline_refusal(pipeline: Pipeline, batch: int) -> str | None:
    """Why the pipeline runtime cannot execute ``pipeline`` (a ``Plan.pipeline``) on a batch of ``batch``."""
    if pipeline.micro_batches > batch:
        return (f"{pipeline.micro_batches} micro-batches of a batch of {batch}: each needs at least one sample; "
                f"choose at most {batch}")
    if pipeline.schedule == "stale" and any(a < b for a, b in zip(pipeline.staleness, pipeline.staleness[1:])):
        return (f"staleness {list(pipeline.staleness)} grows from a stage to a later one; the stale schedule needs it "
                f"non-increasing (DSP's is 2(K−1−k))")
    return None


def crosses_as_tuple(graph: LayerGraph, layer: str, later: Callable[[str], bool]) -> bool:
    """Whether ``layer`` makes several tensors (a tuple: ``x.chunk(2, dim=1)``) read by a layer ``later(name)``
    says is past a pipeline cut: the pipeline runtime sends one tensor per value, so no cut may fall there."""
    output = graph.nodes[layer].output_shape
    return bool(output) and isinstance(output[0], list) and any(later(reader) for reader in graph.successors(layer))


def uncuttable_after(graph: LayerGraph) -> frozenset[int]:
    """Positions ``p`` in the model's order (``graph.compute_layers()``) after which no pipeline cut may fall: the
    planner's search and ``--stages K`` alike. A cut after ``p`` is refused when it would send a layer's tuple of
    tensors (:func:`crosses_as_tuple`) read past ``p``, split one of the trace's ``held_together`` spans (a value
    no layer holds), or put two calls of one module with parameters on two stages (:func:`shared_modules`)."""
    position = {layer: index for index, layer in enumerate(graph.compute_layers())}
    spans = [[position[layer], *(position[r] for r in graph.successors(layer) if r in position)]
             for layer in position if crosses_as_tuple(graph, layer, lambda reader: reader in position)]
    spans += [[position[layer] for layer in span if layer in position]
              for span in graph.graph.get("held_together", [])]
    spans += [[position[layer] for layer in layers if layer in position] for layers in shared_modules(graph).values()]
    return frozenset(p for spots in spans if len(spots) > 1 for p in range(min(spots), max(spots)))


def shared_modules(graph: LayerGraph) -> dict[str, list[str]]:
    """Modules with parameters that several layers call (one module used twice), each with its layers in order.

    Their parameters are trained once, so no pipeline cut may separate those layers (the parameter would be
    trained on two stages). Parameters tied across two modules are not visible in a LayerGraph; the pipeline
    runtime refuses those when it builds its stages.
    """
    calls: dict[str, list[str]] = {}
    holding: set[str] = set()
    for name, data in graph.nodes(data=True):
        module = data.module or ""
        if module and data.kind != "input" and _calls_module(name, module):
            calls.setdefault(module, []).append(name)
            if data.params > 0:
                holding.add(module)
    return {module: layers for module, layers in calls.items() if module in holding and len(layers) > 1}


def _calls_module(name: str, module: str) -> bool:
    """Whether layer ``name`` is a call of ``module`` itself, not a function called in its ``forward`` (whose
    ``module`` is that scope): torch.fx names a module's call after its path, dots as underscores, and its
    later calls with a suffix ``_1``, ``_2``, …"""
    stem = module.replace(".", "_")
    return name == stem or (name.startswith(stem + "_") and name[len(stem) + 1:].isdigit())


def shared_module_refusal(graph: LayerGraph, stage_of: Mapping[str, int]) -> str | None:
    """Why stages ``stage_of`` (layer → stage) cannot run: a module with parameters called on two stages."""
    for module, layers in shared_modules(graph).items():
        stages = sorted({stage_of[layer] for layer in layers if layer in stage_of})
        if len(stages) > 1:
            return (f"module '{module}' (layers {', '.join(layers[:3])}) is called on stages {stages}: its parameters "
                    f"would be trained on two stages; move the cut so that its calls share a stage")
    return None


def shared_layout_refusal(graph: LayerGraph, layers: Mapping[str, LayerAssignment]) -> str | None:
    """Why calls of one module with parameters cannot run under their layouts (``layers``: layer → assignment):
    a channel split slices the module's weights, so every call must then have the same layout."""
    for module, calls in shared_modules(graph).items():
        layouts = {str(layers[name].layout): name for name in calls if name in layers}
        if len(layouts) > 1 and any(layers[name].layout.c > 1 for name in layouts.values()):
            named = ", ".join(f"'{name}' ({layout})" for layout, name in list(layouts.items())[:3])
            return (f"module '{module}' is called by {named}: a channel split slices its weights, so all its calls "
                    f"need one layout; give them one")
    return None


def plan_refusals(plan: Plan, graph: LayerGraph, *, sync_batchnorm: bool = False) -> Iterator[str]:
    """Every reason the runtime would refuse ``plan`` for ``graph``: its pipeline, then layer by layer."""
    pipeline = plan.pipeline
    if pipeline.stages > 1 and (why := pipeline_refusal(pipeline, int(plan.input_shape[0]))):
        yield why
    if pipeline.stages > 1 and (why := shared_module_refusal(graph, {n: a.stage for n, a in plan.layers.items()})):
        yield why
    if (why := shared_layout_refusal(graph, plan.layers)):
        yield why
    if (why := piece_layout_refusal(graph, plan.layers)):
        yield why
    micro = pipeline.micro_batches if pipeline.stages > 1 else 1
    batch = int(plan.input_shape[0])
    least = micro_batch_sizes(batch, micro)[-1] if micro <= batch else batch  # the smallest micro-batch's samples
    smallest = micro_batch_nodes(graph, least) if 1 < micro <= batch else {}
    for name, assignment in plan.layers.items():
        if name not in graph:
            continue
        node = graph.nodes[name]
        why = layer_refusal(node, assignment.layout, sync_batchnorm=sync_batchnorm, micro_batches=micro)
        if why is None and smallest and (why := layer_refusal(smallest[name], assignment.layout,
                                                              sync_batchnorm=sync_batchnorm)):
            why = f"on a micro-batch of {least} sample(s), {why}"
        if why:
            yield f"'{name}' ({node.kind}, {assignment.layout}): {why}"


def _ordered_dim_split(layout: Layout, dim: int, layer: Layer) -> bool:
    """Whether ``layout`` splits dimension ``dim`` of ``layer``'s output, wherever its order puts the axes."""
    rank = len(layer.output_shape)
    order = layer.attrs.get("order") or default_order(rank)
    if len(order) != rank:
        return _dim_split(layout, dim, rank)
    return getattr(layout, order[dim % rank], 1) > 1


def _dim_split(layout: Layout, dim: int, rank: int) -> bool:
    dim = dim % rank if rank else 0
    parts = layout.parts_of(4) if rank == 4 else (layout.n, layout.c)
    return dim < len(parts) and parts[dim] > 1
