"""The patterns of real models that made ranks fail (model-zoo issue 18), each in a tiny hand-built model.

Single process: what the predicate and the pre-flight say about each pattern — tensors computed from
parameters alone (a relative position bias, a concatenated qkv bias, a layer scale viewed ``(C, 1, 1)``)
are constants, run whole whatever the plan says; a permutation that moves the samples out of dimension 0
takes no sample split; an upsampling whose input is one row high reads it whole under a row split; ``F.batch_norm``
(timm's ``BatchNormAct2d``) splits by sample and space even with synchronised statistics.

Multi-rank (2 gloo ranks, float64, exact): each model under each layout family equals the unsplit model —
output, every gradient (the parameters read by element-wise layers under a channel or spatial split
summed over exactly the ranks that hold their parts) and batch-norm's running statistics — and the
attention model with its tensor constants cut into two pipeline stages (the stage cut and the stage's
interpreter trace the model twice: fx names the constants differently each time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from runtime_check import assert_split_matches
from torch import nn

from cost_models.capability.predicate import layer_refusal
from cost_models.layout import Layout

SHAPE = (4, 3, 8, 8)


class BiasedAttention(nn.Module):
    """beit and TNT: a relative position bias gathered from its table by a buffer's view (a tensor constant),
    a qkv bias concatenated from parameters and a buffer, a permutation moving the samples to dimension 1."""

    def __init__(self, dim: int = 8, heads: int = 2, side: int = 4) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.embed = nn.Conv2d(3, dim, 2, stride=2)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.randn(dim)), nn.Parameter(torch.randn(dim))
        self.register_buffer("k_bias", torch.zeros(dim), persistent=False)
        self.table = nn.Parameter(torch.randn((2 * side - 1) ** 2, heads))
        grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")).flatten(1)
        offsets = (grid[:, :, None] - grid[:, None, :]).permute(1, 2, 0) + side - 1
        self.register_buffer("index", offsets[..., 0] * (2 * side - 1) + offsets[..., 1], persistent=False)
        self.head = nn.Linear(dim, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        n, length, dim = tokens.shape
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        qkv = F.linear(tokens, self.qkv.weight, bias).reshape(n, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        relative = self.table[self.index.view(-1)].view(length, length, -1).permute(2, 0, 1).contiguous()
        attention = (q @ k.transpose(-2, -1)) * self.scale + relative.unsqueeze(0)
        out = (attention.softmax(dim=-1) @ v).transpose(1, 2).reshape(n, length, dim)
        return self.head(out.mean(dim=1))


class LayerScaled(nn.Module):
    """fastvit and poolformerv2: layer scales ``(C, 1, 1)`` and ``(C,)`` viewed ``(C, 1, 1)``, a positional
    parameter ``(1, C, H, W)``, a class bias ``(K,)``: element-wise with split activations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.gamma = nn.Parameter(torch.randn(8, 1, 1))
        self.scale = nn.Parameter(torch.randn(8))
        self.position = nn.Parameter(torch.randn(1, 8, *SHAPE[2:]))
        self.fc = nn.Linear(8, 6)
        self.class_bias = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x)) + self.position
        y = y + self.gamma * self.conv2(y)
        y = y * self.scale.view(8, 1, 1) - self.scale.reshape(1, 8, 1, 1).sigmoid()
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1)) + self.class_bias


class FunctionalBatchNorm(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d``: a batch-norm module whose forward calls ``F.batch_norm`` (traced through)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                                   self.momentum, self.eps))


class PooledContext(nn.Module):
    """efficientformerv2: a map pooled to one row and column, upsampled back and added; ``F.batch_norm``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = FunctionalBatchNorm(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x))
        context = F.interpolate(F.avg_pool2d(y, SHAPE[2]), scale_factor=SHAPE[2], mode="nearest")
        return self.fc(F.adaptive_avg_pool2d(self.conv2(y + context), 1).flatten(1))


class Flipper(nn.Module):
    """Kept opaque (``leaf_modules``): a call returning ``(rows reversed, None)``, which the trace cannot shape."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.flip(x, [2]) * 2.0, None


class UntracedCalls(nn.Module):
    """Calls returning ``(out, None)``: a module mixing rows, and ``nn.MultiheadAttention`` (``need_weights=False``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.flip = Flipper()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(torch.relu(self.flip(self.conv(x))[0]))
        tokens = y.flatten(2).transpose(1, 2)
        mixed = self.attention(tokens, tokens, tokens, need_weights=False)[0]
        return self.fc(mixed.mean(dim=1))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "attention": BiasedAttention, "layer_scale": LayerScaled, "pooled_context": PooledContext,
    "untraced": UntracedCalls,
}
LEAVES = {"untraced": ("Flipper",)}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().double().train()


def _plan(name: str, size: int, layouts: Sequence[str]) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.uniform import uniform_plan

    graph = trace(_model(name), SHAPE, torch.float64, LEAVES.get(name, ()))
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=size, devices_per_node=size, memory_bytes=2**34, intra=link, inter=link)
    return uniform_plan(graph, cluster, [*(Layout.parse(text) for text in layouts), Layout()]), graph


# --- single process ---------------------------------------------------------------------------------------


def test_tensors_of_parameters_alone_are_constants_run_whole_whatever_the_plan_says() -> None:
    from cost_models.ir.tracing import symbolic_trace
    from runtime.preflight import check_runnable, held_plan
    from runtime.shapes import constant_nodes

    for name, expected in (("attention", {"cat", "getitem_6"}),
                           ("layer_scale", {"view", "reshape", "sigmoid"})):
        model = _model(name)
        plan, graph = _plan(name, 2, ["c2", "n2"])
        nodes = list(symbolic_trace(model, ()).graph.nodes)
        assert constant_nodes(nodes, frozenset(graph.nodes)) == expected, name  # the table's view reads T: not
        held = held_plan(plan, nodes, graph)
        assert all(held.layers[layer].layout == Layout() for layer in expected)
        check_runnable(model, plan, graph, verify=True)  # a view of a parameter under n2/c2 no longer blocks it


def test_a_permutation_moving_the_samples_takes_no_sample_split() -> None:
    plan, graph = _plan("attention", 2, ["n2"])
    moving = graph.nodes["permute"]
    assert "moves the split samples" in layer_refusal(moving, Layout(n=2))
    assert plan.layers["permute"].layout == Layout()
    assert layer_refusal(graph.nodes["transpose"], Layout(n=2)) is None  # (N, D, T) → (N, T, D) keeps them
    assert layer_refusal(graph.nodes["reshape"], Layout(n=2)) is None  # (N, T, 3D) → (N, T, 3, h, d)
    regroup = {**graph.nodes["reshape"], "input_shapes": [[4, 16, 24]], "output_shape": [64, 24]}
    assert layer_refusal(regroup, Layout(n=2)) is None  # samples 2k, 2k+1 are rows 32k…32k+31: the same elements
    crossed = {**regroup, "input_shapes": [[4, 3, 32]], "output_shape": [3, 128]}
    assert "moves the split samples" in layer_refusal(crossed, Layout(n=2))


def test_the_preflight_checks_a_permutation_by_its_dimensions_not_its_extents() -> None:
    from cost_models.ir.tracing import symbolic_trace
    from runtime.shapes import shape_refusals

    class Square(nn.Module):  # (4, 4, 6) → (4, 4, 6): extents equal, the samples move to dimension 1
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x[:, :, :6] * 2.0).permute(1, 0, 2).contiguous().sum(dim=2)

    model = Square()
    from cost_models.ir.tracing import trace

    graph = trace(model, (4, 4, 6))  # a 3-D input: no order names its axes
    nodes = list(symbolic_trace(model, ()).graph.nodes)
    layouts = {name: Layout(n=2) for name in graph.nodes}
    refused = shape_refusals(nodes, graph, layouts, 2, lambda node: None)
    assert any("'permute'" in why and "does not become its part" in why for why in refused)
    assert layer_refusal(graph.nodes["permute"], Layout(n=2)) is None  # the predicate cannot tell from extents
    named = trace(nn.Flatten(2), (4, 4, 2, 3))  # a map's positions flattened: a sequence, its samples named
    assert named.nodes["_0" if "_0" in named.nodes else list(named.nodes)[-1]]["attrs"].get("order") == "ncw"


def test_an_upsampling_of_one_row_reads_it_whole_and_functional_batchnorm_splits() -> None:
    plan, graph = _plan("pooled_context", 2, ["h2"])
    upsample = next(name for name in graph.nodes if graph.nodes[name]["kind"] == "upsample")
    assert layer_refusal(graph.nodes[upsample], Layout(h=2, w=2)) is None  # each tile reads the 1×1 map whole
    assert plan.layers[upsample].layout == Layout(h=2)
    norm = graph.nodes["batch_norm"]
    assert norm["attrs"]["function_form"]
    for layout in (Layout(n=2), Layout(h=2), Layout(n=2, w=2)):
        assert layer_refusal(norm, layout, sync_batchnorm=True) is None, layout
    assert "function call" in layer_refusal(norm, Layout(c=2))  # its weight and statistics are not sliced


def test_a_per_channel_activation_weight_takes_no_channel_split() -> None:
    from cost_models.ir.tracing import trace

    graph = trace(nn.Sequential(nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.PReLU()), SHAPE)
    assert "not sliced by channel" in layer_refusal(graph.nodes["_1"], Layout(c=2))
    assert layer_refusal(graph.nodes["_1"], Layout(h=2)) is None
    assert layer_refusal(graph.nodes["_2"], Layout(c=2)) is None  # one weight for every channel


# --- several ranks ----------------------------------------------------------------------------------------


def _batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    classes = 6 if name == "layer_scale" else 5
    return (torch.randn(SHAPE, dtype=torch.float64, generator=generator),
            torch.randint(0, classes, (SHAPE[0],), generator=generator))


def _split_equals_unsplit(name: str, world: int, layouts: Sequence[str]) -> dict[str, str]:
    """One step of ``name`` under ``layouts`` (batch-norm synchronised) against the unsplit model, exactly."""
    from runtime.apply import apply_plan

    plan, graph = _plan(name, world, layouts)
    split = apply_plan(_model(name), plan, graph=graph, sync_batchnorm=True, leaf_modules=LEAVES.get(name, ()))
    reference = _model(name)
    x, target = _batch(name)
    out = split(split.shard(x))
    split.loss(out, target[split.target_box(tuple(target.shape))]).backward()
    expected = reference(x)
    F.cross_entropy(expected, target).backward()
    context = f"{name} under {layouts}"
    assert_split_matches(split, reference, out, expected, context)
    sliced = {piece.name: piece for piece in split.slices}
    buffers = dict(reference.named_buffers())
    for buffer, value in split.model.named_buffers():
        piece = sliced.get(buffer.rsplit(".", 1)[0] + ".weight")
        full = buffers[buffer][piece.start:piece.stop] if piece is not None and value.dim() == 1 else buffers[buffer]
        torch.testing.assert_close(value, full, msg=lambda m: f"{context} buffer {buffer}: {m}")
    return {layer: str(assignment.layout) for layer, assignment in plan.layers.items()}


def _pipeline_of_constants(rank: int, world: int) -> int:
    """The attention model in two stages: the stage cut's trace and the interpreter's name constants apart."""
    from cost_models.uniform import staged
    from runtime.pipeline.schedules import one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    plan, graph = _plan("attention", 1, [])
    plan = staged(plan, graph, ["getitem_6"], "sync", 2)  # the bias table's lookup starts stage 1
    model = _model("attention")
    stage = apply_pipeline(model, plan, graph=graph)
    stage.keep_outputs = True
    reference = _model("attention")
    x, target = _batch("attention")
    half = SHAPE[0] // 2

    def data(b: int) -> tuple[Any, Any]:
        return (x[b * half:(b + 1) * half] if stage.first else None,
                target[b * half:(b + 1) * half] if stage.last else None)

    events = [e for e in one_f_one_b(2, stage.index, 2) if e.kind != "U"]
    stage.run(events, torch.optim.SGD(stage.parameters(), lr=0.0), data, last_backward=1)
    for b in range(2):
        out = reference(x[b * half:(b + 1) * half])
        (F.cross_entropy(out, target[b * half:(b + 1) * half]) / 2).backward()
        if stage.last:
            torch.testing.assert_close(stage.outputs[b], out.detach())
    grads = dict(reference.named_parameters())
    for param in stage.parameters():
        name = next(n for n, p in stage.model.model.named_parameters() if p is param)
        torch.testing.assert_close(param.grad, grads[name].grad, msg=lambda m: f"stage {stage.index} {name}: {m}")
    return len(stage.parameters())


CASES = {"attention": (["n2"],), "layer_scale": (["c2"], ["h2"], ["n2"]), "pooled_context": (["n2"], ["h2"]),
         "untraced": (["h2"], ["n2"])}


def _cases(rank: int, world: int) -> dict[str, Any]:
    results: dict[str, Any] = {f"{name} {layouts[0]}": _split_equals_unsplit(name, world, layouts)
                               for name, families in CASES.items() for layouts in families}
    results["pipeline"] = _pipeline_of_constants(rank, world)
    return results


@pytest.mark.multirank
def test_the_zoo_patterns_equal_the_unsplit_model_on_two_ranks() -> None:
    every = run_ranks(_cases, 2, timeout_s=300)
    results = every[0]
    attention = results["attention n2"]
    assert attention["linear"] == "n2" and attention["permute"] == "n1" and attention["matmul"] == "n2"
    for layout, layer in (("c2", "mul"), ("h2", "mul"), ("h2", "add"), ("c2", "add_2"), ("n2", "mul_1")):
        assert results[f"layer_scale {layout}"][layer] == layout, (layout, layer)  # split, reading a parameter
    assert results["pooled_context n2"]["batch_norm"] == "n2" and results["pooled_context h2"]["batch_norm"] == "h2"
    assert results["pooled_context h2"]["interpolate"] == "h2"  # the 1×1 context read whole by each tile
    assert results["untraced h2"]["conv"] == "h2" and results["untraced n2"]["conv2"] == "n2"
    assert sum(rank["pipeline"] for rank in every) == len(list(_model("attention").parameters()))
