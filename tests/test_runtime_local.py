"""Tiers 1–2 of the runtime: placements and moves by arithmetic, synthetic data boxes, apply_plan on one process."""

from __future__ import annotations

import copy
from itertools import product

import pytest
import torch
from conftest import build_model
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.cluster import Cluster, Link
from cost_models.errors import PlanError
from cost_models.formats.plan import LayerAssignment
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.uniform import uniform_plan
from runtime.apply import apply_plan
from runtime.batches import synthetic_input, synthetic_labels
from runtime.placement import Placement
from runtime.preflight import check_runnable
from runtime.redistribute import moves

LINK = Link(1e-6, 1e9)


def _cluster(devices: int) -> Cluster:
    return Cluster(devices=devices, devices_per_node=devices, memory_bytes=2**34, intra=LINK, inter=LINK)


def _layout(n: int, c: int, h: int, w: int) -> Layout:
    return Layout(n=n, c=c, h=h, w=w)


LAYOUTS = [_layout(*parts) for parts in product((1, 2), (1, 2), (1, 2, 3), (1, 2)) if _layout(*parts).ranks <= 6]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(["", "c", "hw"]),
       st.tuples(st.integers(2, 5), st.integers(2, 6), st.integers(3, 7), st.integers(2, 5)))
def test_moves_deliver_every_wanted_element_once(source: Layout, target: Layout, whole: str,
                                                 shape: tuple[int, int, int, int]) -> None:
    size = 12
    src, dst = Placement(source), Placement(target, whole)
    ranks = tuple(range(size))
    plans = [moves(shape, src, dst, ranks, q) for q in ranks]
    sent = sorted((q, peer, box) for q, (sends, _) in enumerate(plans) for peer, box in sends)
    received = sorted((peer, q, box) for q, (_, receives) in enumerate(plans) for peer, box in receives)
    assert sent == received  # every send has its receive, box for box
    for q, (_, receives) in enumerate(plans):
        wanted, held = dst.box(shape, q), src.box(shape, q)
        covered = torch.zeros([hi - lo for lo, hi in wanted], dtype=torch.int64)
        for box in [held, *(box for _, box in receives)]:
            piece = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, wanted)]
            if all(lo < hi for lo, hi in piece):
                covered[tuple(slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in zip(piece, wanted))] += 1
        assert bool((covered == 1).all()), f"member {q}: some wanted elements arrive {covered.max()} times or never"


def test_synthetic_boxes_are_boxes_of_the_whole_batch() -> None:
    shape = (3, 2, 5, 7)
    whole = synthetic_input(shape, [slice(None)] * 4, seed=4, dtype=torch.float64)
    box = (slice(1, 3), slice(0, 2), slice(2, 5), slice(3, 7))
    assert torch.equal(synthetic_input(shape, box, seed=4, dtype=torch.float64), whole[box])
    assert abs(float(whole.mean())) < 0.3 and 0.6 < float(whole.std()) < 1.4
    labels = synthetic_labels((3, 5, 7), [slice(None)] * 3, classes=4, seed=4)
    assert torch.equal(synthetic_labels((3, 5, 7), box[:1] + box[2:], classes=4, seed=4), labels[box[:1] + box[2:]])
    assert set(labels.unique().tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("model_name", ["resnet18", "unet"])
def test_an_unsplit_plan_on_one_process_is_the_model_itself(model_name: str) -> None:
    shape = (2, 3, 32, 32)
    model = build_model(model_name)
    graph = trace(model, shape)
    reference = copy.deepcopy(model)
    split = apply_plan(model, uniform_plan(graph, _cluster(1), [Layout()]), graph=graph)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    assert split.input_box() == (slice(0, 2), slice(0, 3), slice(0, 32), slice(0, 32))
    out, expected = split(split.shard(x)), reference(x)
    assert torch.equal(out, expected)  # the same modules on the same tensors: bit for bit
    target = torch.zeros(expected.shape[0], *expected.shape[2:], dtype=torch.long)
    split.loss(out, target[split.target_box(tuple(target.shape))]).backward()
    torch.nn.functional.cross_entropy(expected, target).backward()
    for (name, mine), (_, theirs) in zip(split.model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=0, msg=name)


def test_a_plan_for_another_model_is_refused_naming_both_fingerprints() -> None:
    graph = trace(build_model("resnet18"), (2, 3, 32, 32))
    plan = uniform_plan(graph, _cluster(1), [Layout()])
    with pytest.raises(PlanError, match=r"made for model fingerprint sha256:\w+.*traces to sha256:\w+"):
        apply_plan(build_model("unet"), plan)


def test_a_split_the_runtime_cannot_execute_is_refused_before_any_rank_starts() -> None:
    model = build_model("unet")
    graph = trace(model, (2, 3, 32, 32))
    plan = uniform_plan(graph, _cluster(2), [Layout(n=2)])
    layers = dict(plan.layers)
    layers["cat"] = LayerAssignment(Layout(c=2))  # concatenation along the split channel dimension
    broken = type(plan)(**{**plan.__dict__, "layers": layers})
    with pytest.raises(PlanError, match=r"'cat' \(cat, c2\): concatenation along a split dimension"):
        check_runnable(model, broken, graph)
