"""Tier 2: the planner plans real models end to end — a layout one layer cannot take leaves that layer's options.

Issue 18: channels-last blocks (ConvNeXt, Swin) whose classifier head permutes a
``(N, C, 1, 1)`` map, and broadcast operands read by a spatially split product,
aborted the plan with "cannot split an extent of 1 into 2 non-empty parts"; a
pipeline configuration whose one-sample micro-batch leaves a batch-norm one
value per channel aborted it with "has no layout".
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from calibrate.presets import preset_cluster, preset_profile
from cost_models.ir.tracing import trace
from planner.search import plan_model
from planner.settings import SearchSettings
from planner.space import build_space, decision_groups


def _cluster(devices: int):  # noqa: ANN202 - a Cluster of 2 devices per node, as `--devices-per-node 2`
    return replace(preset_cluster("v100", devices), devices_per_node=2)


@pytest.mark.parametrize("name", ["convnext_tiny", "swin_t"])
def test_channels_last_models_plan_on_two_devices_with_pipelines(name: str) -> None:
    import torchvision

    graph = trace(torchvision.models.get_model(name, weights=None), (2, 3, 64, 64))
    result = plan_model(graph, preset_profile("v100"), _cluster(2), SearchSettings(max_stages=4))
    assert set(result.plan.layers) == set(graph.compute_layers())
    assert np.isfinite(result.estimate.iteration_s) and result.estimate.iteration_s > 0
    assert len(result.considered) > 2  # the pipeline configurations were priced too


def _gated():  # noqa: ANN202 - an nn.Module
    import torch
    from torch import nn

    class Gated(nn.Module):  # x * gate(x): the gate is a (N, C, 1, 1) broadcast operand, read by a row split
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
            self.pool, self.out = nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return self.out(y * torch.sigmoid(self.fc(self.pool(y))))

    return Gated()


def test_a_product_with_a_broadcast_operand_keeps_its_spatial_layouts() -> None:
    from cost_models.layout import Layout

    graph = trace(_gated(), (2, 3, 16, 16))
    groups = decision_groups(graph)
    assert "mul" in groups and groups["fc"] == ("fc", "sigmoid")  # the product does not follow its scale
    space = build_space(graph, preset_profile("v100"), _cluster(2), 2, prune=False)
    assert Layout(h=2) in space.candidates["mul"]  # the (N, C, 1, 1) scale is read whole by every row tile
    for matrix in space.table.edge_s.values():
        assert np.all(np.isfinite(np.asarray(matrix)))
    scale = space.table.edge_s[("fc", "mul")]  # each row tile gathers the other sample's scale from an n2 split
    assert scale[space.candidates["fc"].index(Layout(n=2))][space.candidates["mul"].index(Layout(h=2))] > 0


def _pooled_norm():  # noqa: ANN202 - an nn.Module
    from torch import nn

    # after global pooling, a batch-norm over one sample of a 1×1 map has one value per channel
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8, 4))


def test_a_pipeline_whose_micro_batch_leaves_a_layer_no_layout_is_left_out() -> None:
    graph = trace(_pooled_norm(), (2, 3, 16, 16))
    result = plan_model(graph, preset_profile("v100"), _cluster(2), SearchSettings(max_stages=2))
    assert set(result.plan.layers) == set(graph.compute_layers())
    pipelines = [considered.summary for considered in result.considered if "stage" in considered.summary]
    assert not any("sync M=2" in summary for summary in pipelines)  # one sample per micro-batch: not plannable


def test_no_pipeline_cut_separates_a_tuple_of_tensors_from_its_readers() -> None:
    """shufflenet's ``x.chunk(2, dim=1)`` makes a tuple; a pipeline sends one tensor per value, so the stage
    search leaves every cut between a chunk and its getitems out, and the plan passes the runtime's pre-flight."""
    import torchvision

    from runtime.preflight import check_runnable

    model = torchvision.models.get_model("shufflenet_v2_x0_5", weights=None)
    graph = trace(model, (4, 3, 32, 32))
    assert any(isinstance(graph.nodes[n]["output_shape"][0], list) for n in graph.compute_layers())
    for devices in (2, 4):
        result = plan_model(graph, preset_profile("v100"), preset_cluster("v100", devices), SearchSettings(max_stages=4))
        assert result.plan.pipeline.stages > 1  # a pipeline is what the search picks here: the cuts were tried
        check_runnable(model, result.plan, graph, (), sync_batchnorm=False, verify=True)
