"""The short form of the model-coverage suite (tier 4): thirteen varied models through ``parplan check``'s checks.

Each model, at batch 4 and a 64×64 input: trace, plan on 2 devices
(``parplan plan``'s default search, for float32), ``--verify`` of that plan,
``--verify`` under n2 and h2 — on one pool of ranks shared by the module
(``runtime.rank_pool``). The verify runs compute in float64 (tolerance 1e-9):
the split must equal the unsplit model. Not 32×32: there the last maps are
1×1 and batch-norm normalises 4 values per channel, which amplifies rounding
so much that two summation orders of the unsplit model itself disagree
(resnet18's float32 gradients by 20%, regnet_x_400mf's float64 ones by 2e-8).
No check may fail; a refusal must be one line. The full suite is
``benchmarks/model_zoo.py`` (``docs/model-coverage.md``, float32 as a user
runs it).

Models that fail today because of an open defect are marked
``xfail(strict=True)`` naming it: when the defect is fixed the test says so
(XPASS fails), and the mark is removed.

The harness itself is tested too: a rank that dies, a rank that hangs and a
rank whose model differs each end as ``fail`` with their reason, and the pool
recovers for the next task; the command's JSON and exit codes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.model_zoo import spec_of
from cost_models.layout import Layout
from parplan.cli.check import CheckRequest, check_model
from runtime.rank_pool import RankPools

pytestmark = pytest.mark.multirank

HERE = Path(__file__).resolve()
CHECKS = ["trace", "plan 2", "verify plan 2", "verify n2", "verify h2"]
LAYOUTS = (Layout.parse("n2"), Layout.parse("h2"))

KNOWN: dict[str, str] = {}
"""Open defects by model id: the reason of each strict xfail (empty when every model passes)."""

MODELS = [
    ("resnet18", "torchvision:resnet18"),
    ("mobilenet_v3_small", "torchvision:mobilenet_v3_small"),
    ("efficientnet_b0", "torchvision:efficientnet_b0"),
    ("convnext_tiny", "torchvision:convnext_tiny"),
    ("regnet_x_400mf", "torchvision:regnet_x_400mf"),
    ("shufflenet_v2_x0_5", "torchvision:shufflenet_v2_x0_5"),
    ("googlenet", "torchvision:googlenet"),
    ("monai-UNet", spec_of("monai__UNet")),
    ("timm-vit_tiny", spec_of("timm__vit_tiny_patch16_224__64")),
    ("torchvision-vit_tiny", f"{HERE.parents[1] / 'examples' / 'vit.py'}:vit_tiny"),  # nn.MultiheadAttention
    ("smp-FPN", spec_of("smp__fpn")),  # as built by default; its forward checks the input's shape (issue 53)
    ("hf-Segformer", spec_of("hf__Segformer")),  # transformers v5: a decorated forward, attention, a decode head
    ("diffusers-UNet2DModel", spec_of("diffusers__UNet2DModel")),  # two inputs (a timestep per sample)
]

INPUTS: dict[str, dict[str, object]] = {
    "diffusers-UNet2DModel": {"input_shapes": ((4, 3, 64, 64), (4,)), "output": "sample"},
}
"""What a model takes besides the one batch of ``4×3×64×64``: its inputs, the part of its output trained on."""


@pytest.fixture(scope="module")
def pools():  # noqa: ANN201 - a RankPools; torch is imported by the harness
    with RankPools(preload=("timm", "monai.networks.nets", "segmentation_models_pytorch", "transformers",
                            "diffusers")) as shared:
        yield shared


def _param(model_id: str, spec: str) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN[model_id])] if model_id in KNOWN else []
    return pytest.param(spec, INPUTS.get(model_id, {}), id=model_id, marks=marks)


@pytest.mark.parametrize(("spec", "inputs"), [_param(*model) for model in MODELS])
def test_a_zoo_model_plans_and_verifies(spec: str, inputs: dict[str, Any], pools: RankPools) -> None:
    request = CheckRequest(spec, (4, 3, 64, 64), devices=(2,), layouts=LAYOUTS, timeout_s=120, verify_dtype="float64",
                           **inputs)
    report = check_model(request, pools)
    results = {check.name: check for check in report.checks}
    failed = [f"{check.name}: {check.reason}" for check in report.checks if check.result == "fail"]
    assert not failed, "; ".join(failed)
    assert list(results) == CHECKS, f"checks not run: {sorted(set(CHECKS) - set(results))}"
    for check in report.checks:
        assert check.result in ("pass", "refused")
        assert check.reason and "\n" not in check.reason, f"{check.name}: the reason must be one line"
    assert results["verify n2"].result == "pass"  # a sample split runs every layer
    assert results["verify h2"].detail["split"] > 0  # some layer is split by rows, or the check proves nothing


def test_a_vision_transformer_verifies_its_token_and_column_splits(pools: RankPools) -> None:
    """ViT's tokens (N, L, E) split by token (``t2``: LayerNorm, MLP, adds, and attention whose queries attend to
    every token) and by column (``c2``: the MLP's first linear layer by its filters, the second in its row form —
    Megatron-LM's pair, ``cost_models.dense_forms`` — and attention's heads) on 2 and 4 ranks, equal to the
    unsplit model in float64."""
    layouts = tuple(Layout.parse(text) for text in ("t2", "c2", "n2·t2", "c2·t2", "n2·c2", "t4"))
    spec = f"{HERE.parents[1] / 'examples' / 'vit.py'}:vit_tiny"
    report = check_model(CheckRequest(spec, (4, 3, 64, 64), devices=(), layouts=layouts, timeout_s=120,
                                      verify_dtype="float64"), pools)
    results = {check.name: check for check in report.checks}
    assert all(check.result == "pass" for check in report.checks), [(c.name, c.reason) for c in report.checks]
    for name, least in (("verify w2", 29), ("verify c2", 25), ("verify n2·w2", 29), ("verify c2·w2", 24),
                        ("verify n2·c2", 25), ("verify w4", 29)):
        assert results[name].detail["split"] >= least, (name, results[name].detail)  # attention too, under w


def test_timms_vision_transformer_verifies_its_token_splits(pools: RankPools) -> None:
    """timm's form — ``qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)`` and
    ``F.scaled_dot_product_attention`` — keeps the tokens named through the heads' view and back, so ``t2``
    splits every layer of its blocks, attention included; ``c2`` splits its MLP (fc1, then fc2 in its row form
    across the ``Identity`` between them)."""
    layouts = tuple(Layout.parse(text) for text in ("t2", "n2·t2", "c2"))
    report = check_model(CheckRequest(f"{HERE.parent / 'small_models.py'}:timm_vit_tiny", (4, 3, 64, 64),
                                      devices=(), layouts=layouts, timeout_s=120, verify_dtype="float64"), pools)
    results = {check.name: check for check in report.checks}
    assert all(check.result == "pass" for check in report.checks), [(c.name, c.reason) for c in report.checks]
    assert results["verify w2"].detail["split"] >= 66 and results["verify n2·w2"].detail["split"] >= 64


def test_swins_shifted_windows_verify_under_row_and_column_splits(pools: RankPools) -> None:
    """torchvision's Swin (``shifted_window_attention`` and patch merging on ``(N, H, W, C)`` maps) split by rows
    and columns of whole windows: the shifted blocks' rolled rows come from the adjacent tiles (``runtime.windows``);
    at 8×8 patches the second stage's windows of 4 split 2 ways, not 4 (those layers stay whole under ``h4``)."""
    layouts = tuple(Layout.parse(text) for text in ("h2", "w2", "h2·w2", "n2·h2", "h4"))
    report = check_model(CheckRequest(f"{HERE.parent / 'small_models.py'}:swin_tiny", (2, 3, 64, 64), devices=(),
                                      layouts=layouts, timeout_s=120, verify_dtype="float64"), pools)
    results = {check.name: check for check in report.checks}
    assert all(check.result == "pass" for check in report.checks), [(c.name, c.reason) for c in report.checks]
    for name in ("verify h2", "verify w2", "verify h2·w2", "verify n2·h2"):
        assert results[name].detail["split"] >= 56, (name, results[name].detail)  # windows, merging, MLPs, norms
    assert results["verify h4"].detail["split"] == 54  # all but the second stage's two window attentions


# -------------------------------------------------------------------- the harness: failures end as fail
def rank_one_dies() -> object:
    """A tiny network whose rank 1 is killed while building it (the parent and rank 0 build it normally)."""
    if _rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return _tiny()


def rank_one_hangs() -> object:
    """A tiny network whose rank 1 never finishes building it."""
    while _rank() == 1:
        time.sleep(3600)
    return _tiny()


def rank_one_differs() -> object:
    """A tiny network whose weights on rank 1 differ from everyone else's: the split is not the unsplit model."""
    import torch

    model = _tiny()
    if _rank() == 1:
        with torch.no_grad():
            model[0].weight.add_(1.0)
    return model


def _tiny() -> object:
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else -1


def _verify_n2(spec: str, pools: RankPools, timeout_s: float = 60.0) -> object:
    request = CheckRequest(spec, (2, 3, 8, 8), devices=(), layouts=(Layout.parse("n2"),), timeout_s=timeout_s)
    report = check_model(request, pools)
    assert [c.name for c in report.checks] == ["trace", "verify n2"]
    return report.checks[1]


def test_a_rank_that_dies_or_hangs_fails_its_check_and_the_pool_recovers(pools: RankPools) -> None:
    died = _verify_n2(f"{HERE}:rank_one_dies", pools)
    assert died.result == "fail" and "rank 1 died (SIGKILL)" in died.reason, died.reason
    hung = _verify_n2(f"{HERE}:rank_one_hangs", pools, timeout_s=8.0)
    assert hung.result == "fail" and "timed out" in hung.reason, hung.reason
    starts = pools.pools[2].starts
    assert _verify_n2(f"{HERE}:_tiny", pools).result == "pass"  # a fresh pool, started for this task
    assert pools.pools[2].starts == starts + 1


def test_a_rank_killed_while_idle_is_replaced_before_the_next_task(pools: RankPools) -> None:
    assert _verify_n2(f"{HERE}:_tiny", pools).result == "pass"
    pool = pools.pools[2]
    starts, victim = pool.starts, pool.pids[1]
    os.kill(victim, signal.SIGKILL)  # as the kernel's OOM killer does, between two tasks
    deadline = time.monotonic() + 10.0
    while _alive(victim) and time.monotonic() < deadline:
        time.sleep(0.1)
    check = _verify_n2(f"{HERE}:_tiny", pools)
    assert check.result == "pass", check.reason
    assert pool.starts == starts + 1


def test_a_pool_knows_its_last_peak_and_others_stop_when_it_would_not_fit(pools: RankPools,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import rank_pool

    assert _verify_n2(f"{HERE}:_tiny", pools).result == "pass"
    pool = pools.pools[2]
    assert pool.last_peak_bytes >= pool.resident_bytes() > 0

    class Idle:  # another size's pool, idle between tasks
        closed = 0

        def close(self) -> None:
            Idle.closed += 1

    pools.pools[1] = Idle()  # type: ignore[assignment]
    try:
        assert _verify_n2(f"{HERE}:_tiny", pools).result == "pass"
        assert Idle.closed == 0  # plenty of memory: kept for its next task
        monkeypatch.setattr(rank_pool, "available_memory_bytes", lambda: pool.last_peak_bytes * 0.1)
        pool.last_peak_bytes = pool.resident_bytes() + 10 * 2**30  # its last task grew by 10 GiB
        assert _verify_n2(f"{HERE}:_tiny", pools).result == "pass"
        assert Idle.closed == 1
    finally:
        del pools.pools[1]


def test_a_split_that_differs_from_the_unsplit_model_fails_with_its_error(pools: RankPools) -> None:
    check = _verify_n2(f"{HERE}:rank_one_differs", pools)
    assert check.result == "fail" and "verify error above tolerance" in check.reason, check.reason
    assert check.detail["grad_max_rel_err"] > 1e-3 or check.detail["output_max_rel_err"] > 1e-3


# -------------------------------------------------------------------- the command
def _parplan(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("parplan")), "check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=HERE.parent.parent)


def test_parplan_check_reports_each_check_as_json() -> None:
    done = _parplan("--model", "examples/unet.py:unet", "--input-shape", "2,3,32,32", "--devices", "2",
                    "--layouts", "n2,h2", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert [c["name"] for c in document["checks"]] == ["trace", "plan 2", "verify plan 2", "verify n2", "verify h2"]
    assert all(c["result"] in ("pass", "refused", "fail") and c["reason"] for c in document["checks"])
    assert [c["layout"] for c in document["checks"]] == [None, None, "plan", "n2", "h2"]
    assert document["counts"]["fail"] == 0


def test_a_right_split_passes_however_its_float32_rounding_falls() -> None:
    """RegNetY-400MF under w2 at batch 2 (batch-norm over a few values per channel amplifies rounding): its float32
    gradients are 0.3 off the unsplit float32 model on an AVX2 AMD EPYC and within the rounding floor on an
    AVX-512 Xeon (8.9e-3), float64 exact on both: the check passes (exit 0), and where the float32 comparison
    went above its floor it says that the float64 recheck passed. (The recheck itself, on any CPU:
    ``tests/test_verify_compare.py``'s planted rounding-sized halo error.)"""
    done = _parplan("--model", "torchvision:regnet_y_400mf", "--input-shape", "2,3,64,64", "--devices", "",
                    "--layouts", "w2", "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    verify = json.loads(done.stdout)["checks"][-1]
    assert verify["result"] == "pass", verify
    if "float64" in verify["detail"]:
        assert verify["detail"]["float64"]["passed"], verify
        assert "above tolerance" in verify["reason"] and "passes: float32 rounding" in verify["reason"], verify


@pytest.mark.parametrize("args, says", [
    (["--model", "torchvision:no_such_net", "--input-shape", "2,3,32,32"], "torchvision has no model"),
    (["--model", "torchvision:resnet18", "--input-shape", "2,3"], "input shape"),
    (["--model", "torchvision:resnet18", "--input-shape", "2,3,32,32", "--layouts", "h2,q3"], "cannot read layout"),
    (["--model", "torchvision:resnet18", "--input-shape", "2,3,32,32", "--profile", "v99"], "v99"),
])
def test_bad_input_is_one_line_and_exit_two(args: list[str], says: str) -> None:
    done = _parplan(*args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


_ORPHAN_SCRIPT = """
import os, sys, time
from runtime.rank_pool import RankPool
sys.path.insert(0, {repo!r})
from tests.test_model_zoo_short import idle_options
def main():
    pool = RankPool(2)
    assert pool.run(idle_options(), timeout_s=120).ok
    print(" ".join(map(str, [os.getpid(), *pool.pids])), flush=True)
    time.sleep(600)
if __name__ == "__main__":
    main()
"""


def idle_options() -> object:
    """The RunOptions of a verify run of the tiny network under n2 (a task that passes)."""
    import torch

    from cost_models.ir.tracing import trace
    from parplan.cli.layouts import layout_plan
    from runtime.options import RunOptions

    spec = f"{HERE}:_tiny"
    graph = trace(_tiny(), (2, 3, 8, 8), torch.float32)
    return RunOptions(model=spec, input_shape=(2, 3, 8, 8), dtype="float32",
                      plan=layout_plan(graph, Layout.parse("n2"), spec).to_dict(), steps=0, warmup=0, verify=True,
                      threads=1, quiet=True, graph=graph)


def test_the_ranks_of_a_pool_die_with_its_process(tmp_path: Path) -> None:
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN_SCRIPT.format(repo=str(HERE.parent.parent)))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                               cwd=HERE.parent.parent)
    try:
        pids = [int(pid) for pid in process.stdout.readline().split()]
        assert len(pids) == 3, pids
        os.kill(pids[0], signal.SIGKILL)  # no clean-up at all
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids[1:]):
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in pids[1:]), f"ranks {pids[1:]} outlived their pool's process"
    finally:
        process.kill()
        process.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has died
    except FileNotFoundError:
        return False


def test_checks_past_the_models_budget_fail_as_timed_out_without_running(pools: RankPools) -> None:
    request = CheckRequest(f"{HERE}:_tiny", (2, 3, 8, 8), devices=(2,), layouts=(Layout.parse("n2"),),
                           budget_s=0.01)
    report = check_model(request, pools)
    late = report.checks[1:]
    assert [c.name for c in late] == ["plan 2", "verify n2"]
    assert all(c.result == "fail" and "were used up" in c.reason for c in late), [c.reason for c in late]


def parameter_free_tail() -> object:
    """A model whose last pipeline stage (pooling and flattening) holds no parameter."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def in_place_head() -> object:
    """A model whose second pipeline stage starts in place (``ReLU(inplace=True)``) on what it receives
    (nextvit_small's 4-stage plan failed so: the received activation was the leaf its gradient is read from)."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 1), nn.ReLU(inplace=True), nn.Conv2d(6, 2, 1))


@pytest.mark.parametrize("model", ["parameter_free_tail", "in_place_head"])
def test_awkward_pipeline_stages_train_and_verify(pools: RankPools, model: str) -> None:
    import torch

    from cost_models.cluster import Cluster, Link
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan
    from runtime.options import RunOptions

    spec, shape = f"{HERE}:{model}", (4, 3, 8, 8)
    graph = trace(load_model(spec), shape, torch.float32)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=1, devices_per_node=1, memory_bytes=2**34, intra=link, inter=link)
    plan = staged(uniform_plan(graph, cluster, [Layout()]), graph, ["_2"], "sync", 2)
    assert plan.pipeline.stages == 2
    options = RunOptions(model=spec, input_shape=shape, dtype="float64", plan=plan.to_dict(), steps=1, warmup=0,
                         verify=True, tolerance=1e-9, threads=1, quiet=True, timeout_s=60.0, graph=graph)
    outcome = pools.run(2, options, timeout_s=120)  # float64 run of a float32 plan: the wire carries float64
    assert outcome.ok, outcome.error
    assert outcome.document["verify"]["passed"], outcome.document["verify"]
