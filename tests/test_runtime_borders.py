"""Every padding mode across tiles (issue 19, item 3): reflect, replicate and circular convolutions and ``F.pad``,
an even kernel's asymmetric ``'same'``, each split equal to the unsplit model in float64.

A periodic-boundary CNN (climate and cosmology grids) pads circularly: the first and last tiles of an axis
exchange halos with each other, as LBANN's Distconv does. Reflect and replicate padding read only the border
tiles' own rows or their neighbours'. The predicate (``cost_models.capability.predicate``) and the cost model
(``cost_models.borders``) agree with the runtime (``runtime.borders``) on which splits run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import step_cases
from torch import nn

from cost_models.borders import gathered_halos, source_row, window_reads
from cost_models.capability.predicate import inherent, layer_refusal
from cost_models.errors import InputError
from cost_models.halo import AxisHalo
from cost_models.layout import Layout

SHAPE = (4, 3, 8, 8)


class Periodic(nn.Module):
    """Every padding mode: circular, reflect and replicate convolutions, even kernels under 'same', ``F.pad``."""

    def __init__(self) -> None:
        super().__init__()
        self.circular = nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular")
        self.reflect = nn.Conv2d(4, 4, 3, padding=2, dilation=2, padding_mode="reflect")
        self.replicate = nn.Conv2d(4, 4, (3, 5), padding=(1, 2), padding_mode="replicate")
        self.even = nn.Conv2d(4, 4, 4, padding="same")  # zeros, one row more after than before
        self.even_circular = nn.Conv2d(4, 4, 2, padding="same", padding_mode="circular")
        self.strided = nn.Conv2d(4, 5, 3, stride=2, padding=1, padding_mode="circular")
        self.pad = nn.ReflectionPad2d(1)
        self.head = nn.Conv2d(5, 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.reflect(torch.relu(self.circular(x))))
        x = self.even(torch.relu(self.replicate(x)))
        x = F.pad(F.pad(x, (1, 2, 2, 1), mode="circular"), (1, 1, 1, 1), mode="replicate")  # 13×13
        x = self.strided(torch.relu(self.even_circular(x)))  # 7×7
        return self.head(self.pad(x)).mean(dim=(2, 3))


BORDERED = ("circular", "reflect", "replicate", "even", "pad", "pad_1", "even_circular", "strided", "pad_2")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Periodic().to(torch.float64)


def _graph() -> Any:
    from cost_models.ir.tracing import trace

    return trace(_model(), SHAPE, torch.float64)


def test_padded_rows_read_their_modes_source_rows() -> None:
    assert [source_row(row, 5, "reflect") for row in (-2, -1, 0, 4, 5, 6)] == [2, 1, 0, 4, 3, 2]
    assert [source_row(row, 5, "replicate") for row in (-2, 5, 6)] == [0, 4, 4]
    assert [source_row(row, 5, "circular") for row in (-2, -1, 5, 6)] == [3, 4, 0, 1]
    assert source_row(-1, 5, "zeros") is None


def test_circular_padding_gives_the_border_tiles_a_halo_from_the_other_end() -> None:
    reads = window_reads(8, 4, 3, 1, 1, (1, 1))
    assert gathered_halos(8, reads, "circular") == [AxisHalo(1, 1)] * 4
    assert gathered_halos(8, reads, "reflect") == [AxisHalo(0, 1), AxisHalo(1, 1), AxisHalo(1, 1), AxisHalo(1, 0)]
    assert gathered_halos(8, window_reads(8, 2, 4, 1, 1, (1, 2)), "zeros") == [AxisHalo(0, 2), AxisHalo(1, 0)]
    with pytest.raises(InputError, match="beyond its neighbours"):
        gathered_halos(4, window_reads(4, 4, 5, 1, 1, (2, 2)), "reflect")  # tile 0 reflects row 2 of tile 2


def test_every_padding_mode_takes_height_and_width_splits_in_the_capability_predicate() -> None:
    graph = _graph()
    for name in BORDERED:
        for layout in ("h2", "w2", "h2·w2", "h4"):
            assert layer_refusal(graph.nodes[name], Layout.parse(layout)) is None, (name, layout)
        assert layer_refusal(graph.nodes[name], Layout.parse("c2")) is None or name.startswith("pad"), name
    too_fine = layer_refusal(graph.nodes["reflect"], Layout.parse("h8"))
    assert too_fine and inherent(too_fine), too_fine


def test_the_cost_model_prices_the_wrap_around_halo() -> None:
    from cost_models.layer_cost import spatial_halos

    graph = _graph()
    rows, _ = spatial_halos(graph.nodes["circular"], Layout.parse("h2"))  # the distinct halos of the row tiles
    assert rows == (AxisHalo(1, 1),)  # both tiles, borders too: the wrap-around
    rows, _ = spatial_halos(graph.nodes["replicate"], Layout.parse("h2"))
    assert rows == (AxisHalo(0, 1), AxisHalo(1, 0))


# --- several ranks ----------------------------------------------------------------------------------------


def _cases(rank: int, world: int, layouts: Sequence[str]) -> dict[str, dict[str, str]]:
    results = step_cases([("periodic", layout) for layout in layouts], world, lambda name: _model(), lambda name: SHAPE)
    return {key.split()[1]: layers for key, layers in results.items()}


@pytest.mark.multirank
def test_every_padding_mode_equals_the_unsplit_model_on_two_ranks() -> None:
    results = run_ranks(_cases, 2, args=(("h2", "w2", "c2"),), timeout_s=300)[0]
    for layout in ("h2", "w2"):
        assert [results[layout][name] for name in BORDERED] == [layout] * len(BORDERED)
    assert results["c2"]["reflect"] == "c2"  # the channel split pads in the layer's mode too


@pytest.mark.multirank
def test_every_padding_mode_equals_the_unsplit_model_on_four_tiles() -> None:
    results = run_ranks(_cases, 4, args=(("h2·w2", "h4"),), timeout_s=300)[0]
    for layout in ("h2·w2", "h4"):
        assert [results[layout][name] for name in BORDERED] == [layout] * len(BORDERED)
