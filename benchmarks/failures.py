"""How soon the other ranks exit after one dies or hangs, and what a checkpoint and an elastic restart cost.

    python benchmarks/failures.py [--repeats 3] [--timeout-s 5] [--model examples/unet.py:unet]

Every figure is a real ``parplan run`` on 2 local ranks (layout h2, gloo),
with a failure injected by ``PARPLAN_FAULT`` (``runtime.fault_injection``):

* **death**: rank 1 SIGKILLs itself at the start of step 4. From the
  wall-clock time it printed just before, until no other rank process is
  left (the benchmark polls /proc every 10 ms), and until the launcher —
  ``parplan run`` with torchrun's agent, or ``mpirun`` — returned.
* **hang**: rank 1 sleeps for ever at step 4; the same intervals, with
  ``--timeout-s``: the other rank's exchange times out, it fails and the hung
  rank is stopped.
* **restart**: ``--checkpoint-every 3 --max-restarts 1`` with rank 1 killed at
  step 5, against the same run without a failure (extra wall seconds), and
  the losses compared.
* **checkpoint**: the size of one checkpoint (both shards and the manifest),
  and the seconds writing one takes (``recovery.checkpoint_s``: serialise,
  write, fsync, rename, exchange digests, manifest).

Medians of ``--repeats`` runs; the machine is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARPLAN = str(Path(sys.executable).parent / "parplan")
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def _command(args: list[str], fault: str, mpi: bool) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PARPLAN_FAULT", None)
    if fault:
        env["PARPLAN_FAULT"] = fault
    launcher = [MPIRUN, "-n", "2", "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
                *(["-x", "PARPLAN_FAULT"] if fault else [])] if mpi else []
    return [*launcher, PARPLAN, "run", *args, *([] if mpi else ["--nproc", "2"])], env


def _run(args: list[str], fault: str = "", mpi: bool = False) -> tuple[subprocess.CompletedProcess[str], float]:
    command, env = _command(args, fault, mpi)
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return completed, time.time()


def _watched(args: list[str], fault: str, mpi: bool) -> tuple[str, int, float, float]:
    """Run and watch the ranks: stderr, exit code, when the last rank process was gone, when the launcher ended."""
    command, env = _command(args, fault, mpi)
    with tempfile.TemporaryFile("w+") as err:
        launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        ranks_gone, seen = 0.0, False
        while launcher.poll() is None:
            alive = _rank_processes(launcher.pid)
            seen = seen or bool(alive)
            if seen and not alive and not ranks_gone:
                ranks_gone = time.time()
            time.sleep(0.01)
        ended = time.time()
        err.seek(0)
        return err.read(), launcher.returncode, ranks_gone or ended, ended


def _rank_processes(launcher_pid: int) -> list[int]:
    """The rank processes under the launcher: spawned by the agent, or the ``parplan`` processes mpirun started."""
    found = []
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = status.read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(status.parent.name)
        if pid != launcher_pid and any(b"spawn_main" in w or w.endswith(b"/parplan") for w in words) \
                and _descends(pid, launcher_pid):
            found.append(pid)
    return found


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
    return False


def _struck(stderr: str) -> float:
    found = re.search(r"parplan: fault: rank \d+ \w+ at step \d+ \(t=([0-9.]+)\)", stderr)
    if found is None:
        raise RuntimeError(f"no fault line in the run's stderr:\n{stderr[-2000:]}")
    return float(found.group(1))


def failure_to_exit_s(base: list[str], kind: str, mpi: bool, timeout_s: float,
                      repeats: int) -> tuple[list[float], list[float]]:
    """Seconds from the fault until every other rank is gone, and until the launcher returned, per repeat."""
    gone, ended = [], []
    for _ in range(repeats):
        stderr, code, ranks_gone, launcher_ended = _watched([*base, "--steps", "6", "--timeout-s", str(timeout_s)],
                                                            f"{kind}:1:4", mpi)
        if code == 0:
            raise RuntimeError(f"the {kind} run succeeded:\n{stderr[-2000:]}")
        struck = _struck(stderr)
        gone.append(ranks_gone - struck)
        ended.append(launcher_ended - struck)
    return gone, ended


def restart_cost(base: list[str], repeats: int) -> dict[str, float | bool]:
    """Extra wall seconds of a run with one killed rank and one restart, and whether its losses are the same."""
    clean_s, restarted_s, same = [], [], True
    reference: list[float] = []  # the clean run's losses (each repeat runs it first)
    for _ in range(repeats):
        for fault, sink in (("", clean_s), ("kill:1:5", restarted_s)):
            with tempfile.TemporaryDirectory() as folder:
                started = time.time()
                run, ended = _run([*base, "--steps", "6", "--json", "--checkpoint-every", "3", "--checkpoint-dir",
                                   folder, "--max-restarts", "1"], fault)
                if run.returncode != 0:
                    raise RuntimeError(run.stderr[-2000:])
                sink.append(ended - started)
                losses = json.loads(run.stdout)["loss"]
                if fault:
                    same = same and losses == reference
                else:
                    reference = losses
    return {"clean_s": statistics.median(clean_s), "restarted_s": statistics.median(restarted_s),
            "extra_s": statistics.median(restarted_s) - statistics.median(clean_s), "same_losses": same}


def checkpoint_cost(base: list[str], repeats: int) -> dict[str, float]:
    """Bytes of one checkpoint and the seconds writing one takes (the measurement's ``checkpoint_s``)."""
    seconds, size = [], 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            run, _ = _run([*base, "--steps", "6", "--json", "--checkpoint-every", "1", "--checkpoint-dir", folder])
            if run.returncode != 0:
                raise RuntimeError(run.stderr[-2000:])
            seconds += json.loads(run.stdout)["recovery"]["checkpoint_s"]
            newest = sorted(Path(folder).glob("step-*"))[-1]
            size = sum(p.stat().st_size for p in newest.iterdir())
    return {"bytes": size, "seconds_each": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/unet.py:unet")
    parser.add_argument("--input-shape", default="4,3,40,24")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()
    base = ["--model", args.model, "--input-shape", args.input_shape, "--layout", "h2", "--warmup", "0"]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores; 2 ranks, gloo, "
          f"{args.model} at {args.input_shape}, h2; medians of {args.repeats}")
    for mpi in ([False, True] if MPIRUN else [False]):
        launcher = "mpirun" if mpi else "torchrun agent"
        for kind in ("kill", "hang"):
            gone, ended = failure_to_exit_s(base, kind, mpi, args.timeout_s, args.repeats)
            label = "death" if kind == "kill" else f"hang (--timeout-s {args.timeout_s:g})"
            print(f"{launcher:15s} {label:22s} → other rank gone {statistics.median(gone):5.2f} s "
                  f"(max {max(gone):.2f}), launcher returned {statistics.median(ended):5.2f} s "
                  f"(max {max(ended):.2f})")
    restart = restart_cost(base, args.repeats)
    print(f"elastic restart (kill at step 5, checkpoint every 3): {restart['restarted_s']:.1f} s against "
          f"{restart['clean_s']:.1f} s clean, +{restart['extra_s']:.1f} s; same losses: {restart['same_losses']}")
    saved = checkpoint_cost(base, args.repeats)
    print(f"checkpoint: {saved['bytes'] / 2**20:.1f} MiB on 2 ranks, {saved['seconds_each'] * 1e3:.0f} ms each")


if __name__ == "__main__":
    main()
