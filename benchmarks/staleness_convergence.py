"""Does DSP's staleness cost accuracy? A small CNN on scikit-learn's digits, unsplit, sync and stale pipelines.

Usage::

    python benchmarks/staleness_convergence.py [--epochs 15] [--stages 2,3,4] [--profile P | --calibrate-s 40]
                                               [--json]

The model is ``examples/digits_cnn.py`` (three conv blocks with a residual
connection, a linear classifier); the data scikit-learn's 1,797 8×8 digits
(shipped with the package), 80% train / 20% test by a fixed split, pixels
scaled to [0, 1]. Every run trains the same epochs on the same shuffled
batches of 32 (the incomplete last batch dropped) with SGD, momentum 0.9 and
the same cosine learning-rate schedule over the updates, from the same
initial weights:

* ``unsplit``: one process, plain PyTorch;
* ``sync``: ``runtime.pipeline.stage`` on K stages (one CPU rank each, gloo), 1F1B
  order with 4 micro-batches per batch — mathematically the unsplit run;
* ``stale``: the DSP schedule on the same K stages, staleness ``2(K−1−k)``.

Cuts (first layer of each later stage): 2 stages ``conv3`` (the residual
crosses), 3 ``conv2, conv3``, 4 ``conv2, conv3, relu3`` (the skip tensor jumps
two cuts). After training, each stage's weights are gathered and the test
accuracy is measured on the unsplit model.

Beside each run's measured seconds per batch it prints the cost model's
prediction for the same plan, from a profile of this machine
(``parplan calibrate`` for ``--calibrate-s`` seconds unless ``--profile`` is
given). On a 2-core machine runs of 3 and 4 ranks share the cores, so their
measured times are not those of K devices; the predictions are.

``--json`` prints one document: ``runs[]`` with ``schedule``, ``stages``,
``test_accuracy`` (a fraction), ``wall_s``, ``seconds_per_batch``,
``predicted_seconds_per_batch`` and, for stale runs, ``staleness``.
Target: every stale run within 2 percentage points of the unsplit accuracy,
and at least 90%.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from examples.digits_cnn import digits_cnn  # noqa: E402

BATCH = 32
MICRO_BATCHES = 4
CUTS = {2: ["conv3"], 3: ["conv2", "conv3"], 4: ["conv2", "conv3", "relu3"]}
SPEC = "examples/digits_cnn.py:digits_cnn"


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and test images ``(N, 1, 8, 8)`` in [0, 1] and their labels, by a fixed stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    train, test = train_test_split(range(len(labels)), test_size=0.2, random_state=seed, stratify=data.target)
    return images[train], labels[train], images[test], labels[test]


def batches(train_size: int, epochs: int, seed: int) -> list[torch.Tensor]:
    """The sample indices of every batch of every epoch (reshuffled each epoch, last incomplete batch dropped)."""
    generator = torch.Generator().manual_seed(seed)
    order = []
    for _ in range(epochs):
        permutation = torch.randperm(train_size, generator=generator)
        order += [permutation[i:i + BATCH] for i in range(0, train_size - BATCH + 1, BATCH)]
    return order


class Scheduled:
    """SGD with momentum; learning rate: linear warm-up over ``warmup`` updates, then a cosine to 0 at ``total``."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, total: int, warmup: int) -> None:
        self.optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda update: factor(update, total, warmup))

    def step(self) -> None:
        self.optimizer.step()
        self.schedule.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def factor(update: int, total: int, warmup: int) -> float:
    """The learning rate's multiplier at ``update`` (see :class:`Scheduled`)."""
    if update < warmup:
        return (update + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(update - warmup, total - warmup) / max(1, total - warmup)))


def train_unsplit(data: tuple[torch.Tensor, ...], order: list[torch.Tensor], rates: tuple[float, int],
                  seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = digits_cnn()
    optimizer = Scheduled(list(model.parameters()), rates[0], len(order), rates[1])
    x, y = data[0], data[1]
    started = time.perf_counter()
    for index in order:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
        optimizer.step()
    return {"wall_s": time.perf_counter() - started, "state": model.state_dict()}


def pipeline_plan(stages: int, schedule: str) -> tuple[Any, Any]:
    from cost_models.cluster import Cluster, Link
    from cost_models.ir.tracing import trace
    from cost_models.layout import Layout
    from cost_models.uniform import staged, uniform_plan

    graph = trace(digits_cnn(), (BATCH, 1, 8, 8), torch.float32)
    link = Link(0.0, 1e9)  # a container for the device count; predictions use the profile's links
    one = uniform_plan(graph, Cluster(1, 1, 2**34, link, link), [Layout()], model_spec=SPEC)
    return staged(one, graph, CUTS[stages], schedule, MICRO_BATCHES if schedule == "sync" else 1), graph


def _rank(rank: int, stages: int, schedule: str, rates: tuple[float, int], seed: int, data: tuple[torch.Tensor, ...],
          order: list[torch.Tensor], rendezvous: str, results: Any) -> None:
    from runtime.pipeline.schedules import dsp, one_f_one_b
    from runtime.pipeline.stage import apply_pipeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=stages)
    try:
        plan, graph = pipeline_plan(stages, schedule)
        torch.manual_seed(seed)
        stage = apply_pipeline(digits_cnn(), plan, graph=graph)
        optimizer = Scheduled(stage.parameters(), rates[0], len(order), rates[1])
        x, y = data[0], data[1]
        micro = plan.pipeline.micro_batches
        size = BATCH // micro

        def load(batch: int, micro_batch: int = 0) -> tuple[Any, Any]:
            index = order[batch][micro_batch * size:(micro_batch + 1) * size]
            return (x[index] if stage.first else None), (y[index] if stage.last else None)

        dist.barrier()
        started = time.perf_counter()
        if schedule == "stale":
            stage.run(dsp(len(order), plan.pipeline.staleness[stage.index]), optimizer, load)  # type: ignore[arg-type]
        else:
            events = one_f_one_b(stages, stage.index, micro)
            for batch in range(len(order)):
                stage.run(events, optimizer, lambda m, b=batch: load(b, m), last_backward=micro - 1)  # type: ignore[arg-type]
        wall_s = time.perf_counter() - started
        mine = {id(p) for p in stage.parameters()}
        state = {name: p.detach().numpy().copy()  # plain arrays: shared-memory tensors die with this process
                 for name, p in stage.model.model.named_parameters() if id(p) in mine}
        results.put((rank, wall_s, state))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def train_pipeline(stages: int, schedule: str, data: tuple[torch.Tensor, ...], order: list[torch.Tensor],
                   rates: tuple[float, int],
                   seed: int) -> dict[str, Any]:
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="parplan-digits-") as scratch:
        processes = [context.Process(target=_rank, args=(rank, stages, schedule, rates, seed, data, order,
                                                          f"file://{scratch}/rendezvous", results))
                     for rank in range(stages)]
        for process in processes:
            process.start()
        gathered = [results.get(timeout=3600) for _ in processes]
        for process in processes:
            process.join()
    state: dict[str, torch.Tensor] = {}
    for _, _, part in gathered:
        state.update({name: torch.from_numpy(array) for name, array in part.items()})
    return {"wall_s": max(wall for _, wall, _ in gathered), "state": state}


def accuracy(state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    model = digits_cnn()
    model.load_state_dict(state)
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean())


def predictions(stage_counts: list[int], profile_path: str) -> dict[tuple[str, int], float]:
    """Predicted seconds per batch of every run, from the profile."""
    from cost_models.estimate import estimate
    from cost_models.profile import load_profile

    profile = load_profile(profile_path)
    found = {}
    for stages in stage_counts:
        for schedule in ("sync", "stale"):
            plan, graph = pipeline_plan(stages, schedule)
            found[(schedule, stages)] = estimate(graph, plan, profile).iteration_s
    plan, graph = pipeline_plan(2, "sync")
    from dataclasses import replace

    from cost_models.formats.plan import LayerAssignment, Pipeline

    single = replace(plan, cluster=replace(plan.cluster, devices=1), pipeline=Pipeline(1, (1,)),
                     layers={name: LayerAssignment(a.layout, 0) for name, a in plan.layers.items()})
    found[("unsplit", 1)] = estimate(graph, single, profile).iteration_s
    return found


def calibrated(seconds: float, scratch: str) -> str:
    path = Path(scratch) / "profile.json"
    parplan = str(Path(sys.executable).parent / "parplan")
    subprocess.run([parplan, "calibrate", "--model", SPEC, "--input-shape", f"{BATCH},1,8,8", "--ranks", "2",
                    "--budget-s", str(seconds), "--out", str(path), "--json"], check=True, cwd=REPO,
                   capture_output=True, text=True)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.02,
                        help="peak learning rate (default 0.02; at 0.05 the 4-stage stale run diverges)")
    parser.add_argument("--warmup-epochs", type=float, default=1.0, help="linear learning-rate warm-up (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages", default="2,3,4", help="stage counts to try (comma-separated, from 2, 3, 4)")
    parser.add_argument("--profile", help="a profile of this machine (default: calibrate one)")
    parser.add_argument("--calibrate-s", type=float, default=40.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stage_counts = [int(k) for k in args.stages.split(",")]
    data = digits(args.seed)
    order = batches(len(data[1]), args.epochs, args.seed)
    rates = (args.lr, round(args.warmup_epochs * len(order) / args.epochs))
    with tempfile.TemporaryDirectory(prefix="parplan-digits-profile-") as scratch:
        profile = args.profile or calibrated(args.calibrate_s, scratch)
        predicted = predictions(stage_counts, profile)
    runs = [("unsplit", 1)] + [(schedule, k) for k in stage_counts for schedule in ("sync", "stale")]
    found = []
    for schedule, stages in runs:
        result = (train_unsplit(data, order, rates, args.seed) if schedule == "unsplit"
                  else train_pipeline(stages, schedule, data, order, rates, args.seed))
        run = {"schedule": schedule, "stages": stages, "test_accuracy": accuracy(result["state"], data[2], data[3]),
               "wall_s": result["wall_s"], "seconds_per_batch": result["wall_s"] / len(order),
               "predicted_seconds_per_batch": predicted[(schedule, stages)]}
        if schedule == "stale":
            run["staleness"] = [2 * (stages - 1 - k) for k in range(stages)]
        found.append(run)
        if not args.json:
            print(f"{schedule:8s} K={stages}  test accuracy {run['test_accuracy']:.2%}  wall {run['wall_s']:7.2f} s  "
                  f"{run['seconds_per_batch'] * 1e3:7.2f} ms/batch measured, "
                  f"{run['predicted_seconds_per_batch'] * 1e3:7.3f} ms/batch predicted", flush=True)
    document = {"benchmark": "staleness_convergence", "epochs": args.epochs, "batch": BATCH,
                "micro_batches_sync": MICRO_BATCHES, "updates": len(order), "lr": args.lr,
                "warmup_updates": rates[1], "momentum": 0.9,
                "train_samples": len(data[1]), "test_samples": len(data[3]), "torch": torch.__version__,
                "threads_per_rank": 1, "runs": found}
    if args.json:
        json.dump(document, sys.stdout, indent=1)
        print()
    else:
        unsplit = found[0]["test_accuracy"]
        worst = min((r for r in found if r["schedule"] == "stale"), key=lambda r: r["test_accuracy"], default=None)
        if worst:
            print(f"worst stale run: K={worst['stages']} {worst['test_accuracy']:.2%} "
                  f"({(worst['test_accuracy'] - unsplit) * 100:+.2f} pp from unsplit {unsplit:.2%}); "
                  f"target within 2 pp and >= 90%")


if __name__ == "__main__":
    main()
