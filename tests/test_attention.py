"""Attention layers: traced as one layer each, counted, refused where they cannot split, timed by calibration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from calibrate.kernels import build_kernel
from cost_models.capability.predicate import layer_refusal
from cost_models.ir.flops import attention_flops
from cost_models.ir.tracing import trace
from cost_models.layout import Layout
from cost_models.local_problem import layer_problem
from examples.vit import vit_tiny


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` with the samples first or (``batch_first=False``) second."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, batch_first=batch_first)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


class FusedAttention(nn.Module):
    """timm's form: one projection to queries, keys and values, ``F.scaled_dot_product_attention`` between them."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(2, 7, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 7, 8)


def _attention(graph):  # noqa: ANN001, ANN202 - a LayerGraph's attention layers' data
    return [data for _, data in graph.nodes(data=True) if data["kind"] == "attention"]


def test_a_vision_transformer_traces_its_attention_and_counts_every_parameter() -> None:
    model = vit_tiny()
    graph = trace(model, (2, 3, 64, 64))
    layers = _attention(graph)
    assert len(layers) == 2  # one per encoder layer: (out, None) was dropped before, with its weights
    assert graph.graph["unused_params"] == 0
    assert graph.totals()["params"] == sum(p.numel() for p in model.parameters())
    assert layers[0]["attrs"] == {"form": "module", "embed_dim": 32, "num_heads": 2, "kdim": 32, "vdim": 32,
                                  "batch_first": True, "dropout": 0.0, "extra_keys": False, "masked": False,
                                  "order": "nwc", "input_orders": ["nwc"]}
    for layout in (Layout(n=2, w=2), Layout(c=2), Layout(c=2, w=2)):  # queries by token, keys whole; by heads
        assert layer_refusal(layers[0], layout) is None, layout
    assert "2 heads into 4 parts" in layer_refusal(layers[0], Layout(c=4))
    assert "no h axis" in layer_refusal(layers[0], Layout(h=2))


def test_tokens_hold_their_length_as_w_and_their_embedding_as_c() -> None:
    """(N, C, H, W) patches flattened to (N, C, H·W) are a sequence; transposed, tokens (N, L, E): ``nwc``. The
    class token's concatenation and everything after it keep that order, so ``t2`` (``w2``) splits tokens."""
    graph = trace(vit_tiny(), (2, 3, 64, 64))
    orders = {name: data["attrs"].get("order") for name, data in graph.nodes(data=True)}
    assert orders["reshape"] == "ncw" and orders["permute"] == "nwc" and orders["cat"] == "nwc"
    assert orders["encoder_layers_encoder_layer_1_mlp_3"] == "nwc" and orders["getitem_5"] == "nwc"
    assert Layout.parse("n2·t2") == Layout(n=2, w=2)
    mlp, norm = graph.nodes["encoder_layers_encoder_layer_0_mlp_0"], graph.nodes["encoder_layers_encoder_layer_0_ln_1"]
    for layout in (Layout(w=2), Layout(c=2), Layout(n=2, c=2, w=2)):  # per token; by columns (filters)
        assert layer_refusal(mlp, layout) is None, layout
    assert layer_refusal(norm, Layout(w=2)) is None and "c2" in layer_refusal(norm, Layout(c=2))
    assert "class token" in layer_refusal(graph.nodes["cat"], Layout(w=2))


def test_attention_flops_equal_the_counted_projections_and_matrix_products() -> None:
    module, x = nn.MultiheadAttention(16, 2, batch_first=True), torch.randn(2, 17, 16)
    with FlopCounterMode(display=False) as projections:
        module(x, x, x, need_weights=False)
    q, k, v = (torch.randn(2, 2, 17, 8) for _ in range(3))
    with FlopCounterMode(display=False) as products:  # the attention as matrix products (CPU's fused kernel: uncounted)
        torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    scores = 2 * 2 * 17 * 17
    attrs = {"form": "module", "embed_dim": 16, "num_heads": 2, "batch_first": True}
    whole = attention_flops([[2, 17, 16]], [2, 17, 16], attrs, needs_input_grad=True, has_weight=True)
    assert whole.fwd == projections.get_total_flops() + products.get_total_flops() + 4 * scores
    fused = attention_flops([[2, 2, 17, 8]] * 3, [2, 2, 17, 8], {"form": "sdpa"}, needs_input_grad=True, has_weight=False)
    assert fused.fwd == products.get_total_flops() + 4 * scores and fused.bwd_weight == 0
    assert whole.bwd_weight == projections.get_total_flops() and whole.bwd_data > whole.fwd


def test_attention_splits_by_sample_where_its_samples_are_in_dimension_zero() -> None:
    first = _attention(trace(SelfAttention(True), (2, 5, 16)))[0]
    second = _attention(trace(SelfAttention(False), (5, 2, 16)))[0]
    fused = _attention(trace(FusedAttention(), (2, 7, 8)))[0]
    assert fused["attrs"]["form"] == "sdpa" and fused["flops_fwd"] > 0
    assert layer_refusal(first, Layout(n=2)) is None and layer_refusal(fused, Layout(n=2)) is None
    assert "batch_first=True" in layer_refusal(second, Layout(n=2))
    for layout in (Layout(c=2), Layout(w=2)):  # tokens not named (a model input), the heads of sdpa: not yet
        assert layer_refusal(first, layout) is not None and layer_refusal(fused, layout) is not None


def test_timms_attention_keeps_its_tokens_named_through_the_heads() -> None:
    from tests.small_models import timm_vit_tiny

    graph = trace(timm_vit_tiny(), (4, 3, 64, 64))
    orders = {name: data["attrs"].get("order") for name, data in graph.nodes(data=True)}
    assert orders["flatten"] == "ncw" and orders["permute"] == ".n.w." and orders["getitem_8"] == "n.w."
    assert orders["reshape_1"] == "nwc"  # the heads' features merged back: the embedding
    unbind, fused = graph.nodes["unbind"], graph.nodes["scaled_dot_product_attention"]
    assert unbind["attrs"]["pieces_drop"] and layer_refusal(unbind, Layout(n=2, w=2)) is None
    assert layer_refusal(fused, Layout(w=2)) is None and "no c axis" in layer_refusal(fused, Layout(c=2))
    problem = layer_problem(fused, Layout(w=2), "float32")
    assert problem.input_shapes == ((4, 3, 9, 64), (4, 3, 17, 64), (4, 3, 17, 64))


def test_fused_attention_splits_tokens_only_where_dimension_two_names_them() -> None:
    """CaiT's class attention: a query of one token (x[:, 0], no named axes: its (N, H, 1, D) permuted from the
    default nchw names D as w) — not a token split; an unbind of unnamed values is kept whole (DaViT)."""
    import timm

    graph = trace(timm.create_model("cait_xxs24_224", img_size=32, num_classes=10, depth=1), (4, 3, 32, 32))
    fused = [data for _, data in graph.nodes(data=True) if data["kind"] == "attention"]
    assert fused and all(layer_refusal(layer, Layout(w=2)) is not None for layer in fused[1:])
    class_attention = fused[-1]
    assert class_attention["input_shapes"][0][2] == 1 and "dimension 2" in layer_refusal(class_attention, Layout(w=2))
    davit = trace(timm.create_model("davit_tiny", num_classes=10), (2, 3, 32, 32))
    assert "not named" in layer_refusal(davit.nodes["unbind"], Layout(c=2))


def test_attention_split_by_tokens_reads_every_token_for_its_keys_and_values() -> None:
    from cost_models.edges import edge_move

    graph = trace(vit_tiny(), (4, 3, 64, 64))
    layer = graph.nodes["encoder_layers_encoder_layer_0_self_attention"]
    problem = layer_problem(layer, Layout(w=2), "float32")
    assert problem.input_shapes == ((4, 9, 32), (4, 17, 32), (4, 17, 32))  # 9 of 17 queries, every key and value
    whole = layer_problem(layer, Layout(), "float32")
    assert whole.flops.fwd > problem.flops.fwd > whole.flops.fwd / 2  # the keys' and values' projections: all
    move = edge_move(graph.nodes["encoder_layers_encoder_layer_0_ln_1"], layer, Layout(w=2), Layout(w=2))
    assert move == ((4, 32, 17), Layout(w=2), Layout())  # an all-gather of the tokens, priced as a sequence


def test_attention_split_by_heads_computes_its_share_and_gathers_the_heads() -> None:
    from cost_models.layer_cost import layer_cost

    graph = trace(vit_tiny(), (4, 3, 64, 64))
    layer = graph.nodes["encoder_layers_encoder_layer_0_self_attention"]
    whole, heads = layer_problem(layer, Layout(), "float32"), layer_problem(layer, Layout(c=2), "float32")
    assert heads.input_shapes == ((4, 17, 32),) and heads.output_shape == (4, 17, 16)  # input whole in channels
    assert heads.flops.fwd == whole.flops.fwd // 2  # one head of two: half of every projection and score
    from calibrate.presets import preset_cluster, preset_profile

    cluster = preset_cluster("h100", 2)
    cost = layer_cost("a", layer, Layout(c=2), 2, preset_profile("h100"), cluster, 4, "float32")
    assert cost.channel_reduce_s > 0  # the heads gathered, the input gradients summed


@pytest.mark.parametrize("model, shape", [(SelfAttention(True), (2, 5, 16)), (FusedAttention(), (2, 7, 8))])
def test_calibration_times_both_attention_forms(model: nn.Module, shape: tuple[int, ...]) -> None:
    layer = _attention(trace(model, shape))[0]
    problem = layer_problem(layer, Layout(n=2), "float32")
    assert problem is not None and problem.input_shapes[0][0] == 1
    for phase in ("fwd", "bwd"):
        build_kernel(problem, phase, torch.device("cpu"))()


def test_a_filter_split_of_a_layer_reading_parameters_alone_sums_no_input_gradient() -> None:
    """swinv2_cr's meta MLP: ``nn.Linear`` of a constant table (no traced input, no input gradient) under ``c2``
    (the attention change to ``_channel_reduce_s`` once read its missing input's shape)."""
    from calibrate.presets import preset_cluster, preset_profile
    from cost_models.layer_cost import layer_cost

    class Table(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 8)
            self.register_buffer("coords", torch.randn(4, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc(self.coords).sum()

    graph = trace(Table(), (2, 8, 4, 4))
    layer = graph.nodes["fc"]
    assert layer["input_shapes"] == [] and not layer["needs_input_grad"]
    cost = layer_cost("fc", layer, Layout(c=2), 2, preset_profile("h100"), preset_cluster("h100", 2), 4, "float32")
    assert cost.channel_reduce_s == 0.0
