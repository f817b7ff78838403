"""parplan's runtime side by side with PyTorch's own: DDP, torch.distributed.pipelining, the plain model.

Usage::

    .venv/bin/python benchmarks/peers.py [--model torchvision:resnet18] [--shape 8,3,64,64] [--pairs 7]
                                         [--steps 5] [--threads 1] [--micro-batches 4] [--cut layer3]
                                         [--only ddp,pipelining,unsplit] [--json FILE]

Two gloo ranks on this machine (``--threads`` each), one process pair for all
of it, so both sides of a comparison run in the same processes, on the same
batch, weights, optimizer (SGD with momentum 0.9), threads and host heap settings
(``processes.heap.steady_heap``, which parplan's ranks take):

* ``ddp``: ``parplan run``'s pure sample plan (``n2``: ``apply_plan``) against
  ``DistributedDataParallel``, each rank its half of the ``--shape`` batch.
* ``pipelining``: parplan's ``sync`` pipeline (two stages of one rank, cut
  before module ``--cut``, ``--micro-batches`` micro-batches of the
  ``--shape`` batch each, GPipe and 1F1B order) against
  ``torch.distributed.pipelining`` (``pipeline(...)`` with a ``SplitPoint``
  at the same module; ``ScheduleGPipe`` and ``Schedule1F1B``).
* ``unsplit``: one rank, the plain model against ``apply_plan`` with every
  layer whole (the runtime's own overhead).

Each comparison runs ``--pairs`` pairs; a pair is ``--steps`` steps of A and
``--steps`` of B after one warm-up step each, in alternating order (A first in
even pairs), so drift hits both alike. A step's time is the slowest rank's.
Printed per comparison: both medians, the median of the per-pair ratios
(parplan / peer) and their spread (min … max).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cost_models.cluster import Cluster, Link  # noqa: E402
from cost_models.ir.graph import parse_input_shape  # noqa: E402
from cost_models.ir.model_spec import load_model  # noqa: E402
from cost_models.ir.tracing import trace
from cost_models.layout import Layout  # noqa: E402
from cost_models.uniform import staged, uniform_plan  # noqa: E402
from processes.heap import steady_heap  # noqa: E402

Step = Callable[[], None]
MOMENTUM = 0.9
LR = 1e-3


@dataclass(frozen=True)
class Settings:
    model: str
    shape: tuple[int, ...]
    pairs: int
    steps: int
    threads: int
    micro_batches: int
    cut: str
    only: tuple[str, ...]


def main() -> None:
    settings, out = _arguments()
    print(f"# {' '.join(sys.argv)}\n# {platform.node()} {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, {os.cpu_count()} cpus, gloo, 2 ranks × {settings.threads} thread(s)")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        mp.start_processes(_rank, args=(2, _free_port(), settings, str(result)), nprocs=2, start_method="spawn")
        figures = json.loads(result.read_text())
    if "unsplit" in settings.only:
        figures["unsplit"] = _unsplit(settings)
    for name, figure in figures.items():
        _print(name, figure)
    if out:
        Path(out).write_text(json.dumps({"command": " ".join(sys.argv), "figures": figures}, indent=1))


def _arguments() -> tuple[Settings, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--shape", default="8,3,64,64")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--cut", default="layer3", help="the module the second pipeline stage starts with")
    parser.add_argument("--only", default="ddp,pipelining,unsplit")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    only = tuple(part for part in args.only.split(",") if part)
    unknown = sorted(set(only) - {"ddp", "pipelining", "unsplit"})
    if unknown:
        parser.error(f"--only: unknown comparison(s) {unknown}; choose from ddp, pipelining, unsplit")
    return Settings(args.model, parse_input_shape(args.shape), args.pairs, args.steps, args.threads,
                    args.micro_batches, args.cut, only), args.json


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(rank: int, world: int, port: int, settings: Settings, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(settings.threads)
    steady_heap()  # what parplan's ranks take; both sides of every comparison run in these processes
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        figures: dict[str, Any] = {}
        if "ddp" in settings.only:
            figures["ddp"] = _compare(settings, {"parplan n2": _parplan_sample(settings), "DDP": _ddp(settings)})
        if "pipelining" in settings.only:
            for order in ("gpipe", "1f1b"):
                steps = {f"parplan sync {order}": _parplan_pipeline(settings, order),
                         f"pipelining {order}": _torch_pipeline(settings, order)}
                figures[f"pipelining {order}"] = _compare(settings, steps)
        if rank == 0:
            Path(result).write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


# --- the sides --------------------------------------------------------------------------------------------


def _fresh(settings: Settings) -> nn.Module:
    torch.manual_seed(0)
    return load_model(settings.model).train()


def _batch(settings: Settings, samples: int, out_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((samples, *settings.shape[1:]), generator=generator)
    return x, torch.randint(0, out_classes, (samples,), generator=generator)


def _optimizer(parameters: Any) -> torch.optim.Optimizer:
    held = list(parameters)
    return torch.optim.SGD(held or [nn.Parameter(torch.zeros(0))], lr=LR, momentum=MOMENTUM)


def _cluster(devices: int) -> Cluster:
    link = Link(0.0, 1e9)
    return Cluster(devices=devices, devices_per_node=devices, memory_bytes=2**40, intra=link, inter=link)


def _classes(graph: Any) -> int:
    return int(graph.nodes[graph.graph["outputs"][0]]["output_shape"][1])


def _parplan_sample(settings: Settings) -> Step:
    from runtime.apply import apply_plan

    model = _fresh(settings)
    graph = trace(model, settings.shape)
    split = apply_plan(model, uniform_plan(graph, _cluster(2), [Layout(n=2)]), graph=graph)
    x, target = _batch(settings, settings.shape[0], _classes(graph))
    inputs, labels = split.shard(x), target[split.target_box(tuple(target.shape))]
    optimizer = _optimizer(split.parameters())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        split.loss(split(inputs), labels).backward()
        optimizer.step()

    return step


def _ddp(settings: Settings) -> Step:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_fresh(settings))
    half = settings.shape[0] // 2
    x, target = _batch(settings, settings.shape[0], _classes(trace(_fresh(settings), settings.shape)))
    rank = dist.get_rank()
    inputs, labels = x[rank * half:(rank + 1) * half], target[rank * half:(rank + 1) * half]
    optimizer = _optimizer(model.parameters())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()

    return step


def _first_layer_of(graph: Any, module: str) -> str:
    prefix = module.replace(".", "_") + "_"
    found = [name for name in graph.compute_layers() if name.startswith(prefix) or name == prefix[:-1]]
    if not found:
        raise SystemExit(f"--cut {module}: no layer of the model belongs to that module; name a submodule")
    return found[0]


def _parplan_pipeline(settings: Settings, order: str) -> Step:
    from runtime.pipeline.schedules import gpipe, one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    model = _fresh(settings)
    micro = settings.shape[0] // settings.micro_batches
    graph = trace(model, settings.shape)
    plan = staged(uniform_plan(graph, _cluster(1), [Layout()]), graph, [_first_layer_of(graph, settings.cut)],
                  "sync", settings.micro_batches)
    stage = apply_pipeline(model, plan, graph=graph)
    x, target = _batch(settings, settings.shape[0], _classes(graph))
    events = (gpipe(settings.micro_batches) if order == "gpipe"
              else one_f_one_b(2, stage.index, settings.micro_batches))
    optimizer = _optimizer(stage.parameters())

    def data(b: int) -> tuple[Any, Any]:
        rows = slice(b * micro, (b + 1) * micro)
        return (x[rows] if stage.first else None), (target[rows] if stage.last else None)

    def step() -> None:
        stage.run(events, optimizer, data, last_backward=settings.micro_batches - 1)

    return step


def _torch_pipeline(settings: Settings, order: str) -> Step:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, SplitPoint, pipeline

    model = _fresh(settings)
    micro = settings.shape[0] // settings.micro_batches
    x, target = _batch(settings, settings.shape[0], _classes(trace(_fresh(settings), settings.shape)))
    pipe = pipeline(model, mb_args=(x[:micro],), split_spec={settings.cut: SplitPoint.BEGINNING})
    stage = pipe.build_stage(dist.get_rank(), torch.device("cpu"))
    schedule_type = ScheduleGPipe if order == "gpipe" else Schedule1F1B
    schedule = schedule_type(stage, n_microbatches=settings.micro_batches, loss_fn=nn.functional.cross_entropy)
    optimizer = _optimizer(stage.submod.parameters())
    first = dist.get_rank() == 0

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if first:
            schedule.step(x)
        else:
            schedule.step(target=target)
        optimizer.step()

    return step


# --- timing -----------------------------------------------------------------------------------------------


def _timed(step: Step) -> float:
    """One step's seconds on the slowest rank."""
    started = time.perf_counter()
    step()
    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _compare(settings: Settings, steps: dict[str, Step]) -> dict[str, Any]:
    """Interleaved pairs of ``settings.steps`` steps of each side (order alternating); medians and ratios."""
    (a_name, a), (b_name, b) = steps.items()
    times: dict[str, list[float]] = {a_name: [], b_name: []}
    ratios = []
    for pair in range(settings.pairs):
        order = [(a_name, a), (b_name, b)] if pair % 2 == 0 else [(b_name, b), (a_name, a)]
        medians = {}
        for name, step in order:
            _timed(step)  # warm-up: caches, allocator, the other side's leftovers
            measured = [_timed(step) for _ in range(settings.steps)]
            times[name] += measured
            medians[name] = statistics.median(measured)
        ratios.append(medians[a_name] / medians[b_name])
    return {"sides": [a_name, b_name], "median_s": {name: statistics.median(t) for name, t in times.items()},
            "ratios": ratios, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "pairs": settings.pairs, "steps": settings.steps}


def _unsplit(settings: Settings) -> dict[str, Any]:
    """One process: the plain model against ``apply_plan`` with every layer whole, interleaved in pairs."""
    from runtime.apply import apply_plan

    torch.set_num_threads(settings.threads)
    steady_heap()
    plain = _fresh(settings)
    graph = trace(plain, settings.shape)
    split = apply_plan(_fresh(settings), uniform_plan(graph, _cluster(1), [Layout()]), graph=graph)
    x, target = _batch(settings, settings.shape[0], _classes(graph))
    sides = {"parplan unsplit": (split, lambda out: split.loss(out, target)),
             "plain model": (plain, lambda out: nn.functional.cross_entropy(out, target))}
    steps = {}
    for name, (model, loss) in sides.items():
        optimizer = _optimizer(model.parameters())

        def step(model: nn.Module = model, loss: Any = loss, optimizer: Any = optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            loss(model(x)).backward()
            optimizer.step()

        steps[name] = step
    return _compare(settings, steps)


def _print(name: str, figure: dict[str, Any]) -> None:
    a, b = figure["sides"]
    print(f"{name:<18} {a} {figure['median_s'][a] * 1e3:8.2f} ms   {b} {figure['median_s'][b] * 1e3:8.2f} ms   "
          f"ratio {figure['ratio_median']:.3f} (spread {figure['ratio_min']:.3f} … {figure['ratio_max']:.3f}, "
          f"{figure['pairs']} pairs × {figure['steps']} steps)")


if __name__ == "__main__":
    main()
