"""``--verify``'s reference computed on rank 0 and broadcast (``runtime.shared_reference``), and the model copies
a pool builds from (``runtime.seeded_model``).

Two gloo ranks: rank 1 receives exactly rank 0's gradients and outputs (a dict holding a tuple and a
non-tensor), builds nothing but the skeleton it holds them on, keeps what it received for the next run of the
same model, and a rank that lost its kept reference (a replaced rank) gets it sent again instead of deadlocking
the others, who still hold theirs. Single process: a kept model's copy equals a fresh build, weights and the
random generator after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from distributed import run_ranks
from torch import nn

from runtime.random_ops import DrawKey


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.left, self.right = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 5, 1), nn.Conv2d(4, 5, 1)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        z = torch.relu(self.body(x))
        return {"left": self.left(z), "pair": (self.right(z), 3)}


def _build(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return _TwoHeads().to(dtype)


def _counted(builds: list[int]) -> Callable[[torch.dtype], nn.Module]:
    """:func:`_build`, each call counted in ``builds``."""

    def counted(dtype: torch.dtype) -> nn.Module:
        builds.append(1)
        return _build(dtype)

    return counted


def _batches() -> list[tuple[torch.Tensor, torch.Tensor, DrawKey]]:
    torch.manual_seed(1)
    x, labels = torch.randn(2, 3, 6, 6, dtype=torch.float64), torch.randint(0, 5, (2, 6, 6))
    return [(x, labels, DrawKey(0, 0))]


def _rank(rank: int, world_size: int) -> dict[str, Any]:
    from runtime.shared_reference import shared_reference
    from runtime.verify import keep_references_of

    builds: list[int] = []
    counted, batches = _counted(builds), _batches()
    device = torch.device("cpu")
    first = shared_reference(counted, (), torch.float64, batches, reuse=("two heads", 0), device=device)
    again = shared_reference(counted, (), torch.float64, batches, reuse=("two heads", 0), device=device)
    if rank == 1:
        keep_references_of(None)  # as a rank replaced after a crash: nothing kept
    resent = shared_reference(counted, (), torch.float64, batches, reuse=("two heads", 0), device=device)
    out = first.outputs[0]
    return {"grads": {n: p.grad.clone() for n, p in first.model.named_parameters()}, "left": out["left"],
            "right": out["pair"][0], "other": out["pair"][1], "kept": again is first, "builds": len(builds),
            "resent_equal": all(torch.equal(a.grad, b.grad) for a, b in zip(first.model.parameters(),
                                                                          resent.model.parameters()))}


def test_rank_0_computes_the_reference_and_every_rank_holds_exactly_its_values() -> None:
    zero, one = run_ranks(_rank, world_size=2)
    assert zero["grads"].keys() == one["grads"].keys()
    assert all(torch.equal(zero["grads"][n], one["grads"][n]) for n in zero["grads"])
    assert torch.equal(zero["left"], one["left"]) and torch.equal(zero["right"], one["right"])
    assert zero["other"] == 3 and one["other"] is None  # not a tensor: never compared, not sent
    assert zero["kept"] and one["kept"]  # the second run of the same model reuses it on both ranks
    assert zero["resent_equal"] and one["resent_equal"]
    assert zero["builds"] == 1  # computed once; rank 0 still held it when rank 1 had lost its copy
    assert one["builds"] == 2  # the skeletons it received into, the first time and after losing it


def test_a_kept_model_is_copied_as_a_fresh_build_would_be_with_the_generator_after_it() -> None:
    from runtime.seeded_model import seeded_model

    spec, device = "torchvision:resnet18", torch.device("cpu")
    fresh = seeded_model(spec, 3, torch.float64, device)
    after_fresh = torch.rand(4)
    kept = seeded_model(spec, 3, torch.float64, device, reuse="pool")
    copied = seeded_model(spec, 3, torch.float64, device, reuse="pool")
    after_copy = torch.rand(4)
    assert copied is not kept and torch.equal(after_fresh, after_copy)
    for a, b, c in zip(fresh.state_dict().values(), kept.state_dict().values(), copied.state_dict().values()):
        assert torch.equal(a, b) and torch.equal(a, c)
    copied.conv1.weight.data.zero_()  # a copy's changes stay in it
    assert not torch.equal(seeded_model(spec, 3, torch.float64, device, reuse="pool").conv1.weight,
                           copied.conv1.weight)


def _partial_rank(rank: int, world_size: int) -> dict[str, Any]:
    from runtime.shared_reference import shared_reference

    builds: list[int] = []
    counted, batches = _counted(builds), _batches()
    wanted = None if rank == 0 else {"left.weight", "left.bias"}  # rank 1: a stage holding one head
    device = torch.device("cpu")
    first = shared_reference(counted, (), torch.float64, batches, reuse=("two heads", 1), device=device,
                             wanted=wanted)
    shared_reference(counted, (), torch.float64, batches, reuse=("two heads", 1), device=device, wanted=wanted)
    return {"grads": {n: None if p.grad is None else p.grad.clone() for n, p in first.model.named_parameters()},
            "sizes": {n: p.numel() for n, p in first.model.named_parameters()}, "scale": first.gradient_scale(),
            "left": first.outputs[0]["left"], "builds": len(builds)}


def test_a_rank_that_compares_some_gradients_receives_and_holds_only_those() -> None:
    zero, one = run_ranks(_partial_rank, world_size=2)
    assert all(zero["grads"][n] is not None for n in zero["grads"])
    assert {n for n, g in one["grads"].items() if g is not None} == {"left.weight", "left.bias"}
    assert all(torch.equal(one["grads"][n], zero["grads"][n]) for n in ("left.weight", "left.bias"))
    assert {n for n, size in one["sizes"].items() if size} == {"left.weight", "left.bias"}  # the rest released
    assert one["scale"] == zero["scale"] > 0  # the whole model's largest gradient, from rank 0
    assert max(float(g.abs().max()) for g in zero["grads"].values()) == zero["scale"]
    assert torch.equal(one["left"], zero["left"])
    assert zero["builds"] == 1 and one["builds"] == 2  # a partial reference is not kept: sent again
