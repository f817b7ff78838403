"""Shape reads in the split interpreter (``runtime.shapes``): every rank computes the unsplit program's values.

Single process: shape reads and what is computed from them evaluate from
the traced global shapes; views with written sizes are exact on a box only
when its input and output parts are the same elements (``flat_runs``); an
op given a value that depends on a split extent is refused before any rank
starts, naming it; values computed from shapes do not cross pipeline cuts.

Multi-rank (gloo, float64, exact): a model that reads ``x.shape`` (with an
assertion on the global height), reshapes with ``x.shape[0]`` and the
spatial extents, expands a class token to ``z.size(0)``, interpolates to
``y.shape[-2:]`` and flattens with the same ``x.shape[0]`` equals the unsplit model
split by samples, by rows, and cut into two pipeline stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from torch import nn

from cost_models.errors import PlanError
from cost_models.layout import Layout
from runtime.boxes import flat_runs, nd_box
from runtime.placement import Placement
from runtime.shapes import static_nodes, static_values, tensor_names

SHAPE = (4, 3, 12, 8)


class ShapeNet(nn.Module):
    """A ViT-like head and a segmentation-like branch, both sized from the input's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.proj = nn.Conv2d(8, 16, 2, stride=2)
        self.token = nn.Parameter(torch.randn(1, 1, 16))
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        torch._assert(h == SHAPE[2], "the global height")
        y = torch.relu(self.conv(x))
        z = self.proj(y).reshape(n, 16, (h // 2) * (w // 2)).permute(0, 2, 1)
        tokens = torch.cat([self.token.expand(z.size(0), -1, -1), z], dim=1)
        side = F.interpolate(F.avg_pool2d(y, 2), size=y.shape[-2:], mode="nearest")
        return self.fc(tokens[:, 0]) + side.view(n, -1).mean(dim=1, keepdim=True)


class HalfBatch(nn.Module):
    """Slices the batch at half its size: under a sample split each rank would need its own half."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.flatten(y[: y.shape[0] // 2], 1)


class ScaledByHeight(nn.Module):
    """Scales a row-split activation by a number read from its height: on a tile the local height would differ."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.head(y * (y.shape[2] / 8)).mean((2, 3))


def _model(cls: type[nn.Module] = ShapeNet) -> nn.Module:
    torch.manual_seed(0)
    return cls().double().train()


def _plan(model: nn.Module, size: int, layouts: Sequence[str], starts: Sequence[str] = ()) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.uniform import staged, uniform_plan

    graph = trace(model, SHAPE, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=size, devices_per_node=size, memory_bytes=2**34, intra=link, inter=link)
    plan = uniform_plan(graph, cluster, [*(Layout.parse(text) for text in layouts), Layout()])
    return (staged(plan, graph, starts, "sync", 2) if starts else plan), graph


# --- single process ---------------------------------------------------------------------------------------


def test_shape_reads_evaluate_from_the_traced_global_shapes() -> None:
    from cost_models.ir.tracing import symbolic_trace, trace

    model = _model()
    graph = trace(model, SHAPE, torch.float64)
    nodes = list(symbolic_trace(model, ()).graph.nodes)
    static = static_nodes(nodes, tensor_names(graph))
    values = static_values(static, lambda name: graph.nodes[name]["output_shape"])
    reads = [node for node in static if node.args and getattr(node.args[0], "name", None) == "x"]
    assert [values[node.name] for node in reads] == [torch.Size(SHAPE)]
    assert sorted(v for v in values.values() if type(v) is int) == sorted([4, 3, 12, 8, 12 // 2, 8 // 2, 24, 4])
    assert values["eq"] is True and values["getitem_4"] == torch.Size(SHAPE[2:])  # the assertion and y.shape[-2:]
    tile = static_values(static, lambda name: (2, *graph.nodes[name]["output_shape"][1:]))  # half the samples
    assert [tile[node.name] for node in reads] == [torch.Size((2, *SHAPE[1:]))]


def test_a_view_is_exact_on_a_box_only_when_its_parts_are_the_same_elements() -> None:
    samples, channels, rows = Placement(Layout(n=2)), Placement(Layout(c=2)), Placement(Layout(h=2))
    for member in range(2):
        assert flat_runs((4, 8, 3, 3), nd_box((4, 8, 3, 3), samples, member)) == flat_runs(
            (4, 72), nd_box((4, 72), samples, member))
        assert flat_runs((4, 8, 3, 3), nd_box((4, 8, 3, 3), channels, member)) == flat_runs(
            (4, 72), nd_box((4, 72), channels, member))
        assert flat_runs((4, 8, 6, 6), nd_box((4, 8, 6, 6), rows, member)) != flat_runs(
            (4, 8, 36), nd_box((4, 8, 36), rows, member))
    assert flat_runs((4, 9), ((0, 2), (0, 9))) == ((36, 0, 18),)
    assert flat_runs((3, 4, 5), ((1, 2), (1, 3), (0, 5))) == ((60, 25, 35),)  # one row: a contiguous run
    assert nd_box((4, 5, 6), Placement(Layout(c=2)), 0) is None  # a 3-D tensor's features cannot split


def test_an_op_given_a_split_extent_is_refused_before_any_rank_starts() -> None:
    from runtime.preflight import check_runnable

    model = _model(ScaledByHeight)
    plan, graph = _plan(model, 2, ["h2"])
    refused = r"'mul' \(.*\) takes .* computed from tensor shapes.*extent of a split dimension"
    with pytest.raises(PlanError, match=refused):
        check_runnable(model, plan, graph)
    whole, graph = _plan(model, 2, [])
    check_runnable(model, whole, graph)  # unsplit: every rank's shapes are the global ones
    check_runnable(_model(HalfBatch), *_plan(_model(HalfBatch), 2, ["n2"]))  # its slice runs whole: unsplit sizes
    for layouts in (["n2"], ["h2"]):
        plan, graph = _plan(_model(), 2, layouts)
        check_runnable(_model(), plan, graph)


def test_layout_plans_fall_back_per_layer_where_a_split_would_take_a_wrong_size() -> None:
    """``--layout`` refused the whole plan for one layer given a size read from a split tensor's shape (issue 53
    item 5); that layer now runs whole (its inputs whole, the unsplit program's sizes) and the rest keep the
    layout. An op the plan runs whole is never refused for the sizes it takes."""
    from runtime.preflight import check_runnable, shape_fallbacks

    model = _model(ScaledByHeight)
    plan, graph = _plan(model, 2, ["h2"])
    fallen, whole = shape_fallbacks(model, plan, graph)
    assert whole == ["mul"] and fallen.layers["mul"].layout == Layout()
    assert fallen.layers["conv"].layout == Layout(h=2) and fallen.layers["head"].layout == Layout(h=2)
    check_runnable(model, fallen, graph)
    assert shape_fallbacks(_model(), *_plan(_model(), 2, ["h2"]))[1] == []


def test_values_computed_from_shapes_do_not_cross_pipeline_cuts() -> None:
    from cost_models.ir.tracing import symbolic_trace, trace
    from runtime.pipeline.cut import cut_stages

    model = _model()
    graph = trace(model, SHAPE, torch.float64)
    nodes = list(symbolic_trace(model, ()).graph.nodes)
    first = ("x", "conv", "relu", "proj", "reshape", "permute")  # n = x.shape[0] is read on both stages
    stage_of = {name: (0 if name in first else 1) for name in graph.nodes}
    static = frozenset(node.name for node in static_nodes(nodes, tensor_names(graph)))
    with pytest.raises(PlanError, match="only layers' tensors can cross a cut"):
        cut_stages(nodes, stage_of, 2)
    cuts = cut_stages(nodes, stage_of, 2, static=static)
    assert {c.name for c in cuts[1].receives} == {"relu", "permute"}


# --- several ranks ----------------------------------------------------------------------------------------


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return (torch.randn(SHAPE, dtype=torch.float64, generator=generator),
            torch.randint(0, 5, (SHAPE[0],), generator=generator))


def _single_stage(rank: int, world: int, layouts: Sequence[str], cls: type[nn.Module] = ShapeNet) -> str:
    from runtime.apply import apply_plan
    from runtime.preflight import shape_fallbacks

    plan, graph = _plan(_model(cls), world, layouts)
    plan, _ = shape_fallbacks(_model(cls), plan, graph)  # as --layout runs it
    split = apply_plan(_model(cls), plan, graph=graph)
    reference = _model(cls)
    x, target = _batch()
    out = split(split.shard(x))
    split.loss(out, target[split.target_box(tuple(target.shape))]).backward()
    expected = reference(x)
    F.cross_entropy(expected, target).backward()
    box = split.output_placement.box((*expected.shape, 1, 1), split.member)
    torch.testing.assert_close(out, expected.detach()[tuple(slice(a, b) for a, b in box)[:2]])
    grads = dict(reference.named_parameters())
    for name, param in split.model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, msg=lambda m: f"{layouts} grad of {name}: {m}")
    return plan.summary()


def _pipeline(rank: int, world: int) -> int:
    from runtime.pipeline.schedules import one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    plan, graph = _plan(_model(), 1, [], ["proj"])
    stage = apply_pipeline(_model(), plan)
    stage.keep_outputs = True
    reference = _model()
    x, target = _batch()
    size = SHAPE[0] // 2

    def data(b: int) -> tuple[Any, Any]:
        return (x[b * size:(b + 1) * size] if stage.first else None,
                target[b * size:(b + 1) * size] if stage.last else None)

    events = [e for e in one_f_one_b(2, stage.index, 2) if e.kind != "U"]
    stage.run(events, torch.optim.SGD(stage.parameters(), lr=0.0), data, last_backward=1)
    for b in range(2):
        out = reference(x[b * size:(b + 1) * size])
        (F.cross_entropy(out, target[b * size:(b + 1) * size]) / 2).backward()
        if stage.last:
            torch.testing.assert_close(stage.outputs[b], out.detach())
    grads = dict(reference.named_parameters())
    for param in stage.parameters():
        name = next(n for n, p in stage.model.model.named_parameters() if p is param)
        torch.testing.assert_close(param.grad, grads[name].grad, msg=lambda m: f"stage {stage.index} {name}: {m}")
    return len(stage.parameters())


def _cases(rank: int, world: int) -> dict[str, Any]:
    return {"n2": _single_stage(rank, world, ["n2"]), "h2": _single_stage(rank, world, ["h2"]),
            "scaled h2": _single_stage(rank, world, ["h2"], ScaledByHeight), "pipeline": _pipeline(rank, world)}


@pytest.mark.multirank
def test_a_model_sized_from_its_shapes_equals_the_unsplit_model_under_splits_and_stages() -> None:
    results = run_ranks(_cases, 2, timeout_s=300)
    assert results[0]["n2"].startswith("n2") and "h2" in results[0]["h2"]
    assert "n1" in results[0]["scaled h2"]  # its shape-scaled product ran whole (--layout's per-layer fallback)
    assert sum(result["pipeline"] for result in results) == len(list(_model().parameters()))
