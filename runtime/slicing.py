"""Cutting the weights of channel-split layers to this rank's slice, and the replica group of every parameter.

A layer split ``c`` ways keeps on each rank the filters (output channels) of
its channel part ``partition(C_out, c)[k]``: the weight's first dimension
(the second for a transposed convolution) and the bias — a linear layer in
its row form (``cost_models.dense_forms``) keeps the weight's columns of its
input part instead, and its part of the bias; batch-norm keeps the
same slice of its weight, bias and running statistics. The parameter is
replaced in the module by a new one holding the slice, so an optimizer built
afterwards sees only local data. Every other parameter stays whole.

The replica group of a slice is the ranks with the same channel part
(``runtime.groups``, kind ``"slice"``); of a whole parameter, every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cost_models.errors import PlanError
from cost_models.halo import partition
from cost_models.redistribution import coordinates
from processes.heap import hand_back_free
from runtime.groups import block_of
from runtime.layers import Site

__all__ = ["ParameterSlice", "release_others", "slice_parameters"]

_SLICED_DIM = {"conv": 0, "linear": 0, "conv_transpose": 1, "batchnorm": 0}


@dataclass(frozen=True)
class ParameterSlice:
    """Which part of the unsplit tensor ``name`` (a parameter or a buffer) this rank holds.

    The rows ``[start, stop)`` of ``extent`` along ``dim``.
    """

    name: str
    dim: int
    start: int
    stop: int
    extent: int


def slice_parameters(sites: Iterable[Site], member: int, model: nn.Module,
                     params: Callable[[], Iterable[nn.Parameter]] | None = None) -> tuple[
        dict[tuple[int, ...], list[nn.Parameter]], list[ParameterSlice]]:
    """Slice the weights of channel-split layers in place; return the parameters by replica group and the slices.

    ``params()`` lists, after slicing, the parameters the caller trains (default: all of ``model``'s); the
    others are left alone.

    Raises:
        PlanError: A parameter shared by several layers would be sliced differently by them.
    """
    groups: dict[tuple[int, ...], list[nn.Parameter]] = {}
    owner: dict[int, tuple[int, ...]] = {}
    slices: list[ParameterSlice] = []
    size = 0
    sites = list(sites)
    for site in _once_per_module(sites):
        size = len(site.ranks)
        if site.module is None or site.layout.c == 1 or site.kind not in _SLICED_DIM:
            continue
        members = block_of(site.layout, size, "slice", member)
        index = coordinates(site.layout, member)[1]
        for piece, param in _cut(site, index):
            slices.append(piece)
            if param is None:  # a buffer: sliced, never summed
                continue
            if owner.setdefault(id(param), members) != members:
                raise PlanError(f"parameter {piece.name} is shared by layers split differently; give them one layout")
            groups.setdefault(members, []).append(param)
    size = max((len(site.ranks) for site in sites), default=size)
    everyone = tuple(range(size))
    for param in model.parameters() if params is None else params():
        if id(param) not in owner:
            owner[id(param)] = everyone
            groups.setdefault(everyone, []).append(param)
    return groups, slices


def _once_per_module(sites: list[Site]) -> list[Site]:
    """The sites, each module's first call only: a module called again (a shared block) is sliced once.

    Raises:
        PlanError: Calls of one module with parameters under different channel splits (its weights would have
            to be whole for one and sliced for the other).
    """
    first: dict[int, Site] = {}
    kept = []
    for site in sites:
        if site.module is None or site.kind not in _SLICED_DIM:
            kept.append(site)
            continue
        known = first.setdefault(id(site.module), site)
        if known is site:
            kept.append(site)
        elif (known.layout.c > 1 or site.layout.c > 1) and known.layout != site.layout:
            raise PlanError(f"layers '{known.name}' ({known.layout}) and '{site.name}' ({site.layout}) call one module "
                            f"with parameters under different channel splits; give them one layout")
    return kept


def _cut(site: Site, index: int) -> list[tuple[ParameterSlice, nn.Parameter | None]]:
    module, dim = site.module, 1 if site.row_form else _SLICED_DIM[site.kind]  # (row form: its input's columns)
    assert module is not None
    cut: list[tuple[ParameterSlice, nn.Parameter | None]] = []
    for key in ("weight", "bias", "running_mean", "running_var"):
        tensor = getattr(module, key, None)
        if not isinstance(tensor, torch.Tensor):
            continue
        along = dim if key == "weight" else 0
        if tensor.shape[along] < site.layout.c:
            raise PlanError(f"layer '{site.name}' ({site.kind}, {site.layout}): its {key} {tuple(tensor.shape)} has "
                            f"{tensor.shape[along]} along dimension {along}, fewer than the {site.layout.c} channel "
                            f"parts (a module called again, already sliced?); give it a layout without c")
        start, stop = partition(tensor.shape[along], site.layout.c)[index]
        piece = tensor.detach().narrow(along, start, stop - start).clone()
        prefix = site.layer.module
        sliced = ParameterSlice(f"{prefix}.{key}", along, start, stop, tensor.shape[along])
        if isinstance(tensor, nn.Parameter):
            param = nn.Parameter(piece, requires_grad=tensor.requires_grad)
            setattr(module, key, param)
            cut.append((sliced, param))
        else:
            module.register_buffer(key, piece)
            cut.append((sliced, None))
    return cut


def release_others(model: nn.Module, own: Sequence[nn.Parameter]) -> None:
    """Empty ``model``'s parameters other than ``own`` on this rank: a pipeline stage's (the other stages train
    theirs elsewhere), a ``--verify`` reference's that this rank does not compare (``runtime.shared_reference``)."""
    mine = {id(param) for param in own}
    for param in model.parameters():
        if id(param) not in mine:
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
            param.requires_grad_(False)
    hand_back_free()
