"""``--output KEY``: the loss of one part of what a model returns (``runtime.outputs``), split and unsplit alike.

A segmentation model returning ``{"out": …, "aux": …}`` trains on ``out`` alone under ``--output out``: the
auxiliary head is computed and takes no gradient, on the split model as on the unsplit one (float64, exact, on
two ranks). A key naming no part is refused with the parts the output has.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from distributed import run_ranks
from runtime_check import split_step_matches
from torch import nn

from cost_models.errors import PlanError
from runtime.outputs import output_loss, select_nodes, select_value

SHAPE = (4, 3, 8, 8)
Heads = namedtuple("Heads", ["logits", "aux"])


class TwoHeads(nn.Module):
    """torchvision's segmentation models: a dict of two maps of the same shape."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Conv2d(3, 6, 3, padding=1)
        self.out, self.aux = nn.Conv2d(6, 5, 1), nn.Conv2d(6, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = torch.relu(self.body(x))
        return {"out": self.out(features).mean(dim=(2, 3)), "aux": self.aux(features).mean(dim=(2, 3))}


class NamedHeads(TwoHeads):
    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        both = super().forward(x)
        return Heads(both["out"], aux=both["aux"])


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return {"dict": TwoHeads, "named": NamedHeads}[name]().to(torch.float64)


def test_a_key_selects_a_dict_key_a_named_field_or_an_index_and_the_parts_are_named_otherwise() -> None:
    value = {"out": torch.ones(2), "aux": torch.zeros(2)}
    assert select_value(value, "aux") is value["aux"] and select_value(value, None) is value
    heads = Heads(torch.ones(1), aux=torch.zeros(1))
    assert select_value(heads, "aux") is heads.aux and select_value(heads, "-1") is heads.aux
    assert select_value((heads.logits, heads.aux), "0") is heads.logits
    with pytest.raises(PlanError, match="--output main: the model's output has no such part; it has keys out, aux"):
        select_value(value, "main")
    with pytest.raises(PlanError, match="fields logits, aux or indices 0…1"):
        select_value(heads, "2")
    target = torch.tensor([0, 1])
    logits = {"out": torch.randn(2, 3), "aux": torch.randn(2, 3)}
    assert torch.equal(output_loss(logits, target, key="out"), torch.nn.functional.cross_entropy(logits["out"], target))


def test_the_traced_output_is_selected_as_the_value_is() -> None:
    from cost_models.ir.tracing import symbolic_trace

    for name in ("dict", "named"):
        output = next(n for n in symbolic_trace(_model(name), ()).graph.nodes if n.op == "output")
        assert select_nodes(output.args[0], "aux").name == "mean_1"
        assert select_nodes(output.args[0], "0" if name == "named" else "out").name == "mean"
    with pytest.raises(PlanError, match="has no such part; it has keys out, aux"):
        select_nodes(output.args[0] if name == "dict" else {"out": 0, "aux": 1}, "main")


def _cases(rank: int, world: int) -> dict[str, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan

    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world, devices_per_node=world, memory_bytes=2**34, intra=link, inter=link)
    done = {}
    for name, output in (("dict", "out"), ("named", "aux"), ("dict", None)):
        graph = trace(_model(name), SHAPE, torch.float64)
        for layout in ("n2", "h2"):
            plan = uniform_plan(graph, cluster, [Layout.parse(layout), Layout()])
            split_step_matches(lambda: _model(name), plan, graph, SHAPE, f"{name} {output} {layout}", output=output)
            done[f"{name} {output} {layout}"] = plan.summary()
    return done


@pytest.mark.multirank
def test_the_loss_of_one_output_trains_the_split_model_as_the_unsplit_one() -> None:
    assert len(run_ranks(_cases, 2, timeout_s=300)[0]) == 6
