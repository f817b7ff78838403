"""Tier 2: tracing real models into LayerGraphs (single process, torch on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
import torch
from conftest import ALL_MODELS, SMALL_SHAPE, build_model
from torch import nn

from cost_models.errors import InputError, TraceError
from cost_models.ir.graph import LayerGraph, compute_fingerprint
from cost_models.ir.tracing import trace


@pytest.fixture(scope="module", params=ALL_MODELS)
def traced(request: pytest.FixtureRequest) -> tuple[str, nn.Module, LayerGraph]:
    model = build_model(request.param)
    return request.param, model, trace(model, SMALL_SHAPE)


def test_parameter_total_is_exact(traced: tuple[str, nn.Module, LayerGraph]) -> None:
    _, model, graph = traced
    assert graph.totals()["params"] == sum(p.numel() for p in model.parameters())
    assert graph.graph["unused_params"] == 0
    assert graph.totals()["param_bytes"] == 4 * graph.totals()["params"]


def test_output_shape_matches_a_real_forward(traced: tuple[str, nn.Module, LayerGraph]) -> None:
    _, model, graph = traced
    with torch.no_grad():
        output = model(torch.randn(SMALL_SHAPE))
    (name,) = graph.graph["outputs"]
    assert graph.nodes[name]["output_shape"] == list(output.shape)


def test_graph_structure(traced: tuple[str, nn.Module, LayerGraph]) -> None:
    _, _, graph = traced
    assert nx.is_directed_acyclic_graph(graph)
    order = {name: index for index, name in enumerate(graph.layers())}
    assert all(order[u] < order[v] for u, v in graph.edges)
    assert [n for n, d in graph.nodes(data=True) if d["kind"] == "input"] == [graph.layers()[0]]
    for src, dst, data in graph.edges(data=True):
        assert data["bytes"] == graph.nodes[src]["activation_bytes"] > 0
        assert data["shape"] in graph.nodes[dst]["input_shapes"]
    assert "other" not in {d["kind"] for _, d in graph.nodes(data=True)}


def test_fingerprint_is_stable_and_shape_sensitive(traced: tuple[str, nn.Module, LayerGraph]) -> None:
    name, _, graph = traced
    again = trace(build_model(name), SMALL_SHAPE)
    assert again.fingerprint == graph.fingerprint
    assert trace(build_model(name), (4, 3, 64, 64)).fingerprint != graph.fingerprint
    round_tripped = LayerGraph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert compute_fingerprint(round_tripped) == graph.fingerprint
    assert round_tripped.totals() == graph.totals()


def test_layer_attributes_for_cost_models() -> None:
    graph = trace(build_model("resnet18"), SMALL_SHAPE)
    conv1 = graph.nodes["conv1"]
    assert conv1["kind"] == "conv" and conv1["module"] == "conv1"
    assert conv1["attrs"]["kernel_size"] == [7, 7] and conv1["attrs"]["stride"] == [2, 2]
    assert conv1["attrs"]["padding"] == [3, 3] and conv1["attrs"]["dilation"] == [1, 1]
    assert conv1["weight_shape"] == [64, 3, 7, 7] and conv1["params"] == 64 * 3 * 49
    assert conv1["flops_bwd_data"] == 0 < conv1["flops_bwd_weight"]
    assert graph.nodes["layer1_0_conv1"]["flops_bwd_data"] == graph.nodes["layer1_0_conv1"]["flops_fwd"]
    assert graph.nodes["maxpool"]["attrs"]["kernel_size"] == 3
    add = graph.nodes["add"]
    assert add["kind"] == "add" and add["module"] == "layer1.0" and graph.in_degree("add") == 2
    assert graph.nodes["relu"]["aliases_input"] is True


def test_concatenation_and_grouped_convolutions() -> None:
    dense = trace(build_model("densenet121"), SMALL_SHAPE)
    cats = [d for _, d in dense.nodes(data=True) if d["kind"] == "cat"]
    assert cats and all(d["attrs"]["dim"] == 1 for d in cats)
    mobile = trace(build_model("mobilenet_v2"), SMALL_SHAPE)
    depthwise = [d for _, d in mobile.nodes(data=True) if d["kind"] == "conv" and d["attrs"]["groups"] > 1]
    assert depthwise and all(d["attrs"]["groups"] == d["weight_shape"][0] for d in depthwise)


def test_unet_upsampling_and_skips() -> None:
    graph = trace(build_model("unet"), SMALL_SHAPE)
    kinds = [d["kind"] for _, d in graph.nodes(data=True)]
    assert {"conv_transpose", "upsample", "cat", "maxpool"} <= set(kinds)
    upsample = next(d for _, d in graph.nodes(data=True) if d["kind"] == "upsample")
    assert upsample["attrs"]["scale_factor"] == 2.0 and upsample["attrs"]["mode"] == "bilinear"
    for name, data in graph.nodes(data=True):
        if data["kind"] == "cat":
            assert graph.in_degree(name) == 2  # the skip and the upsampled tensor


def test_huge_input_costs_no_memory() -> None:
    graph = trace(build_model("resnet50"), (64, 3, 2048, 2048))
    assert graph.nodes["conv1"]["output_shape"] == [64, 64, 1024, 1024]
    assert graph.totals()["activation_bytes"] > 500 * 2**30  # far more than this machine has
    assert graph.totals()["params"] == 25_557_032


def test_tracing_keeps_the_models_modes() -> None:
    model = build_model("vgg11").eval()
    trace(model, SMALL_SHAPE)
    assert not any(module.training for module in model.modules())


def test_dtype_sets_bytes() -> None:
    graph = trace(build_model("resnet18"), SMALL_SHAPE, dtype=torch.bfloat16)
    assert graph.graph["dtype"] == "bfloat16"
    assert graph.nodes["conv1"]["activation_bytes"] == 2 * 2 * 64 * 32 * 32


class _ShapeDependent(nn.Module):
    """Iterates its input's samples: torch.fx cannot trace it (a split changes their count), fake tensors can run
    it. (A branch on a shape traces: ``tests/test_shape_specialize.py``.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([sample * 2 for sample in x])


class _ValueDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


class _Wrapper(nn.Module):
    def __init__(self, gate: type[nn.Module] = _ShapeDependent) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.conv(x))


def test_an_untraceable_module_is_kept_opaque_and_named() -> None:
    automatic = trace(_Wrapper(), SMALL_SHAPE)
    assert [entry["module"] for entry in automatic.graph["opaque_modules"]] == ["gate"]
    assert automatic.nodes["gate"]["kind"] == "other"
    graph = trace(_Wrapper(), SMALL_SHAPE, leaf_modules=["gate"])
    assert graph.nodes["gate"]["kind"] == "other"
    assert graph.nodes["gate"]["output_shape"] == [2, 4, 64, 64]
    by_class = trace(_Wrapper(), SMALL_SHAPE, leaf_modules=["_ShapeDependent"])
    assert by_class.fingerprint == graph.fingerprint


def test_value_dependent_leaf_is_reported() -> None:
    with pytest.raises(TraceError, match=r"layer 'gate' .* needs tensor values .* depend on shapes only"):
        trace(_Wrapper(_ValueDependent), SMALL_SHAPE, leaf_modules=["gate"])


def test_rejected_input_names_the_layer() -> None:
    with pytest.raises(TraceError, match=r"rejects input shape 2,4,64,64 at layer 'conv1'.*3 channels"):
        trace(build_model("resnet18"), (2, 4, 64, 64))


@pytest.mark.parametrize("shape", [(2, 3, 64), (2, 3, 0, 64), (2, 3, 64, 64, 1), "2,3,a,64"])
def test_bad_input_shapes(shape: object) -> None:
    with pytest.raises(InputError, match="input shape"):
        trace(build_model("resnet18"), shape)  # type: ignore[arg-type]


def test_not_a_module() -> None:
    with pytest.raises(InputError, match="expected a torch.nn.Module"):
        trace(lambda x: x, SMALL_SHAPE)


class _Tied(nn.Module):
    """One convolution applied twice: its weights are counted once, its work twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.conv(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_weights_are_counted_once(dtype: torch.dtype) -> None:
    graph = trace(_Tied(), SMALL_SHAPE, dtype=dtype)
    convs = [d for _, d in graph.nodes(data=True) if d["kind"] == "conv"]
    assert len(convs) == 2 and convs[0]["flops_fwd"] == convs[1]["flops_fwd"]
    assert graph.totals()["params"] == 3 * 3 * 9 + 3
    assert convs[1]["flops_bwd_weight"] > 0  # the second use still computes a weight gradient


class _Checkpointed(nn.Module):
    """A block run under ``torch.utils.checkpoint`` (re-entrant or not) between two plain layers."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(4, 2, 1)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_regions_are_traced_through_and_named(reentrant: bool, tmp_path, capsys) -> None:  # noqa: ANN001
    """torch.fx traces a checkpointed region inline, so parplan runs it without recomputation: the graph names
    the region (``recomputed``) and every command tracing it says so in one line (issue 53, item 7)."""
    if not hasattr(torch.utils.checkpoint, "_checkpoint_impl"):
        pytest.skip("this torch calls no _checkpoint_impl: regions are traced through unnamed")
    graph = trace(_Checkpointed(reentrant), (2, 4, 8, 8))
    assert graph.graph["recomputed"] == ["block"]
    assert [graph.nodes[name].kind for name in graph.compute_layers()] == ["conv", "activation", "conv"]
    assert trace(nn.Sequential(nn.Conv2d(4, 2, 1)), (2, 4, 8, 8)).graph["recomputed"] == []

    from parplan.cli import main

    model = tmp_path / "checkpointed.py"
    here = str(Path(__file__).parent)
    model.write_text(f"import sys\nsys.path.insert(0, {here!r})\nfrom test_trace import _Checkpointed\n\n"
                     f"def build():\n    return _Checkpointed({reentrant!r})\n")
    assert main(["inspect", "--model", f"{model}:build", "--input-shape", "2,4,8,8", "--json"]) == 0
    err = capsys.readouterr().err
    assert "warning: torch.utils.checkpoint in block is traced through" in err and "without recomputation" in err
