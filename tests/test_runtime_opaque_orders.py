"""What an untraced call makes of a value in a non-default order (``cost_models.ir.orders.unknown_order``).

The full model-zoo run at ec0af21 found three plans the predicate admitted and the ranks crashed on:

* torchvision's Swin (and MaxViT, TinyViT) under ``w2``: an opaque call (Swin's ``_patch_merging_pad``) on an
  ``nhwc`` value was taken to return ``nchw``, so the channels were cut as if they were columns;
* timm's Hiera and PVT-v2 under ``w2``: a LayerNorm over the last dimension of a 3-D value whose order puts
  the columns there was admitted (the rule read 3-D values as ``n`` + channels, ignoring their order);
* torchvision's MaxViT under ``w2``: a global average pool of a value whose split columns are its dimension 1
  summed its tiles over dimensions 2 and 3, as for ``nchw``;
* timm's Sequencer under ``n2``: an LSTM run on ``B·W`` rows (a value with no sample axis) returned a tuple the
  trace does not shape, whose items were taken to hold the samples first;
* physicsnemo's FNO (issue 53): points ``(N·H·W, C)`` reshaped into ``(N, H, W, C)`` were taken for ``nchw``, and
  permuted back to ``(N, C, H, W)`` for ``nwch``: the loss target of every plan that kept the output's samples
  whole on a rank (a pipeline's last stage) was cut as ``(N, W, C)`` — a crash after the ranks started.

And one form the run showed missing: a reshape of tokens that every rank holds whole (SwiftFormer's and
EfficientViM's attention gives its tokens back as a map) was kept whole, and the convolution after it read a
redistributed map; now each rank reshapes and cuts its tile.

Each model here has that pattern in a few layers; the trace names no axis the call may have moved, the
predicate keeps what it cannot split whole, and the split equals the unsplit model in float64 on two ranks.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import split_step_matches
from torch import fx, nn

from cost_models.capability.predicate import layer_refusal
from cost_models.cluster import Cluster, Link
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan

SHAPE = (4, 3, 16, 16)


def _pad_and_merge(x: torch.Tensor) -> torch.Tensor:
    """Swin's patch merging on an ``nhwc`` value: pad to even sides, gather 2×2 neighbours into the channels."""
    h, w = x.shape[1], x.shape[2]
    x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
    return torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)


fx.wrap("_pad_and_merge")


class SwinLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 4, 2, stride=2)
        self.norm1, self.norm2 = nn.LayerNorm(4), nn.LayerNorm(16)
        self.reduce = nn.Linear(16, 6)
        self.head = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(self.embed(x).permute(0, 2, 3, 1))
        x = self.reduce(self.norm2(_pad_and_merge(x)))
        return self.head(F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1))


class TokensLike(nn.Module):
    """Hiera's unroll: tokens ``(N, L, C)`` viewed as a grid, cut into blocks and back to tokens, then normalised."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 4, 2, stride=2)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x).reshape(x.shape[0], 4, 64).transpose(1, 2)
        t = t.view(x.shape[0], 8, 8, 4).view(x.shape[0], 4, 2, 4, 2, 4).permute(0, 2, 4, 1, 3, 5)
        return self.head(self.norm(t.reshape(x.shape[0], 64, 4)).mean(1))


class SequencerLike(nn.Module):
    """Sequencer2d's vertical LSTM: each column of an ``nhwc`` map a sequence, ``B·W`` rows of one batch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 4, 2, stride=2)
        self.rnn = nn.LSTM(4, 3, batch_first=True)
        self.head = nn.Linear(3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).permute(0, 2, 3, 1)
        n, h, w, c = x.shape
        v, _ = self.rnn(x.permute(0, 2, 1, 3).reshape(-1, h, c))
        v = v.reshape(n, w, h, -1).permute(0, 2, 1, 3)
        return self.head(v.mean((1, 2)))


class ColumnsFirst(nn.Module):
    """A global average pool of a value whose columns are its dimension 1 (MaxViT's last grid block reshaped)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.embed(x).permute(0, 3, 1, 2))  # nwch: the columns first
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


class TokensToMap(nn.Module):
    """SwiftFormer's additive attention: a map to tokens ``(N, H·W, C)``, mixed over every token, back to the map by
    ``reshape`` — which each rank makes whole and cuts to its tile, so the convolution after it keeps its split."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 4)
        self.conv, self.head = nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.embed(x)
        n, c, h, w = y.shape
        t = y.flatten(2).transpose(1, 2)
        t = t * torch.softmax(self.mix(t), dim=1).sum(1, keepdim=True)  # over every token: held whole
        y = F.relu(self.conv(t.transpose(1, 2).reshape(n, c, h, w)))
        return self.head(y.mean((2, 3)))


class PointsToGrid(nn.Module):
    """physicsnemo's FNO decoder: a map made points ``(N·H·W, C)``, a linear layer, points made a map again."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mlp = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        shape = list(y.size())
        out = self.mlp(torch.permute(y, (0, 2, 3, 1)).reshape(-1, y.size(1)))
        return torch.permute(out.reshape(shape[0], shape[2], shape[3], out.size(-1)), (0, 3, 1, 2))


BUILDS = {"swin": SwinLike, "tokens": TokensLike, "sequencer": SequencerLike, "columns": ColumnsFirst, "map": TokensToMap,
          "points": PointsToGrid}
LAYOUTS = {"swin": "w2", "tokens": "w2", "sequencer": "n2", "columns": "w2", "map": "h2", "points": "n2"}


def _build(name: str) -> Any:
    torch.manual_seed(0)
    return BUILDS[name]().double()


def test_an_untraced_call_on_an_ordered_value_names_only_its_samples() -> None:
    swin = trace(SwinLike(), SHAPE)
    assert swin.nodes["_pad_and_merge"]["attrs"]["order"] == "n..."
    assert swin.nodes["permute_1"]["attrs"]["order"] == "n..."  # was 'nwch': the channels taken for columns
    assert "no w axis to split" in layer_refusal(swin.nodes["reduce"], Layout(w=2))
    assert layer_refusal(swin.nodes["norm1"], Layout(w=2)) is None  # before the call: nhwc, split by columns
    tokens = trace(TokensLike(), SHAPE)
    assert tokens.nodes["norm"]["attrs"]["input_orders"] == ["n.w"]
    assert "normalises over its last 1 dimension(s), which hold the w axis" in \
        layer_refusal(tokens.nodes["norm"], Layout(w=2))
    assert layer_refusal(tokens.nodes["norm"], Layout(n=2)) is None
    sequencer = trace(SequencerLike(), SHAPE)
    assert sequencer.nodes["getitem_4"]["attrs"]["order"] == "..."  # the LSTM's rows merge samples and columns
    assert "no n axis to split" in layer_refusal(sequencer.nodes["getitem_4"], Layout(n=2))
    assert "holds no sample axis" in layer_refusal(sequencer.nodes["mean"], Layout(n=2))
    columns = trace(ColumnsFirst(), SHAPE)
    assert columns.nodes["gelu"]["attrs"]["order"] == "nwch"
    tokens_map = trace(TokensToMap(), SHAPE)
    assert layer_refusal(tokens_map.nodes["reshape"], Layout(h=2)) is None  # tokens whole: reshaped, then cut
    assert layer_refusal(tokens_map.nodes["reshape"], Layout(h=2, w=2)) is None
    assert layer_refusal(tokens_map.nodes["transpose_1"], Layout(h=2)) is not None  # tokens: no rows to split
    points = trace(PointsToGrid(), SHAPE)
    assert points.nodes["reshape_1"]["attrs"]["order"] == "n..."  # was nchw: (N, H, W, C) read as (N, C, H, W)
    assert points.nodes["permute_1"]["attrs"]["order"] == "n..."  # was nwch: a loss target cut as (N, W, C)


def _case(rank: int, world: int) -> dict[str, dict[str, str]]:
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world, devices_per_node=world, memory_bytes=2**34, intra=link, inter=link)
    layouts = {}
    for name in BUILDS:
        graph = trace(_build(name), SHAPE, torch.float64)
        plan = uniform_plan(graph, cluster, [Layout.parse(LAYOUTS[name]), Layout()])
        split_step_matches(lambda name=name: _build(name), plan, graph, SHAPE, f"{name} under {LAYOUTS[name]}")
        layouts[name] = {layer: str(assignment.layout) for layer, assignment in plan.layers.items()}
    return layouts


@pytest.mark.multirank
def test_untraced_calls_on_ordered_values_run_equal_to_the_unsplit_model() -> None:
    layouts = run_ranks(_case, 2, timeout_s=300)[0]
    assert all(LAYOUTS[name] in made.values() for name, made in layouts.items()), layouts  # each split some
    assert layouts["map"]["reshape"] == "h2" and layouts["map"]["conv"] == "h2"
