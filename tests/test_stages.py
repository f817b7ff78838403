"""Pipeline stage search (tier 1 on hand-made numbers, tier 2 on resnet18) and the runner-up explanation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_model
from torch import nn

from calibrate.presets import preset_cluster, preset_profile
from cost_models.formats.plan import Plan, load_plan
from cost_models.ir.tracing import trace
from cost_models.pipeline_cost import least_staleness
from parplan.cli import main
from planner.pipeline.stages import micro_batch_counts, search_pipelines, stage_counts
from planner.search import plan_model
from planner.settings import SearchSettings
from planner.solvers.cost_table import CostTable
from planner.solvers.explain import runner_ups


def test_stage_counts_and_micro_batches() -> None:
    assert stage_counts(64, 8, 4) == [2, 4]  # 32 and 16 devices: whole nodes
    assert stage_counts(8, 8, 4) == [2, 4]  # parts of one node
    assert stage_counts(24, 8, 4) == [3]  # 12 devices per stage would split a node unevenly
    assert micro_batch_counts(64, 4) == [4, 8, 16, 32, 64]  # divisors: sizes 16, 8, … 1, each half the last
    assert micro_batch_counts(6, 4) == [6]  # 4 micro-batches would hold 2 samples at most: not twice 1
    assert micro_batch_counts(13, 2) == [2, 4, 7, 13]  # 7 + 6, 4 + 3 + 3 + 3, 2 × 6 + 1 and 1 each
    assert micro_batch_counts(7, 2) == [2, 4, 7]  # 4 + 3, 2 + 2 + 2 + 1, and 1 each: no size twice the next
    assert micro_batch_counts(3, 8) == [3]  # a batch smaller than the stages


def test_stages_may_take_any_number_of_whole_nodes_their_largest_activation_fills() -> None:
    """A batch of 12 at 96×96 on 64 devices (8 to a node): 24 devices (n12·h2) are 3 nodes no equal split of 64
    gives; 3 stages take 16 or 24 each (24 + 24 + 16 uses every device). ResNet-50 at 2048² fills powers of two
    only: its sizes stay those of equal stages."""
    from planner.pipeline.sizes import sizes_for as _sizes_for
    from planner.pipeline.sizes import stage_sizes as _stage_sizes

    graph = trace(build_model("resnet18"), (12, 3, 96, 96))
    sizes = _stage_sizes(preset_cluster("h100", 64), graph)
    assert sizes == [48, 32, 24, 16, 8, 4, 2, 1] and _sizes_for(3, 64, sizes) == (16, 24)
    large = trace(build_model("resnet18"), (64, 3, 2048, 2048))
    assert _stage_sizes(preset_cluster("h100", 1024), large) == [512, 256, 128, 64, 32, 16, 8, 4, 2, 1]


def test_runner_ups_name_the_best_alternative_and_its_extra_cost() -> None:
    table = CostTable(("a", "b"), {"a": ("x", "y", "z"), "b": ("x", "y")}, {"a": (1.0, 1.5, 3.0), "b": (1.0, 0.2)},
                      {("a", "b"): ((0.0, 2.0), (2.0, 0.0), (1.0, 1.0))})
    found = runner_ups(table, {"a": 0, "b": 0})
    assert found["a"].option == "y" and found["a"].extra_s == pytest.approx(2.5)  # 1.5 + 2 (shuffle) − 1
    assert found["b"].option == "y" and found["b"].extra_s == pytest.approx(1.2)  # 0.2 + 2 − 1


@pytest.fixture(scope="module")
def resnet18():  # noqa: ANN201
    return trace(build_model("resnet18"), (8, 3, 64, 64))


def test_the_search_prices_sync_and_stale_pipelines(resnet18) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 8)
    everything = search_pipelines(resnet18, profile, cluster, _maker(resnet18, cluster), SearchSettings(max_stages=4),
                                  prune=False)
    assert everything.skipped == 0
    summaries = [c.plan.summary() for c in everything.candidates]
    assert any("2 stages sync" in s for s in summaries) and any("4 stages stale" in s for s in summaries)
    sync = {(c.plan.pipeline.stages, c.plan.pipeline.micro_batches) for c in everything.candidates
            if c.plan.pipeline.schedule == "sync"}
    batch = resnet18.input_shape[0]
    assert sync == {(k, m) for k in (2, 3, 4) for m in micro_batch_counts(batch, k)}  # 3 stages: 4 + 2 + 2 devices
    three = [c.plan.pipeline.devices_per_stage for c in everything.candidates if c.plan.pipeline.stages == 3]
    assert three and all(set(split) <= {2, 4} and sum(split) <= 8 or set(split) <= {1, 2} and sum(split) <= 4
                         for split in three)  # some devices may idle: on a budget of 8 devices, or of 4
    assert {sum(split) <= 4 for split in three} == {True, False}
    result = plan_model(resnet18, profile, cluster, SearchSettings(max_stages=4))
    best = min(c.estimate.iteration_s for c in everything.candidates if c.fits)
    assert result.estimate.iteration_s <= best + 1e-12  # the bound skipped nothing that would have won
    assert all(result.estimate.iteration_s <= b.estimate.iteration_s + 1e-12 for b in result.baselines)
    assert result.chosen_from == "search" and result.runner_ups  # explained, pipeline or not
    assert all(found.option is None or found.extra_s >= -1e-12 for found in result.runner_ups.values())
    plan = result.plan
    order = resnet18.compute_layers()
    stages = [plan.layers[name].stage for name in order]
    assert stages == sorted(stages)  # contiguous cuts in topological order
    for candidate in everything.candidates:  # a stale plan's staleness: the least that keeps its predicted pace
        pipeline, stages = candidate.plan.pipeline, candidate.estimate.stages
        if pipeline.schedule == "stale":
            least = least_staleness([s.forward_s for s in stages], [s.backward_s for s in stages],
                                    [s.transfer_s for s in stages[:-1]], [s.allreduce_s for s in stages])
            assert pipeline.staleness == tuple(min(a, 2 * (pipeline.stages - 1 - k)) for k, a in enumerate(least))


def test_a_pipeline_may_leave_half_or_more_of_the_devices_idle() -> None:
    from planner.pipeline.sizes import budgets

    assert budgets(64, 8) == [64, 32, 16, 8, 4, 2]  # whole nodes, then parts of one
    assert budgets(24, 8) == [24]  # 12 devices would take a node and a half
    assert budgets(3, 8) == [3]


def test_more_devices_never_plan_slower_the_search_leaves_them_idle() -> None:
    """resnet18 on 2 samples of 512²: past 32 devices every finer split is slower. Before pipelines could leave
    devices idle, 1024 devices planned 0.68 ms (4 stages on 64 of them) against 0.63 ms on 64 devices."""
    graph, profile = trace(build_model("resnet18"), (2, 3, 512, 512)), preset_profile("h100")
    settings = SearchSettings(max_stages=4)
    small = plan_model(graph, profile, preset_cluster("h100", 64), settings)
    large = plan_model(graph, profile, preset_cluster("h100", 1024), settings)
    assert large.estimate.iteration_s <= small.estimate.iteration_s * (1 + 1e-12)
    assert sum(large.plan.pipeline.devices_per_stage) < 1024


def test_no_layout_takes_fewer_device_seconds_than_the_work_bound() -> None:
    """``least_device_s`` (the bound that skips device budgets unpriced) is below every option of every decision
    on 1, 2 and 4 devices, kept or recomputed — also where calibration timed problems faster than its fit."""
    from dataclasses import replace

    from cost_models.layer_cost import least_device_s
    from cost_models.layout import Layout
    from cost_models.local_problem import layer_problem, phases_of
    from cost_models.profile import ComputeSample
    from planner.space import LayerCosts

    graph, base = trace(build_model("resnet18"), (4, 3, 32, 32)), preset_profile("h100")
    problems = [p for _, data in graph.nodes(data=True) if (p := layer_problem(data, Layout(n=2), "float32"))]
    samples = tuple(ComputeSample(p.kind, phase, p.key, getattr(p.flops, phase), p.bytes_moved(phase),
                                  0.3 * base.compute_fit(p.kind, phase).time_s(getattr(p.flops, phase),
                                                                               p.bytes_moved(phase)), 0.0, 3)
                    for p in problems[::3] for phase in phases_of(p))
    for profile in (base, replace(base, compute_samples=samples)):
        for size in (1, 2, 4):
            for recompute in (False, True):
                costs = LayerCosts(graph, profile, preset_cluster("h100", size), size, "sgd", recompute=recompute)
                for members in costs.groups.values():
                    bound = sum(least_device_s(graph.nodes[m], profile, "float32", recompute=recompute)
                                for m in members)
                    assert min(size * row[2] for row in costs.rows(members)) >= bound * (1 - 1e-12), members


def test_the_bound_only_skips_configurations_that_cannot_win(resnet18) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 8)
    everything = search_pipelines(resnet18, profile, cluster, _maker(resnet18, cluster), SearchSettings(max_stages=4),
                                  prune=False)
    times = sorted(c.estimate.iteration_s for c in everything.candidates)
    incumbent = times[len(times) // 2]
    bounded = search_pipelines(resnet18, profile, cluster, _maker(resnet18, cluster), SearchSettings(max_stages=4),
                               incumbent_s=incumbent)
    assert bounded.skipped > 0 and len(bounded.candidates) < len(everything.candidates)
    assert min(c.estimate.iteration_s for c in bounded.candidates) == pytest.approx(times[0], rel=1e-12)


def test_a_stale_stage_sends_no_faster_than_its_transfer_floor(resnet18) -> None:  # noqa: ANN001
    """The floor that rules stale configurations out (``planner.pipeline.bounds.send_floor``) is below the estimate's
    transfer after every stage of every stale plan the search prices, on one node and across nodes."""
    from cost_models.estimate import estimate
    from planner.pipeline.bounds import send_floor

    profile = preset_profile("h100")
    for devices in (8, 32):
        cluster = preset_cluster("h100", devices)
        searched = search_pipelines(resnet18, profile, cluster, _maker(resnet18, cluster),
                                    SearchSettings(max_stages=4, schedule="stale"), prune=False)
        checked = 0
        for candidate in searched.candidates:
            pipeline, layers = candidate.plan.pipeline, candidate.plan.layers
            config = next(c for c in _stale_configs(resnet18, profile, cluster) if c.pipeline.stages == pipeline.stages)
            heads = list(config.groups)
            floor = send_floor(config.graph, config.groups, heads, profile, cluster, {})
            for stage in range(pipeline.stages - 1):
                first = next(i for i, head in enumerate(heads) if layers[head].stage == stage + 1)
                sent_s = candidate.estimate.stages[stage].transfer_s
                assert floor(first, pipeline.devices_per_stage[stage]) <= sent_s * (1 + 1e-12), (devices, pipeline)
                checked += 1
        assert checked > 0
        for candidate in searched.candidates:  # priced from the capped plan's estimate (``restaled``): as in full
            assert candidate.estimate == estimate(resnet18, candidate.plan, profile), candidate.plan.pipeline


def _stale_configs(graph, profile, cluster):  # noqa: ANN001, ANN202
    from cost_models.estimate import CostMemo
    from planner.pipeline.stages import _configs
    return [c for c in _configs(graph, profile, cluster, SearchSettings(max_stages=4, schedule="stale"),
                                CostMemo(profile, "float32")) if c.pipeline.schedule == "stale"]


def _maker(graph, cluster):  # noqa: ANN001, ANN202
    def make(assignments, pipeline, info):  # noqa: ANN001, ANN202
        return Plan(graph.fingerprint, tuple(graph.input_shape), "float32", cluster, dict(assignments), pipeline,
                    solver=info)
    return make


def test_max_staleness_bounds_and_zero_means_synchronous(resnet18) -> None:  # noqa: ANN001
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 8)
    bounded = search_pipelines(resnet18, profile, cluster, _maker(resnet18, cluster),
                               SearchSettings(max_stages=4, schedule="stale", max_staleness=2))
    assert bounded.candidates and all(max(c.plan.pipeline.staleness) <= 2 for c in bounded.candidates)
    synchronous = search_pipelines(resnet18, profile, cluster, _maker(resnet18, cluster),
                                   SearchSettings(max_stages=4, max_staleness=0))
    assert synchronous.candidates and not any("stale" in c.plan.summary() for c in synchronous.candidates)
    chosen = plan_model(resnet18, profile, cluster, SearchSettings(max_stages=4, max_staleness=0))
    assert not any(chosen.plan.pipeline.staleness)


def test_plan_command_explains_and_records_the_pipeline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["plan", "--model", "torchvision:resnet18", "--input-shape", "8,3,64,64", "--profile", "h100",
            "--devices", "8", "--out", str(out)]
    assert main([*args, "--explain"]) == 0
    text = capsys.readouterr().out
    assert "runner-up" in text and "pure sample" in text and "speedup" in text
    assert main([*args, "--json", "--max-stages", "2", "--schedule", "sync"]) == 0
    document = json.loads(capsys.readouterr().out)
    plan = load_plan(out)
    assert plan.pipeline.schedule == "sync" and document["pipeline"]["staleness"] == [0] * plan.pipeline.stages
    assert {row["layer"] for row in document["decisions"]} >= {"conv1", "fc"} and document["staleness_why"] is None
    assert main([*args, "--schedule", "stale", "--max-staleness", "2"]) == 0
    assert re.search(r"staleness [012](,[012])+( \(capped\))?: the (least per stage|gradient round trip)", capsys.readouterr().out)
    with pytest.raises(SystemExit) as exited:
        main([*args, "--max-staleness", "-1"])
    assert exited.value.code == 2 and "--max-staleness" in capsys.readouterr().err


def test_more_devices_than_samples_get_split_in_space_and_beat_both_baselines() -> None:
    graph = trace(build_model("resnet18"), (2, 3, 512, 512))
    result = plan_model(graph, preset_profile("h100"), preset_cluster("h100", 16), SearchSettings(max_stages=1))
    layouts = [assignment.layout for assignment in result.plan.layers.values()]
    assert any(layout.h * layout.w > 1 for layout in layouts)
    assert result.plan.solver is not None and result.plan.solver.status == "Optimal"
    sample, single = result.baselines
    assert sample.name == "pure sample" and result.estimate.iteration_s < sample.estimate.iteration_s
    assert result.estimate.iteration_s <= single.estimate.iteration_s


def _assert_allowed_cuts_are_the_runnable_ones(nodes: Any, groups: Any, allowed: Any) -> None:
    """For every cut between decisions: the stage search allows it exactly when the runtime's cut runs."""
    from runtime.pipeline.cut import cut_stages

    heads = list(groups)
    for cut in range(1, len(heads)):
        stages = {layer: int(index >= cut) for index, head in enumerate(heads) for layer in groups[head]}
        try:
            cut_stages(nodes, stages, 2)
            runs = True
        except Exception:
            runs = False
        assert runs == (cut in allowed), heads[cut]


def test_stages_start_only_where_the_traced_program_can_be_cut() -> None:
    # A residual block's shortcut convolution is traced after its main branch, but the decisions'
    # topological order puts it first: a cut between them would not be contiguous for the runtime.
    from cost_models.ir.tracing import symbolic_trace
    from planner.pipeline.cuts import allowed_cuts
    from planner.space import decision_groups

    model = build_model("resnet18")
    graph = trace(model, (8, 3, 64, 64))
    groups = decision_groups(graph)
    allowed = allowed_cuts(graph, groups)
    heads = list(groups)
    assert 0 < len(allowed) < len(heads) - 1
    shortcut = heads.index("layer2_0_downsample_0")
    assert shortcut + 1 not in allowed  # right after the shortcut, the block's main branch is still to come
    nodes = list(symbolic_trace(model, ()).graph.nodes)
    _assert_allowed_cuts_are_the_runnable_ones(nodes, groups, allowed)


class _SizedAttention(nn.Module):
    """mvitv2's attention: returns its output with the feature size, ``(x, (h, w))`` — no layer's tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor, size: Any) -> tuple[torch.Tensor, tuple[int, int]]:
        return self.proj(x), (x.shape[2], x.shape[3])


class _SizedBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1)
        self.first, self.second, self.third = _SizedAttention(), _SizedAttention(), _SizedAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x, size = self.first(x, None)
        x, size = self.second(torch.relu(x), size)
        x, _ = self.third(torch.sigmoid(x), None)
        return self.head(x)


def test_stages_never_start_where_a_value_no_layer_holds_would_cross() -> None:
    from cost_models.ir.tracing import symbolic_trace
    from planner.pipeline.cuts import allowed_cuts
    from planner.space import decision_groups

    model, leaves = _SizedBlocks(), ("_SizedAttention",)
    graph = trace(model, (4, 3, 8, 8), leaf_modules=leaves)
    assert ["getitem", "getitem_2"] in graph.graph["held_together"]  # first's output and, by its size, second's
    groups = decision_groups(graph)
    allowed = allowed_cuts(graph, groups)
    nodes = list(symbolic_trace(model, leaves).graph.nodes)
    _assert_allowed_cuts_are_the_runnable_ones(nodes, groups, allowed)
    assert len(allowed) >= 2  # before the first block, before the third (it takes no size): tensors only


class _FetchedWeights(nn.Module):
    """physicsnemo's AFNO: the forward fetches ``self.w[0]`` and ``self.w[1]`` itself, for two products."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1)
        self.w = nn.Parameter(torch.randn(2, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x)).permute(0, 2, 3, 1)
        y = torch.relu(torch.einsum("nhwc,cd->nhwd", y, self.w[0]))
        y = torch.einsum("nhwc,cd->nhwd", torch.sigmoid(y), self.w[1])
        return self.head(y.permute(0, 3, 1, 2))


def test_stages_never_separate_the_layers_reading_one_fetched_weight() -> None:
    """A 4-stage plan of AFNO put ``w[0]``'s and ``w[1]``'s products on two stages; the runtime refused the
    weight crossing after the planner chose it."""
    from cost_models.ir.tracing import symbolic_trace
    from planner.pipeline.cuts import allowed_cuts
    from planner.space import decision_groups

    model = _FetchedWeights()
    graph = trace(model, (4, 3, 8, 8))
    assert ["getitem", "getitem_1"] in graph.graph["held_together"]  # w[0] and w[1]: the einsums between them
    groups = decision_groups(graph)
    allowed = allowed_cuts(graph, groups)
    _assert_allowed_cuts_are_the_runnable_ones(list(symbolic_trace(model, ()).graph.nodes), groups, allowed)


def test_a_recomputing_stage_keeps_its_inputs_and_runs_its_forward_twice(resnet18) -> None:  # noqa: ANN001
    """Priced as the runtime runs it: one micro-batch's activations at a time plus the in-flight inputs (less
    memory), and before each backward the stage's forward again (the breakdown's ``recompute``)."""
    from dataclasses import replace

    from cost_models.estimate import estimate
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan

    profile, cluster = preset_profile("h100"), preset_cluster("h100", 2)
    one = uniform_plan(resnet18, replace(cluster, devices=1, devices_per_node=1), [Layout()])
    plan = staged(one, resnet18, ["layer2_0_conv1"], "sync", micro_batches=4)
    kept = estimate(resnet18, plan, profile)
    again = estimate(resnet18, replace(plan, pipeline=replace(plan.pipeline, recompute=(True, False))), profile)
    first = [layer for layer in kept.layers if layer.stage == 0]
    assert again.breakdown_s["recompute"] == pytest.approx(4 * sum(layer.cost.forward_s for layer in first))
    assert again.stages[0].backward_s == pytest.approx(kept.stages[0].backward_s + kept.stages[0].forward_s
                                                       - profile_event_s(profile))
    assert again.stages[0].memory_bytes < kept.stages[0].memory_bytes
    assert again.stages[1] == kept.stages[1] and again.iteration_s > kept.iteration_s


def profile_event_s(profile: Any) -> float:
    return profile.corrections.event_overhead_s if profile.corrections else 0.0


def test_a_stage_recomputes_where_keeping_its_activations_does_not_fit() -> None:
    """The UNet at 8×3×128×128 on 2 devices, 2 sync stages of 8 micro-batches: the first stage holds two
    micro-batches' activations under 1F1B (20.7 MB), recomputing one (12.0 MB); with 17 MB per device only the
    plan whose first stage recomputes fits, and the search finds it; with room to spare nothing recomputes."""
    from dataclasses import replace

    from examples.unet import unet

    graph = trace(unet(), (8, 3, 128, 128))
    profile = preset_profile("h100")
    for memory_bytes, expected in ((2**34, (False, False)), (17_000_000, (True, False))):
        cluster = replace(preset_cluster("h100", 2), memory_bytes=memory_bytes)
        found = search_pipelines(graph, profile, cluster, _maker(graph, cluster),
                                 SearchSettings(max_stages=2, schedule="sync"), prune=False)
        fitting = [c for c in found.candidates if c.fits]
        assert fitting and all(tuple(c.plan.pipeline.recomputes(k) for k in range(2)) == expected for c in fitting)
        if expected[0]:
            assert all("recompute" in c.estimate.breakdown_s for c in fitting)


@pytest.mark.parametrize("batch", [8, 5])  # 5: two stages also try 2 and 3 uneven micro-batches (3 + 2, 2 + 2 + 1)
def test_the_search_cuts_where_brute_force_over_every_cut_does(batch: int) -> None:
    """resnet18 on 4 devices, 2 to 4 stages, sync (each micro-batch count) and stale: the cut and the devices
    per stage the search picks have the least objective (``Σ t + (M−1)·max t`` or ``max t``, each stage's time its
    exact layout optimum on its devices) of every allowed cut and every split of the devices among the stages'
    sizes within its budget (3 stages: 2 + 1 + 1, or fewer with devices left idle; 2 stages on a budget of 2
    devices: 1 + 1); and the lower bound that skips configurations
    (``planner.pipeline.bounds.Floor``) is never above that optimum."""
    import itertools
    import math

    from cost_models.estimate import CostMemo
    from planner.pipeline.cuts import allowed_cuts
    from planner.pipeline.stages import _best_stage_solve, _configs, _stage_layouts, _StageSpaces

    graph = trace(build_model("resnet18"), (batch, 3, 32, 32))
    profile, cluster = preset_profile("h100"), preset_cluster("h100", 4)
    settings = SearchSettings(max_stages=4)
    uneven, budgets = set(), set()
    for config in _configs(graph, profile, cluster, settings, CostMemo(profile, "float32")):
        unpriced_s = config.floor.bound_s  # every decision counted by its least device-seconds
        if config.floor.reaches(None):  # some layer has no layout on a stage's devices (the search drops it)
            continue
        assert 0 < unpriced_s <= config.floor.bound_s * (1 + 1e-12), config.pipeline  # pricing only raises it
        budgets.add(config.budget)
        if batch % config.pipeline.micro_batches:
            uneven.add((config.pipeline.stages, config.pipeline.micro_batches))
        heads, stages = list(config.groups), config.pipeline.stages
        micro, stale = config.pipeline.micro_batches, config.pipeline.schedule == "stale"

        seen: dict[tuple[int, int, int, int], float] = {}

        def time(i: int, j: int, k: int, size: int) -> float:
            if (i, j, k, size) not in seen:
                best = _best_stage_solve(_StageSpaces(config, profile, cluster, k, heads[i:j], size), 0, settings)
                seen[i, j, k, size] = math.inf if best is None else best[2].objective_s
            return seen[i, j, k, size]

        def objective(cuts: list[int], sizes: tuple[int, ...]) -> float:
            times = [time(a, b, k, sizes[k]) for k, (a, b) in enumerate(zip(cuts, [*cuts[1:], len(heads)]))]
            return max(times) if stale else sum(times) + (micro - 1) * max(times)

        allowed = sorted(allowed_cuts(config.graph, config.groups))
        splits = [split for split in itertools.product(config.sizes, repeat=stages) if sum(split) <= config.budget]
        brute = min(objective([0, *starts], split) for starts in itertools.combinations(allowed, stages - 1)
                    for split in splits)
        assert config.floor.bound_s <= brute * (1 + 1e-12), config.pipeline  # the bound the search prunes by
        assignments, _, _, pipeline = _stage_layouts(config, profile, cluster, settings)[0]
        chosen = [0] + [heads.index(next(h for h in heads if assignments[h].stage == k)) for k in range(1, stages)]
        assert objective(chosen, pipeline.devices_per_stage) == pytest.approx(brute, rel=1e-9), config.pipeline
    assert uneven == ({(2, 2)} if batch == 5 else set())  # 3 + 2 samples; 2 + 2 + 1 leaves a batch-norm over 1×1
    assert budgets == {4, 2}  # maps one sample; all 4 devices, or 2 of them (the rest idle)


class _Chunked(nn.Module):
    """A tuple of tensors (``chunk``) whose second item is read only after the first branch."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 2, 1)
        self.a = nn.Sequential(*[nn.Conv2d(4, 4, 3, padding=1) for _ in range(3)])
        self.b = nn.Sequential(*[nn.Conv2d(4, 4, 3, padding=1) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.stem(x).chunk(2, dim=1)
        return self.head(torch.cat([self.a(parts[0]), self.b(parts[1])], dim=1))


def test_stages_k_cuts_only_where_the_planner_may_and_says_how_many_places_there_are() -> None:
    """``--stages K`` (``balanced_starts``) once cut between ``chunk`` and a reader of its tuple, which the runtime
    refused after its ranks had started (issue 53 item 4): it now takes the planner's rule
    (``uncuttable_after``), for every K there is room for, and refuses more in one line."""
    from cost_models.capability.predicate import uncuttable_after
    from cost_models.errors import InputError
    from cost_models.uniform import balanced_starts

    graph = trace(_Chunked(), (4, 3, 8, 8))
    order = graph.compute_layers()
    forbidden = uncuttable_after(graph)
    assert order.index("chunk") in forbidden and order.index("getitem_1") - 1 in forbidden
    room = sum(1 for p in range(1, len(order)) if p - 1 not in forbidden)
    for stages in range(1, room + 2):
        starts = balanced_starts(graph, stages)
        assert len(starts) == stages - 1 and all(order.index(s) - 1 not in forbidden for s in starts)
    with pytest.raises(InputError, match=rf"can be cut at {room} places .*use 1 to {room + 1} stages"):
        balanced_starts(graph, room + 2)
