"""Timing kernels as a training step runs them: in model order, with the host's other ranks busy.

A kernel timed alone, again and again on the same tensors, finds its weights
and inputs in cache. In a step, a layer's weights were last touched a whole
step earlier, and the other ranks on the host share the cores' caches and the
memory bandwidth. Measured on the 2-core development VM (resnet18, 4 samples,
one thread): the convolutions of ``layer4`` (9 MiB of weights each) took
1.5–1.9× their isolated time inside a step, the model's convolutions
together 1.39× forward and backward.

So each candidate layout's local problems are run as a step runs them: every
layer's forward in model order, then the backward passes in reverse, each
kernel on tensors of its own (two layers of the same shape do not share a
warm weight), each call timed by itself. The sequence repeats; each
(problem, pass) gets the median of all its calls. With ``helpers`` the same
sequences run meanwhile in that many other processes, as the other ranks of
a run on this host would.

After the timed passes, one more pass measures each call's peak bytes — the
most it had allocated at once: its outputs and its kernel's workspace (on CPU
from ``torch.profiler``'s allocation events inside the call, on CUDA
``max_memory_allocated`` over it) — which the memory model adds to a layer's
transient (``cost_models.memory``). On CPU a second such pass at another
thread count (the host's cores, or one thread) says how much of it grows per
thread (oneDNN's weight-gradient convolution keeps a workspace per thread:
36 MiB at one thread and 72 at two on resnet18's 2×2 ``layer4`` maps), so a
run with more threads per rank than calibration's is priced with its own.

Assumptions: a layer's input and output are as cold as its weights (the
kernels do not hand tensors to each other); sequences longer than the memory
cap are cut into chunks of consecutive layers, each run by itself; the
first pass of a chunk warms it up and counts only when no second pass fits.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

import torch

from calibrate.kernels import TIMED_KINDS, build_kernel
from calibrate.problems import Call
from cost_models.layout import Layout, layouts_dividing
from cost_models.local_problem import LocalProblem, layer_problem, phases_of
from cost_models.profile import ComputeSample
from processes.quiet import native_stderr_silenced

if TYPE_CHECKING:
    from calibrate.busy import Busy
    from cost_models.ir.graph import LayerGraph

__all__ = ["Call", "Chunk", "growth_per_thread", "layout_chunks", "peak_bytes", "time_chunks"]

MAX_PASSES = 9
"""Timed passes per chunk at most (after the warm-up pass)."""
PROBE_SIDE = 1024
"""The square matmul (and the copy of its operand) that :func:`device_rates` times before any chunk."""
Progress = Callable[[str, int, int], None]
_WINDOW = "parplan.kernel."


@dataclass(frozen=True)
class Chunk:
    """Consecutive layers of one layout: their forward calls in order, then their backward calls in reverse."""

    layout: Layout
    calls: tuple[Call, ...]

    @property
    def footprint_bytes(self) -> int:
        """Memory its kernels hold at once."""
        return sum(_footprint_bytes(problem) for problem in {id(c.problem): c.problem for c in self.calls}.values())

    def guess_s(self, flops_per_s: float, bytes_per_s: float) -> float:
        """A rough duration of one pass, before any of it was timed."""
        return sum(call.flops / flops_per_s + call.bytes / bytes_per_s for call in self.calls)


def device_rates(device: torch.device, repeats: int = 3) -> tuple[float, float]:
    """FLOP/s of a ``PROBE_SIDE``² matmul and bytes/s of a copy on ``device`` (the best of ``repeats``): what a
    chunk's first pass is guessed to take before anything of it is timed, so a budget skips only what cannot fit.

    A fixed guess cannot serve both a 2-core VM and a GPU 1000 times faster: too slow a guess skips every chunk
    of a large model on the GPU, too fast a one starts a chunk on the CPU that outlasts the budget.
    """
    a = torch.randn(PROBE_SIDE, PROBE_SIDE, device=device)
    out = torch.empty_like(a)
    flops_s = copy_s = float("inf")
    for _ in range(repeats + 1):  # the first call warms up
        flops_s = min(flops_s, _timed(lambda: torch.mm(a, a, out=out), device))
        copy_s = min(copy_s, _timed(lambda: out.copy_(a), device))
    return 2 * PROBE_SIDE ** 3 / max(flops_s, 1e-9), 2 * a.numel() * a.element_size() / max(copy_s, 1e-9)


def _timed(kernel: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    kernel()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def layout_chunks(graph: LayerGraph, device_counts: Iterable[int], max_bytes: int) -> list[Chunk]:
    """Every candidate layout's sequence of ``graph``'s timed layers, cut into chunks of at most ``max_bytes``.

    A layer whose local problem alone exceeds ``max_bytes`` is left out (the fitted model prices it).
    """
    layouts = sorted({layout for devices in device_counts for layout in layouts_dividing(devices)},
                     key=lambda layout: (layout.ranks, layout.parts()))
    chunks: list[Chunk] = []
    for layout in layouts:
        problems = [layer_problem(graph.nodes[name], layout, graph.graph["dtype"])
                    for name in graph.compute_layers()]
        timed = [p for p in problems if p is not None and p.kind in TIMED_KINDS and _footprint_bytes(p) <= max_bytes]
        chunks += [_chunk(layout, group) for group in _groups(timed, max_bytes)]
    return chunks


def _groups(problems: Sequence[LocalProblem], max_bytes: int) -> list[list[LocalProblem]]:
    groups: list[list[LocalProblem]] = [[]]
    held = 0
    for problem in problems:
        size = _footprint_bytes(problem)
        if groups[-1] and held + size > max_bytes:
            groups.append([])
            held = 0
        groups[-1].append(problem)
        held += size
    return [group for group in groups if group]


def _chunk(layout: Layout, problems: Sequence[LocalProblem]) -> Chunk:
    forward = [Call(p, "fwd") for p in problems]
    backward = [Call(p, phase) for p in reversed(problems) for phase in phases_of(p) if phase != "fwd"]
    return Chunk(layout, tuple(forward + backward))


def _footprint_bytes(problem: LocalProblem) -> int:
    """Memory one problem's kernels need: inputs, output, weight, and their gradients (twice the tensors)."""
    elements = sum(prod(shape) for shape in problem.input_shapes) + prod(problem.output_shape)
    elements += prod(problem.weight_shape) if problem.weight_shape else 0
    return 2 * elements * problem.itemsize


def build_chunk(chunk: Chunk, device: torch.device) -> list[Callable[[], object] | None]:
    """One kernel per call (its own tensors); ``None`` where this device has no kernel for the form."""
    kernels: list[Callable[[], object] | None] = []
    for call in chunk.calls:
        try:
            kernels.append(build_kernel(call.problem, call.phase, device))
        except ValueError:
            kernels.append(None)
    return kernels


def time_chunks(chunks: Sequence[Chunk], deadline: float, device: str, *, busy: Busy | None = None,
                progress: Progress | None = None) -> tuple[list[ComputeSample], bool]:
    """Run every chunk's passes until ``deadline``; the samples per (problem, pass), and whether Ctrl-C stopped it.

    ``busy`` (a :class:`calibrate.busy.Busy`) is switched to each chunk before it is timed.
    """
    target = torch.device(device)
    seconds: dict[tuple[str, str], list[float]] = {}
    calls: dict[tuple[str, str], Call] = {}
    peaks: dict[tuple[str, str], tuple[int, int | None]] = {}
    flops_per_s, bytes_per_s = device_rates(target) if chunks else (1.0, 1.0)
    try:
        for index, chunk in enumerate(chunks):
            left_s = deadline - time.monotonic()
            if left_s <= 0 or 3 * chunk.guess_s(flops_per_s, bytes_per_s) > left_s:
                continue  # left to the fitted model: building, warming up and one pass must fit
            if busy is not None:
                busy.run(index)
            timed = _time_chunk(chunk, target, left_s / (len(chunks) - index), deadline)
            for call, runs, (peak, grows) in timed:
                key = (call.problem.key, call.phase)
                calls.setdefault(key, call)
                seconds.setdefault(key, []).extend(runs)
                if peak is not None:
                    peaks[key] = max(peaks.get(key, (0, None)), (peak, grows), key=lambda known: known[0])
                flops_per_s = max(flops_per_s, call.flops / max(min(runs), 1e-9))
            if progress is not None:
                progress("compute", index + 1, len(chunks))
    except KeyboardInterrupt:
        return _samples(calls, seconds, peaks), True
    return _samples(calls, seconds, peaks), False


def _time_chunk(chunk: Chunk, device: torch.device, share_s: float,
                deadline: float) -> list[tuple[Call, list[float], tuple[int | None, int | None]]]:
    kernels = build_chunk(chunk, device)
    clock = _Clock(device)
    started = time.monotonic()
    first = clock.run(kernels)
    pass_s = max(time.monotonic() - started, 1e-6)
    passes = max(0, min(MAX_PASSES, int(share_s / pass_s) - 1, int((deadline - time.monotonic()) / pass_s) - 1))
    runs: list[list[float]] = [[] for _ in kernels]
    for _ in range(passes):
        for index, value in enumerate(clock.run(kernels)):
            runs[index].append(value)
    if passes == 0:
        runs = [[value] for value in first]
    peaks = peak_bytes(kernels, device)
    growth = growth_per_thread(kernels, device, peaks)
    return [(call, times, (peak, grows)) for call, kernel, times, peak, grows
            in zip(chunk.calls, kernels, runs, peaks, growth) if kernel is not None]


def peak_bytes(kernels: Sequence[Callable[[], object] | None], device: torch.device) -> list[int | None]:
    """Run each kernel once; the most bytes each had allocated at once (``None`` where it could not be told)."""
    if device.type == "cuda":
        out: list[int | None] = []
        for kernel in kernels:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            if kernel is not None:
                kernel()
            torch.cuda.synchronize(device)
            out.append(int(torch.cuda.max_memory_allocated(device) - base) if kernel is not None else None)
        return out
    return _cpu_peaks(kernels)


def growth_per_thread(kernels: Sequence[Callable[[], object] | None], device: torch.device,
                      peaks: Sequence[int | None]) -> list[int | None]:
    """How much each kernel's ``peaks`` (at this process's threads) grows per thread: its peak measured again at
    another thread count (the host's cores, or one thread when this process has them all); CPU only."""
    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    other = cores if cores > threads else 1
    if device.type != "cpu" or other == threads:
        return [None] * len(kernels)
    torch.set_num_threads(other)
    try:
        again = _cpu_peaks(kernels)
    finally:
        torch.set_num_threads(threads)
    return [None if base is None or moved is None else max(0, round((moved - base) / (other - threads)))
            for base, moved in zip(peaks, again)]


def _cpu_peaks(kernels: Sequence[Callable[[], object] | None]) -> list[int | None]:
    from torch.profiler import ProfilerActivity, profile, record_function

    with native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        for index, kernel in enumerate(kernels):
            if kernel is not None:
                with record_function(f"{_WINDOW}{index}"):
                    kernel()
    events = list(profiler.profiler.kineto_results.events())
    windows = {int(e.name()[len(_WINDOW):]): (e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
               if e.name().startswith(_WINDOW)}
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    return [_window_peak(changes, *windows[index]) if index in windows else None for index in range(len(kernels))]


def _window_peak(changes: Sequence[tuple[int, int]], start_ns: int, stop_ns: int) -> int:
    total = peak = 0
    for when, change in changes:
        if start_ns <= when <= stop_ns:
            total += change
            peak = max(peak, total)
    return peak


class _Clock:
    """Times each kernel of a pass: ``perf_counter`` around the call on CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def run(self, kernels: Sequence[Callable[[], object] | None]) -> list[float]:
        if self.cuda:
            return self._run_cuda(kernels)
        out: list[float] = []
        for kernel in kernels:
            started = time.perf_counter()
            if kernel is not None:
                kernel()
            out.append(time.perf_counter() - started)
        return out

    @staticmethod
    def _run_cuda(kernels: Sequence[Callable[[], object] | None]) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in kernels]
        for kernel, (start, end) in zip(kernels, events):
            start.record()
            if kernel is not None:
                kernel()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in events]


def _samples(calls: dict[tuple[str, str], Call], seconds: dict[tuple[str, str], list[float]],
             peaks: dict[tuple[str, str], tuple[int, int | None]]) -> list[ComputeSample]:
    samples = []
    for key, runs in seconds.items():
        call = calls[key]
        ordered = sorted(runs)
        quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
        samples.append(ComputeSample(call.problem.kind, call.phase, call.problem.key, call.flops, call.bytes,
                                     statistics.median(ordered), quartiles[2] - quartiles[0], len(ordered),
                                     *peaks.get(key, (None, None))))
    return samples
