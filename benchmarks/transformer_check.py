"""Vision transformers in float64 on 2 and 4 gloo ranks: each plans with default settings and verifies its plan,
and its splits verify — ViT's token (``t2``), head/column (``c2``) and sample·token (``n2·t2``), Swin's rows and
columns of whole windows (``h2``, ``w2``, ``n2·h2``) — against the unsplit model, forward output and every
parameter gradient (``parplan check --verify-dtype float64``).

Usage::

    .venv/bin/python benchmarks/transformer_check.py [--case vit64|vit512|swin_t ...] [--timeout-s 3000]

The cases (issue 25's): ViT-B/16 at 64×64 (``examples/vit.py:vit_b_16_64``, 4 images), at 512×512
(``vit_b_16_512``, 2 images: 1,025 tokens; ~10 GiB of memory on 4 ranks in float64) and torchvision's
Swin-T at 224×224 (4 images). Too slow for the test suite (minutes each on 2 cores); prints one line per
check and a summary per model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "vit64": ("examples/vit.py:vit_b_16_64", "4,3,64,64", "c2,t2,n2·t2"),
    "vit512": ("examples/vit.py:vit_b_16_512", "2,3,512,512", "c2,t2,n2·t2"),
    "swin_t": ("torchvision:swin_t", "4,3,224,224", "n2,h2,w2,n2·h2"),
}


def run_case(name: str, timeout_s: int) -> bool:
    """Run one case's ``parplan check``; print its checks; whether every check passed."""
    model, shape, layouts = CASES[name]
    command = [str(Path(sys.executable).parent / "parplan"), "check", "--model", model, "--input-shape", shape,
               "--devices", "2,4", "--layouts", layouts, "--verify-dtype", "float64", "--timeout-s", str(timeout_s),
               "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s * 8)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        print(f"{name}: parplan check exited {done.returncode}: {done.stderr.strip()[-400:]}")
        return False
    report = json.loads(done.stdout)
    for check in report["checks"]:
        print(f"  {name:7s} {check['name']:16s} {check['result']:8s} {check['seconds']:7.1f} s  "
              f"{check['reason'][:90] if check['result'] != 'pass' else _detail(check.get('detail') or {})}")
    passed = all(check["result"] == "pass" for check in report["checks"])
    print(f"{name}: {model} at {shape}, float64: {sum(c['result'] == 'pass' for c in report['checks'])} of "
          f"{len(report['checks'])} passed in {time.perf_counter() - started:.0f} s", flush=True)
    return passed


def _detail(detail: dict) -> str:
    """A passed check's figures: the plan, or the verify's largest errors and the layers split."""
    if "plan" in detail:
        return f"{detail['plan']}"
    errors = f"grad err {detail['grad_max_rel_err']:.1e}" if "grad_max_rel_err" in detail else ""
    split = f", {detail['split']} of {detail['layers']} layers split" if "split" in detail else ""
    return errors + split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), default=None)
    parser.add_argument("--timeout-s", type=int, default=3000)
    args = parser.parse_args()
    results = [run_case(name, args.timeout_s) for name in args.case or list(CASES)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
