"""The public API behind ``import parplan``: trace, plan, estimate, what-if, and the runtime's entry points.

Thin on purpose: each function names its options as keywords and hands them to the room that owns the work
(``cost_models`` traces and prices, ``planner`` searches, ``runtime`` executes). Profiles are a preset name
(``v100``, ``a100``, ``h100``) or a profile JSON path wherever a profile is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from cost_models.cluster import Cluster
from cost_models.estimate import Estimate
from cost_models.formats.plan import Plan
from cost_models.ir.graph import LayerGraph
from cost_models.profile import Profile

if TYPE_CHECKING:
    from typing import NotRequired  # Python 3.11's; in annotations only, which are never evaluated

    import torch
    from torch import nn

    from planner.search import PlanResult
    from planner.settings import Progress, SearchSettings

__all__ = ["WHATIF_FORMAT", "WhatIfDocument", "cluster", "estimate", "load_profile", "plan", "trace", "whatif"]

WHATIF_FORMAT = "parplan.whatif/1"


class WhatIfDocument(TypedDict):
    """The ``parplan.whatif/1`` document :func:`whatif` returns (``parplan whatif --json``)."""

    format: str
    model: str
    input_shape: list[int]
    input_shapes: NotRequired[list[list[int]]]  # a model taking several inputs: every one's, in argument order
    dtype: str
    amp: NotRequired[str]  # priced under mixed precision (``bf16``, ``fp16``)
    profile: str
    device: str
    scaling: str
    devices_per_node: int
    scale_inter_bw: float
    scale_intra_bw: float
    memory_bytes: int
    max_stages: int
    one_device: dict[str, Any]  # ``planner.whatif.OneDevice``'s fields
    rows: list[dict[str, Any]]  # ``planner.whatif.WhatIfRow.to_dict()`` per device count


class _Inputs(TypedDict, total=False):
    input_shapes: list[list[int]]


class _Precision(TypedDict, total=False):
    amp: str


def trace(model: nn.Module, input_shape: Sequence[int] | Sequence[Sequence[int]], *,
          dtype: torch.dtype | str | None = None, leaf_modules: Iterable[str] = (), amp: str = "") -> LayerGraph:
    """``model`` traced at its global ``input_shape`` (several shapes: one per forward argument) into a LayerGraph.

    ``dtype``: a ``torch.dtype`` or its name (default float32); ``leaf_modules``: modules kept opaque to torch.fx;
    ``amp``: ``bf16`` or ``fp16`` to trace (and so price) the forward under ``torch.autocast``.
    """
    from cost_models.ir.tracing import trace as trace_graph

    return trace_graph(model, input_shape, dtype, leaf_modules, amp=amp)


def _rates_dtype(graph: LayerGraph) -> str:
    """The dtype a preset's compute rates are taken for: the autocast dtype under mixed precision."""
    return graph.graph.get("amp") or graph.graph["dtype"]


def load_profile(profile: str | os.PathLike[str] | Profile, *, dtype: str = "float32") -> Profile:
    """A preset's datasheet profile for ``dtype``, or the profile JSON at a path (a Profile is returned as is)."""
    if isinstance(profile, Profile):
        return profile
    from calibrate.presets import preset_profile
    from cost_models.profile import load_profile as load_file

    text = os.fspath(profile)
    if os.path.exists(text) or text.endswith(".json") or os.sep in text:
        return load_file(text)
    return preset_profile(text, dtype)  # a preset, or one line naming the known ones


def cluster(profile: str | os.PathLike[str] | Profile, devices: int, *, devices_per_node: int | None = None,
            dtype: str = "float32") -> Cluster:
    """The cluster of ``devices`` devices a plan is made for: a preset's nodes and links, or a measured profile's."""
    from dataclasses import replace

    from calibrate.presets import is_preset, preset_cluster

    if isinstance(profile, (str, os.PathLike)) and is_preset(os.fspath(profile)) and not os.path.exists(profile):
        found = preset_cluster(os.fspath(profile), devices)
        return replace(found, devices_per_node=devices_per_node) if devices_per_node else found
    return load_profile(profile, dtype=dtype).cluster(devices, devices_per_node)


def plan(graph: LayerGraph, *, profile: str | os.PathLike[str] | Profile, devices: int,
         devices_per_node: int | None = None, settings: SearchSettings | None = None, model_spec: str = "",
         progress: Progress | None = None) -> PlanResult:
    """The least predicted time plan of ``graph`` on ``devices`` devices: a ``planner.search.PlanResult``.

    ``settings``: a ``planner.settings.SearchSettings`` (default: ``parplan plan``'s defaults);
    ``model_spec``: how to rebuild the model, recorded in the plan (``torchvision:resnet50``); ``progress``: called
    with the stage search's progress (``planner.settings.Progress``).
    """
    from planner.search import plan_model
    from planner.settings import SearchSettings

    loaded = load_profile(profile, dtype=_rates_dtype(graph))
    where = cluster(profile if not isinstance(profile, Profile) else loaded, devices,
                    devices_per_node=devices_per_node, dtype=_rates_dtype(graph))
    return plan_model(graph, loaded, where, settings or SearchSettings(), model_spec=model_spec, progress=progress)


def estimate(graph: LayerGraph, plan: Plan, *, profile: str | os.PathLike[str] | Profile, optimizer: str = "sgd",
             overlap: bool = True, threads: int | None = None) -> Estimate:
    """``plan``'s predicted iteration time per layer and term, and memory per rank, for ``graph``; ``threads``:
    CPU threads per rank of the run (its kernels' workspace), ``None`` for the profile's own."""
    from cost_models.estimate import estimate as price

    return price(graph, plan, load_profile(profile, dtype=_rates_dtype(graph)), optimizer=optimizer, overlap=overlap,
                 threads=threads)


def whatif(model: str, input_shape: str | Sequence[str | Sequence[int]], *, profile: str, devices: Sequence[int],
           devices_per_node: int | None = None, scale_inter_bw: float = 1.0, scale_intra_bw: float = 1.0,
           memory_gb: float | None = None, weak_scaling: bool = False, settings: SearchSettings | None = None,
           dtype: str = "float32", jobs: int | None = None, leaf_modules: Sequence[str] = (),
           progress: Progress | None = None, amp: str = "") -> WhatIfDocument:
    """Plan ``model`` at each of ``devices`` and return the ``parplan.whatif/1`` document (``parplan whatif``).

    Args:
        model: A model spec (``torchvision:resnet50``, ``path/file.py:factory``).
        input_shape: ``"N,C,H,W"`` or a sequence; N is global (strong scaling) or per device (``weak_scaling``).
            A model taking several tensors: a sequence of such shapes, one per input, each batch first (every
            input's batch scales alike).
        profile: A preset name (``v100``, ``a100``, ``h100``) or a profile JSON path.
        memory_gb: Device memory in GiB instead of the profile's.
        settings: A ``planner.settings.SearchSettings`` (default: ``parplan plan``'s defaults).
        jobs: Processes planning in parallel (default: one per core).
        progress: Called ``(done, total)`` as sizes finish (a progress bar).
        amp: ``bf16`` or ``fp16``: priced under mixed precision (autocast dtypes, float32 weights; one stage).

    Raises:
        InputError: Bad shape, profile, factors or model (one line each).
    """
    from dataclasses import asdict, replace

    from cost_models.ir.graph import AMP_DTYPES, parse_input_shapes
    from cost_models.ir.model_spec import load_model
    from planner.settings import SearchSettings
    from planner.whatif import scaled_profile, sweep

    settings = settings or SearchSettings()
    settings = replace(settings, max_stages=1) if amp else settings  # pipelines do not run under autocast
    shapes = parse_input_shapes(input_shape)
    memory = int(memory_gb * 2**30) if memory_gb else None
    scaled = scaled_profile(load_profile(profile, dtype=AMP_DTYPES[amp] if amp else dtype), scale_intra_bw,
                            scale_inter_bw, memory)
    network = load_model(model)
    graphs: dict[int, LayerGraph] = {}

    def graph_for(batch: int) -> LayerGraph:
        if batch not in graphs:
            graphs[batch] = trace(network, [(batch, *each[1:]) for each in shapes], dtype=dtype,
                                  leaf_modules=list(leaf_modules), amp=amp)
        return graphs[batch]

    def cluster_at(count: int) -> Cluster:
        found = cluster(profile if not os.path.exists(profile) else scaled, count, devices_per_node=devices_per_node)
        return replace(found, memory_bytes=memory) if memory else found

    rows, reference = sweep(graph_for, scaled, cluster_at, devices, shapes[0][0], settings, weak=weak_scaling,
                            jobs=jobs, model_spec=model, progress=progress)
    inputs: _Inputs = {"input_shapes": [list(each) for each in shapes]} if len(shapes) > 1 else {}
    precision: _Precision = {"amp": amp} if amp else {}
    return {"format": WHATIF_FORMAT, "model": model, "input_shape": list(shapes[0]), **inputs,
            "dtype": dtype, **precision, "profile": profile,
            "device": scaled.device.name, "scaling": "weak" if weak_scaling else "strong",
            "devices_per_node": cluster_at(max(devices)).devices_per_node,
            "scale_inter_bw": scale_inter_bw, "scale_intra_bw": scale_intra_bw,
            "memory_bytes": scaled.device.memory_bytes, "max_stages": settings.max_stages,
            "one_device": asdict(reference), "rows": [row.to_dict() for row in rows]}
