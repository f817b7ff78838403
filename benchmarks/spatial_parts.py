"""Spatial splits against the pure sample split of the same batch on the same ranks: step times and where the
time goes (issue 52).

Usage::

    .venv/bin/python benchmarks/spatial_parts.py [--cases resnet18-h2,resnet18-w2,unet-h2,unet3d-d2]
                                                 [--rounds 3] [--steps 4] [--warmup 2] [--parts]

Timing: for each case, ``parplan run --layout L --nproc 2 --threads 1 --steps S --warmup W --json`` of the
split and of ``n2``, interleaved (``n2``, split, ``n2``, split, …) for ``--rounds`` rounds; the median of each
run's per-step times, then the median over rounds; the ratio split / ``n2`` (issue 52's target: ≤ 1.15).
``n2`` keeps each rank's batch-norm statistics to its own samples, as data parallelism does; a spatial split
cannot (a tile's statistics are not a batch's) and sums them over its tiles, two meeting points per batch-norm
a step. So each round also runs ``n2 --sync-batchnorm`` — the sample split with the same statistics, the one
equal to the unsplit model — and reports the split against it too.

``--parts``: each case's ``n2``, synchronised ``n2`` and split also run in this process's two spawned gloo ranks
(one thread each) through ``apply_plan``, 2 steps under ``torch.profiler``; rank 0's self CPU time per step, summed
by part: convolution kernels, batch-norm kernels, other kernels, halo exchange (parplan's halo functions — their
own time is mostly waiting for the neighbour —, sends, receives, joins), split statistics (parplan's batch-norm and
all-reduce functions: waiting for the group, and their arithmetic in Python), collectives (the gradient
all-reduce), element-wise and copies, and the rest (dispatch, autograd).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Case(NamedTuple):
    model: str
    shape: str
    layout: str


CASES = {
    "resnet18-h2": Case("torchvision:resnet18", "8,3,256,256", "h2"),
    "resnet18-w2": Case("torchvision:resnet18", "8,3,256,256", "w2"),
    "unet-h2": Case("examples/unet.py:unet", "4,3,256,256", "h2"),
    "unet3d-d2": Case("examples/unet3d.py:unet3d", "4,1,48,48,48", "d2"),
}

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("convolution kernels", ("aten::convolution_backward", "aten::mkldnn_convolution", "aten::_slow_conv2d",
                             "aten::slow_conv3d", "aten::_convolution")),
    ("batch-norm kernels", ("aten::native_batch_norm", "aten::batch_norm_update_stats",
                            "aten::native_batch_norm_backward")),
    ("other kernels", ("aten::max_pool", "aten::avg_pool", "aten::threshold_backward", "aten::addmm", "aten::mm",
                       "aten::upsample", "aten::max_pool2d_with_indices_backward", "aten::max_pool3d")),
    ("halo exchange", ("_Halo", "_Superposed", "c10d::send", "c10d::recv", "aten::cat")),
    ("split statistics", ("_BatchNorm", "_GroupNorm", "_AllReduceSum", "c10d::allgather")),
    ("collectives", ("c10d::allreduce",)),
    ("element-wise and copies", ("aten::add", "aten::sub", "aten::mul", "aten::copy_", "aten::fill_",
                                 "aten::addcmul", "aten::clamp", "aten::relu", "aten::zero_", "aten::div",
                                 "aten::sum", "aten::_to_copy", "aten::contiguous", "aten::clone")),
)


class Variant(NamedTuple):
    """One timed configuration: a layout, with batch-norm statistics per rank or over the whole batch."""

    layout: str
    sync_batchnorm: bool = False

    def __str__(self) -> str:
        return self.layout + " --sync-batchnorm" * self.sync_batchnorm


SYNCED = Variant("n2", sync_batchnorm=True)
"""The sample split with batch-norm statistics over the whole batch, as the split and the unsplit model have them."""


def variants(case: Case) -> tuple[Variant, Variant, Variant]:
    """What each case times and profiles: ``n2``, :data:`SYNCED` and the split."""
    return Variant("n2"), SYNCED, Variant(case.layout)


def _run(case: Case, variant: Variant, steps: int, warmup: int) -> float:
    """The median step of one ``parplan run`` of ``variant`` (seconds)."""
    command = [str(ROOT / ".venv/bin/parplan"), "run", "--model", case.model, "--input-shape", case.shape,
               "--layout", variant.layout, *["--sync-batchnorm"] * variant.sync_batchnorm, "--nproc", "2",
               "--threads", "1", "--steps", str(steps), "--warmup", str(warmup), "--json"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    document = json.loads(done.stdout)
    return statistics.median(document["per_step_s"])


def time_case(name: str, case: Case, rounds: int, steps: int, warmup: int) -> dict[str, object]:
    """Interleaved medians of ``n2``, ``n2`` with synchronised batch-norm and the split; the split's ratios to both
    (each round's ratio first, then their median: a round's runs are minutes apart, the rounds may not be)."""
    plain, synced, split = variants(case)
    times: dict[Variant, list[float]] = {plain: [], synced: [], split: []}
    for _ in range(rounds):
        for variant, values in times.items():
            values.append(_run(case, variant, steps, warmup))
    medians = {variant: statistics.median(values) for variant, values in times.items()}
    row = {"case": name, "model": case.model, "shape": case.shape, "layout": case.layout,
           "n2_ms": round(medians[plain] * 1e3, 1), "n2_synced_ms": round(medians[synced] * 1e3, 1),
           "split_ms": round(medians[split] * 1e3, 1),
           "ratio": round(statistics.median(a / b for a, b in zip(times[split], times[plain], strict=True)), 3),
           "ratio_synced": round(statistics.median(a / b for a, b in zip(times[split], times[synced], strict=True)),
                                 3),
           "runs_ms": {str(variant): [round(t * 1e3, 1) for t in values] for variant, values in times.items()}}
    print(f"{name}: n2 {row['n2_ms']} ms, {SYNCED} {row['n2_synced_ms']} ms, {case.layout} {row['split_ms']} ms; "
          f"split / n2 {row['ratio']}, split / synced n2 {row['ratio_synced']} (runs {row['runs_ms']})", flush=True)
    return row


def _part(op: str) -> str:
    for part, prefixes in PARTS:
        if op.startswith(prefixes):
            return part
    return "the rest (dispatch, autograd)"


def _profiled(rank: int, world: int, case: Case, out: str) -> None:
    """One rank of ``--parts``: each of :func:`variants`, 2 profiled steps after 2 unprofiled."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import uniform_plan
    from runtime.apply import apply_plan

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shape = tuple(int(v) for v in case.shape.split(","))
    graph = trace(load_model(case.model), shape, torch.float32)
    link = Link(1e-6, 1e9)
    cluster = Cluster(devices=world, devices_per_node=world, memory_bytes=2**36, intra=link, inter=link)
    parts: dict[str, dict[str, float]] = {}
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    for variant in variants(case):
        torch.manual_seed(0)
        plan = uniform_plan(graph, cluster, [Layout.parse(variant.layout), Layout()])
        split = apply_plan(load_model(case.model), plan, graph=graph, sync_batchnorm=variant.sync_batchnorm)
        local = split.shard(x)
        for _ in range(2):
            split(local).float().mean().backward()
        dist.barrier()
        with torch.profiler.profile() as profile:
            for _ in range(2):
                split(local).float().mean().backward()
                dist.barrier()
        totals: dict[str, float] = {}
        for event in profile.key_averages():
            totals[_part(event.key)] = totals.get(_part(event.key), 0.0) + event.self_cpu_time_total / 2e3
        parts[str(variant)] = totals
    if rank == 0:
        Path(out).write_text(json.dumps(parts))
    dist.destroy_process_group()


def parts_case(name: str, case: Case) -> dict[str, dict[str, float]]:
    """Milliseconds per step by part, ``n2`` and the split (rank 0, profiled)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as directory:
        out = str(Path(directory) / "parts.json")
        mp.spawn(_profiled, args=(2, case, out), nprocs=2)
        parts: dict[str, dict[str, float]] = json.loads(Path(out).read_text())
    print(f"{name}: ms per step (rank 0, profiled) — part: n2 / {SYNCED} / {case.layout}")
    for part in [p for p, _ in PARTS] + ["the rest (dispatch, autograd)"]:
        print(f"  {part:32s} " + " / ".join(f"{parts[str(variant)].get(part, 0.0):8.1f}"
                                            for variant in variants(case)))
    return parts


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--parts", action="store_true", help="also profile where each step's time goes")
    parser.add_argument("--json", dest="json_path", help="write the figures here")
    args = parser.parse_args(argv)
    rows = []
    for name in args.cases.split(","):
        if name not in CASES:
            parser.error(f"unknown case {name!r}; choose from {', '.join(CASES)}")
        row: dict[str, object] = time_case(name, CASES[name], args.rounds, args.steps, args.warmup)
        if args.parts:
            row["parts_ms"] = parts_case(name, CASES[name])
        rows.append(row)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
