"""Pipeline stages on CPU ranks (gloo) against the unsplit model: sync schedules, stale ones, cuts, events.

Each case cuts a real model (resnet18 or the example UNet) into stages with
``cost_models.uniform.staged`` and trains it a few steps with ``runtime.pipeline.stage``
next to an unsplit copy on every rank. The unsplit reference of a ``sync``
iteration with ``M`` micro-batches accumulates the gradients of the same ``M``
micro-batches (loss / M each) and then steps: that is GPipe's definition,
and with batch-norm it differs from one pass over the whole batch only
through the per-micro-batch statistics. float64 throughout, so that
``assert_close``'s default tolerance holds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
from distributed import run_ranks
from runtime_check import _prepared

pytestmark = pytest.mark.multirank

def _cases(rank: int, world: int, cases: dict[str, tuple[str, tuple[Any, ...]]]) -> dict[str, Any]:
    """Run several cases in one set of ranks (spawning costs more than a case); a failed case gives its traceback."""
    import traceback

    found: dict[str, Any] = {}
    for name, (function, args) in cases.items():
        try:
            found[name] = globals()[function](rank, world, *args)
        except Exception:  # reported by the test of this case, the others still run
            found[name] = "FAILED\n" + traceback.format_exc()
    return found


def _result(results: list[dict[str, Any]], case: str) -> list[Any]:
    """Each rank's result of ``case``, failing the test with the first traceback."""
    for rank, result in enumerate(results):
        value = result[case]
        assert not (isinstance(value, str) and value.startswith("FAILED")), f"rank {rank}, {case}: {value}"
    return [result[case] for result in results]


RESNET = ("resnet18", (4, 3, 32, 32))  # 2-sample micro-batches keep batch-norm defined at 1×1
UNET = ("unet", (4, 3, 32, 24))


def _plan(model: Any, shape: tuple[int, ...], size: int, layouts: Sequence[str], starts: Sequence[str],
          schedule: str, micro: int, staleness: Sequence[int] | None = None) -> tuple[Any, Any]:
    import torch

    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan

    graph = trace(model, shape, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=size, devices_per_node=size, memory_bytes=2**34, intra=link, inter=link)
    plan = uniform_plan(graph, cluster, [*(Layout.parse(text) for text in layouts), Layout()])
    return staged(plan, graph, starts, schedule, micro, staleness), graph


def _unequal_plan(model: Any, shape: tuple[int, ...], devices: Sequence[int], layouts: Sequence[str],
                  starts: Sequence[str], schedule: str, micro: int,
                  staleness: Sequence[int] | None = None) -> tuple[Any, Any]:
    """Stages of ``devices[k]`` ranks each, stage ``k``'s layers in ``layouts[k]`` where it applies (else whole)."""
    from dataclasses import replace

    import torch

    from cost_models.cluster import Cluster, Link
    from cost_models.formats.plan import LayerAssignment
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan

    graph = trace(model, shape, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=sum(devices), devices_per_node=sum(devices), memory_bytes=2**34, intra=link, inter=link)
    cut = staged(uniform_plan(graph, replace(cluster, devices=1, devices_per_node=1), [Layout()]), graph, starts,
                 schedule, micro, staleness)
    per_stage = [uniform_plan(graph, replace(cluster, devices=d, devices_per_node=d), [Layout.parse(text), Layout()])
                 for d, text in zip(devices, layouts)]
    layers = {name: LayerAssignment(per_stage[a.stage].layers[name].layout, a.stage) for name, a in cut.layers.items()}
    return replace(cut, cluster=cluster, layers=layers,
                   pipeline=replace(cut.pipeline, devices_per_stage=tuple(devices))), graph


def _micro(x: Any, target: Any, micro: int, batch: int) -> tuple[Any, Any]:
    size = x.shape[0] // micro
    return x[batch * size:(batch + 1) * size], target[batch * size:(batch + 1) * size]


def _data(stage: Any, x: Any, target: Any, micro: int) -> Any:
    def load(batch: int) -> tuple[Any, Any]:
        xm, tm = _micro(x, target, micro, batch)
        return (xm[stage.input_box()] if stage.first else None,
                tm[stage.target_box(tuple(tm.shape))] if stage.last else None)
    return load


def _setup(model_name: str, shape: tuple[int, ...], seed: int = 7) -> tuple[Any, Any, Any]:
    import torch
    from conftest import build_model

    torch.set_default_dtype(torch.float64)
    base = _prepared(build_model(model_name).double())
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        out = copy.deepcopy(base)(x)
    target = torch.randint(0, out.shape[1], (out.shape[0], *out.shape[2:]), generator=generator)
    return base, x, target


def _reference_step(reference: Any, optimizer: Any, x: Any, target: Any, micro: int) -> tuple[list[Any], list[Any]]:
    import torch

    outputs, grads = [], []
    for batch in range(micro):
        xm, tm = _micro(x, target, micro, batch)
        out = reference(xm)
        (torch.nn.functional.cross_entropy(out, tm) / micro).backward()
        outputs.append(out.detach())
    grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return outputs, grads


def _own(stage: Any) -> dict[str, tuple[Any, Any]]:
    """This rank's trained parameters by name, with how to cut the unsplit one to compare."""
    sliced = {piece.name: piece for piece in stage.model.slices}
    mine = {id(p) for p in stage.parameters()}
    return {name: (param, sliced.get(name)) for name, param in stage.model.model.named_parameters() if id(param) in mine}


def _cut(full: Any, piece: Any) -> Any:
    return full if piece is None else full.narrow(piece.dim, piece.start, piece.stop - piece.start)


def _sync_case(rank: int, world: int, model_name: str, shape: tuple[int, ...], layouts: Sequence[str],
               starts: Sequence[str], micro: int, order: str, steps: int,
               devices: Sequence[int] = (), recompute: Sequence[bool] = ()) -> dict[str, Any]:
    """``devices``: unequal stages, ``layouts[k]`` stage ``k``'s (default: equal stages, ``layouts`` everywhere);
    ``recompute``: the stages that keep only their inputs and recompute their forward before each backward."""
    from dataclasses import replace

    import torch

    from runtime.pipeline.schedules import gpipe, one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    base, x, target = _setup(model_name, shape)
    stages = len(starts) + 1
    plan, graph = (_unequal_plan(base, shape, devices, layouts, starts, "sync", micro) if devices
                   else _plan(base, shape, world // stages, layouts, starts, "sync", micro))
    plan = replace(plan, pipeline=replace(plan.pipeline, recompute=tuple(recompute)))
    reference = copy.deepcopy(base)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    stage = apply_pipeline(copy.deepcopy(base), plan, sync_batchnorm=True, graph=graph)
    stage.keep_outputs = True
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.1)
    events = gpipe(micro) if order == "gpipe" else one_f_one_b(stages, stage.index, micro)
    where = f"{model_name} stage {stage.index} rank {rank} ({plan.summary()}, {order})"
    for step in range(steps):
        expected_out, expected_grads = _reference_step(reference, ref_optimizer, x, target, micro)
        stage.run(events[:-1], optimizer, _data(stage, x, target, micro), last_backward=micro - 1)
        for batch in range(micro) if stage.last else ():
            box = tuple(slice(a, b) for a, b in stage.model.output_placement.box(
                tuple(expected_out[batch].shape) + (1, 1) * (expected_out[batch].dim() == 2), stage.member))
            torch.testing.assert_close(stage.outputs[batch], expected_out[batch][box[:expected_out[batch].dim()]],
                                       msg=lambda m: f"{where} step {step} output {batch}: {m}")
        for name, (param, piece) in _own(stage).items():
            torch.testing.assert_close(param.grad, _cut(expected_grads[name], piece),
                                       msg=lambda m: f"{where} step {step} grad of {name}: {m}")
        stage.run(events[-1:], optimizer, _data(stage, x, target, micro))
    expected_params = dict(reference.named_parameters())
    for name, (param, piece) in _own(stage).items():
        torch.testing.assert_close(param.detach(), _cut(expected_params[name].detach(), piece),
                                   msg=lambda m: f"{where} weight {name} after {steps} steps: {m}")
    return {"stage": stage.index, "parameters": len(_own(stage)), "receives": [c.name for c in stage.cut.receives],
            "recomputes": stage.recompute}


RESNET_CUTS = {2: ["layer2_0_conv1"], 4: ["layer1_0_bn1", "layer2_1_conv1", "layer4_0_conv1"]}
UNET_CUTS = {2: ["downs_1_0"], 4: ["downs_0_0", "downs_2_0", "ups_0_conv_0"]}


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_cases, 2, ({
        "resnet18/2": ("_sync_case", (*RESNET, [], RESNET_CUTS[2], 2, "1f1b", 2)),
        "unet/2": ("_sync_case", (*UNET, [], UNET_CUTS[2], 2, "gpipe", 2)),
        "resnet18/2 recompute": ("_sync_case", (*RESNET, ["h2"], [], 2, "1f1b", 1, (), (True,))),  # one step: BN of
        # two samples at 1×1 amplifies float64 rounding over further steps
        "unet/2 recompute 0": ("_sync_case", (*UNET, [], UNET_CUTS[2], 2, "1f1b", 2, (), (True, False))),
    },), timeout_s=300)


@pytest.fixture(scope="module")
def four_ranks() -> list[dict[str, Any]]:
    return run_ranks(_cases, 4, ({
        "resnet18/4": ("_sync_case", (*RESNET, [], RESNET_CUTS[4], 2, "1f1b", 2)),
        "unet/4": ("_sync_case", (*UNET, [], UNET_CUTS[4], 2, "gpipe", 2)),
        "resnet18/2x2": ("_sync_case", (*RESNET, ["h2"], RESNET_CUTS[2], 2, "1f1b", 1)),
        "unet/1+3": ("_sync_case", (*UNET, ["n1", "w3"], UNET_CUTS[2], 2, "gpipe", 1, (1, 3))),
        "unet/3+1": ("_sync_case", (*UNET, ["w3", "n1"], UNET_CUTS[2], 2, "1f1b", 1, (3, 1))),
    },), timeout_s=500)


@pytest.mark.parametrize("stages", [2, 4])
def test_sync_resnet18_equals_unsplit(stages: int, two_ranks: Any, four_ranks: Any) -> None:
    """1F1B with 2 micro-batches, two steps: outputs, gradients and weights as the unsplit model's."""
    results = _result(two_ranks if stages == 2 else four_ranks, f"resnet18/{stages}")
    assert sorted(r["stage"] for r in results) == list(range(stages))
    assert sum(r["parameters"] for r in results) == 62  # every parameter of resnet18 trained on one stage
    if stages == 4:
        assert results[1]["receives"] == ["maxpool", "layer1_0_conv1"]  # the residual crosses the cut


@pytest.mark.parametrize("stages", [2, 4])
def test_sync_unet_equals_unsplit(stages: int, two_ranks: Any, four_ranks: Any) -> None:
    """GPipe order with 2 micro-batches: the skip connections cross every cut after them."""
    results = _result(two_ranks if stages == 2 else four_ranks, f"unet/{stages}")
    assert any(len(r["receives"]) > 1 for r in results[1:])


def test_sync_stages_split_inside(four_ranks: Any) -> None:
    """Two stages of two ranks each, split into rows inside: crossings move tiles, each stage redistributes."""
    results = _result(four_ranks, "resnet18/2x2")
    assert [r["stage"] for r in results] == [0, 0, 1, 1]

def _stale_case(rank: int, world: int, model_name: str, shape: tuple[int, ...], starts: Sequence[str],
                steps: int, devices: Sequence[int] = (), layouts: Sequence[str] = ()) -> dict[str, Any]:
    """The same steps under sync (M = 1) and under stale with staleness forced to 0: the same weights.

    ``devices``: unequal stages, ``layouts[k]`` stage ``k``'s (default: one rank a stage)."""
    import torch

    from runtime.pipeline.schedules import dsp, one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    base, x, target = _setup(model_name, shape)
    data = [_setup(model_name, shape, seed)[1:] for seed in range(steps)]
    stages = len(starts) + 1
    weights = {}
    for schedule in ("sync", "stale"):
        plan, graph = (_unequal_plan(base, shape, devices, layouts, starts, schedule, 1, (0,) * stages) if devices
                       else _plan(base, shape, 1, [], starts, schedule, 1, (0,) * stages))
        stage = apply_pipeline(copy.deepcopy(base), plan, graph=graph)
        optimizer = torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)

        def load(batch: int, stage: Any = stage) -> tuple[Any, Any]:
            return _data(stage, *data[batch], 1)(0)

        if schedule == "sync":
            for step in range(steps):
                stage.run(one_f_one_b(stages, stage.index, 1), optimizer, lambda _b, s=step: load(s))
        else:
            stage.run(dsp(steps, 0), optimizer, load)
        weights[schedule] = {name: param.detach().clone() for name, (param, _) in _own(stage).items()}
        buffers = {name: b.clone() for name, b in stage.model.model.named_buffers()}
        weights[schedule + "/buffers"] = buffers
    for name, value in weights["sync"].items():
        torch.testing.assert_close(weights["stale"][name], value, rtol=0, atol=0,
                                   msg=lambda m: f"stage {rank} {name} after {steps} steps: {m}")
    for name, value in weights["sync/buffers"].items():
        torch.testing.assert_close(weights["stale/buffers"][name], value, rtol=0, atol=0,
                                   msg=lambda m: f"stage {rank} buffer {name}: {m}")
    return len(weights["sync"])


@pytest.fixture(scope="module")
def three_ranks() -> list[dict[str, Any]]:
    cuts = ["layer1_1_conv1", "layer3_0_conv1"]
    return run_ranks(_cases, 3, ({"stale0": ("_stale_case", (*RESNET, cuts, 3)),
                                  "timeline": ("_timeline_case", (*RESNET, cuts, 6)),
                                  "resnet18/1+2": ("_sync_case", (*RESNET, ["n1", "h2"], RESNET_CUTS[2], 2, "1f1b", 1,
                                                                  (1, 2))),
                                  "unet/1+2 stale0": ("_stale_case", (*UNET, UNET_CUTS[2], 2, (1, 2), ("n1", "w2")))},),
                     timeout_s=400)


def test_stale_with_staleness_zero_equals_sync(three_ranks: Any) -> None:
    """Recomputing from the stashed input with unchanged weights gives sync's weights exactly."""
    counts = _result(three_ranks, "stale0")
    assert sum(counts) == 62


K3_TIMELINE = {  # DSP on 3 stages, 6 batches: one forward per tick, then the backward that has arrived
    0: "F0 F1 F2 F3 F4 B0 U F5 B1 U B2 U B3 U B4 U B5 U",
    1: "F0 F1 F2 B0 U F3 B1 U F4 B2 U F5 B3 U B4 U B5 U",
    2: "F0 B0 U F1 B1 U F2 B2 U F3 B3 U F4 B4 U F5 B5 U",
}


def test_dsp_timeline_by_hand() -> None:
    """The schedule generator's K = 3 lists, and their staleness 4, 2, 0 once the pipeline is full."""
    from runtime.pipeline.schedules import dsp, staleness_of

    for stage, expected in K3_TIMELINE.items():
        events = dsp(6, 2 * (2 - stage))
        assert " ".join(map(str, events)) == expected
        assert max(staleness_of(events).values()) == 2 * (2 - stage)


def _timeline_case(rank: int, world: int, model_name: str, shape: tuple[int, ...], starts: Sequence[str],
                   batches: int) -> dict[str, Any]:
    import torch

    from runtime.pipeline.schedules import dsp, staleness_of
    from runtime.pipeline.stage import apply_pipeline

    base, x, target = _setup(model_name, shape)
    plan, graph = _plan(base, shape, 1, [], starts, "stale", 1)
    stage = apply_pipeline(copy.deepcopy(base), plan, graph=graph)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    load = _data(stage, x, target, 1)
    records = stage.run(dsp(batches, plan.pipeline.staleness[stage.index]), optimizer, lambda _batch: load(0))
    return {"events": " ".join(str(r.event) for r in records),
            "times": {str(r.event): (r.start_s, r.end_s) for r in records if r.event.kind != "U"},
            "staleness": max(staleness_of([r.event for r in records]).values()),
            "losses": [float(loss) for loss in stage.losses]}


def test_stale_runtime_follows_the_dsp_timeline(three_ranks: Any) -> None:
    """Three ranks run DSP: each executes the hand-written order, and the batches flow causally between them."""
    results = _result(three_ranks, "timeline")
    assert [r["events"] for r in results] == [K3_TIMELINE[k] for k in range(3)]
    assert [r["staleness"] for r in results] == [4, 2, 0]
    for k in range(2):
        for b in range(6):
            early, late = results[k]["times"], results[k + 1]["times"]
            assert late[f"F{b}"][1] > early[f"F{b}"][0]  # stage k+1's forward needs stage k's output
            assert early[f"B{b}"][1] > late[f"B{b}"][0]  # stage k's backward needs stage k+1's gradient
    assert len(results[2]["losses"]) == 6 and all(loss == loss for loss in results[2]["losses"])


@pytest.mark.parametrize("case, stages", [("resnet18/1+2", [0, 1, 1]), ("unet/1+3", [0, 1, 1, 1]),
                                          ("unet/3+1", [0, 0, 0, 1])])
def test_unequal_stages_equal_unsplit(case: str, stages: list[int], three_ranks: Any, four_ranks: Any) -> None:
    """Stages of 1 + 2, 1 + 3 and 3 + 1 ranks (1F1B and GPipe, 2 micro-batches): a crossing moves between a whole
    value on one rank and tiles or copies on several; outputs, gradients and weights as the unsplit model's."""
    results = _result(three_ranks if len(stages) == 3 else four_ranks, case)
    assert [r["stage"] for r in results] == stages


def test_unequal_stale_with_staleness_zero_equals_sync(three_ranks: Any) -> None:
    """The stale schedule on stages of 1 + 2 ranks (columns split on the second) with staleness 0 is sync's."""
    assert len(_result(three_ranks, "unet/1+2 stale0")) == 3


@pytest.mark.parametrize("case, recomputes", [("resnet18/2 recompute", [True, True]),
                                              ("unet/2 recompute 0", [True, False])])
def test_recomputing_stages_equal_unsplit(case: str, recomputes: list[bool], two_ranks: Any) -> None:
    """A stage that keeps only its inputs and recomputes its forward before each backward (activation
    checkpointing of the stage; 2 micro-batches, two steps, batch-norm counted once): outputs, gradients and
    weights as the unsplit model's — one stage of two ranks split into rows, and the first of two stages."""
    results = _result(two_ranks, case)
    assert [r["recomputes"] for r in results] == recomputes
