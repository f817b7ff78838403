"""Tier 1–2: kernels timed in model order with the host's other ranks busy, and the optimizer step, priced."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from calibrate.busy import Busy
from calibrate.optimizer_bench import measure_optimizers, parameter_shapes
from calibrate.sequences import layout_chunks, time_chunks
from cost_models.estimate import estimate
from cost_models.layout import Layout
from cost_models.memory import parameter_tensors
from cost_models.profile import OptimizerFit, Profile
from examples.unet import unet
from parplan.api import trace
from tests.test_estimate import PROFILE, conv_graph, plan_for


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201
    return trace(unet(), (2, 3, 32, 32))


def test_a_chunk_runs_forward_in_model_order_then_backward_in_reverse(graph) -> None:  # noqa: ANN001
    from calibrate.kernels import TIMED_KINDS
    from calibrate.sequences import Call
    from cost_models.local_problem import local_problem, phases_of

    chunks = layout_chunks(graph, (1,), 2**40)
    assert len(chunks) == 1 and chunks[0].layout == Layout()
    problems = [local_problem(graph.nodes[name], Layout(), 4, "float32") for name in graph.compute_layers()]
    problems = [p for p in problems if p is not None and p.kind in TIMED_KINDS]
    backward = [Call(p, phase) for p in reversed(problems) for phase in phases_of(p) if phase != "fwd"]
    assert chunks[0].calls == tuple([Call(p, "fwd") for p in problems] + backward)
    assert {c.phase for c in chunks[0].calls} >= {"fwd", "bwd_data", "bwd_weight", "bwd"}


def test_chunks_respect_the_memory_cap(graph) -> None:  # noqa: ANN001
    whole = layout_chunks(graph, (1, 2), 2**40)
    small_cap = max(chunk.footprint_bytes for chunk in whole) // 3
    cut = layout_chunks(graph, (1, 2), small_cap)
    assert len(cut) > len(whole)
    assert all(chunk.footprint_bytes <= small_cap for chunk in cut)
    assert {c.layout for c in cut} == {c.layout for c in whole}


def test_every_pass_is_timed_with_a_busy_helper(graph) -> None:  # noqa: ANN001
    chunks = layout_chunks(graph, (1, 2), 2**40)
    with Busy(chunks, helpers=1, threads=1, device="cpu") as busy:
        samples, interrupted = time_chunks(chunks, time.monotonic() + 60, "cpu", busy=busy)
    assert busy.failed is None and not interrupted
    wanted = {(call.problem.key, call.phase) for chunk in chunks for call in chunk.calls
              if call.problem.kind not in ("flatten",)}
    assert {(s.key, s.phase) for s in samples} == wanted
    assert all(s.median_s > 0 and s.repeats >= 1 for s in samples)  # how many repeats fit: the machine's load


def test_optimizer_fits_price_bytes_and_tensors(graph) -> None:  # noqa: ANN001
    whole, half = parameter_shapes(graph, 1), parameter_shapes(graph, 2)
    assert len(whole) == len(half) == sum(parameter_tensors(graph.nodes[n]) for n in graph.compute_layers())
    fits, notes = measure_optimizers(graph, "cpu", time.monotonic() + 60)
    assert not notes and [f.optimizer for f in fits] == ["sgd", "momentum", "adam"]
    for fit in fits:  # how steep each is, the machine's speed and load decide (benchmarks/calibration_fit.py)
        assert fit.s_per_byte >= 0 and fit.s_per_tensor >= 0 and fit.n_train >= 2
        assert fit.time_s(len(whole), 4e6) >= fit.time_s(len(whole), 1e6) > 0


def test_the_estimate_adds_the_optimizer_step_once_per_iteration() -> None:
    graph = conv_graph()
    fit = OptimizerFit("sgd", s_per_tensor=1e-3, s_per_byte=1e-9, n_train=4)
    priced = replace(PROFILE, optimizer_fits=(fit,))
    for layout in (Layout(), Layout(c=2)):
        plan = plan_for(graph, layout.ranks, {"conv": layout, "relu": layout})
        base, stepped = estimate(graph, plan, PROFILE), estimate(graph, plan, priced)
        weights = 16 * 16 * 9 * 4 // layout.c
        assert stepped.breakdown_s["optimizer"] == pytest.approx(1e-3 + weights * 1e-9)
        assert stepped.iteration_s == pytest.approx(base.iteration_s + stepped.breakdown_s["optimizer"])
    assert estimate(graph, plan, priced, optimizer="adam").breakdown_s["optimizer"] == 0.0  # not calibrated


def test_profiles_keep_their_optimizer_fits(tmp_path) -> None:  # noqa: ANN001
    from cost_models.profile import load_profile, save_profile

    fit = OptimizerFit("momentum", 2e-6, 3e-10, 4)
    save_profile(replace(PROFILE, optimizer_fits=(fit,)), tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")
    assert loaded.optimizer_fits == (fit,) and isinstance(loaded, Profile)
    assert loaded.optimizer_step_s("momentum", 3, 1000) == pytest.approx(3 * 2e-6 + 1000 * 3e-10)


def test_a_kernels_growth_per_thread_is_measured_at_another_thread_count() -> None:
    import os

    import torch

    from calibrate.sequences import growth_per_thread, peak_bytes

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    mib = 1 << 20

    def per_thread() -> None:  # a workspace per thread, as oneDNN's weight-gradient convolution keeps
        torch.empty(torch.get_num_threads() * mib, dtype=torch.uint8).fill_(1)

    def fixed() -> None:
        torch.empty(3 * mib, dtype=torch.uint8).fill_(1)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kernels = [per_thread, None, fixed]
        peaks = peak_bytes(kernels, torch.device("cpu"))
        assert peaks == [mib, None, 3 * mib]
        assert growth_per_thread(kernels, torch.device("cpu"), peaks) == [mib, None, 0]
        assert torch.get_num_threads() == 1  # restored
        assert growth_per_thread(kernels, torch.device("meta"), peaks) == [None, None, None]
    finally:
        torch.set_num_threads(threads)


def test_a_run_with_more_threads_than_calibration_is_priced_with_their_workspace() -> None:
    from cost_models.local_problem import local_problem
    from cost_models.profile import ComputeSample

    graph = conv_graph()
    problem = local_problem(graph.nodes["conv"], Layout(), 4, "float32")
    assert problem is not None
    workspace, growth = 256 << 20, 32 << 20  # large enough to be the step's peak
    sample = ComputeSample(problem.kind, "bwd_weight", problem.key, 1, 1, 1e-3, 0.0, 3, workspace, growth)
    profile = replace(PROFILE, meta={"source": "measured", "threads_per_rank": 1}, compute_samples=(sample,))
    plan = plan_for(graph, 1, {"conv": Layout(), "relu": Layout()})
    calibrated = estimate(graph, plan, profile).memory_bytes_max
    assert estimate(graph, plan, profile, threads=1).memory_bytes_max == calibrated
    assert estimate(graph, plan, profile, threads=3).memory_bytes_max == calibrated + 2 * growth
    without = replace(profile, compute_samples=(replace(sample, peak_bytes_per_thread=None),))
    assert estimate(graph, plan, without, threads=3).memory_bytes_max == calibrated


def test_a_chunks_first_guess_comes_from_the_device_s_own_speed() -> None:
    """Before a chunk is timed its pass is guessed from a matmul and a copy timed on the device, within 10× of the
    pass as measured on a quiet machine (30× under load): a fixed guess (once 1 GFLOP/s) skipped every chunk of
    ResNet-50 at 32×224² on any device. One thread: several threads on cores another
    job holds wait at every parallel region's barrier, and the pass took 50× its quiet time (1.53 s against 0.03)."""
    import torch

    from calibrate.sequences import device_rates

    big = trace(unet(), (2, 3, 96, 96))
    chunk = layout_chunks(big, (1,), 2**40)[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flops_per_s, bytes_per_s = device_rates(torch.device("cpu"))
        samples, _ = time_chunks([chunk], time.monotonic() + 60, "cpu")
    finally:
        torch.set_num_threads(threads)
    measured_s = sum(sample.median_s for sample in samples)
    # within 30×, a loaded machine's spread (the fixed guess was ~60× off here, and more on a GPU)
    assert measured_s / 30 < chunk.guess_s(flops_per_s, bytes_per_s) < 30 * measured_s


def test_a_one_rank_profile_plans_one_device() -> None:
    """A profile calibrated on one rank has no link fits; one device sends nothing, so it still plans it."""
    from cost_models.ir.tracing import trace as trace_graph
    from planner.search import plan_model
    from planner.settings import SearchSettings

    alone = replace(PROFILE, comm_fits=())
    graph = trace_graph(unet(), (2, 3, 32, 32))
    result = plan_model(graph, alone, alone.cluster(1), SearchSettings(max_stages=1))
    assert result.plan.cluster.devices == 1 and result.estimate.breakdown_s["redistribution"] == 0
