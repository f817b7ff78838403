"""Batch-norm over tiles (``runtime.norm.batch_norm``) against PyTorch's fused kernel on the same local shape.

Usage::

    .venv/bin/python benchmarks/batchnorm_speed.py [--shapes 8x64x56x56,8x256x28x28,4x32x128x128]
                                                   [--threads 1] [--repeats 15] [--dtype float32]

One process, no communication: forward and backward of a training-mode
batch-norm, ``F.batch_norm`` against parplan's on a tile said to be half of
its group (so that every pass a real split runs is timed; without a process
group the sums are this tile's alone), interleaved repeat by repeat.
Prints the medians and, per shape, the median of the repeats' paired ratios with their
interquartile range (issue 21's target: ≤ 1.2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from processes.heap import steady_heap  # noqa: E402
from runtime.norm import batch_norm  # noqa: E402


def _pass(norm: Callable[..., torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> Callable[[], float]:
    channels = x.shape[1]
    weight = torch.ones(channels, dtype=x.dtype, requires_grad=True)
    bias = torch.zeros(channels, dtype=x.dtype, requires_grad=True)
    mean, var = torch.zeros(channels, dtype=x.dtype), torch.ones(channels, dtype=x.dtype)

    def run() -> float:
        started = time.perf_counter()
        out = norm(x, mean, var, weight, bias)
        torch.autograd.grad(out, (x, weight, bias), grad)
        return time.perf_counter() - started

    return run


def _fused(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, mean, var, weight, bias, True, 0.1, 1e-5)


def _tiles(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor) -> torch.Tensor:
    return batch_norm(x, mean, var, weight, bias, True, 0.1, 1e-5, None, 2 * (x.numel() // x.shape[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x64x56x56,8x256x28x28,4x32x128x128")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    heap = "steady heap" if steady_heap() else "the allocator's own heap settings"
    print(f"# {' '.join(sys.argv)}\n# torch {torch.__version__}, {args.threads} thread(s), {args.dtype}, {heap}")
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        x = torch.randn(shape, dtype=getattr(torch, args.dtype), requires_grad=True)
        grad = torch.randn(shape, dtype=x.dtype)
        runs = {"F.batch_norm": _pass(_fused, x, grad), "parplan tiles": _pass(_tiles, x, grad)}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats + 2):
            for name, run in runs.items():
                seconds = run()
                if repeat >= 2:
                    times[name].append(seconds)
        fused, tiles = (statistics.median(times[name]) for name in runs)
        ratios = sorted(b / a for a, b in zip(*times.values()))  # each repeat's pair: drift cancels
        quartiles = statistics.quantiles(ratios, n=4)
        print(f"{text:>16}: F.batch_norm {fused * 1e3:7.2f} ms   parplan {tiles * 1e3:7.2f} ms   "
              f"ratio {statistics.median(ratios):.2f} (pairs' median; IQR {quartiles[0]:.2f}–{quartiles[2]:.2f})")


if __name__ == "__main__":
    main()
