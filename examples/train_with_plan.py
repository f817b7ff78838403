"""Train your own model under a parplan plan: trace, plan, apply, then an ordinary optimizer and data loop.

Run it on as many ranks as the plan has devices::

    torchrun --nproc-per-node 2 examples/train_with_plan.py --steps 20
    mpirun -n 4 python examples/train_with_plan.py --profile h100

Rank 0 traces the model and plans it (``parplan.trace``, ``parplan.plan``) and writes the plan; every rank
reads it and wraps its identically initialised model (``parplan.apply_plan``). From there it is a PyTorch
training loop: each rank loads only its box of the batch (``shard``, ``target_box``), the loss is this rank's
share of the unsplit loss (``loss``; the shares sum to it — any loss written for the unsplit model, a Dice
loss too: ``--loss dice|ce|mse``), ``backward`` sums every gradient over exactly the
ranks that hold it, and any optimizer steps the local parameters. Trained this way the model follows the
same trajectory as unsplit training of the whole batch on one device (with ``--sync-batchnorm``, batch-norm
statistics over the whole batch as one device computes them).

The model is the example UNet on a per-pixel segmentation of a synthetic pattern (``examples/pattern_data.py``);
swap in yours and a real dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import parplan  # noqa: E402
from examples.pattern_data import batch as pattern_batch  # noqa: E402
from examples.unet import unet  # noqa: E402


def main() -> None:
    args = _arguments()
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)  # the same weights on every rank
    model = unet().to(dtype)
    shape = (args.batch, 3, args.size, args.size)
    plan_path = Path(args.plan)
    if rank == 0:
        graph = parplan.trace(model, shape, dtype=dtype)
        profile = parplan.load_profile(args.profile)  # float32 figures (presets have no float64 peak)
        result = parplan.plan(graph, profile=profile, devices=world,
                              settings=parplan.SearchSettings(max_stages=1))  # one stage: apply_plan runs it
        parplan.save_plan(result.plan, plan_path)
        print(f"plan: {result.plan.summary()}, predicted {result.estimate.iteration_s * 1e3:.2f} ms per step")
    dist.barrier()
    distributed = parplan.apply_plan(model, parplan.load_plan(plan_path), sync_batchnorm=args.sync_batchnorm)
    optimizer = torch.optim.SGD(distributed.parameters(), lr=args.lr, momentum=0.9)
    losses = []
    for step in range(args.steps):
        images, labels = _global_batch(shape, step)  # a real loader would read only this rank's box
        target = _target(args.loss, labels, dtype)
        local_images = distributed.shard(images.to(dtype))
        local_target = target[distributed.target_box(target.shape)]
        optimizer.zero_grad()
        share = distributed.loss(distributed(local_images), local_target, LOSSES[args.loss])
        share.backward()
        optimizer.step()
        losses.append(distributed.global_value(share))
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f}")
    if rank == 0 and args.out:
        plan = parplan.load_plan(plan_path)
        Path(args.out).write_text(json.dumps({"plan": plan.summary(), "devices": plan.cluster.devices,
                                              "losses": losses}))
    dist.destroy_process_group()


def dice(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A soft Dice loss as written for one device: a ratio of sums over every pixel of each sample, per class.
    ``distributed.loss`` keeps it split: each rank sums its tile, the ranks add their sums."""
    probabilities = output.softmax(dim=1)
    onehot = F.one_hot(labels, output.shape[1]).movedim(-1, 1).to(output.dtype)
    overlap = (probabilities * onehot).sum(dim=(2, 3))
    total = probabilities.sum(dim=(2, 3)) + onehot.sum(dim=(2, 3))
    return 1 - ((2 * overlap + 1) / (total + 1)).mean()


LOSSES = {"ce": F.cross_entropy, "dice": dice, "mse": F.mse_loss}


def _target(loss: str, labels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What the loss compares the output with: the labels, or (``mse``) their one-hot map of the output's shape."""
    return F.one_hot(labels, 2).movedim(-1, 1).to(dtype) if loss == "mse" else labels


def _global_batch(shape: tuple[int, int, int, int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``(N, 3, H, W)`` and per-pixel labels ``(N, H, W)`` of one step (the pattern of every pixel)."""
    n, c, h, w = shape
    return pattern_batch((slice(0, n), slice(0, c), slice(0, h), slice(0, w)),
                         (slice(0, n), slice(0, h), slice(0, w)), step)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h100", help="a preset or a profile JSON of your machines")
    parser.add_argument("--batch", type=int, default=4, help="global batch (default 4)")
    parser.add_argument("--size", type=int, default=64, help="image height and width (default 64)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--sync-batchnorm", action="store_true", help="batch-norm over the whole batch")
    parser.add_argument("--loss", default="ce", choices=tuple(LOSSES),
                        help="cross-entropy (default), a soft Dice, or a squared error against one-hot labels")
    parser.add_argument("--plan", default=os.environ.get("PARPLAN_PLAN", "train_plan.json"),
                        help="where rank 0 writes the plan (a path every rank can read)")
    parser.add_argument("--out", help="write the plan and the loss of every step here (JSON)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
