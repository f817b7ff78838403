"""What one synchronisation point costs two ranks that compute between them (issue 52).

A spatial split meets its neighbour at every halo exchange and every split
batch-norm (resnet18 under ``h2``: about 77 points a step); the sample split
``n2`` meets it once, at the gradient allreduce. This measures one point:
2 ranks × 1 thread (gloo) each run a fixed convolution (~8 ms on the 2-core
development machine) and then one exchange, ``--rounds`` times a kind, kinds
interleaved ``--repeats`` times:

* ``none``: no exchange (the work alone, and its jitter);
* ``sendrecv``: a 1-row halo of an ``(8, 64, ·, 64)`` tile each way (``isend``/``irecv``);
* ``allgather``: 192 float64 values (a batch-norm's statistics), gathered;
* ``allreduce``: the same values, summed.

It prints, per kind and rank, the work's median, p10 and p90 and the time
spent waiting in the exchange (mean, median, p90): the cost of a point is its
mean wait, and when the two ranks' waits add to more than twice the median,
the rest is the neighbour's jitter, which no overlap of the exchange hides.

    .venv/bin/python benchmarks/sync_cost.py --rounds 200 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

KINDS = ("none", "sendrecv", "allgather", "allreduce")


def _exchange(kind: str, rank: int, rows: torch.Tensor, received: torch.Tensor, values: torch.Tensor) -> None:
    if kind == "sendrecv":
        for request in [dist.isend(rows, 1 - rank), dist.irecv(received, 1 - rank)]:
            assert request is not None
            request.wait()
    elif kind == "allgather":
        dist.all_gather([torch.empty_like(values) for _ in range(2)], values)
    elif kind == "allreduce":
        dist.all_reduce(values.clone())


def _rank(rank: int, world: int, kind: str, rounds: int, port: int, queue: mp.SimpleQueue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    generator = torch.Generator().manual_seed(rank)
    tile, weight = torch.randn(8, 64, 16, 64, generator=generator), torch.randn(64, 64, 3, 3, generator=generator)
    rows, values = torch.randn(8, 64, 1, 64, generator=generator), torch.randn(192, dtype=torch.float64)
    received = torch.empty_like(rows)
    work_s, wait_s = [], []
    for index in range(rounds + 20):  # 20 rounds of warm-up
        start = time.perf_counter()
        F.conv2d(tile, weight, padding=1)
        middle = time.perf_counter()
        _exchange(kind, rank, rows, received, values)
        if index >= 20:
            work_s.append(middle - start)
            wait_s.append(time.perf_counter() - middle)
    queue.put({"kind": kind, "rank": rank, "work_ms": _summary(work_s), "wait_ms": _summary(wait_s)})
    dist.destroy_process_group()


def _summary(seconds: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(seconds, n=10)
    return {"mean": round(statistics.mean(seconds) * 1e3, 3), "median": round(statistics.median(seconds) * 1e3, 3),
            "p10": round(deciles[0] * 1e3, 3), "p90": round(deciles[-1] * 1e3, 3)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", dest="json_path", help="write the figures here")
    args = parser.parse_args(argv)
    context = mp.get_context("spawn")
    rows = []
    for repeat in range(args.repeats):
        for number, kind in enumerate(KINDS):
            queue = context.SimpleQueue()
            mp.start_processes(_rank, args=(2, kind, args.rounds, 29600 + 10 * repeat + number, queue), nprocs=2,
                               start_method="spawn")
            for _ in range(2):
                row = queue.get()
                rows.append(row)
                work, wait = row["work_ms"], row["wait_ms"]
                print(f"{kind:9s} rank {row['rank']}: work median {work['median']:.2f} ms (p10 {work['p10']:.2f}, "
                      f"p90 {work['p90']:.2f}); waiting mean {wait['mean']:.2f} ms, median {wait['median']:.2f}, "
                      f"p90 {wait['p90']:.2f}", flush=True)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump({"format": "parplan.sync_cost/1", "rounds": args.rounds, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
