"""Complex parameters keep their dtype (issue 53, item 3): ``complex64`` ↔ ``complex128`` with ``--dtype``.

``Module.to(dtype=torch.float64)`` casts a complex parameter to float64, dropping its imaginary part: a Fourier
neural operator then failed every layout ("expected scalar type ComplexFloat but found Float"), and in float64
tracing said "the model rejects input shape"; a complex activation crossing a pipeline cut was received in
half its bytes and gloo aborted the rank. The tracer's fake copy and every rank's model now cast complex
tensors to the run dtype's complex counterpart; tracing records each complex output's dtype
(``attrs["output_dtype"]``), which a pipeline receives it (and its gradient) in; the ``--verify`` reference
ships gradients one buffer per dtype. Checked: the dtypes, the trace, one float64 step under ``n2`` and ``c2``
on 2 ranks against the unsplit model (output and every gradient, the complex weight's included), and two
pipeline stages cut where complex values cross.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from distributed import run_ranks
from runtime_check import split_step_matches, uniform_test_plan

SPEC = f"{Path(__file__).with_name('small_models.py')}:spectral"
SHAPE = (4, 3, 16, 16)


def _model(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    from runtime.seeded_model import seeded_model

    return seeded_model(SPEC, 0, dtype, torch.device("cpu"))


def test_complex_parameters_take_the_complex_counterpart_of_the_run_dtype() -> None:
    for dtype, complex_dtype in ((torch.float64, torch.complex128), (torch.float32, torch.complex64)):
        model = _model(dtype)
        assert model.weight.dtype == complex_dtype and model.lift.weight.dtype == dtype
        assert model.weight.imag.abs().sum() > 0  # the imaginary part kept


def test_a_complex_model_traces_in_float64() -> None:
    from cost_models.ir.tracing import trace

    graph = trace(_model(), SHAPE, torch.float64)
    assert graph.graph["dtype"] == "float64" and "einsum" in graph.nodes


def _pipeline() -> None:
    """Two stages, the second from ``einsum`` on: the complex spectrum crosses the cut (two micro-batches)."""
    import torch.nn.functional as F

    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan
    from runtime.pipeline.schedules import one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    graph = trace(_model(), SHAPE, torch.float64)
    assert graph.nodes["getitem"].attrs["output_dtype"] == "complex128"
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=1, devices_per_node=1, memory_bytes=2**34, intra=link, inter=link)
    plan = staged(uniform_plan(graph, cluster, [Layout()]), graph, ["einsum"], "sync", 2)
    stage = apply_pipeline(_model(), plan, graph=graph)
    stage.keep_outputs = True
    reference = _model()
    generator = torch.Generator().manual_seed(3)
    x, target = torch.randn(SHAPE, dtype=torch.float64, generator=generator), torch.tensor([1, 4, 0, 2])

    def data(b: int) -> tuple[object, object]:
        return (x[2 * b:2 * b + 2] if stage.first else None, target[2 * b:2 * b + 2] if stage.last else None)

    events = [e for e in one_f_one_b(2, stage.index, 2) if e.kind != "U"]
    stage.run(events, torch.optim.SGD(stage.parameters(), lr=0.0), data, last_backward=1)
    for b in range(2):
        out = reference(x[2 * b:2 * b + 2])
        (F.cross_entropy(out, target[2 * b:2 * b + 2]) / 2).backward()
        if stage.last:
            torch.testing.assert_close(stage.outputs[b], out.detach())
    grads = dict(reference.named_parameters())
    for param in stage.parameters():
        key = next(n for n, p in stage.model.model.named_parameters() if p is param)
        torch.testing.assert_close(param.grad, grads[key].grad, msg=lambda m: f"stage {stage.index} {key}: {m}")


def _steps(rank: int, world: int) -> list[str]:
    from cost_models.ir.tracing import trace

    layouts = []
    for layout in ("n2", "c2", "h2"):  # h2: irfft2 runs whole, given the unsplit s= it reads from a row tile
        graph = trace(_model(), SHAPE, torch.float64)
        plan = uniform_test_plan(graph, world, [layout])
        split_step_matches(_model, plan, graph, SHAPE, f"spectral under {layout}")
        layouts.append(plan.summary())
    _pipeline()
    return layouts


@pytest.mark.multirank
def test_a_complex_model_equals_the_unsplit_model_under_splits_and_across_a_cut() -> None:
    summaries = run_ranks(_steps, 2, timeout_s=300)[0]
    assert summaries[0].startswith("n2") and "c2" in summaries[1] and "h2" in summaries[2]
