"""Seconds of one layer under one layout: compute, halo exchange, weight-gradient allreduce, norm statistics.

Assumptions (beyond those of the modules used):
    * Compute is the local problem's passes (``local_problem.phases_of``), each
      a measured profile entry when its key was timed, else the fitted model.
    * Halo exchange (convolution and pooling split by height/width) happens
      once forward (activations) and once backward (their gradients); with
      ``overlap`` on a device whose runtime overlaps (``Profile.overlaps_halos``:
      GPUs, not CPUs) the interior of the tile is computed meanwhile, so only
      ``max(0, halo − interior compute)`` is exposed. The interior is the share
      of local output rows/columns that need no halo.
    * Ranks of a layer are placed row-major over ``(n, c, h, w)``
      (``cost_models.redistribution``): a tile's spatial neighbours are
      consecutive ranks, and the ``h·w`` group spans nodes only when it is
      larger than a node.
    * Weights split by ``c`` (filters of convolution/linear, channels of
      batch-norm) are allreduced over the ``D/c`` ranks that hold the same slice,
      in buckets shared with the other layers' gradients
      (``comm_cost.gradient_allreduce_s``).
    * Batch-norm split by space sums its statistics over the ``h·w`` tiles of
      its samples (the runtime's default; statistics per group of samples, as
      data parallelism computes them): forward, one allgather of each tile's
      count, mean and variance (``3·C`` float64); backward, one allreduce of
      ``2·C`` float64 sums (``runtime.norm``). Synchronised batch-norm (over
      the whole batch, ``parplan run --sync-batchnorm``) is not priced: it
      runs the same two collectives over the ``n·h·w`` ranks. Group-norm and
      instance-norm split by space allreduce ``2·N·G`` sums (per sample and
      group) forward and backward.
    * A filter (``c``) split of a convolution or linear layer needs the full
      input on every rank (an edge redistribution provides it) and sums the
      partial input gradients over the ``c`` group: one allreduce of the local
      input gradient. A channels-last linear layer's is priced on its input
      edge instead, whose layouts decide its form (``cost_models.dense_forms``).
      A head split of attention sums the input gradients too, and gathers
      every head's output over the group (an all-gather forward, its adjoint
      backward, each priced as one all-gather); its weights are whole on every
      rank, allreduced over all of them.
    * Swin's window attention split by rows or columns (whole windows per
      tile) exchanges its shifted windows' rows with the adjacent tiles: four
      messages of ``shift`` rows per split axis (``runtime.windows``), exposed.
    * A profile refined by ``parplan validate --refine`` scales every term but
      the weight-gradient allreduce by its layer factor
      (``cost_models.corrections``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import prod

from cost_models.borders import axis_pads, gathered_halos, window_reads
from cost_models.cluster import Cluster
from cost_models.comm_cost import (
    GRADIENT_BUCKET_BYTES,
    allgather_s,
    allreduce_s,
    halo_exchange_s,
    node_shape,
    shaped_allreduce_s,
)
from cost_models.dense_forms import channels_last_linear
from cost_models.errors import PlanError
from cost_models.halo import AxisHalo, distinct_axis_halos, halo_messages, volume_halo_messages
from cost_models.ir.kinds import DENSE_KINDS
from cost_models.ir.layer import Layer
from cost_models.layout import Layout
from cost_models.local_problem import LocalProblem, axis_value, layer_problem, local_problem, phases_of
from cost_models.profile import Profile

__all__ = ["Compute", "LayerCost", "compute_s", "layer_cost", "least_device_s", "problem_cost"]

_HALO_KINDS = frozenset({"conv", "maxpool", "avgpool"})
_FLOPS_OF = {"fwd": "fwd", "bwd_data": "bwd_data", "bwd_weight": "bwd_weight", "bwd": "bwd"}


@dataclass(frozen=True)
class LayerCost:
    """One layer's seconds per term; ``compute_source`` is ``measured``, ``fitted``, ``mixed`` or ``none``."""

    forward_s: float
    backward_s: float
    halo_s: float
    halo_exposed_s: float
    allreduce_s: float
    norm_s: float
    channel_reduce_s: float
    compute_source: str
    backward_weight_s: float = 0.0
    """The weight-gradient share of ``backward_s`` (timed apart: ``bwd_weight``; 0 when fused or weightless)."""

    @property
    def total_s(self) -> float:
        """Time on the critical path if nothing overlapped except the halo's interior."""
        return (self.forward_s + self.backward_s + self.halo_exposed_s + self.allreduce_s + self.norm_s
                + self.channel_reduce_s)


def layer_cost(name: str, layer: Layer, layout: Layout, devices: int, profile: Profile,
               cluster: Cluster, itemsize: int, dtype: str, overlap: bool = True) -> LayerCost:
    """All terms of one layer (see the module docstring)."""
    return problem_cost(name, layer, layout, local_problem(layer, layout, itemsize, dtype), devices, profile, cluster,
                        itemsize, overlap)


def problem_cost(name: str, layer: Layer, layout: Layout, problem: LocalProblem | None, devices: int,
                 profile: Profile, cluster: Cluster, itemsize: int, overlap: bool = True, *,
                 compute: Compute | None = None) -> LayerCost:
    """:func:`layer_cost` given the layer's ``local_problem`` under ``layout`` (computed once by the caller) and,
    optionally, its :func:`compute_s` (the same for every layer and layout of that local problem)."""
    if problem is None:
        if layer.kind in ("input", "flatten", "view", "getitem", "identity") or layout.ranks == 1:
            allreduce = _weight_allreduce_s(layer, layout, devices, profile, cluster, itemsize)
            return LayerCost(0.0, 0.0, 0.0, 0.0, allreduce, 0.0, 0.0, "none")
        raise PlanError(f"layout {layout} cannot split layer '{name}' ({layer.kind}, output "
                        f"{tuple(layer.output_shape)}); choose a layout its kind and shape allow")
    forward_s, backward_s, weight_s, source = compute or compute_s(problem, profile)
    halos = spatial_halos(layer, layout)
    halo_s = _halo_s(layer, layout, problem, profile, cluster, halos) + _window_shift_s(layer, layout, problem,
                                                                                         profile, cluster)
    interior = _interior_share(problem, halos) if overlap and profile.overlaps_halos else 0.0
    exposed = max(0.0, halo_s / 2 - interior * forward_s) + max(0.0, halo_s / 2 - interior * backward_s)
    scale = 1.0 if profile.corrections is None else profile.corrections.scale(layer.kind, layout)
    return LayerCost(
        scale * forward_s, scale * backward_s, scale * halo_s, scale * exposed,
        _weight_allreduce_s(layer, layout, devices, profile, cluster, itemsize),
        scale * _norm_s(layer, layout, problem, profile, cluster),
        scale * _channel_reduce_s(layer, layout, problem, profile, cluster), source, scale * weight_s,
    )


Compute = tuple[float, float, float, str]
"""Forward, backward and weight-gradient seconds of a local problem, and their source (:class:`LayerCost`)."""


def compute_s(problem: LocalProblem, profile: Profile) -> Compute:
    """Seconds of the local problem's passes (forward, backward, the weight-gradient share of backward) and
    where they came from (``measured``, ``fitted`` or ``mixed``)."""
    flops, key = problem.flops, problem.key if profile.timed(problem.kind) else ""  # "": no sample, the fit
    forward_s = backward_s = weight_s = 0.0
    sources = set()
    for phase in phases_of(problem):
        count = getattr(flops, _FLOPS_OF[phase])
        seconds, source = profile.compute_time_s(problem.kind, phase, key, count, problem.bytes_moved(phase))
        sources.add(source)
        if phase == "fwd":
            forward_s += seconds
        else:
            backward_s += seconds
            weight_s += seconds if phase == "bwd_weight" else 0.0
    return forward_s, backward_s, weight_s, sources.pop() if len(sources) == 1 else "mixed"


def least_device_s(layer: Layer, profile: Profile, dtype: str, *, recompute: bool = False) -> float:
    """A lower bound on the device-seconds of ``layer``'s forward and backward under any layout on any number of
    ranks (its forward twice with ``recompute``): every layout's ranks compute at least the whole layer's flops
    and move at least its bytes between them (ceilings, halos and copies only add), and no term of
    :func:`problem_cost` but compute is below zero (``Profile.least_device_s``)."""
    whole = layer_problem(layer, Layout(), dtype)  # in the layer's own dtype under mixed precision
    if whole is None:
        return 0.0
    total = 0.0
    for phase in phases_of(whole):
        seconds = profile.least_device_s(whole.kind, phase, getattr(whole.flops, _FLOPS_OF[phase]),
                                         whole.bytes_moved(phase))
        total += 2 * seconds if phase == "fwd" and recompute else seconds
    return total


def spatial_halos(layer: Layer, layout: Layout) -> tuple[tuple[AxisHalo, ...], ...] | None:
    """The distinct per-tile halos of each spatial axis (``(rows, columns)`` of an image; slices first of a
    volume) of a convolution or pooling split by space, in tile order; ``None`` if it has none.

    Raises:
        InputError: A tile would read beyond its adjacent tile.
    """
    if layer.kind not in _HALO_KINDS or layout.spatial == 1:
        return None
    attrs, shape = layer.attrs, layer.input_shapes[0]
    if "pads" in attrs or (layer.kind == "conv" and (isinstance(attrs.get("padding"), str)
                                                         or attrs.get("padding_mode", "zeros") != "zeros")):
        return _gathered(layer, layout)
    halos = []
    for axis, parts in enumerate(layout.parts_of(len(shape))[2:]):
        kernel, stride, dilation, padding = (axis_value(attrs.get(key, default), axis) for key, default in
                                             (("kernel_size", 1), ("stride", None), ("dilation", 1), ("padding", 0)))
        halos.append(distinct_axis_halos(shape[2 + axis], parts, kernel, stride or kernel, dilation, padding,
                                         bool(attrs.get("ceil_mode"))))
    return tuple(halos)


def _gathered(layer: Layer, layout: Layout) -> tuple[tuple[AxisHalo, ...], ...]:
    """The halos of a convolution padded in a mode or asymmetrically (``cost_models.borders``): circular padding
    gives the border tiles a halo from the opposite end, as an interior tile has."""
    attrs, shape = layer.attrs, layer.input_shapes[0]
    halos = []
    for axis, parts in enumerate(layout.parts_of(len(shape))[2:]):
        window = tuple(axis_value(attrs.get(key, 1), axis) for key in ("kernel_size", "stride", "dilation"))
        kernel, stride, dilation = window
        reads = window_reads(shape[2 + axis], parts, kernel, stride, dilation, axis_pads(dict(attrs), axis))
        halos.append(tuple(dict.fromkeys(gathered_halos(shape[2 + axis], reads, attrs.get("padding_mode", "zeros")))))
    return tuple(halos)


def _halo_s(layer: Layer, layout: Layout, problem: LocalProblem, profile: Profile, cluster: Cluster,
            halos: tuple[tuple[AxisHalo, ...], ...] | None) -> float:
    if halos is None:
        return 0.0
    shape = layer.input_shapes[0]
    tile_shape = layout.local_shape(tuple(shape))[2:]
    plane_bytes = problem.input_shapes[0][0] * problem.input_shapes[0][1] * problem.itemsize
    level = _tile_level(layout, cluster)
    distinct = halos  # a tile's messages depend only on its halos (sizes use the largest tile): each distinct once
    if len(distinct) != 2:  # a volume's or a sequence's tile: its axes one after the other
        messages = (volume_halo_messages(combination, tile_shape, plane_bytes) for combination in product(*distinct))
    else:
        rows_shape = (tile_shape[0], tile_shape[1])
        messages = (halo_messages(distinct[0], distinct[1], (i, j), rows_shape, plane_bytes)
                    for i in range(len(distinct[0])) for j in range(len(distinct[1])))
    return 2 * max(halo_exchange_s(profile, found, level) for found in messages)  # forward, backward gradients


def _tile_level(layout: Layout, cluster: Cluster) -> str:
    """The link between a sample's tiles: ``inter`` when its ``h·w`` group spans nodes."""
    return "inter" if cluster.spans_nodes(range(min(layout.spatial, cluster.devices))) else "intra"


def _window_shift_s(layer: Layer, layout: Layout, problem: LocalProblem, profile: Profile,
                    cluster: Cluster) -> float:
    """Swin's shifted windows split by rows or columns: along each split axis a tile receives the next tile's
    first ``shift`` rows before attending and the previous tile's last ``shift`` after (``runtime.windows``),
    and returns their gradients backward: four messages of ``shift`` rows, one after the other."""
    attrs = layer.attrs
    if layer.kind != "window_attention" or layout.spatial == 1 or not any(attrs.get("shift_size") or [0]):
        return 0.0
    n, h, w, c = problem.output_shape
    level = _tile_level(layout, cluster)
    extents = layer.input_shapes[0][1:3]
    seconds = 0.0
    for parts, extent, window, shift, across in zip((layout.h, layout.w), extents, attrs["window_size"],
                                                    attrs["shift_size"], (w, h)):
        if parts > 1 and shift and window < extent:
            seconds += 4 * profile.comm_time_s("sendrecv", level, 2, n * shift * across * c * problem.itemsize)
    return seconds


def _interior_share(problem: LocalProblem, halos: tuple[tuple[AxisHalo, ...], ...] | None) -> float:
    if halos is None or len(halos) != 2:  # a volume's tile is convolved after its exchange (runtime.spatial)
        return 0.0
    out_h, out_w = problem.output_shape[2], problem.output_shape[3]
    rows, cols = halos
    edge_h = max(max(h.before for h in rows), max(h.after for h in rows))
    edge_w = max(max(h.before for h in cols), max(h.after for h in cols))
    inner_h, inner_w = max(0, out_h - 2 * edge_h), max(0, out_w - 2 * edge_w)
    return inner_h * inner_w / (out_h * out_w)


def _weight_allreduce_s(layer: Layer, layout: Layout, devices: int, profile: Profile, cluster: Cluster,
                        itemsize: int) -> float:
    if not layer.params:
        return 0.0
    split = layout.c if layer.kind in DENSE_KINDS | {"batchnorm"} else 1
    channels = 1 if layer.kind == "attention" else layout.c  # its weights whole on every rank (runtime.attention)
    group, nodes, local = _replica_shape(channels, layout.spatial, devices, cluster)
    nbytes = layer.params * itemsize / split  # as comm_cost.gradient_allreduce_s prices it: t(B)·nbytes/B
    return shaped_allreduce_s(profile, group, nodes, local, GRADIENT_BUCKET_BYTES) * nbytes / GRADIENT_BUCKET_BYTES


def _norm_s(layer: Layer, layout: Layout, problem: LocalProblem, profile: Profile, cluster: Cluster) -> float:
    attrs = layer.attrs
    ranks = layout.spatial * (layout.c if layer.kind == "norm" else 1)  # group-norm: every channel part too
    if layer.kind not in ("batchnorm", "norm") or ranks == 1 or attrs.get("norm") == "LayerNorm":
        return 0.0  # a LayerNorm over whole last dimensions reduces within each box
    shape = problem.output_shape
    sums = shape[1] if layer.kind == "batchnorm" else shape[0] * attrs.get("num_groups", shape[1])
    group = list(range(ranks))  # a sample's ranks are consecutive
    stats_bytes = 2 * sums * 8  # Σx and Σx² (backward: Σg, Σg·x̂) per channel, or per sample and group, in float64
    if layer.kind == "batchnorm":  # forward: each tile's count, mean and variance gathered (runtime.norm)
        return allgather_s(profile, cluster, group, 3 * sums * 8 * ranks) + allreduce_s(profile, cluster, group,
                                                                                          stats_bytes)
    return 2 * allreduce_s(profile, cluster, group, stats_bytes)


def _channel_reduce_s(layer: Layer, layout: Layout, problem: LocalProblem, profile: Profile,
                      cluster: Cluster) -> float:
    if layer.kind not in DENSE_KINDS | {"attention"} or layout.c == 1 or channels_last_linear(layer):
        return 0.0  # (a channels-last linear layer's form is priced on its input edge: cost_models.dense_forms)
    stride = layout.spatial
    group = [index * stride for index in range(layout.c)]
    reduced = allreduce_s(profile, cluster, group, problem.itemsize * prod(problem.input_shapes[0])) \
        if problem.needs_input_grad else 0.0  # (a layer of parameters alone reads no input)
    if layer.kind != "attention":
        return reduced
    heads_bytes = problem.itemsize * prod(problem.output_shape) * layout.c  # every head's output, gathered
    return reduced + 2 * allgather_s(profile, cluster, group, heads_bytes)  # and its gradient scattered back


@lru_cache(maxsize=4096)
def _replica_shape(channels: int, spatial: int, devices: int, cluster: Cluster) -> tuple[int, int, int]:
    """The size and node shape (``comm_cost.node_shape``) of the ranks holding channel slice 0 of the weights
    (each slice's group has the same node shape), once per layout's channel and spatial parts."""
    block = channels * spatial  # ranks r with (r // spatial) % c == 0, as layout.ranks divides devices
    group = [start + offset for start in range(0, devices, block) for offset in range(spatial)]
    return (len(group), *node_shape(cluster, group))

