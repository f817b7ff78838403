"""A soak under failures: many steps, ranks killed at random steps across attempts, the final weights compared.

    python benchmarks/soak.py [--steps 24] [--faults 3] [--every 3] [--seed 0] [--cases sync,stale,spatial]

Each case is a real ``parplan run`` on 2 local gloo ranks in float64 with
``--checkpoint-every`` and ``--max-restarts`` (torchrun's agent restarts the
group, which resumes from the newest checkpoint), its faults a schedule
across attempts (``PARPLAN_FAULT=kill:1:7,exit:0:13,…``, ``runtime.fault_injection``:
the ``i``-th fault hits attempt ``i``) drawn at random from ``--seed``:

* ``sync``: resnet18 at 4×3×32×32 in 2 pipeline stages, 2 micro-batches (1F1B);
* ``stale``: the same in 2 stale (DSP) stages — its checkpoints keep the
  batches in flight, so the restarts must not change its trajectory either;
* ``spatial``: the example UNet at 4×3×40×24 split by rows (``h2``).

A case passes only when its losses and its final weights, buffers and
optimizer state (the gathered checkpoint after the last step) equal an
uninterrupted run's bit for bit. Reported: faults struck, restarts survived,
steps redone (per fault: the step it struck at, less one, less the step the
next attempt resumed from) and wall seconds lost against the uninterrupted
run. Not in the test suite: minutes of runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PARPLAN = str(Path(sys.executable).parent / "parplan")
RESNET = ["--model", "torchvision:resnet18", "--input-shape", "4,3,32,32", "--layout", "n1", "--stages", "2"]
CASES = {
    "sync": [*RESNET, "--schedule", "sync", "--micro-batches", "2"],
    "stale": [*RESNET, "--schedule", "stale"],
    "spatial": ["--model", "examples/unet.py:unet", "--input-shape", "4,3,40,24", "--layout", "h2"],
}
GAP = 3
"""Steps at least between two faults: a stale stage forwards up to its staleness (2 here) ahead, so a fault at a
step whose forward a resumed attempt took back from the checkpoint would not strike again."""


@dataclass(frozen=True)
class Outcome:
    """One run: its measurement document, stderr and wall seconds."""

    document: dict[str, Any]
    stderr: str
    wall_s: float


def _run(case: str, steps: int, every: int, folder: Path, faults: str, restarts: int) -> Outcome:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PARPLAN_FAULT", None)
    if faults:
        env["PARPLAN_FAULT"] = faults
    command = [PARPLAN, "run", *CASES[case], "--dtype", "float64", "--warmup", "0", "--steps", str(steps), "--nproc",
               "2", "--checkpoint-every", str(every), "--checkpoint-dir", str(folder), "--max-restarts",
               str(restarts), "--timeout-s", "30", "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"soak: {case} with PARPLAN_FAULT={faults or '(none)'} failed: "
                         f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return Outcome(json.loads(done.stdout), done.stderr, wall_s)


def schedule(steps: int, faults: int, rng: random.Random) -> list[tuple[str, int, int]]:
    """``faults`` faults (kind, rank, step) at increasing steps at least :data:`GAP` apart, within ``2 … steps``."""
    found: list[tuple[str, int, int]] = []
    low = 2
    for index in range(faults):
        high = steps - GAP * (faults - 1 - index)
        if low > high:
            raise SystemExit(f"soak: {faults} faults {GAP} steps apart do not fit in {steps} steps; raise --steps")
        step = rng.randint(low, min(high, low + steps // max(faults, 1)))
        found.append((rng.choice(("kill", "exit")), rng.randrange(2), step))
        low = step + GAP
    return found


def _final_state(folder: Path) -> dict[str, Any]:
    from runtime.checkpoint import gather, latest

    manifest = latest(folder)
    if manifest is None:
        raise SystemExit(f"soak: {folder} holds no checkpoint")
    return gather(manifest)


def _equal(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Names of the tensors that differ (bit for bit) between two gathered states."""
    import torch

    differ = []
    for part in ("parameters", "buffers"):
        for name in sorted(set(ours[part]) | set(theirs[part])):
            if name not in ours[part] or name not in theirs[part] or not torch.equal(ours[part][name],
                                                                                      theirs[part][name]):
                differ.append(f"{part}.{name}")
    for name, entry in theirs["optimizer"]["state"].items():
        for key, value in entry.items():
            other = ours["optimizer"]["state"].get(name, {}).get(key)
            if isinstance(value, torch.Tensor) and (other is None or not torch.equal(value, other)):
                differ.append(f"optimizer.{name}.{key}")
    return differ


def soak(case: str, steps: int, every: int, faults: list[tuple[str, int, int]], root: Path) -> dict[str, Any]:
    """The case without and with its faults; its figures, and whether the two ended equal."""
    text = ",".join(f"{kind}:{rank}:{step}" for kind, rank, step in faults)
    clean = _run(case, steps, every, root / f"{case}-clean", "", 0)
    faulty = _run(case, steps, every, root / f"{case}-faulty", text, len(faults))
    struck = [int(s) for s in re.findall(r"parplan: fault: rank \d+ \w+(?: \w+)* at step (\d+)", faulty.stderr)]
    resumed = [int(s) for s in re.findall(r"parplan: attempt \d+ resumes from step (\d+)", faulty.stderr)]
    redone = sum(step - 1 - start for step, start in zip(struck, resumed))
    differ = _equal(_final_state(root / f"{case}-faulty"), _final_state(root / f"{case}-clean"))
    same_losses = faulty.document["loss"] == clean.document["loss"]
    return {"case": case, "faults": text, "struck": len(struck), "restarts": faulty.document["recovery"]["restarts"],
            "resumed_from": resumed, "steps_redone": redone, "seconds_lost": faulty.wall_s - clean.wall_s,
            "clean_s": clean.wall_s, "passed": same_losses and not differ and len(struck) == len(faults),
            "differ": differ[:5], "same_losses": same_losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--faults", type=int, default=3)
    parser.add_argument("--every", type=int, default=3, help="--checkpoint-every (a divisor of --steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    if args.steps % args.every:
        raise SystemExit(f"soak: --every {args.every} must divide --steps {args.steps} (the last checkpoint holds "
                         "the final weights compared)")
    rng = random.Random(args.seed)
    print(f"soak on {platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
          f"{args.steps} steps, a checkpoint every {args.every}, seed {args.seed}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="parplan-soak-") as root:
        for case in args.cases.split(","):
            result = soak(case, args.steps, args.every, schedule(args.steps, args.faults, rng), Path(root))
            results.append(result)
            print(f"{case:8s} faults {result['faults']:28s} struck {result['struck']}, restarts "
                  f"{result['restarts']}, resumed from {result['resumed_from']}, steps redone "
                  f"{result['steps_redone']}, seconds lost {result['seconds_lost']:.1f} (clean run "
                  f"{result['clean_s']:.1f} s): {'PASS' if result['passed'] else 'FAIL ' + str(result)}", flush=True)
    sys.exit(0 if all(result["passed"] for result in results) else 1)


if __name__ == "__main__":
    main()
