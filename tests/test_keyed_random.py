"""Keyed random layers (``runtime.random_ops``): every rank, and the unsplit reference, draw the same masks.

Single process: the hash is the same bits in torch int64 as in Python
integers; a box's draws are the whole tensor's draws at the box (also with
a micro-batch's sample offset); channel-wise and per-sample masks are whole
channels and whole samples; dropout keeps ``1 − p`` of the elements; keys
change the masks; evaluation mode draws nothing.

Multi-rank (gloo, float64, exact): a small model with ``nn.Dropout`` (on a
4-D activation and on features), ``nn.Dropout2d`` and torchvision's
``StochasticDepth(p, "row")`` all active, split by rows (``h2``), by samples
and rows (``n2·h2``, 4 ranks), and cut into a 2-stage pipeline (sync with 2
micro-batches: the second micro-batch's sample offset; stale: the recomputed
forward), equals the unsplit model run with the same keyed ops — output and
every gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from distributed import run_ranks
from torch import nn

from runtime.random_ops import DrawKey, KeyedInterpreter, mix, mix_int, random_ops, uniform

SHAPE = (4, 3, 12, 10)
SEED = 11


class RandomNet(nn.Module):
    """Convolutions with every kind of keyed random layer between them, split-able by rows."""

    def __init__(self) -> None:
        from torchvision.ops import StochasticDepth

        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.drop2d = nn.Dropout2d(0.4)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.depth = StochasticDepth(0.5, "row")
        self.drop = nn.Dropout(0.3)
        self.conv3 = nn.Conv2d(8, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.features_drop = nn.Dropout(0.5)
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop2d(torch.relu(self.conv1(x)))
        x = x + self.depth(self.conv2(x))
        x = self.conv3(self.drop(torch.relu(x)))
        return self.fc(self.features_drop(torch.flatten(self.pool(x), 1)))


def _model() -> RandomNet:
    torch.manual_seed(0)
    return RandomNet().double().train()


def _keyed(model: nn.Module, key: DrawKey) -> Any:
    from cost_models.ir.tracing import symbolic_trace

    return KeyedInterpreter(symbolic_trace(model, ()), key, root=model)


# --- single process ---------------------------------------------------------------------------------------


def test_the_hash_is_the_same_bits_in_torch_and_in_python() -> None:
    values = [0, 1, 12345, 2**62 + 7, -(2**63), 2**63 - 1, -1]
    mixed = mix(torch.tensor(values, dtype=torch.int64))
    assert [int(v) & (2**64 - 1) for v in mixed] == [mix_int(v) for v in values]


def test_a_box_draws_what_the_whole_tensor_draws_there() -> None:
    key, shape = DrawKey(3, 5), (4, 6, 8, 10)
    whole = uniform(key, "layer", tuple((0, e) for e in shape), shape)
    box = ((1, 3), (2, 5), (3, 8), (0, 10))
    assert torch.equal(uniform(key, "layer", box, shape), whole[1:3, 2:5, 3:8, :])
    later = DrawKey(3, 5, first_sample=2)  # a micro-batch starting at global sample 2
    assert torch.equal(uniform(later, "layer", ((0, 2), (0, 6), (0, 8), (0, 10)), shape), whole[2:4])
    channels = uniform(key, "layer", box, shape, "channel")
    assert channels.shape == (2, 3, 1, 1)
    assert torch.equal(channels, uniform(key, "layer", tuple((0, e) for e in shape), shape, "channel")[1:3, 2:5])
    assert 0.45 < float(whole.mean()) < 0.55 and float(whole.min()) >= 0.0 and float(whole.max()) < 1.0


def test_keys_layers_and_steps_give_other_draws() -> None:
    shape = (2, 3, 4, 4)
    box = tuple((0, e) for e in shape)
    first = uniform(DrawKey(0, 0), "a", box, shape)
    for other in (uniform(DrawKey(1, 0), "a", box, shape), uniform(DrawKey(0, 1), "a", box, shape),
                  uniform(DrawKey(0, 0), "b", box, shape)):
        assert not torch.equal(first, other)
    assert torch.equal(first, uniform(DrawKey(0, 0), "a", box, shape))


def test_masks_are_whole_channels_and_whole_samples_and_keep_one_minus_p() -> None:
    from torchvision.ops import StochasticDepth

    class Three(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.channel, self.row, self.element = nn.Dropout2d(0.5), StochasticDepth(0.5, "row"), nn.Dropout(0.25)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.channel(x), self.row(x), self.element(x)

    model = Three().train()
    x = torch.ones(64, 16, 6, 6, dtype=torch.float64)
    channel, row, element = _keyed(model, DrawKey(SEED, 0)).run(x)
    per_channel = channel.amax(dim=(2, 3))
    assert torch.equal(channel, per_channel[:, :, None, None].expand_as(channel))  # all or nothing per channel
    assert set(per_channel.unique().tolist()) == {0.0, 2.0}
    per_sample = row.amax(dim=(1, 2, 3))
    assert torch.equal(row, per_sample[:, None, None, None].expand_as(row))
    assert 0.35 < float((per_sample == 0).double().mean()) < 0.65
    assert set(element.unique().tolist()) == {0.0, 4.0 / 3.0}
    assert 0.23 < float((element == 0).double().mean()) < 0.27
    assert {str(op) for op in random_ops(list(_keyed(model, DrawKey(0, 0)).module.graph.nodes), model).values()} == {
        "channel (dropout2d)", "stochastic_depth (stochastic_depth)", "element (dropout)"}


def test_evaluation_mode_draws_nothing() -> None:
    model = _model()
    x = torch.randn(SHAPE, dtype=torch.float64)
    trained = _keyed(model, DrawKey(SEED, 0)).run(x)
    model.eval()
    assert torch.equal(_keyed(model, DrawKey(SEED, 0)).run(x), model(x))
    assert not torch.allclose(trained, model(x))


# --- several ranks ----------------------------------------------------------------------------------------


def _plan(model: nn.Module, size: int, layouts: Sequence[str], starts: Sequence[str] = (), schedule: str = "sync",
          micro: int = 1) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan

    graph = trace(model, SHAPE, torch.float64)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=size, devices_per_node=size, memory_bytes=2**34, intra=link, inter=link)
    plan = uniform_plan(graph, cluster, [*(Layout.parse(text) for text in layouts), Layout()])
    if starts:
        plan = staged(plan, graph, starts, schedule, micro, [0, 0] if schedule == "stale" else None)
    return plan, graph


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return (torch.randn(SHAPE, dtype=torch.float64, generator=generator),
            torch.randint(0, 5, (SHAPE[0],), generator=generator))


def _reference(micro: int, key_of: Any) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The unsplit model's outputs per micro-batch and its accumulated gradients, drawing by ``key_of(b)``."""
    reference = _model()
    x, target = _batch()
    size = SHAPE[0] // micro
    outputs = []
    for b in range(micro):
        out = _keyed(reference, key_of(b)).run(x[b * size:(b + 1) * size])
        (nn.functional.cross_entropy(out, target[b * size:(b + 1) * size]) / micro).backward()
        outputs.append(out.detach())
    return outputs, {name: p.grad for name, p in reference.named_parameters()}


def _single_stage(rank: int, world: int, layouts: Sequence[str]) -> dict[str, str]:
    from runtime.apply import apply_plan

    plan, graph = _plan(_model(), world, layouts)
    split = apply_plan(_model(), plan, graph=graph, random_seed=SEED)
    split.draw_key = DrawKey(SEED, 3)
    x, target = _batch()
    out = split(split.shard(x))
    split.loss(out, target[split.target_box(tuple(target.shape))]).backward()
    (expected,), grads = _reference(1, lambda b: DrawKey(SEED, 3))
    box = split.output_placement.box((*expected.shape, 1, 1), split.member)
    torch.testing.assert_close(out, expected[tuple(slice(a, b) for a, b in box)[:2]])
    sliced = {piece.name: piece for piece in split.slices}
    for name, param in split.model.named_parameters():
        full = grads[name] if name not in sliced else grads[name].narrow(
            sliced[name].dim, sliced[name].start, sliced[name].stop - sliced[name].start)
        torch.testing.assert_close(param.grad, full, msg=lambda m: f"{layouts} rank {rank} grad of {name}: {m}")
    return {name: str(plan.layers[name].layout) for name in ("drop2d", "stochastic_depth", "drop", "features_drop")}


def _pipeline(rank: int, world: int, schedule: str, micro: int) -> int:
    from runtime.pipeline.schedules import dsp, one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    plan, graph = _plan(_model(), 1, [], ["conv2"], schedule, micro)
    stage = apply_pipeline(_model(), plan, random_seed=SEED)
    stage.keep_outputs = True
    x, target = _batch()
    size = SHAPE[0] // micro

    def data(b: int) -> tuple[Any, Any]:
        return (x[b * size:(b + 1) * size] if stage.first else None,
                target[b * size:(b + 1) * size] if stage.last else None)

    events = dsp(1, 0) if schedule == "stale" else one_f_one_b(2, stage.index, micro)
    keys = (lambda b: DrawKey(SEED, 2, b * size))
    stage.run([e for e in events if e.kind != "U"], torch.optim.SGD(stage.parameters(), lr=0.0), data,
              last_backward=micro - 1, keys=keys)
    outputs, grads = _reference(micro, keys)
    for b in range(micro) if stage.last else ():
        torch.testing.assert_close(stage.outputs[b], outputs[b], msg=lambda m: f"{schedule} output {b}: {m}")
    for param in stage.parameters():
        name = next(n for n, p in stage.model.model.named_parameters() if p is param)
        torch.testing.assert_close(param.grad, grads[name], msg=lambda m: f"{schedule} stage {stage.index} {name}: {m}")
    return len(stage.parameters())


def _cases(rank: int, world: int, cases: dict[str, tuple[str, tuple[Any, ...]]]) -> dict[str, Any]:
    return {name: globals()[function](rank, world, *args) for name, (function, args) in cases.items()}


@pytest.mark.multirank
def test_rows_and_a_pipeline_on_two_ranks_equal_the_unsplit_model_with_the_same_masks() -> None:
    results = run_ranks(_cases, 2, ({"h2": ("_single_stage", (["h2"],)), "sync": ("_pipeline", ("sync", 2)),
                                     "stale": ("_pipeline", ("stale", 1))},), timeout_s=300)
    layouts = results[0]["h2"]
    assert layouts["drop2d"] == "h2" and layouts["stochastic_depth"] == "h2" and layouts["drop"] == "h2"
    for schedule in ("sync", "stale"):
        assert sum(result[schedule] for result in results) == len(list(_model().parameters()))


@pytest.mark.multirank
def test_samples_and_rows_on_four_ranks_equal_the_unsplit_model_with_the_same_masks() -> None:
    results = run_ranks(_cases, 4, ({"n2·h2": ("_single_stage", (["n2·h2", "n2"],))},), timeout_s=300)
    assert results[0]["n2·h2"]["stochastic_depth"] == "n2·h2" and results[0]["n2·h2"]["drop2d"] == "n2·h2"
