"""The one capability predicate: the planner offers only what the runtime runs, and the runtime refuses the rest first.

Tier 2 (single process) except the last test, which runs the functional model split by height on 2 ranks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import build_model
from distributed import run_ranks
from runtime_check import compare_plans
from torch import nn

from calibrate.presets import preset_profile
from cost_models.capability.predicate import inherent, layer_refusal, plan_refusals
from cost_models.cluster import Cluster, Link
from cost_models.errors import PlanError
from cost_models.formats.plan import LayerAssignment
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan
from planner.search import plan_model
from planner.settings import SearchSettings
from planner.space import build_space
from runtime.groups import GroupCache
from runtime.layers import Site, refusal
from runtime.preflight import check_runnable

LINK = Link(1e-6, 1e9)


def _cluster(devices: int) -> Cluster:
    return Cluster(devices=devices, devices_per_node=devices, memory_bytes=2**34, intra=LINK, inter=LINK)


def _graph(name: str, shape: tuple[int, ...] = (2, 3, 16, 16)):  # noqa: ANN202 - a LayerGraph
    return build_model(name), trace(build_model(name), shape)


def test_batchnorm_with_one_value_per_channel_is_refused_unless_synchronised() -> None:
    _, graph = _graph("norm_after_pool")
    node = graph.nodes["norm"]
    assert "1 value per channel" in layer_refusal(node, Layout(n=2))
    assert layer_refusal(node, Layout(n=2), sync_batchnorm=True) is None
    assert layer_refusal(node, Layout()) is None
    assert "1 value per channel" in layer_refusal(node, Layout(), micro_batches=2)  # a micro-batch of one sample


def test_a_plan_the_runtime_would_crash_on_is_refused_before_any_rank_starts() -> None:
    model, graph = _graph("norm_after_pool")
    plan = uniform_plan(graph, _cluster(2), [Layout(n=2), Layout()])
    assert plan.layers["norm"].layout == Layout()  # the rule's n2 does not apply there: the layer keeps copies
    forced = dataclasses.replace(plan, layers={name: LayerAssignment(Layout(n=2)) for name in plan.layers})
    with pytest.raises(PlanError, match=r"'norm' \(batchnorm, n2\): batch-norm statistics over 1 value"):
        check_runnable(model, forced, graph)
    check_runnable(model, forced, graph, sync_batchnorm=True)  # over the whole batch: two values, runs


def test_functional_forms_are_read_as_their_modules() -> None:
    _, graph = _graph("functional")
    avg, peak, conv = (graph.nodes[name]["attrs"] for name in ("avg_pool2d", "max_pool2d", "conv2d"))
    assert (avg["kernel_size"], avg["stride"], avg["ceil_mode"], avg["count_include_pad"]) == (2, 2, False, True)
    assert (peak["kernel_size"], peak["stride"], peak["padding"]) == (3, 1, 1)
    assert conv["kernel_size"] == [3, 3] and conv["function_form"] and conv["padding_mode"] == "zeros"
    assert graph.nodes["pad"]["kind"] == "pad" and graph.nodes["pad"]["attrs"]["pad"] == [1, 1, 1, 1]
    assert layer_refusal(graph.nodes["avg_pool2d"], Layout(h=2)) is None
    assert layer_refusal(graph.nodes["conv2d"], Layout(h=2)) is None  # its filters whole on every tile
    assert "function call" in layer_refusal(graph.nodes["conv2d"], Layout(c=2))
    assert layer_refusal(graph.nodes["pad"], Layout(h=2)) is None  # constant padding splits across tiles
    reflect = {**graph.nodes["pad"], "attrs": {**graph.nodes["pad"]["attrs"], "mode": "reflect"}}
    assert layer_refusal(reflect, Layout(h=2)) is None  # every mode splits across tiles (cost_models.borders)
    pool = graph.nodes["avg_pool2d"]
    excluding = {**pool, "attrs": {**pool["attrs"], "padding": 1, "count_include_pad": False}}
    assert layer_refusal(excluding, Layout(h=2)) is None  # the divisor from a mask of the tile (runtime.spatial)
    overridden = {**pool, "attrs": {**pool["attrs"], "divisor_override": 3}}
    assert "divisor override" in layer_refusal(overridden, Layout(h=2))


@pytest.mark.parametrize(("name", "shape"), [("functional", (2, 3, 16, 16)), ("norm_after_pool", (2, 3, 16, 16)),
                                             ("mobilenet_v3_small", (2, 3, 64, 64)), ("squeezenet1_1", (2, 3, 64, 64))])
def test_every_candidate_and_every_plan_passes_the_runtimes_preflight(name: str, shape: tuple[int, ...]) -> None:
    import torchvision

    model = build_model(name) if name in ("functional", "norm_after_pool") else \
        torchvision.models.get_model(name, weights=None)
    graph = trace(model, shape)
    profile, cluster = preset_profile("v100", "float32"), _cluster(2)
    space = build_space(graph, profile, cluster, 2)
    for head, members in space.members.items():
        for layout in space.candidates[head]:
            for layer in members:
                site = Site(layer, graph.nodes[layer]["kind"], layout, graph.nodes[layer], None, 0, (0, 1),
                            GroupCache((0, 1)), False)
                assert refusal(site) is None, (layer, str(layout), refusal(site))
    plan = plan_model(graph, profile, cluster, SearchSettings(max_stages=2)).plan
    assert list(plan_refusals(plan, graph)) == []
    check_runnable(model, plan, graph, verify=True)


@pytest.mark.multirank
def test_functional_layers_split_by_height_equal_the_unsplit_model() -> None:
    results = run_ranks(compare_plans, 2, args=("functional", (2, 3, 16, 16), ["height", "width", "sample"],
                                                ["float64"]))
    assert set(results[0]) == {"height/float64", "width/float64", "sample/float64"}
    assert "h2" in results[0]["height/float64"]  # the pools, the interpolation and the head really are split


def test_refusals_say_whether_the_layer_itself_cannot_be_split() -> None:
    _, graph = _graph("norm_after_pool")
    assert inherent(layer_refusal(graph.nodes["pool"], Layout(h=2)))  # a 1×1 output has no two rows
    assert inherent(layer_refusal(graph.nodes["flatten"], Layout(h=2)))  # 2-D: no rows to split
    assert not inherent(layer_refusal(graph.nodes["norm"], Layout(n=2)))
    _, functional = _graph("functional")
    assert not inherent(layer_refusal(functional.nodes["conv2d"], Layout(c=2)))  # a form not implemented yet
    reflect = {**functional.nodes["pad"], "attrs": {**functional.nodes["pad"]["attrs"], "mode": "reflect",
                                                     "pad": [2, 2, 2, 2]}}
    assert "beyond its neighbours" in layer_refusal(reflect, Layout(h=8))  # tiles of one row: tile 0 reflects row 2
    assert inherent(layer_refusal(reflect, Layout(h=8)))


class _Stacked(nn.Module):
    """Attention's ``qkv`` stack: a permutation moves the samples to dimension 1, and ``stack[0]`` indexes it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stack = self.conv(x).reshape(x.shape[0], 3, 4, 4, 4).permute(1, 0, 2, 3, 4)
        padded = F.pad(x, (1, 1, 1, 1))  # rows and columns only
        channels = F.pad(x, (0, 0, 0, 0, 2, 2))  # the channels
        computed = F.pad(x, (0, x.shape[-1] % 3))  # from a shape: which dimensions it pads is not known
        return (stack[0] + stack[1] * stack[2]).sum() + padded.mean() + channels.mean() + computed.mean()


def test_a_layer_that_moves_the_split_samples_or_pads_split_channels_is_refused() -> None:
    graph = trace(_Stacked(), (2, 3, 4, 4))
    getitem = next(name for name in graph.nodes if graph.nodes[name]["kind"] == "getitem")
    assert "moves the split samples" in layer_refusal(graph.nodes[getitem], Layout(n=2))
    assert layer_refusal(graph.nodes[getitem], Layout()) is None
    assert layer_refusal(graph.nodes["pad"], Layout(c=2)) is None
    assert "split channel dimension" in layer_refusal(graph.nodes["pad_1"], Layout(c=2))
    assert graph.nodes["pad_2"]["attrs"]["pad"] == [0, 1]  # computed from a shape: recorded when traced
    assert layer_refusal(graph.nodes["pad_2"], Layout(c=2)) is None  # it pads the width only
    assert not inherent(layer_refusal(graph.nodes[getitem], Layout(n=2)))  # a runtime could track the box


class _Heads(nn.Module):
    """efficientvim's head outputs: ``torch.stack`` of four ``(N, F)`` tensors along a new dimension 0, and one
    along dimension 1; with a batch of 4 the first reads as if it kept the samples in dimension 0."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).mean(dim=(2, 3))
        return torch.stack([y, 2 * y, 3 * y, 4 * y]).sum(0) + torch.stack([y, y], dim=1).sum(1)


def test_a_stack_ahead_of_the_samples_is_refused_under_a_sample_split() -> None:
    graph = trace(_Heads(), (4, 3, 6, 6))
    assert graph.nodes["stack"]["attrs"]["stack_dim"] == 0
    assert "ahead of the samples" in layer_refusal(graph.nodes["stack"], Layout(n=2))
    assert layer_refusal(graph.nodes["stack_1"], Layout(n=2)) is None
    assert graph.nodes["sum_1"]["attrs"] == {"reduces": [0], "keepdim": False}  # the stacked heads summed
    assert "reduces dimension 0" in layer_refusal(graph.nodes["sum_1"], Layout(n=2))
    assert layer_refusal(graph.nodes["sum_2"], Layout(n=2)) is None


class _BatchAttention(nn.Module):
    """timm's csatv2 attention: ``q @ k.T`` of two ``(B, N)`` values is ``(B, B)``, and ``attn @ v`` sums over it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.flatten(1)
        attn = (q @ (2 * q).transpose(-1, -2)).softmax(dim=-1)
        return attn @ q


def test_an_attention_across_the_batch_is_refused_under_a_sample_split() -> None:
    graph = trace(_BatchAttention(), (4, 3, 2, 2))
    first, second = (name for name in graph.nodes if graph.nodes[name]["target"] == "_operator.matmul")
    assert graph.nodes[second]["input_shapes"] == [[4, 4], [4, 12]]
    why = layer_refusal(graph.nodes[second], Layout(n=2))
    assert "summing over the batch" in why and inherent(why)
    assert layer_refusal(graph.nodes[first], Layout(n=2))  # (B, N) @ (N, B): moves the samples
    assert layer_refusal(graph.nodes[second], Layout()) is None


class _Crops(nn.Module):
    """A channel slice with constant bounds, and one with a bound computed from a shape (swinv2_cr's
    ``x[:, :H, :W]`` of padded windows: the bound may read a split extent, which the pre-flight refuses)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[:, :4] + y[:, : y.shape[1] - 2]


def test_a_slice_takes_a_split_only_with_constant_bounds() -> None:
    graph = trace(_Crops(), (2, 3, 4, 4))
    constant, computed = (graph.nodes[name] for name in ("getitem", "getitem_2"))
    assert constant["attrs"] == {"sliced_dims": [1]} and layer_refusal(constant, Layout(h=2)) is None
    assert "it slices dimension 1" in layer_refusal(constant, Layout(c=2))
    assert computed["attrs"] == {} and "cannot be split by height" in layer_refusal(computed, Layout(h=2))


class _Scaled(nn.Module):
    """A layer scale: functions of its parameter in its ``forward`` (their layers' scope), called once."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.gamma = nn.Conv2d(4, 4, 1), nn.Parameter(torch.ones(4, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * self.conv(x).permute(0, 1, 3, 2)


class _Shared(nn.Module):
    """One convolution called twice, another between the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.shared, self.middle = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.head, self.scaled = nn.Conv2d(4, 4, 1), _Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scaled(self.shared(self.middle(self.shared(x))).relu()))


def test_no_pipeline_cut_separates_two_calls_of_one_module() -> None:
    from cost_models.capability.predicate import shared_modules
    from cost_models.uniform import staged

    model = _Shared()
    graph = trace(model, (4, 4, 8, 8))
    assert shared_modules(graph) == {"shared": ["shared", "shared_1"]}
    between = staged(uniform_plan(graph, _cluster(1), [Layout()]), graph, ["middle"])
    assert any("module 'shared'" in why for why in plan_refusals(between, graph))
    with pytest.raises(PlanError, match="module 'shared'"):
        check_runnable(model, between, graph)
    after = staged(uniform_plan(graph, _cluster(1), [Layout()]), graph, ["relu"])
    assert list(plan_refusals(after, graph)) == []
    from cost_models.formats.plan import Plan, SolverInfo
    from planner.pipeline.stages import search_pipelines

    def make(layers: dict, pipeline: object, info: SolverInfo) -> Plan:
        return dataclasses.replace(between, layers=dict(layers), pipeline=pipeline, solver=info)

    searched = search_pipelines(graph, preset_profile("v100", "float32"), _cluster(2), make,
                                SearchSettings(max_stages=2), prune=False)
    assert searched.candidates  # the cut after the second call (or later) is allowed
    for candidate in searched.candidates:
        stages = {candidate.plan.layers[name].stage for name in ("shared", "middle", "shared_1")}
        assert len(stages) == 1, candidate.plan.summary()


class _FourWay(nn.Module):
    """edgenext's ``torch.split`` into four: a layer whose output is four tensors (not a 4-D shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d = torch.split(self.conv(x), 2, dim=1)
        return torch.cat([a * b, c + d], dim=1).mean(dim=(2, 3))


def test_a_layer_with_four_output_tensors_is_planned_not_read_as_a_shape() -> None:
    graph = trace(_FourWay(), (4, 3, 8, 8))
    plan = plan_model(graph, preset_profile("v100", "float32"), _cluster(2), SearchSettings(max_stages=2)).plan
    assert layer_refusal(graph.nodes["split"], plan.layers["split"].layout) is None  # what the runtime runs
    assert layer_refusal(graph.nodes["split"], Layout(c=2)) is not None  # the pieces cut the channels
    check_runnable(_FourWay(), plan, graph, verify=True)


class _ScalarGate(nn.Module):
    """efficientvim's gate: a feature map scaled by a 0-D tensor computed from it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return (y * y.mean()).mean(dim=(2, 3))


def test_a_layer_reading_a_zero_dimensional_tensor_is_planned() -> None:
    graph = trace(_ScalarGate(), (4, 3, 8, 8))
    assert [] in graph.nodes["mul"]["input_shapes"]
    plan = plan_model(graph, preset_profile("v100", "float32"), _cluster(2), SearchSettings(max_stages=2)).plan
    check_runnable(_ScalarGate(), plan, graph, verify=True)


def test_a_tuple_of_logits_has_no_height_to_split_and_adaptive_pooling_splits_by_its_windows() -> None:
    """googlenet's and inception_v3's (logits, aux) outputs cannot take h2 at all (no runtime gap); adaptive
    average pooling to more than one row splits by height (its aux head: 2×2 to 4×4) unless a tile would read
    past its neighbours."""
    from cost_models.capability.predicate import inherent, layer_refusal

    outputs = {"kind": "other", "output_shape": [[4, 1000], [4, 1000]], "input_shapes": [[4, 1000], [4, 1000]],
               "attrs": {}}
    assert inherent(layer_refusal(outputs, Layout(h=2)) or "")
    assert layer_refusal(outputs, Layout(n=2)) == "a layer with several output tensors is kept whole"
    pool = {"kind": "adaptive_avgpool", "output_shape": [4, 8, 4, 4], "input_shapes": [[4, 8, 2, 2]],
            "attrs": {"output_size": [4, 4]}}
    assert layer_refusal(pool, Layout(h=2)) is None and layer_refusal(pool, Layout(h=2, w=2)) is None
    assert layer_refusal({**pool, "output_shape": [4, 8, 3, 3], "input_shapes": [[4, 8, 13, 7]]}, Layout(h=2)) is None
    alexnet = {**pool, "output_shape": [4, 8, 6, 6], "input_shapes": [[4, 8, 1, 1]]}  # 1×1 read whole by each tile
    assert layer_refusal(alexnet, Layout(h=2)) is None and layer_refusal(alexnet, Layout(h=2, w=2)) is None
    one_row = layer_refusal({**pool, "output_shape": [4, 8, 1, 1], "input_shapes": [[4, 8, 7, 7]]}, Layout(h=2))
    assert one_row and inherent(one_row)  # a global pool: its input's tiles are summed (runtime.spatial)
    assert inherent(layer_refusal(outputs, Layout(w=2)) or "")


class _MergedSamples(nn.Module):
    """Attention's bookkeeping: ``(B, C, H, W) → (B·heads, C/heads, H, W)`` merges the samples with the heads, and a
    reshape of a channels-last value whose new sizes only happen to match its columns' extent."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)                                        # (2, 4, 4, 8)
        heads = y.reshape(4, 2, 4, 8).reshape(4, 2, 32)          # dimension 0: samples × heads
        moved = y.permute(0, 3, 2, 1).reshape(4, 2, 4, 8)       # 'nwhc' (2, 8, 4, 4) → (4, 2, 4, 8)
        return heads.flatten(1).sum() + moved.flatten(1).sum()


def test_views_of_merged_samples_or_lost_axes_are_refused_and_method_arguments_are_read() -> None:
    graph = trace(_MergedSamples(), (2, 3, 4, 8))
    assert graph.nodes["reshape"]["attrs"]["order"] == "..hw"
    assert "holds no sample axis" in layer_refusal(graph.nodes["reshape_1"], Layout(n=2))
    assert "moves the split columns" in layer_refusal(graph.nodes["reshape_2"], Layout(w=2))
    assert graph.nodes["flatten"]["attrs"]["start_dim"] == 1  # x.flatten(1): a positional argument
