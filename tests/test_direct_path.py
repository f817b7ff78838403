"""Pure sample plans run the traced program as written (``runtime.direct``), equal to the interpreted runtime.

On two gloo ranks in float64: a BN-free CNN under ``n2`` runs directly, and its output and every gradient equal
those of the same plan interpreted node by node (the path every other plan takes, checked against the unsplit
model by the rest of the suite). Plans whose program sees across samples are interpreted: a spatial split, a
dropout, batch-norm synchronised over the batch, a view that reads the batch size.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from distributed import run_ranks
from torch import nn

pytestmark = pytest.mark.multirank


class _Net(nn.Module):
    def __init__(self, extra: str = "") -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.GELU())
        self.norm = nn.BatchNorm2d(8) if extra == "batchnorm" else nn.Identity()
        self.drop = nn.Dropout(0.5) if extra == "dropout" else nn.Identity()
        self.batch_view = extra == "view"
        self.head = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.norm(self.features(x)))
        x = x.view(x.size(0), -1) if self.batch_view else torch.flatten(x, 1)
        return self.head(x)


def _split(extra: str, layout: str, sync: bool) -> Any:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan
    from runtime.apply import apply_plan

    torch.manual_seed(0)
    model = _Net(extra).double()
    graph = trace(model, (4, 3, 8, 8), torch.float64)
    cluster = Cluster(devices=2, devices_per_node=2, memory_bytes=2**40, intra=Link(0.0, 1e9), inter=Link(0.0, 1e9))
    return apply_plan(model, uniform_plan(graph, cluster, [Layout.parse(layout), Layout()]), graph=graph,
                      sync_batchnorm=sync)


def _step(split: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64, generator=generator)
    target = torch.randint(0, 5, (4,), generator=generator)
    output = split(split.shard(x))
    split.loss(output, target[split.target_box(tuple(target.shape))]).backward()
    return output.detach(), [p.grad.clone() for p in split.parameters()]


def _compare(rank: int, world_size: int) -> dict[str, Any]:
    direct, interpreted = _split("", "n2", False), _split("", "n2", False)
    interpreted._program = ()  # the node-by-node path every other plan takes
    (out_a, grads_a), (out_b, grads_b) = _step(direct), _step(interpreted)
    verdicts = {case: _split(*case).runs_directly for case in
                (("", "h2", False), ("dropout", "n2", False), ("batchnorm", "n2", True), ("batchnorm", "n2", False),
                 ("view", "n2", False))}
    return {"direct": direct.runs_directly, "interpreted": interpreted.runs_directly,
            "output_err": float((out_a - out_b).abs().max()),
            "grad_err": max(float((a - b).abs().max()) for a, b in zip(grads_a, grads_b)),
            "grad_scale": max(float(a.abs().max()) for a in grads_a), "verdicts": verdicts}


def test_a_pure_sample_plan_runs_the_program_as_written_and_equals_the_interpreter() -> None:
    for found in run_ranks(_compare, world_size=2):
        assert found["direct"] and not found["interpreted"]
        assert found["grad_scale"] > 0
        assert found["output_err"] < 1e-12 and found["grad_err"] < 1e-12 * max(1.0, found["grad_scale"])
        assert found["verdicts"] == {("", "h2", False): False, ("dropout", "n2", False): False,
                                     ("batchnorm", "n2", True): False, ("batchnorm", "n2", False): True,
                                     ("view", "n2", False): False}
