"""Pipelines of every depth: ``parplan run --layout n1 --stages K`` for every K a model can be cut into (issue 53).

For each K from 2 to the number of places the model can be cut plus one, the
plan ``parplan run --layout n1 --stages K`` makes (stages of equal compute,
``cost_models.uniform.balanced_starts``; sync micro-batches as ``run`` picks
them) goes through ``parplan run``'s whole pre-flight
(``runtime.preflight.check_runnable``: layouts, shape reads, stage cuts, the
values crossing them); every K it refuses is listed with its one line. The
K up to ``--run-up-to`` (each needs K ranks: this 2-core machine holds a few), or the K that ``--run`` lists
(``5-12,16``), are then run, ``--verify`` in float64, and must pass.

    .venv/bin/python benchmarks/stage_sweep.py --model torchvision:resnet18 --input-shape 4,3,32,32 --run-up-to 4
    .venv/bin/python benchmarks/stage_sweep.py --model torchvision:resnet18 --input-shape 4,3,32,32 --run 5-12,16

Prints one line a K that did not pass, and a summary; ``--json`` writes every K's result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models.cluster import Cluster, Link  # noqa: E402
from cost_models.errors import InputError, PlanError  # noqa: E402
from cost_models.ir.graph import LayerGraph  # noqa: E402
from cost_models.ir.model_spec import load_model  # noqa: E402
from cost_models.ir.tracing import trace  # noqa: E402
from cost_models.layout import Layout  # noqa: E402
from cost_models.uniform import balanced_starts, cut_places, default_micro_batches, staged, uniform_plan  # noqa: E402
from runtime.preflight import check_runnable  # noqa: E402


def deepest(graph: LayerGraph) -> int:
    """The most stages the model can be cut into (one more than its places to cut)."""
    return 1 + len(cut_places(graph))


def preflight(model: torch.nn.Module, graph: LayerGraph, stages: int) -> str:
    """``pass`` or the one line ``parplan run --layout n1 --stages K`` would refuse the plan with."""
    link = Link(1e-6, 1e9)
    one = Cluster(devices=1, devices_per_node=1, memory_bytes=2**40, intra=link, inter=link)
    try:
        whole = uniform_plan(graph, one, [Layout()])
        micro = default_micro_batches(whole, graph, stages)
        plan = staged(whole, graph, balanced_starts(graph, stages), "sync", micro)
        check_runnable(model, plan, graph)
    except (InputError, PlanError) as err:
        return f"refused: {err}"
    return "pass"


def run_verified(spec: str, shape: str, stages: int, timeout_s: float) -> str:
    """``pass``, or what ``parplan run --layout n1 --stages K --nproc K --verify`` in float64 said instead."""
    command = [str(ROOT / ".venv/bin/parplan"), "run", "--model", spec, "--input-shape", shape, "--layout", "n1",
               "--stages", str(stages), "--nproc", str(stages), "--verify", "--dtype", "float64", "--steps", "1",
               "--warmup", "0", "--json"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    if done.returncode not in (0, 1):
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
    verify = json.loads(done.stdout).get("verify") or {}
    return "pass" if verify.get("passed") else f"verify failed: {verify.get('summary', verify)}"


def depths(text: str) -> frozenset[int]:
    """``5-12,16`` → {5, …, 12, 16} (``--run``)."""
    ks: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.strip().isdigit() or (high and not high.strip().isdigit()):
            raise argparse.ArgumentTypeError(f"--run takes K and ranges of K such as 5-12,16, not {text!r}")
        ks.update(range(int(low), int(high or low) + 1))
    return frozenset(ks)


def _spans(ks: list[int]) -> str:
    spans: list[list[int]] = []
    for k in ks:
        if spans and spans[-1][1] == k - 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model spec, as parplan run takes it")
    parser.add_argument("--input-shape", required=True, help="N,C,H,W (N,C,D,H,W)")
    parser.add_argument("--run-up-to", type=int, default=3, help="run and verify K = 2 … this (K ranks each)")
    parser.add_argument("--run", dest="run_ks", type=depths, help="run and verify these K instead (5-12,16)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    parser.add_argument("--json", dest="json_path", help="write every K's result here")
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.input_shape.split(","))
    model = load_model(args.model)
    graph = trace(model, shape, torch.float32)
    most = deepest(graph)
    started = time.monotonic()
    rows: list[dict[str, Any]] = [{"stages": k, "preflight": preflight(model, graph, k)} for k in range(2, most + 1)]
    chosen = args.run_ks or frozenset(range(2, args.run_up_to + 1))
    for row in rows:
        if row["stages"] in chosen and row["preflight"] == "pass":
            row["run"] = run_verified(args.model, args.input_shape, row["stages"], args.timeout_s)
    for row in rows:
        if row["preflight"] != "pass" or row.get("run", "pass") != "pass":
            print(f"K = {row['stages']}: {row['preflight']}; run: {row.get('run', 'not run')}")
    refused = sum(row["preflight"] != "pass" for row in rows)
    ran = [row for row in rows if "run" in row]
    print(f"{args.model} {args.input_shape}: {len(graph.compute_layers())} layers, cut into 2 … {most} stages: "
          f"{len(rows) - refused} of {len(rows)} pre-flighted, {refused} refused; run and verified in float64: "
          f"{sum(row['run'] == 'pass' for row in ran)} of {len(ran)} (K = {_spans(sorted(chosen))}); "
          f"{time.monotonic() - started:.0f} s")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"format": "parplan.stage_sweep/1", "model": args.model,
                                                    "input_shape": list(shape), "rows": rows}, indent=1))
    return 0 if refused == 0 and all(row["run"] == "pass" for row in ran) else 1


if __name__ == "__main__":
    raise SystemExit(main())
