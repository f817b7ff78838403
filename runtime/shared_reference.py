"""``--verify``'s unsplit reference, computed once per run: on rank 0, with the cores its ranks share, and
broadcast.

Every rank compares its split against the same unsplit step (one seed, the whole batch). Computing it on
every rank costs a whole model's step per rank; where ranks share cores (``parplan check`` on one machine)
that is most of a verify's time. Rank 0 computes it (the others wait in the broadcast), then sends the
gradients (one flat buffer) and the outputs (their structure as JSON, then each tensor) to the others, who
hold them on a fresh copy of the model. It computes it with the threads each rank has, as the split does:
with more threads its float32 sums come out in another order than the split's, and on an ill-conditioned
float32 model (regnet_y_1_6gf) that difference exceeds the rounding floor. Its float64 twin, which only
measures that floor, runs with the threads of all the ranks on the node.

A rank that compares only some gradients (a pipeline stage's rank: its own parameters, ``wanted``) receives
only those: the ranks first gather which gradients each wants, and where any rank wants fewer than all, rank 0
sends each rank its own share point to point instead of broadcasting them all. A K-stage pipeline's ranks then
hold one model's gradients between them, not K (resnet18 in float64: 94 MB a rank less); they hold the other
parameters of their skeleton empty, and the model's largest gradient (the comparison's scale) comes in the header.

A reference kept from an earlier run of the same model (``runtime.verify``'s ``reuse``) is used only if every
rank holds it — a rank replaced after a crash holds none, and then rank 0 sends it again. A rank keeps only a
whole reference (every gradient).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.fx.node import Argument

from processes.cores import unpinned
from runtime.inputs import Inputs
from runtime.random_ops import DrawKey
from runtime.slicing import release_others
from runtime.verify import Reference, held_reference, keep_reference, reference_step, rounding_error
from runtime.waiting import all_reduce, exchange

__all__ = ["shared_reference", "shared_rounding"]

Batches = Sequence[tuple[Inputs, torch.Tensor, DrawKey]]


class _Structure(TypedDict, total=False):
    """An output's shape as JSON (:func:`_structure`): one of its keys."""

    tensor: list[int]
    dtype: str
    items: list[_Structure]
    pairs: list[tuple[str, _Structure]]
    other: None


class _Header(TypedDict):
    """What rank 0 sends first: which parameters have a gradient, and each output's structure."""

    grads: list[bool]
    outputs: list[_Structure]
    loss: float
    largest_gradient: float


def shared_reference(build: Callable[[torch.dtype], nn.Module], leaf_modules: Sequence[str], dtype: torch.dtype,
                     batches: Batches, *, reuse: Hashable | None, device: torch.device,
                     output: str | None = None, amp: str = "", loss: str = "",
                     wanted: Collection[str] | None = None) -> Reference:
    """:func:`runtime.verify.reference_step`'s reference, computed on rank 0 and broadcast (module docstring).

    ``wanted``: the parameters whose gradients this rank compares (``runtime.verify.compared_parameters``;
    ``None``: every one); another rank than 0 receives and holds only those."""
    batches = list(batches)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return reference_step(build, leaf_modules, dtype, batches, reuse=reuse, output=output, amp=amp, loss=loss)
    held = held_reference(reuse, leaf_modules, dtype, batches) if reuse is not None else None
    if _everywhere(held is not None, device):
        assert held is not None, "this rank holds the reference, as every rank does"
        return held
    if dist.get_rank() == 0:
        reference = reference_step(build, leaf_modules, dtype, batches, reuse=reuse, output=output, loss=loss,
                                   amp=amp)  # ranks' threads
        _send(reference, device)
        return reference
    reference = _receive(build(dtype), device, wanted)
    if reuse is not None and reference.largest_gradient is None:  # whole: every gradient received
        keep_reference(reuse, leaf_modules, dtype, batches, reference)
    return reference


def shared_rounding(reference: Reference, wide: Callable[[], Reference],
                    device: torch.device) -> tuple[float, float] | None:
    """``reference``'s largest errors against its float64 twin ``wide()`` (outputs, gradients), computed on rank 0
    only, with the cores of its node, and shared: every rank holds the same unsplit reference. ``None`` when the
    model does not run in float64 (physicsnemo's AFNO computes its spectral layers in ``x.float()`` whatever the
    weights' dtype): the comparison then allows no rounding beyond its tolerance."""
    distributed = dist.is_available() and dist.is_initialized()
    if distributed and dist.get_rank() != 0:
        noise = torch.zeros(2, dtype=torch.float64, device=device)
    else:
        with _every_core():
            noise = torch.tensor(_rounding_or_nothing(reference, wide), dtype=torch.float64, device=device)
    if distributed:
        all_reduce(noise, "the --verify rounding broadcast", dist.ReduceOp.MAX)
    return None if bool(torch.isinf(noise).any()) else (float(noise[0]), float(noise[1]))


def _rounding_or_nothing(reference: Reference, wide: Callable[[], Reference]) -> tuple[float, float]:
    """:func:`rounding_error` against ``wide()``; infinite (shared as "none") when the float64 twin fails."""
    try:
        twin = wide()
    except RuntimeError:  # the model's own code refuses float64 (a dtype mismatch in its arithmetic)
        return float("inf"), float("inf")
    return rounding_error(reference, twin)


def _everywhere(true: bool, device: torch.device) -> bool:
    flag = torch.tensor([1 if true else 0], dtype=torch.int64, device=device)
    all_reduce(flag, "the --verify reference check", dist.ReduceOp.MIN)
    return bool(flag.item())


@contextmanager
def _every_core() -> Iterator[None]:
    """The threads of all the ranks on this node for the duration (they wait for rank 0 meanwhile)."""
    threads = torch.get_num_threads()
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    with unpinned():  # the other ranks' cores too (processes.cores)
        torch.set_num_threads(max(threads, min(os.cpu_count() or 1, threads * local)))
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def _send(reference: Reference, device: torch.device) -> None:
    named = list(reference.model.named_parameters())
    leaves: list[torch.Tensor] = []
    header: _Header = {"grads": [p.grad is not None for _, p in named],
                       "outputs": [_structure(out, leaves) for out in reference.outputs], "loss": reference.loss,
                       "largest_gradient": reference.gradient_scale()}
    _broadcast_text(json.dumps(header), device)
    wants = _wants(header["grads"], device)
    if _all_want_all(wants, header["grads"]):
        for group in _by_dtype([p for _, p in named if p.grad is not None]):  # one buffer per dtype: complex stays
            _broadcast(_flat_gradients(group, device), "the --verify reference gradients")
    else:
        for rank, wanted in enumerate(wants[1:], start=1):
            for group in _by_dtype([p for (_, p), want in zip(named, wanted) if want]):
                with exchange(f"the --verify reference gradients for rank {rank}"):
                    dist.send(_flat_gradients(group, device), dst=rank)
    for leaf in leaves:
        _broadcast(leaf.contiguous().to(device), "the --verify reference outputs")


def _receive(model: nn.Module, device: torch.device, wanted: Collection[str] | None) -> Reference:
    header: _Header = json.loads(_broadcast_text("", device))
    named = list(model.named_parameters())
    mine = [has and (wanted is None or name in wanted) for (name, _), has in zip(named, header["grads"])]
    wants = _wants(mine, device)
    whole = _all_want_all(wants, header["grads"])
    for group in _by_dtype([p for (_, p), want in zip(named, header["grads"] if whole else mine) if want]):
        flat = torch.empty(sum(p.numel() for p in group), dtype=group[0].dtype, device=device)
        if whole:
            _broadcast(flat, "the --verify reference gradients")
        else:
            with exchange("the --verify reference gradients from rank 0"):
                dist.recv(flat, src=0)
        offset = 0
        for p in group:
            p.grad, offset = flat[offset:offset + p.numel()].view_as(p), offset + p.numel()
    if not all(mine):  # hold only the compared parameters
        release_others(model, [p for (_, p), want in zip(named, mine) if want])
    outputs = tuple(_rebuilt(out, device) for out in header["outputs"])
    held = mine == header["grads"]  # every gradient: this rank's model gives the scale itself
    return Reference(model, outputs, loss=header["loss"], largest_gradient=None if held else header["largest_gradient"])


def _wants(mine: Sequence[bool], device: torch.device) -> list[list[bool]]:
    """Every rank's ``mine`` (which gradients it wants, in the model's parameter order), gathered."""
    mask = torch.tensor([1 if want else 0 for want in mine], dtype=torch.uint8, device=device)
    rows = [torch.empty_like(mask) for _ in range(dist.get_world_size())]
    with exchange("the --verify reference's wanted gradients"):
        dist.all_gather(rows, mask)
    return [[bool(v) for v in row.tolist()] for row in rows]


def _all_want_all(wants: Sequence[Sequence[bool]], grads: Sequence[bool]) -> bool:
    """Whether every rank but 0 wants every gradient there is (then one broadcast serves them all)."""
    return all(list(row) == list(grads) for row in wants[1:])


def _flat_gradients(params: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]).to(device)


def _by_dtype(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``params`` grouped by dtype, groups in order of first appearance (the same on every rank)."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in params:
        groups.setdefault(param.dtype, []).append(param)
    return list(groups.values())


def _structure(value: object, leaves: list[torch.Tensor]) -> _Structure:
    """``value``'s shape as JSON: tensors by index into ``leaves`` (appended), containers as lists or pairs."""
    if isinstance(value, torch.Tensor):
        leaves.append(value.detach())
        return {"tensor": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (tuple, list)):
        return {"items": [_structure(v, leaves) for v in value]}
    if isinstance(value, dict):
        return {"pairs": [(key, _structure(v, leaves)) for key, v in value.items()]}
    return {"other": None}  # never compared (not a floating tensor)


def _rebuilt(shape: _Structure, device: torch.device) -> Argument:
    """The value :func:`_structure` described, each tensor received in turn (tuples for every sequence)."""
    if "tensor" in shape:
        tensor = torch.empty(shape["tensor"], dtype=getattr(torch, shape["dtype"]), device=device)
        _broadcast(tensor, "the --verify reference outputs")
        return tensor
    if "items" in shape:
        return tuple(_rebuilt(item, device) for item in shape["items"])
    if "pairs" in shape:
        return {key: _rebuilt(item, device) for key, item in shape["pairs"]}
    return None


def _broadcast_text(text: str, device: torch.device) -> str:
    data = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    _broadcast(size, "the --verify reference header")
    if dist.get_rank() != 0:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _broadcast(data, "the --verify reference header")
    return bytes(data.cpu().tolist()).decode()


def _broadcast(tensor: torch.Tensor, what: str) -> None:
    with exchange(what):
        dist.broadcast(tensor, src=0)
