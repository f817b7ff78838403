"""A model taking two tensors (``examples/conditioned_cnn.py``: ``forward(x, cond)``) on two gloo ranks.

In float64 against the unsplit model — output and every parameter gradient at
``assert_close``'s default tolerance: split by sample (``n2``: the condition
split with its samples), by height (``h2``: the condition's linear layer
whole, its per-channel bias broadcast onto the tiles), and cut into two
pipeline stages with the condition read only by the second (it crosses the
cut from stage 0, which loads every input). Then the same model from the
command line: ``parplan plan`` and ``parplan run --layout h2 --verify``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from distributed import run_ranks
from runtime_check import assert_split_matches

pytestmark = pytest.mark.multirank

SHAPES = ((4, 3, 16, 12), (4, 8))
MODEL = ["--model", "examples/conditioned_cnn.py:conditioned_cnn", "--input-shape", "4,3,16,12",
         "--input-shape", "4,8"]


def _setup() -> tuple[Any, Any, tuple[Any, ...], Any]:
    """The model (float64, seeded), its graph, a batch of both inputs and per-pixel labels."""
    import torch

    from cost_models.ir.tracing import trace
    from examples.conditioned_cnn import conditioned_cnn

    torch.manual_seed(0)
    model = conditioned_cnn().double()
    graph = trace(model, SHAPES, torch.float64)
    generator = torch.Generator().manual_seed(7)
    inputs = tuple(torch.randn(shape, dtype=torch.float64, generator=generator) for shape in SHAPES)
    target = torch.randint(0, 4, (SHAPES[0][0], *SHAPES[0][2:]), generator=generator)
    return model, graph, inputs, target


def _cluster(devices: int) -> Any:
    from cost_models.cluster import Cluster, Link

    link = Link(1e-6, 1e9)
    return Cluster(devices=devices, devices_per_node=devices, memory_bytes=2**34, intra=link, inter=link)


def _split_case(rank: int, world: int, layout: str) -> str:
    import torch

    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan
    from runtime.apply import apply_plan

    model, graph, inputs, target = _setup()
    plan = uniform_plan(graph, _cluster(world), [Layout.parse(layout), Layout()])
    reference = copy.deepcopy(model)
    expected = reference(*inputs)
    torch.nn.functional.cross_entropy(expected, target).backward()
    split = apply_plan(model, plan, graph=graph, sync_batchnorm=True)
    out = split(*split.shard_inputs(inputs))
    split.loss(out, target[split.target_box(tuple(target.shape))]).backward()
    assert_split_matches(split, reference, out, expected, f"{plan.summary()} on rank {rank}")
    return plan.summary()


def _pipeline_case(rank: int, world: int, micro: int) -> dict[str, Any]:
    """Two stages of one rank, cut before the condition's linear layer: ``cond`` crosses from stage 0."""
    import torch

    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan
    from runtime.pipeline.schedules import one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    model, graph, inputs, target = _setup()
    plan = staged(uniform_plan(graph, _cluster(1), [Layout()]), graph, ["lin"], "sync", micro)
    reference = copy.deepcopy(model)
    size = SHAPES[0][0] // micro
    pieces = [(tuple(t[b * size:(b + 1) * size] for t in inputs), target[b * size:(b + 1) * size])
              for b in range(micro)]
    expected = []
    for xs, labels in pieces:
        out = reference(*xs)
        (torch.nn.functional.cross_entropy(out, labels) / micro).backward()
        expected.append(out.detach())
    stage = apply_pipeline(model, plan, sync_batchnorm=True, graph=graph)
    stage.keep_outputs = True

    def data(batch: int) -> tuple[Any, Any]:
        xs, labels = pieces[batch]
        return (tuple(t[box] for t, box in zip(xs, stage.input_boxes())) if stage.first else None,
                labels[stage.target_box(tuple(labels.shape))] if stage.last else None)

    events = one_f_one_b(2, stage.index, micro)
    stage.run([e for e in events if e.kind != "U"], torch.optim.SGD(stage.parameters(), lr=0.0), data,
              last_backward=micro - 1)
    for batch in range(micro) if stage.last else ():
        torch.testing.assert_close(stage.outputs[batch], expected[batch], msg=lambda m: f"output {batch}: {m}")
    grads = dict(reference.named_parameters())
    mine = {id(p) for p in stage.parameters()}
    for name, param in stage.model.model.named_parameters():
        if id(param) in mine:
            torch.testing.assert_close(param.grad, grads[name].grad, msg=lambda m: f"stage {stage.index} {name}: {m}")
    return {"stage": stage.index, "receives": [c.name for c in stage.cut.receives],
            "parameters": sorted(n for n, p in stage.model.model.named_parameters() if id(p) in mine)}


def _cases(rank: int, world: int, cases: dict[str, tuple[str, tuple[Any, ...]]]) -> dict[str, Any]:
    """Every case in one set of ranks; a failed case gives its traceback (reported by its test)."""
    import traceback

    found: dict[str, Any] = {}
    for name, (function, args) in cases.items():
        try:
            found[name] = globals()[function](rank, world, *args)
        except Exception:
            found[name] = "FAILED\n" + traceback.format_exc()
    return found


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_cases, 2, ({"n2": ("_split_case", ("n2",)), "h2": ("_split_case", ("h2",)),
                                  "pipeline": ("_pipeline_case", (2,))},), timeout_s=300.0)


def _result(results: list[dict[str, Any]], case: str) -> list[Any]:
    for rank, result in enumerate(results):
        value = result[case]
        assert not (isinstance(value, str) and value.startswith("FAILED")), f"rank {rank}, {case}: {value}"
    return [result[case] for result in results]


@pytest.mark.parametrize("case", ["n2", "h2"])
def test_a_split_two_input_model_equals_the_unsplit_model(two_ranks: list[dict[str, Any]], case: str) -> None:
    summaries = _result(two_ranks, case)
    assert summaries[0] == summaries[1] and summaries[0].startswith(case)


def test_a_condition_read_on_the_second_stage_crosses_the_cut(two_ranks: list[dict[str, Any]]) -> None:
    first, second = _result(two_ranks, "pipeline")
    assert first["receives"] == [] and "cond" in second["receives"]
    assert "lin.weight" in second["parameters"] and first["parameters"] == ["conv1.bias", "conv1.weight"]


def _parplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(cwd), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "parplan", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_plan_and_run_two_inputs_from_the_command_line(repo: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    made = _parplan("plan", *MODEL, "--profile", "v100", "--devices", "2", "--out", str(plan), "--json", cwd=repo)
    assert made.returncode == 0, made.stderr
    assert json.loads(plan.read_text())["model"]["input_shapes"] == [list(s) for s in SHAPES]
    run = _parplan("run", *MODEL, "--layout", "h2", "--nproc", "2", "--steps", "1", "--warmup", "0", "--verify",
                   "--threads", "1", "--dtype", "float64", "--json", cwd=repo)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["model"]["input_shapes"] == [list(s) for s in SHAPES]
    assert document["plan"]["summary"].startswith("h2") and document["verify"]["passed"], document["verify"]
