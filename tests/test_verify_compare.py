"""``--verify``'s comparison (``runtime.verify``): rounding passes, real errors fail, both figures reported.

Single process: a gradient that is zero in exact arithmetic (a bias before
batch-norm) differs by 100 % of itself and passes, as mobilenet_v3_small's
did not; an error of a fraction of a percent of a tensor's own gradients
fails in float64 and in float32; the floor below float64 follows the
unsplit model's own float32 rounding; random ops that cannot be keyed are
listed, and the switchable ones run switched off on the reference.

Multi-rank, end to end: ``parplan run --verify`` split by rows passes
exactly in float64 for a model with active ``Dropout``, ``Dropout2d``,
``StochasticDepth`` and ``RReLU`` (reported switched off), and for one
returning a dict of two upsampled maps (its loss: the sum over both); split
by samples, for a model whose opaque block holds a dropout and a drop-path
(unkeyable: switched off on both sides and reported; nest_tiny differed by
its drop-path before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from torch import nn

from runtime.random_ops import DrawKey, KeyedInterpreter, random_ops
from runtime.verify import VERIFY_ATOL_EPS, Comparison, Reference, random_report

EPS64, EPS32 = torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps


def _comparison(dtype_eps: float, tolerance: float, scale: float = 0.7) -> Comparison:
    floor = VERIFY_ATOL_EPS * dtype_eps
    return Comparison(tolerance, output_scale=scale, gradient_scale=scale, output_floor=floor, gradient_floor=floor)


def test_a_zero_gradient_off_by_rounding_passes_and_both_figures_are_reported() -> None:
    comparison = _comparison(EPS64, 1e-9)
    truth = torch.tensor([5e-17, -3e-17, 1e-17], dtype=torch.float64)  # shift-invariant: zero up to rounding
    comparison.gradient("block.bias", truth + torch.tensor([9e-17, 0.0, 0.0], dtype=torch.float64), truth)
    ordinary = torch.linspace(-0.7, 0.7, 11, dtype=torch.float64)
    comparison.gradient("block.weight", ordinary * (1 + 1e-12), ordinary)
    report = comparison.report(torch.device("cpu"))
    assert report["passed"]
    # the zero gradient is off by 180 % of its own largest value — rounding over rounding: it is counted, and
    # compared by the model's scale only, so the relative figure is the real tensor's
    assert report["grad_zero_tensors"] == 1
    assert report["grad_max_rel_err"] == pytest.approx(1e-12, rel=1e-3)
    assert report["grad_max_abs_err"] == pytest.approx(7e-13 / 0.7, rel=1e-3)  # relative to the model's largest
    assert report["grad_atol"] == pytest.approx(VERIFY_ATOL_EPS * EPS64 * 0.7)
    assert report["worst_parameter_on_rank0"] == "block.bias"  # nearest its bound: 0.6 % of it


@pytest.mark.parametrize("eps, tolerance", [(EPS64, 1e-9), (EPS32, 1e-3)])
def test_a_real_error_still_fails(eps: float, tolerance: float) -> None:
    comparison = _comparison(eps, tolerance)
    expected = torch.linspace(-0.07, 0.07, 15, dtype=torch.float64)  # a tenth of the model's largest gradient
    wrong = expected.clone()
    wrong[3] += 0.005 * 0.07  # half a percent of its own largest value: a tile summed twice would do more
    comparison.gradient("layer.weight", expected, expected)
    comparison.gradient("other.weight", wrong, expected)
    report = comparison.report(torch.device("cpu"))
    assert not report["passed"] and report["worst_parameter_on_rank0"] == "other.weight"
    comparison = _comparison(eps, tolerance)
    comparison.output(wrong, expected)
    assert not comparison.report(torch.device("cpu"))["passed"]


def test_a_complex_gradient_is_compared_with_its_imaginary_part() -> None:
    """A spectral weight's gradient (complex64 split, complex128 yardstick): an error only in the imaginary part
    fails (it was cast to float64, dropping the imaginary part, and passed)."""
    expected = torch.tensor([0.3 + 0.4j, -0.2 + 0.1j, 0.05 - 0.5j], dtype=torch.complex128)
    comparison = _comparison(EPS32, 1e-3)
    comparison.gradient("spectral.weight", (expected + 0.01j).to(torch.complex64), expected)
    assert not comparison.report(torch.device("cpu"))["passed"]
    comparison = _comparison(EPS32, 1e-3)
    comparison.gradient("spectral.weight", expected.to(torch.complex64), expected)
    assert comparison.report(torch.device("cpu"))["passed"]


def _reference(dtype: torch.dtype) -> Reference:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)).to(dtype)
    x = torch.linspace(-3, 3, 8 * 64, dtype=torch.float64).reshape(8, 64).to(dtype)
    out = model(x)
    out.pow(2).sum().backward()
    return Reference(model, (out.detach(),))


def test_below_float64_the_floor_is_the_unsplit_models_own_rounding() -> None:
    narrow, wide = _reference(torch.float32), _reference(torch.float64)
    comparison = Comparison.of(narrow, torch.float32, 1e-3, wide)
    noise = max(float((p.grad.double() - q.grad).abs().max()) for p, q in zip(narrow.model.parameters(),
                                                                                wide.model.parameters()))
    assert noise > 0
    assert comparison.gradient_floor == pytest.approx(max(VERIFY_ATOL_EPS * EPS32, 4 * noise / comparison.gradient_scale))
    exact = Comparison.of(wide, torch.float64, 1e-9, None)
    assert exact.gradient_floor == VERIFY_ATOL_EPS * EPS64 and exact.output_floor == VERIFY_ATOL_EPS * EPS64
    assert comparison.report(torch.device("cpu"))["conclusive"]


def test_a_floor_that_would_let_real_errors_pass_is_reported_inconclusive() -> None:
    ill = Comparison(1e-3, output_scale=1.0, gradient_scale=1.0, output_floor=1e-5, gradient_floor=0.2)
    ill.gradient("w", torch.ones(3, dtype=torch.float64) * 1.1, torch.ones(3, dtype=torch.float64))
    report = ill.report(torch.device("cpu"))
    assert report["passed"] and not report["conclusive"] and "--dtype float64" in report["note"]


class Unkeyable(nn.Module):
    """RReLU can be switched off (its evaluation form); ``torch.randint`` can neither be keyed nor switched off."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) + torch.randint_like(x, 2)


def test_unkeyable_random_ops_are_listed_and_rrelu_runs_switched_off() -> None:
    from cost_models.ir.tracing import symbolic_trace

    model = Unkeyable().train()
    traced = symbolic_trace(model, ())
    report = random_report(random_ops(list(traced.graph.nodes), model).values())
    assert report == {"random_switched_off": ["act (rrelu)"], "random_left_on": ["randint_like (randint)"]}
    x = -torch.linspace(1, 2, 10, dtype=torch.float64)
    torch.manual_seed(1)
    off = KeyedInterpreter(traced, DrawKey(0, 0), root=model, switch_off=True).run(x)
    assert model.act.training  # switched off for the call only
    torch.manual_seed(1)
    assert torch.equal(off, model.eval()(x))
    torch.manual_seed(1)
    assert not torch.equal(off, model.train()(x))  # in training RReLU draws its slopes


# --- end to end -------------------------------------------------------------------------------------------


def random_net() -> nn.Module:
    """The keyed-random test model with an RReLU after it (``parplan run`` builds it by this file's path)."""
    from test_keyed_random import RandomNet

    return nn.Sequential(RandomNet(), nn.RReLU())


class Segmenter(nn.Module):
    """Returns a dict, as torchvision's segmentation models do, upsampled to ``x.shape[-2:]``, with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.drop = nn.Dropout2d(0.3)
        self.head, self.aux = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        size = x.shape[-2:]
        y = self.drop(torch.relu(self.down(x)))
        return {"out": nn.functional.interpolate(self.head(y), size=size, mode="bilinear", align_corners=False),
                "aux": nn.functional.interpolate(self.aux(y), size=size, mode="nearest")}


class DropPath(nn.Module):
    """timm's drop-path: one Bernoulli draw per sample, from torch's generator."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - self.drop_prob)
        return x * keep / (1 - self.drop_prob)


class UntracedBlock(nn.Module):
    """A residual block fx cannot trace (a loop over a shape): parplan keeps it opaque."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.drop, self.drop_path = nn.Conv2d(8, 8, 3, padding=1), nn.Dropout(0.3), DropPath(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(x.shape[1] // 8):  # once; a proxy for the tracer
            x = x + self.drop_path(self.drop(self.conv(x)))
        return x


def opaque_random() -> nn.Module:
    """Random modules inside an opaque block: unkeyable, so --verify switches them off on both sides."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), UntracedBlock(), nn.Conv2d(8, 4, 1))


@pytest.mark.multirank
@pytest.mark.parametrize(("model", "layout", "switched_off"), [
    ("random_net", "h2", ["_1 (rrelu)"]), ("Segmenter", "h2", []),
    ("opaque_random", "n2", ["_1.drop (Dropout inside opaque 1)", "_1.drop_path (DropPath inside opaque 1)"])])
def test_parplan_run_verify_keeps_random_layers_on_and_passes_exactly(repo: Path, model: str, layout: str,
                                                                      switched_off: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo / "tests")}
    command = [str(Path(sys.executable).parent / "parplan"), "run", "--model", f"tests/test_verify_compare.py:{model}",
               "--input-shape", "4,3,12,10", "--dtype", "float64", "--layout", layout, "--nproc", "2", "--steps", "1",
               "--warmup", "0", "--verify", "--json"]
    run = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    verified = document["verify"]
    assert verified["passed"] and verified["grad_max_abs_err"] < 1e-13 and verified["output_max_abs_err"] < 1e-13
    assert verified["random_switched_off"] == switched_off and verified["random_left_on"] == []
    assert {"grad_max_rel_err", "output_max_rel_err", "grad_atol", "output_atol"} <= set(verified)
    assert document["plan"]["summary"].startswith(layout)


def test_a_reused_reference_is_the_one_computed_for_the_same_model_and_batches_and_only_that() -> None:
    from runtime.verify import reference_step

    builds: list[torch.dtype] = []

    def build(dtype: torch.dtype) -> nn.Module:
        builds.append(dtype)
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).to(dtype)

    x, labels = torch.randn(2, 3, 8, 8), torch.tensor([1, 3])
    batches = [(x, labels, DrawKey(0, 0))]
    first = reference_step(build, (), torch.float64, batches, reuse=("net", 0))
    assert reference_step(build, (), torch.float64, [(x.clone(), labels.clone(), DrawKey(0, 0))],
                          reuse=("net", 0)) is first
    fresh = reference_step(build, (), torch.float64, batches)  # without reuse: computed again, equal
    assert fresh is not first and torch.equal(fresh.model[0].weight.grad, first.model[0].weight.grad)
    other_batch = reference_step(build, (), torch.float64, [(x + 1, labels, DrawKey(0, 0))], reuse=("net", 0))
    other_key = reference_step(build, (), torch.float64, [(x, labels, DrawKey(0, 1))], reuse=("net", 0))
    other_model = reference_step(build, (), torch.float64, batches, reuse=("net", 1))
    assert len({id(first), id(other_batch), id(other_key), id(other_model)}) == 4
    assert builds == [torch.float64] * 5
    from runtime.verify import keep_references_of

    keep_references_of(("net", 1))  # the other model's is kept, this one's too
    assert reference_step(build, (), torch.float64, batches, reuse=("net", 1)) is other_model
    keep_references_of(("net", 0))  # dropped: built again
    assert reference_step(build, (), torch.float64, batches, reuse=("net", 1)) is not other_model


# ------------------------------------------------ a wrong split fails in float32, a right one passes (issue 53)
PLANTED_SHAPE = (4, 3, 16, 12)


def planted_net() -> nn.Module:
    """Convolutions with batch-norm and a classifier: every gradient depends on each halo row."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


ROUNDING_SIZED = 1e6
"""The second plant scales a halo row by ``1 + ROUNDING_SIZED·eps``: 12 % in float32, 2.2e-10 in float64 — a
split whose float32 result is far off and whose float64 one within 1e-9, as a float32 gap of rounding is."""


def _planted_halo_row(exchange: object, plant: str) -> object:
    """``exchange_halo`` with the first row received from the tile before zeroed (``drop``: a planted bug) or
    scaled by ``1 + ROUNDING_SIZED·eps`` of its dtype (``rounding``: off in float32 only)."""
    def planted(tile: torch.Tensor, dim: int, window: object, *args: object) -> torch.Tensor:
        out = exchange(tile, dim, window, *args)  # type: ignore[operator]
        if getattr(window, "before", None) is None:
            return out
        mask = torch.ones_like(out)
        row = 0.0 if plant == "drop" else 1.0 + ROUNDING_SIZED * torch.finfo(out.dtype).eps
        mask.narrow(dim, 0, 1).fill_(row)
        return out * mask
    return planted


def _verify_in_ranks(rank: int, world: int, dtype: str, plant: str | None) -> dict[str, object] | None:
    import runtime.overlap
    import runtime.spatial
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from parplan.cli.layouts import layout_plan
    from runtime.options import RunOptions
    from runtime.train import worker

    if plant:  # in the joined form (the superposed one receives its halos inside one autograd function)
        for module in (runtime.spatial, runtime.overlap):
            module.exchange_halo = _planted_halo_row(module.exchange_halo, plant)  # type: ignore[attr-defined]
        runtime.spatial.conv_form = lambda *_args, **_kwargs: "joined"  # type: ignore[assignment]
    spec = f"{Path(__file__).resolve()}:planted_net"
    graph = trace(planted_net(), PLANTED_SHAPE, getattr(torch, dtype))
    options = RunOptions(model=spec, input_shape=PLANTED_SHAPE, dtype=dtype, steps=0, warmup=0, verify=True,
                         plan=layout_plan(graph, Layout.parse("h2"), spec).to_dict(), threads=1, quiet=True,
                         graph=graph)
    document = worker(options)
    return None if document is None else dict(document["verify"])  # type: ignore[arg-type]


@pytest.mark.multirank
def test_a_planted_halo_error_fails_in_float32_and_float64_and_the_right_split_passes() -> None:
    """One halo row dropped: ``--verify`` in float32 at the default tolerance fails, and its float64 recheck
    fails too (a wrong split is wrong in every dtype); without the plant it passes. A gap of float32 only (a
    halo row off by 1e6 of the dtype's epsilon) fails the float32 comparison and passes by its float64 recheck,
    saying so — on any CPU, where a real model's float32 gap depends on the CPU's kernels (RegNetY-400MF under
    w2: 0.3 on an AVX2 AMD EPYC, within rounding on an AVX-512 Xeon)."""
    from distributed import run_ranks

    wrong = run_ranks(_verify_in_ranks, 2, ("float32", "drop"), timeout_s=300)[0]
    assert wrong is not None and not wrong["passed"], wrong
    assert wrong["float64"]["passed"] is False and wrong["float64"]["grad_max_rel_err"] > 1e-3, wrong
    narrow = run_ranks(_verify_in_ranks, 2, ("float32", "rounding"), timeout_s=300)[0]
    assert narrow is not None and narrow["passed"] and narrow["float64"]["passed"], narrow
    assert narrow["grad_max_rel_err"] > 1e-3 > 1e-9 > narrow["float64"]["grad_max_rel_err"], narrow
    assert "gap is rounding" in str(narrow["note"]), narrow
    from runtime.verify import float64_verdict  # parplan check's words for it

    assert float64_verdict(narrow["float64"]).endswith("(passes: float32 rounding)")
    right = run_ranks(_verify_in_ranks, 2, ("float32", None), timeout_s=300)[0]
    assert right is not None and right["passed"] and "float64" not in right, right


def test_a_model_that_does_not_run_in_float64_is_verified_without_its_rounding_twin() -> None:
    """physicsnemo's AFNO computes its spectral layers in ``x.float()`` whatever the weights' dtype: its float64
    twin fails (a dtype mismatch in ``einsum``), which killed rank 0 of every float32 verify; now the comparison
    allows no rounding beyond its tolerance, and a failed verify is not rechecked in float64, saying why."""
    from runtime.shared_reference import shared_rounding
    from runtime.verify import recheck_in_float64

    def refuses() -> Any:
        raise RuntimeError("expected scalar type Double but found Float")

    assert shared_rounding(cast(Any, None), refuses, torch.device("cpu")) is None
    failed = {"passed": False, "conclusive": True}
    rechecked = recheck_in_float64(failed, torch.float32, refuses)
    assert not rechecked["passed"] and "does not run in float64" in str(rechecked["note"])
