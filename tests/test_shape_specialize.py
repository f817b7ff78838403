"""Python decisions on shapes are taken at trace time for the given input shapes (``cost_models.ir.specialize``).

Single process: a forward that checks its input (``x.ndim``, ``h % 4``, ``len(x.shape)``, ``if kwargs``) and
branches on its width traces at the shapes given, taking the branch an input of that shape takes, each
decision recorded with this file's line and part of the fingerprint, the shape arithmetic only decisions read
left out of the graph; a shape the model itself rejects is its own message; control flow on tensor values,
or on a tensor's length, is refused naming the line — in the root, as a trace error; in a submodule, which is
then kept opaque. Without shapes, torch.fx's refusal stands.

Several ranks (gloo, float64, exact): the checked model equals the unsplit model under ``n2``, ``h2`` and ``c2``.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from distributed import run_ranks
from torch import nn

from cost_models.errors import TraceError
from cost_models.ir.tracing import symbolic_trace, trace

WIDE, NARROW = (4, 3, 8, 12), (4, 3, 8, 8)


class CheckedNet(nn.Module):
    """Checks its input as segmentation libraries do, and picks a branch by the input's width."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.wide = nn.Conv2d(6, 5, 3, padding=1)
        self.narrow = nn.Conv2d(6, 5, 1)
        self.norm = nn.BatchNorm2d(5)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if x.ndim != 4 or len(x.shape) != 4:
            raise ValueError(f"expected a 4-D input, got {x.ndim}-D")
        h, w = x.shape[-2:]
        if h % 4 != 0 or w % 4 != 0:
            raise ValueError(f"the input's height and width must be divisible by 4, got {h}x{w}")
        if kwargs:
            raise TypeError("no keyword inputs")
        y = torch.relu(self.conv(x))
        y = self.wide(y) if w > 8 else self.narrow(y)
        size = [d // 2 for d in y.shape[2:]]
        z = F.interpolate(self.norm(F.avg_pool2d(y, 2)), size=[2 * d for d in size], mode="nearest")
        return (z * y).mean((2, 3))  # five classes


class ValueBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.sum() > 0:  # control flow on values
            return y
        return -y


class NumpyChecked(nn.Module):
    """MONAI's SwinUNETR: the input's size checked in numpy (``np.array(x_in.shape[2:])``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (np.array(x.shape[2:]) % 4 > 0).any():
            raise ValueError(f"spatial shape {tuple(np.array(x.shape))} must be divisible by 4")
        return self.conv(x)


class NumpyValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * float(np.array(x.sum()))  # a tensor's value in numpy


class Wrapped(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.head = inner, nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x))


class LengthLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.conv(x[i:i + 1])[0] for i in range(len(x))])  # one sample at a time


class Timestepped(nn.Module):
    """diffusers' pattern: a timestep that may be a Python number or a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, timestep: Any) -> torch.Tensor:
        if not torch.is_tensor(timestep):
            timestep = torch.tensor([timestep], dtype=torch.long)
        return self.conv(x) * timestep.view(-1, 1, 1, 1)


def returns_tuple_when_asked(forward: Any) -> Any:
    """Hugging Face transformers' ``can_return_tuple``: a ``(self, *args, **kwargs)`` wrapper of the forward that
    pops an option from ``kwargs``."""

    @functools.wraps(forward)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        as_tuple = kwargs.pop("return_tuple", False)
        output = forward(self, *args, **kwargs)
        return (output,) if as_tuple else output

    return wrapper


class Decorated(nn.Module):
    """A root forward behind a variadic decorator, with an optional and a keyword-only argument."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    @returns_tuple_when_asked
    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None, *, scale: float = 2.0,
                **kwargs: Any) -> torch.Tensor:
        y = self.conv(x) * scale
        return y if labels is None else y - labels


class GridCache(nn.Module):
    """neuraloperator's grid embedding: the last resolution and its grid cached on the module by the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self._res: Any = None
        self._grid: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._grid is None or self._res != x.shape[2:]:
            self._grid = torch.linspace(0, 1, x.shape[3], dtype=x.dtype).expand(x.shape[0], 1, *x.shape[2:])
            self._res = x.shape[2:]
        return self.conv(torch.cat((x, self._grid), dim=1))


class BufferCache(nn.Module):
    """timm's ConViT: relative indices computed by the forward for its token count, kept in a registered buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("offsets", torch.zeros(1, 1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offsets.shape[3] != x.shape[3]:
            self.offsets = torch.arange(x.shape[3], dtype=x.dtype).view(1, 1, 1, -1)
        return self.conv(x) + self.offsets


def _model(cls: type[nn.Module] = CheckedNet) -> nn.Module:
    torch.manual_seed(0)
    return cls().double().train()


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if text in line)


def test_shape_checks_trace_for_the_given_shapes_and_take_the_branch_that_shape_takes() -> None:
    wide, narrow = trace(_model(), WIDE), trace(_model(), NARROW)
    assert "wide" in wide and "narrow" not in wide
    assert "narrow" in narrow and "wide" not in narrow
    where = {entry[0] for entry in wide.graph["specialized"]}
    assert f"tests/test_shape_specialize.py:{_line_of('if w > 8')}" in where
    assert f"tests/test_shape_specialize.py:{_line_of('if kwargs:')}" in where
    assert wide.graph["specialized"] != narrow.graph["specialized"]  # the branch taken is in the fingerprint
    traced = symbolic_trace(_model(), (), shapes=[WIDE])
    decided = {operator.mod, operator.ne, operator.or_, operator.gt}
    assert not [node for node in traced.graph.nodes if node.target in decided]  # only decisions read them
    x = torch.randn(WIDE, dtype=torch.float64)
    torch.testing.assert_close(traced(x), _model()(x), rtol=0, atol=0)


def test_a_shape_the_model_rejects_is_its_own_message() -> None:
    with pytest.raises(TraceError, match="rejects input shape 4,3,8,10: .*must be divisible by 4, got 8x10"):
        trace(_model(), (4, 3, 8, 10))


def test_sizes_read_into_numpy_are_their_values_and_a_tensors_values_are_refused() -> None:
    """SwinUNETR's numpy check of its input's size failed every trace ("invalid __array_struct__")."""
    graph = trace(_model(NumpyChecked), NARROW)
    assert [entry[2] for entry in graph.graph["specialized"]] == ["(8, 8)"]  # the branch the size takes
    with pytest.raises(TraceError, match="rejects input shape 4,3,8,10: .*must be divisible by 4"):
        trace(_model(NumpyChecked), (4, 3, 8, 10))
    with pytest.raises(TraceError, match=f"tensor values at tests/test_shape_specialize.py:{_line_of('x.sum()))')}"):
        trace(_model(NumpyValues), NARROW)


def test_control_flow_on_values_is_refused_naming_the_line() -> None:
    line = f"tests/test_shape_specialize.py:{_line_of('if y.sum() > 0')}"
    with pytest.raises(TraceError, match=f"tensor values at {line}"):
        trace(_model(ValueBranch), NARROW)
    traced = symbolic_trace(Wrapped(ValueBranch()), (), shapes=[NARROW])  # in a submodule: kept opaque
    (entry,) = traced.meta["opaque_modules"]
    assert entry["module"] == "inner" and line in entry["reason"]
    (entry,) = trace(Wrapped(LengthLoop()), NARROW).graph["opaque_modules"]
    assert entry["module"] == "inner" and "a tensor's len (its first extent)" in entry["reason"]


def test_a_traced_timestep_is_a_tensor() -> None:
    """``torch.is_tensor`` of a traced input is true, as of the tensor it stands for (it was false, so the trace
    took the branch for a Python number and failed in ``torch.tensor([proxy])``)."""
    graph = trace(Timestepped(), [(4, 3, 8, 8), (4,)])
    assert [graph.nodes[name]["kind"] for name in graph][:3] == ["input", "input", "conv"]
    assert not any(graph.nodes[name]["target"] == "tensor" for name in graph)
    assert torch.is_tensor(torch.zeros(1)) and not torch.is_tensor(3)  # restored


def test_a_root_forward_behind_a_variadic_decorator_traces_with_the_signature_it_wraps() -> None:
    """torch.fx read the wrapped parameters but called the wrapper with them: its ``kwargs`` got ``None``
    (``'NoneType' object has no attribute 'pop'``, every transformers v5 model)."""
    model = _model(Decorated)
    traced = symbolic_trace(model, (), shapes=[NARROW])
    x = torch.randn(NARROW, dtype=torch.float64)
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)
    assert Decorated.forward.__code__.co_flags & 0x0C  # the class keeps its decorated forward
    assert [graph_node for graph_node in trace(_model(Decorated), NARROW)][:2] == ["x", "conv"]


def test_what_a_forward_caches_on_its_modules_is_taken_back_after_the_trace() -> None:
    """The second trace of a model compared the first trace's proxy with its own ("the model rejects input
    shape …: getitem_1", neuraloperator's FNO under ``parplan check``)."""
    model = _model(GridCache)
    first = symbolic_trace(model, (), shapes=[NARROW])
    assert model._grid is None and model._res is None  # as before the trace
    second = symbolic_trace(model, (), shapes=[NARROW])
    x = torch.randn(NARROW, dtype=torch.float64)
    for traced in (first, second):
        torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)


def test_what_a_forward_stores_in_a_registered_buffer_is_taken_back_after_the_trace() -> None:
    """timm's ConViT left a proxy in its ``rel_indices`` buffer: the next trace of the model failed on it, and
    every verify of ``parplan check`` was refused."""
    model = _model(BufferCache)
    graphs = [trace(model, NARROW) for _ in range(2)]
    assert torch.is_tensor(model.offsets) and model.offsets.shape == (1, 1, 1, 1)  # as before the trace
    assert graphs[0].graph["fingerprint"] == graphs[1].graph["fingerprint"]


def test_without_shapes_torch_fx_refuses_as_before() -> None:
    with pytest.raises(TraceError, match="cannot be used as inputs to control flow"):
        symbolic_trace(_model(), ())


# --- several ranks ----------------------------------------------------------------------------------------


def _cases(rank: int, world: int) -> dict[str, dict[str, str]]:
    from runtime_check import step_cases

    return step_cases([("checked", "n2"), ("checked", "h2"), ("checked", "c2")], world,
                      lambda name: _model(), lambda name: WIDE)


@pytest.mark.multirank
def test_a_model_checking_its_shapes_equals_the_unsplit_model_under_splits() -> None:
    results = run_ranks(_cases, 2, timeout_s=300)[0]
    assert results["checked n2"]["wide"] == "n2" and results["checked h2"]["wide"] == "h2"
    assert results["checked c2"]["conv"] == "c2"


class MergedSamples(nn.Module):
    """mobilevit's transformer: patches folded into the batch (``B·P`` rows), then timm's ``qkv.unbind(0)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.qkv = nn.Conv2d(3, 8, 1), nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = self.conv(x).shape
        tokens = self.conv(x).reshape(b, c, h * w // 4, 4).transpose(1, 3).reshape(b * 4, h * w // 4, c)
        q, k, v = self.qkv(tokens).reshape(b * 4, h * w // 4, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return (q * k + v).mean((1, 2, 3)).reshape(b, 4).mean(1, keepdim=True).expand(b, 5)


def test_pieces_of_merged_samples_have_no_sample_axis_and_run_whole_under_a_sample_split() -> None:
    """An unbind of a value whose samples are merged with other rows gave its pieces a 5-letter order for 4-D
    pieces, so the predicate let ``n2`` split them and the runtime failed after its ranks started (mobilevit,
    naflexvit, once traced through): the pieces' order has their rank and no sample axis."""
    from cost_models.capability.predicate import layer_refusal
    from cost_models.layout import Layout

    graph = trace(_model(MergedSamples), (4, 3, 4, 4))
    unbind = graph.nodes["unbind"]
    assert unbind.attrs["piece_order"] == "...." and graph.nodes["getitem_4"].attrs["order"] == "...."
    assert layer_refusal(unbind, Layout(n=2)) and layer_refusal(graph.nodes["getitem_4"], Layout(n=2))
    assert Layout(n=2).fits((4, 12, 0, 64)) and Layout().fits((4, 12, 0, 64))  # an empty extent not split fits
    assert not Layout(h=2).fits((4, 12, 0, 64))
