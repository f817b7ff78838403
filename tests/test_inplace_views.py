"""In-place writes into views train the split model exactly as the unsplit one (issue 53, item 2).

torch.fx traces ``y[:, :4].mul_(2)`` as a view and a write nobody reads, while the next layer reads ``y``:
split by rows or channels, or cut into stages after the write, the write was lost (float64 output error
0.74–0.81, silently). Tracing now makes each such write a value (``cost_models.ir.functionalize``): checked
here in float64 — output and every parameter gradient against the unsplit model — for a slice ``mul_``,
``narrow().add_()``, ``index_put_``, ``__setitem__`` (a slice, and an index tensor), ``masked_fill_``,
``clamp_`` on a view, ``+=`` on a slice, an in-place method on the whole value, an in-place activation module
on a view, and a write into some samples, under ``n2``, ``h2``, ``c2`` and a pipeline cut right after the
write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import split_step_matches, uniform_test_plan
from torch import nn

SHAPE = (2, 3, 12, 12)


class Base(nn.Module):
    """conv → a write into (a view of) its output → conv reading the whole output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 5, 3, padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        self.write(y)
        return self.conv2(y).mean((2, 3))

    def write(self, y: torch.Tensor) -> None:
        raise NotImplementedError


def _slice_add(y: torch.Tensor) -> None:
    y[:, :3] += 1


WRITES: dict[str, Callable[[Any, torch.Tensor], Any]] = {
    "slice mul_": lambda m, y: y[:, :4].mul_(2),
    "narrow add_": lambda m, y: y.narrow(2, 0, 5).add_(1),
    "index_put_": lambda m, y: y[:, 1:4].index_put_((torch.tensor([0, 1]), torch.tensor([2, 0])), y.new_full((), 0.25)),
    "setitem": lambda m, y: y.__setitem__((slice(None), slice(2, 5), slice(1, 6)), 0.5),
    "setitem by index": lambda m, y: y.__setitem__((slice(None), torch.tensor([1, 3])), 0.0),
    "masked_fill_": lambda m, y: y[:, 1:3].masked_fill_(y[:, 1:3] > 0.1, 0.0),
    "clamp_ on a view": lambda m, y: y[:, :, 2:].clamp_(min=0),
    "+= on a slice": lambda m, y: _slice_add(y),
    "whole mul_": lambda m, y: y.mul_(3),
    "inplace module": lambda m, y: m.act(y[:, 2:6]),
    "some samples": lambda m, y: y[:1].mul_(2),
}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    write = WRITES[name]
    cls = type(name.title().replace(" ", ""), (Base,), {"write": lambda self, y: write(self, y)})
    return cls().double().train()


# --- single process ---------------------------------------------------------------------------------------


def test_the_trace_makes_each_write_a_value_the_next_layer_reads() -> None:
    from cost_models.ir.tracing import symbolic_trace

    x = torch.randn(SHAPE, dtype=torch.float64)
    for name in WRITES:
        model = _model(name)
        traced = symbolic_trace(model, ())
        conv2 = next(node for node in traced.graph.nodes if node.target == "conv2")
        assert conv2.args[0].name.startswith("write_into"), name
        torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0, msg=name)


def test_a_write_that_may_index_the_samples_runs_whole_under_a_sample_split() -> None:
    from cost_models.ir.tracing import trace

    for name, whole in (("some samples", True), ("index_put_", True), ("slice mul_", False)):
        graph = trace(_model(name), SHAPE, torch.float64)
        plan = uniform_test_plan(graph, 2, ["n2"])
        assert (plan.layers["write_into"].layout.n == 1) is whole, name


def test_a_write_nobody_reads_through_an_alias_is_left_as_traced() -> None:
    from cost_models.ir.tracing import symbolic_trace

    class Fresh(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            noise = torch.zeros_like(x).add_(1)  # the new value flows through the write's result
            return F.relu(x, inplace=True) * noise

    targets = [str(node.target) for node in symbolic_trace(Fresh(), ()).graph.nodes]
    assert "add_" in targets and not any("write_into" in target for target in targets)


# --- two ranks --------------------------------------------------------------------------------------------


def _single(name: str, layout: str) -> str:
    from cost_models.ir.tracing import trace

    graph = trace(_model(name), SHAPE, torch.float64)
    plan = uniform_test_plan(graph, 2, [layout])
    split_step_matches(lambda: _model(name), plan, graph, SHAPE, f"{name} under {layout}")
    written = plan.layers.get("write_into")
    return str(written.layout) if written is not None else "no write traced"


def _pipeline(name: str) -> None:
    """Two stages cut right after the write, one micro-batch (a write that indexes samples is another model on
    fewer of them)."""
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan
    from runtime.pipeline.schedules import one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    graph = trace(_model(name), SHAPE, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=1, devices_per_node=1, memory_bytes=2**34, intra=link, inter=link)
    plan = staged(uniform_plan(graph, cluster, [Layout()]), graph, ["conv2"], "sync", 1)
    stage = apply_pipeline(_model(name), plan)
    stage.keep_outputs = True
    reference = _model(name)
    generator = torch.Generator().manual_seed(3)
    x, target = torch.randn(SHAPE, dtype=torch.float64, generator=generator), torch.tensor([1, 4])

    def data(b: int) -> tuple[Any, Any]:
        return (x if stage.first else None, target if stage.last else None)

    events = [e for e in one_f_one_b(2, stage.index, 1) if e.kind != "U"]
    stage.run(events, torch.optim.SGD(stage.parameters(), lr=0.0), data, last_backward=0)
    out = reference(x)
    F.cross_entropy(out, target).backward()
    if stage.last:
        torch.testing.assert_close(stage.outputs[0], out.detach(), msg=lambda m: f"{name} pipeline: {m}")
    grads = dict(reference.named_parameters())
    for param in stage.parameters():
        key = next(n for n, p in stage.model.model.named_parameters() if p is param)
        torch.testing.assert_close(param.grad, grads[key].grad, msg=lambda m: f"{name} pipeline {key}: {m}")


def _cases(rank: int, world: int, layouts: Sequence[str]) -> dict[str, str]:
    results = {}
    for name in WRITES:
        for layout in layouts:
            results[f"{name} {layout}"] = _single(name, layout)
        _pipeline(name)
    return results


@pytest.mark.multirank
def test_writes_into_views_equal_the_unsplit_model_under_splits_and_a_cut_after_the_write() -> None:
    results = run_ranks(_cases, 2, (["n2", "h2", "c2"],), timeout_s=600)[0]
    assert results["slice mul_ n2"].startswith("n2") and results["some samples n2"] in ("n1", "")
