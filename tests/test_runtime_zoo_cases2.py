"""More patterns of real models that made ranks fail (model-zoo issue 18, second sample), each in a tiny model.

* xcit's ``PositionalEncodingFourier``: tensors made from the batch's shapes but from none of its values —
  ``torch.arange(1, H + 1)`` of a height read from a shape, sines of it, a 1×1 convolution, ``repeat(B)`` — and
  timm's class token ``token.expand(B, -1, -1)``. Every rank computes them whole (``runtime.shapes.
  shape_made_nodes``); the element-wise layers reading them take the part broadcasting onto their box (a
  ``(W,)`` ramp onto a column split too), a concatenation its box. Before, the plan's ``n2`` on the
  ``arange`` made a local ``(4,)`` where its box was ``(2,)``, and the pre-flight refused ``h2``/``w2``
  (``arange`` and ``repeat`` take a size computed from shapes) and ``c2`` (the encoding's ``flatten``).
* vision_transformer_relpos's ``RelPosMlp``: linear layers of a buffer (no traced input: the distributed
  form read an input the trace does not list, an ``IndexError`` on every layout).
* mvitv2's reshape of an opaque attention's tokens by the feature size it returns, under a sample split:
  this rank's samples (it took the whole batch and failed).
* ghostnet's and rexnet's channel slices (``x[:, :k]``): each part's slice under a split of other
  dimensions (they were kept whole under ``h2``: "a getitem layer cannot be split by height or width").
* shufflenet's and skresnet's tuples: ``x.chunk(2, dim=1)`` read by ``getitem`` (each rank's part of every
  piece under a split of the other dimensions; res2net's ``torch.split`` of unequal widths too; an item in
  another layout than its pieces is refused), a channel shuffle — and a pipeline cut that the tuple
  crosses, which the pipeline cannot send: the pre-flight now refuses it in one line (it failed on the
  ranks with a ``TypeError``).

Single process: what the pre-flight says. Multi-rank (2 gloo ranks, float64, exact): each model under
each layout family equals the unsplit model — output and every gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import split_step_matches
from torch import nn

from cost_models.errors import PlanError
from cost_models.layout import Layout

SHAPE = (4, 3, 8, 8)


class FourierEncoding(nn.Module):
    """xcit's positional encoding: built from ``(B, H, W)`` alone, ``(B, dim, H, W)``."""

    def __init__(self, dim: int = 8, hidden: int = 4) -> None:
        super().__init__()
        self.hidden = hidden
        self.projection = nn.Conv2d(2 * hidden, dim, 1)

    def forward(self, batch: int, height: int, width: int) -> torch.Tensor:
        device = self.projection.weight.device
        rows = torch.arange(1, height + 1, device=device).to(torch.float64).unsqueeze(1).repeat(1, 1, width)
        columns = torch.arange(1, width + 1, device=device).to(torch.float64).repeat(1, height, 1)
        frequencies = torch.arange(self.hidden, device=device).to(torch.float64) + 1.0
        pos_y, pos_x = rows[:, :, :, None] / frequencies, columns[:, :, :, None] / frequencies
        pos = torch.cat((pos_y.sin(), pos_x.cos()), dim=3).permute(0, 3, 1, 2)
        return self.projection(pos.to(self.projection.weight.dtype)).repeat(batch, 1, 1, 1)


class ShapeMade(nn.Module):
    """The encoding added to a feature map, a ``(W,)`` ramp from its width, a class token expanded to ``B``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 2, stride=2)
        self.position = FourierEncoding()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.token = nn.Parameter(torch.randn(1, 1, 8))
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.embed(x)
        n, _, h, w = y.shape
        y = y + self.position(n, h, w)
        y = self.conv(y) * torch.arange(1, w + 1, device=y.device).to(y.dtype).div(w)
        tokens = y.flatten(2).transpose(1, 2)
        tokens = torch.cat((self.token.expand(n, -1, -1), tokens), dim=1)
        return self.head(tokens.mean(dim=1))


class Shuffled(nn.Module):
    """shufflenet's unit: halves by ``chunk``, one convolved, concatenated and channel-shuffled."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        left, right = y.chunk(2, dim=1)
        y = torch.cat((left, self.branch(right)), dim=1)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        return self.fc(F.adaptive_avg_pool2d(self.conv2(y), 1).flatten(1))


class BufferMlp(nn.Module):
    """timm's ``RelPosMlp`` (vision_transformer_relpos): an MLP of a buffer of coordinates, a bias of the tokens;
    its first linear layer reads no traced tensor (the trace gives it no input shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 2, stride=2)
        self.register_buffer("coords", torch.randn(16, 2), persistent=False)
        self.fc1, self.fc2 = nn.Linear(2, 6), nn.Linear(6, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        bias = self.fc2(torch.relu(self.fc1(self.coords)))
        return self.head((tokens + bias).mean(dim=1))


class SharedBlock(nn.Module):
    """coat's shared convolutional position encoding: one (grouped) convolution called by two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.shared = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.shared(x)
        x = x + self.shared(torch.relu(x))
        return self.head(x.mean(dim=(2, 3)))


class ChannelSlices(nn.Module):
    """ghostnet's ``out[:, :k, :, :]`` of a concatenation, rexnet's ``x[:, 0:k]`` residual, a crop of the map."""

    def __init__(self) -> None:
        super().__init__()
        self.primary = nn.Conv2d(3, 6, 3, padding=1)
        self.cheap = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.mix = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.primary(x)
        ghost = torch.cat([y, self.cheap(y)], dim=1)[:, :8, :, :]
        z = self.mix(ghost[:, 0:4]) + ghost[:, 4:]
        return self.head(torch.relu(z)[:, :, 1:-1, 1:].mean(dim=(2, 3)))


class Scales(nn.Module):
    """res2net's block: ``torch.split`` of the channels into unequal widths, each scale convolved and added to
    the next, concatenated back."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.first, self.second = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
        self.head = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = torch.split(self.stem(x), [2, 2, 2], 1)
        b = self.first(b)
        c = self.second(c + b)
        return self.head(torch.cat([a, b, c], 1).mean(dim=(2, 3)))


class _SizedAttention(nn.Module):
    """mvitv2's attention, kept opaque (a loop over a shape): returns its tokens and the feature size."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        for _ in range(x.shape[2] // 4):
            x = self.proj(x)
        return x, size


class SizedTokens(nn.Module):
    """mvitv2's block: tokens through an opaque attention that returns the feature size, reshaped to a map by
    that size and the batch read from a shape (n2 failed: the reshape took the whole batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.attn, self.head = nn.Conv2d(3, 4, 2, stride=2), _SizedAttention(), nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.embed(x)
        b, c, h, w = y.shape
        tokens, size = self.attn(y.flatten(2).transpose(1, 2), (h, w))
        grid = tokens.reshape(b, size[0], size[1], c).permute(0, 3, 1, 2)
        return self.head(grid.mean(dim=(2, 3)))


MODELS: dict[str, Callable[[], nn.Module]] = {"shape_made": ShapeMade, "shuffled": Shuffled, "buffer_mlp": BufferMlp,
                                              "shared": SharedBlock, "sliced": ChannelSlices, "scales": Scales,
                                              "sized": SizedTokens}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().double().train()


def _plan(name: str, size: int, layouts: Sequence[str]) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.uniform import uniform_plan

    graph = trace(_model(name), SHAPE, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=size, devices_per_node=size, memory_bytes=2**34, intra=link, inter=link)
    return uniform_plan(graph, cluster, [*(Layout.parse(text) for text in layouts), Layout()]), graph


# --- single process ---------------------------------------------------------------------------------------


def test_tensors_made_from_shapes_alone_run_whole_and_every_layout_passes_the_preflight() -> None:
    from cost_models.ir.tracing import symbolic_trace
    from runtime.preflight import check_runnable, held_plan
    from runtime.shapes import constant_nodes, shape_made_nodes, tensor_names

    model = _model("shape_made")
    plan, graph = _plan("shape_made", 2, ["n2"])
    nodes = list(symbolic_trace(model, ()).graph.nodes)
    made = shape_made_nodes(nodes, frozenset(graph.nodes), tensor_names(graph))
    assert {"arange", "repeat", "position_projection", "repeat_2", "arange_3", "div", "expand"} <= made
    assert not made & {"embed", "add_3", "conv", "mul", "cat_1", "head"}  # the batch's values: not made from shapes
    assert not made & constant_nodes(nodes, frozenset(graph.nodes))  # those read no shape
    assert plan.layers["arange"].layout == Layout(n=2)  # (4,): the plan splits it, the runtime holds it whole
    assert all(held_plan(plan, nodes, graph).layers[name].layout == Layout() for name in made)
    for layouts in (["n2"], ["h2"], ["w2"], ["c2"]):  # refused before: arange/repeat sizes, the flatten under c2
        plan, graph = _plan("shape_made", 2, layouts)
        check_runnable(model, plan, graph, verify=True)


def test_a_tuple_crossing_a_pipeline_cut_is_refused_before_any_rank_starts() -> None:
    from cost_models.uniform import staged
    from runtime.preflight import check_runnable

    plan, graph = _plan("shuffled", 1, [])
    assert isinstance(graph.nodes["chunk"]["output_shape"][0], list)
    crossed = staged(plan, graph, ["getitem"], "sync", 2)  # the chunk's items are read on stage 1
    with pytest.raises(PlanError, match=r"chunk with several output tensors .* cross a pipeline cut"):
        check_runnable(_model("shuffled"), crossed, graph, verify=True)
    check_runnable(_model("shuffled"), staged(plan, graph, ["cat"], "sync", 2), graph, verify=True)


def test_an_item_in_another_layout_than_its_pieces_is_refused_before_any_rank_starts() -> None:
    import dataclasses

    from cost_models.formats.plan import LayerAssignment
    from runtime.preflight import check_runnable

    plan, graph = _plan("scales", 2, ["h2"])
    assert plan.layers["split"].layout == plan.layers["getitem"].layout == Layout(h=2)
    mixed = dataclasses.replace(plan, layers={**plan.layers, "getitem": LayerAssignment(Layout())})
    with pytest.raises(PlanError, match=r"'getitem' \(getitem, n1\) reads a piece of 'split' \(h2\)"):
        check_runnable(_model("scales"), mixed, graph, verify=True)


def test_calls_of_one_module_under_different_channel_splits_are_refused_before_any_rank_starts() -> None:
    import dataclasses

    from cost_models.formats.plan import LayerAssignment
    from runtime.preflight import check_runnable

    plan, graph = _plan("shared", 2, ["c2"])
    assert plan.layers["shared"].layout == plan.layers["shared_1"].layout == Layout.parse("c2")
    check_runnable(_model("shared"), plan, graph, verify=True)
    mixed = dataclasses.replace(plan, layers={**plan.layers, "shared_1": LayerAssignment(Layout.parse("n2"))})
    with pytest.raises(PlanError, match="module 'shared' is called by 'shared' \\(c2\\), 'shared_1' \\(n2\\)"):
        check_runnable(_model("shared"), mixed, graph, verify=True)


# --- several ranks ----------------------------------------------------------------------------------------


def _split_equals_unsplit(name: str, world: int, layouts: Sequence[str]) -> dict[str, str]:
    """One step of ``name`` under ``layouts`` (batch-norm synchronised) against the unsplit model, exactly."""
    plan, graph = _plan(name, world, layouts)
    split_step_matches(lambda: _model(name), plan, graph, SHAPE, f"{name} under {layouts}")
    return {layer: str(assignment.layout) for layer, assignment in plan.layers.items()}


CASES = {"shape_made": (["n2"], ["h2"], ["w2"], ["c2"]), "shuffled": (["n2"], ["h2"], ["c2"]),
         "buffer_mlp": (["n2"], ["c2"]), "shared": (["n2"], ["h2"], ["c2"]),
         "sliced": (["n2"], ["h2"], ["w2"], ["c2"]), "scales": (["n2"], ["h2"], ["w2"], ["c2"]), "sized": (["n2"],)}


def _cases(rank: int, world: int) -> dict[str, Any]:
    return {f"{name} {layouts[0]}": _split_equals_unsplit(name, world, layouts)
            for name, families in CASES.items() for layouts in families}


@pytest.mark.multirank
def test_the_second_zoo_patterns_equal_the_unsplit_model_on_two_ranks() -> None:
    results = run_ranks(_cases, 2, timeout_s=300)[0]
    for layout, layer in (("n2", "add_3"), ("h2", "add_3"), ("c2", "add_3"), ("w2", "mul"), ("h2", "mul"),
                          ("n2", "cat_1"), ("c2", "conv")):
        assert results[f"shape_made {layout}"][layer] == layout, (layout, layer)  # split, reading made tensors
    assert results["shuffled c2"]["branch"] == "c2" and results["shuffled h2"]["conv2"] == "h2"
    for layout in ("n2", "h2"):  # the chunk along the channels: each rank's part of both halves
        assert [results[f"shuffled {layout}"][f] for f in ("chunk", "getitem", "getitem_1")] == [layout] * 3
    assert results["shuffled c2"]["chunk"] == "n1"  # it cuts the split channels: kept whole
    assert results["sized n2"]["reshape"] == "n2"  # its sizes from the opaque call: this rank's samples
    assert [results[f"scales {layout}"]["split"] for layout in ("n2", "h2", "w2", "c2")] == ["n2", "h2", "w2", "n1"]
    assert results["buffer_mlp c2"]["fc1"] == "c2" and results["buffer_mlp n2"]["add"] == "n2"  # fc1: held whole
    assert results["shared c2"]["shared_1"] == "c2"  # the module's weights sliced once, for both calls
    for layout in ("h2", "w2"):  # channel slices of a tile: the tile's slices
        assert [results[f"sliced {layout}"][f] for f in ("getitem", "getitem_1", "getitem_2")] == [layout] * 3
    assert results["sliced h2"]["getitem_3"] == "n1" and results["sliced w2"]["getitem_3"] == "n1"  # the crop
    assert results["sliced c2"]["getitem_3"] == "c2" and results["sliced c2"]["getitem"] == "n1"
