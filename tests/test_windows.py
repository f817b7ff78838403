"""Swin's window attention and patch merging: traced as layers (their FLOPs counted), split by rows and columns
of whole windows, their shifted rows priced (float64 equality: ``test_model_zoo_short``'s Swin)."""

from __future__ import annotations

import pytest
import torchvision

from calibrate.presets import preset_cluster, preset_profile
from cost_models.capability.predicate import layer_refusal
from cost_models.ir.tracing import trace
from cost_models.layer_cost import layer_cost
from cost_models.layout import Layout
from tests.small_models import swin_tiny


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201 - swin_tiny's LayerGraph
    return trace(swin_tiny(), (2, 3, 64, 64))


def _kind(graph, kind: str) -> list[str]:  # noqa: ANN001
    return [name for name, data in graph.nodes(data=True) if data["kind"] == kind]


def test_swin_traces_its_windows_as_layers_with_their_flops_and_keeps_its_maps_channels_last() -> None:
    graph = trace(torchvision.models.swin_t(), (1, 3, 224, 224))
    windows = _kind(graph, "window_attention")
    assert len(windows) == 12  # 2 + 2 + 6 + 2 blocks
    assert graph.nodes[windows[1]]["attrs"]["shift_size"] == [3, 3] and graph.nodes[windows[0]]["attrs"][
        "window_size"] == [7, 7]
    assert 8.5e9 < graph.totals()["flops_fwd"] < 9.5e9  # Swin-T: 4.5 GMACs (its attention was unpriced before)
    blocks = [data for _, data in graph.nodes(data=True) if data["kind"] in ("window_attention", "norm", "linear",
                                                                             "add") or data["attrs"].get("patch_merging")]
    assert len(blocks) > 80 and all(data["attrs"].get("order") == "nhwc" for data in blocks[:-1])  # not the head


def test_windows_split_at_whole_windows_and_merging_at_whole_patches(graph) -> None:  # noqa: ANN001
    first, *_, last = (graph.nodes[name] for name in _kind(graph, "window_attention"))  # 16×16 and 8×8, windows 4
    for layout in ("n2", "h2", "w2", "h2·w2", "h4", "n2·w4"):
        assert layer_refusal(first, Layout.parse(layout)) is None, layout
    assert "whole windows only: 8 rows into 4 parts" in layer_refusal(last, Layout.parse("h4"))
    assert "not its heads" in layer_refusal(first, Layout.parse("c2"))
    merging = next(data for _, data in graph.nodes(data=True) if data["attrs"].get("patch_merging"))
    assert layer_refusal(merging, Layout.parse("h4")) is None  # 16 rows: tiles of 4, whole 2×2 patches
    assert "whole 2×2 patches" in layer_refusal(merging, Layout(h=3))  # rows 0, 6, 11: a patch across tiles
    assert "2×2 patch's channels" in layer_refusal(merging, Layout.parse("c2"))


def test_only_shifted_windows_split_by_space_exchange_rows(graph) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 4)
    plain, shifted = (graph.nodes[name] for name in _kind(graph, "window_attention")[:2])
    assert shifted["attrs"]["shift_size"] == [2, 2] and plain["attrs"]["shift_size"] == [0, 0]
    seconds = {(name, layout): layer_cost(name, data, Layout.parse(layout), 4, profile, cluster, 4, "float32").halo_s
               for name, data in (("plain", plain), ("shifted", shifted)) for layout in ("n2", "h2", "h2·w2")}
    assert seconds["plain", "h2"] == seconds["plain", "h2·w2"] == seconds["shifted", "n2"] == 0.0
    assert 0 < seconds["shifted", "h2"] < seconds["shifted", "h2·w2"]  # rows; rows and columns
