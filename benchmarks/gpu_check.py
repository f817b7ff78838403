"""GPU readiness: calibrate, estimate, run and what-if parplan on this machine's CUDA GPUs, into one JSON.

Usage, from the repository root (the repository need not be installed)::

    python3 benchmarks/gpu_check.py [--out gpu_check.json] [--budget-s 450]

Without a CUDA GPU it prints one line and exits 0. With one GPU, for
ResNet-50 (``torchvision:resnet50``, 32×3×224×224) and the example UNet of the
what-if figures (``examples/unet.py:unet``, 4×3×512×512):

a. ``parplan calibrate`` on one rank, the compute kernels on ``cuda``, within
   a time budget; the profile is written next to ``--out``
   (``<stem>-<model>-profile.json``) to be committed beside the presets;
b. the unsplit plan (``parplan plan --devices 1``), ``parplan estimate`` of it
   from the measured profile, and ``parplan run`` of it on one rank (nccl):
   the measured median step and peak ``torch.cuda.max_memory_allocated``
   beside the predicted time and memory, with the relative errors;
c. the plain model's training step against ``runtime.apply.apply_plan`` with
   every layer whole, interleaved in one process, and their ratio;
d. ``parplan whatif`` on 8…1024 such GPUs from a profile of the measured
   compute and the links of the nearest datasheet preset (one GPU cannot time
   links), at the what-if shapes of ``docs/commands.md``.

With R ≥ 2 GPUs (the largest power of two up to 8) also: ``parplan calibrate
--ranks R`` of the UNet (NCCL collectives), ``parplan run --verify`` of its
``hR`` split under torchrun with nccl, ``parplan validate``, and
``benchmarks/peers.py`` when that file exists.

Each step runs as ``python -m parplan …`` (``PYTHONPATH`` = the repository)
in its own process group, guarded: a failure or timeout is recorded with its
command and the script goes on. ``--budget-s`` bounds the whole run; a step
that no longer fits is recorded as skipped. The report is rewritten after
every step, so even a killed run leaves what it measured. ``--device cpu``
runs the same steps on the CPU with gloo (a dry run of this script; its
figures mean nothing).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.gpu_overhead import overhead  # noqa: E402 - after the repository is on the path
from benchmarks.gpu_steps import MIN_STEP_S, Clock, Report, communicate, guarded, parsed, run_step, shown  # noqa: E402

FORMAT = "parplan.gpu_check/1"
UNET = "examples/unet.py:unet"
PRESET_OF = (("H100", "h100"), ("H200", "h100"), ("H800", "h100"), ("GH200", "h100"), ("A100", "a100"),
             ("A800", "a100"), ("V100", "v100"))


@dataclass(frozen=True)
class ModelCase:
    """One model of the check: its spec, training shape, what-if shape and calibration budget."""

    key: str
    spec: str
    shape: str
    whatif_shape: str
    calibrate_s: float


@dataclass(frozen=True)
class Settings:
    """What the check runs and where it writes."""

    out: Path
    budget_s: float
    device: str  # "cuda", or "cpu" for a dry run
    ranks: int  # ranks of the multi-GPU part (below 2: none)
    steps: int
    warmup: int
    whatif_devices: str
    cases: tuple[ModelCase, ...]

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def fresh_path(self, suffix: str) -> Path:
        """A file next to ``out``, ``<stem>-<suffix>``, removed if an earlier check left one (no stale figures)."""
        found = self.out.with_name(f"{self.out.stem}-{suffix}")
        found.unlink(missing_ok=True)
        return found


def parplan(*args: str) -> list[str]:
    """The command line of ``parplan ARGS`` (``--debug``: a failed step's report ends with its traceback)."""
    return [sys.executable, "-m", "parplan", *args, "--debug"]


def rel_err(predicted: float | None, measured: float | None) -> float | None:
    """``predicted / measured − 1`` (signed), or None when either is missing or measured is not positive."""
    if predicted is None or measured is None or measured <= 0:
        return None
    return predicted / measured - 1.0


# --- the machine ---------------------------------------------------------------


def machine() -> dict[str, Any]:
    """GPU names and memory, torch, CUDA, cuDNN, driver, host."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = [torch.cuda.get_device_properties(index) for index in range(count)]
    return {"gpu_name": gpus[0].name if gpus else None, "gpu_count": count,
            "gpus": [{"name": g.name, "memory_bytes": int(g.total_memory),
                      "capability": f"{g.major}.{g.minor}"} for g in gpus],
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "driver": _driver(), "python": platform.python_version(), "host": socket.gethostname(),
            "cpu_count": os.cpu_count(), "platform": platform.platform()}


def _driver() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def nearest_preset(gpu_name: str | None) -> str:
    """The datasheet preset whose links stand in for this GPU's cluster (h100 when the name is not known)."""
    for fragment, preset in PRESET_OF:
        if gpu_name and fragment in gpu_name.upper():
            return preset
    return "h100"


def commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# --- one GPU: calibrate, plan, estimate, run, overhead, what-if -------------------


def linked_profile(measured_path: Path, preset: str, out_path: Path) -> dict[str, Any]:
    """The measured profile with the preset's links and devices per node (for plans on more than one device)."""
    from calibrate.presets import preset_profile
    from cost_models.profile import load_profile, save_profile

    measured = load_profile(measured_path)
    links = preset_profile(preset, str(measured.meta.get("dtype", "float32")))
    per_node = int(links.meta["devices_per_node"])
    notes = [*measured.meta.get("notes", []), f"links and devices per node ({per_node}) from the {preset} "
             f"datasheet preset; compute measured"]
    linked = replace(measured, comm_fits=links.comm_fits, comm_error=links.comm_error,
                     meta={**measured.meta, "devices_per_node": per_node, "notes": notes})
    save_profile(linked, out_path)
    return {"profile": str(out_path), "links_from": preset, "devices_per_node": per_node}


def calibrate_case(case: ModelCase, settings: Settings, clock: Clock, report: Report) -> Path | None:
    profile = settings.fresh_path(f"{case.key}-profile.json")
    command = parplan("calibrate", "--model", case.spec, "--input-shape", case.shape, "--device", settings.device,
                      "--budget-s", str(case.calibrate_s), "--out", str(profile), "--json")
    summary = run_step(report, clock, f"{case.key}: calibrate", command, case.calibrate_s + 90.0)
    if summary is None or not profile.exists():
        return None
    report.result(case.key)["calibration"] = {
        "profile": str(profile), "measured": summary.get("measured"), "left_to_fit": summary.get("left_to_fit"),
        "interrupted": summary.get("interrupted"), "fit": summary.get("fit"), "seconds": summary.get("seconds"),
        "notes": summary.get("notes"), "command": shown(command)}
    return profile


def unsplit_plan(case: ModelCase, settings: Settings, clock: Clock, report: Report, linked: Path) -> Path | None:
    plan = settings.fresh_path(f"{case.key}-unsplit-plan.json")
    command = parplan("plan", "--model", case.spec, "--input-shape", case.shape, "--profile", str(linked),
                      "--devices", "1", "--max-stages", "1", "--out", str(plan), "--json")
    run_step(report, clock, f"{case.key}: unsplit plan", command, 120.0)
    return plan if plan.exists() else None


def training_step(case: ModelCase, settings: Settings, clock: Clock, report: Report, profile: Path,
                  plan: Path) -> None:
    """(b): estimate and run of the unsplit plan; measured beside predicted, with the errors."""
    estimate_cmd = parplan("estimate", "--model", case.spec, "--input-shape", case.shape, "--plan", str(plan),
                           "--profile", str(profile), "--json")
    predicted = run_step(report, clock, f"{case.key}: estimate", estimate_cmd, 120.0) or {}
    measurement = settings.fresh_path(f"{case.key}-unsplit-measurement.json")
    run_cmd = parplan("run", "--model", case.spec, "--input-shape", case.shape, "--plan", str(plan), "--nproc", "1",
                      "--backend", settings.backend, "--steps", str(settings.steps), "--warmup", str(settings.warmup),
                      "--profile", str(profile), "--out", str(measurement), "--json")
    measured = run_step(report, clock, f"{case.key}: run unsplit", run_cmd, 180.0) or {}
    report.result(case.key)["training_step"] = _step_figures(predicted, measured, estimate_cmd, run_cmd)
    report.write()


def _step_figures(predicted: dict[str, Any], measured: dict[str, Any], estimate_cmd: list[str],
                  run_cmd: list[str]) -> dict[str, Any]:
    time_s, memory = measured.get("iteration_s"), measured.get("memory_bytes_max")
    predicted_s, predicted_memory = predicted.get("iteration_s"), predicted.get("memory_bytes_max")
    return {
        "measured": {"median_step_s": time_s, "per_step_s": measured.get("per_step_s"),
                     "peak_memory_bytes": memory, "memory": measured.get("memory"),
                     "predicted_by_run_s": measured.get("predicted_iteration_s"),
                     "backend": measured.get("backend"), "command": shown(run_cmd)},
        "predicted": {"step_s": predicted_s, "memory_bytes": predicted_memory,
                      "breakdown_s": predicted.get("breakdown_s"), "command": shown(estimate_cmd)},
        "errors": {"step_rel_err": rel_err(predicted_s, time_s), "memory_rel_err": rel_err(predicted_memory, memory)},
    }


def overhead_case(case: ModelCase, settings: Settings, clock: Clock, report: Report) -> None:
    """(c): the plain model against apply_plan unsplit, in a process of its own."""
    command = [sys.executable, str(Path(__file__).resolve()), "--overhead", case.spec, case.shape,
               "--device", settings.device, "--steps", str(max(settings.steps, 10))]
    found = run_step(report, clock, f"{case.key}: apply_plan overhead", command, 180.0)
    if found is not None:
        report.result(case.key)["overhead"] = {**found, "command": shown(command)}
        report.write()


def whatif_case(case: ModelCase, settings: Settings, clock: Clock, report: Report, linked: dict[str, Any]) -> None:
    """(d): the what-if sweep from the measured compute and the preset's links."""
    command = parplan("whatif", "--model", case.spec, "--input-shape", case.whatif_shape, "--profile",
                      linked["profile"], "--devices", settings.whatif_devices, "--devices-per-node",
                      str(linked["devices_per_node"]), "--json")
    found = run_step(report, clock, f"{case.key}: whatif", command, 180.0)
    if found is not None:
        report.result(case.key)["whatif"] = {
            "input_shape": found.get("input_shape"), "device": found.get("device"),
            "links_from": linked["links_from"], "devices_per_node": found.get("devices_per_node"),
            "one_device": found.get("one_device"), "rows": found.get("rows"), "command": shown(command)}
        report.write()


def check_case(case: ModelCase, settings: Settings, clock: Clock, report: Report, preset: str) -> dict[str, Any] | None:
    """(a)–(c) for one model; returns the linked profile for its what-if (None when calibration failed)."""
    profile = calibrate_case(case, settings, clock, report)
    if profile is None:
        return None
    linked_path = settings.fresh_path(f"{case.key}-linked-profile.json")
    linked = guarded(report, f"{case.key}: profile with {preset} links",
                     lambda: linked_profile(profile, preset, linked_path))
    plan = unsplit_plan(case, settings, clock, report, linked_path) if linked else None
    if plan is not None:
        training_step(case, settings, clock, report, profile, plan)
    overhead_case(case, settings, clock, report)
    return linked


# --- two or more GPUs ---------------------------------------------------------------


def multi_gpu(settings: Settings, clock: Clock, report: Report, unet: ModelCase) -> None:
    """NCCL calibration, a verified split run, validate, and the peers comparison."""
    ranks = str(settings.ranks)
    model = ["--model", unet.spec, "--input-shape", unet.shape]
    profile = settings.fresh_path(f"unet-{settings.backend}-{ranks}-profile.json")
    calibrate = parplan("calibrate", *model, "--device", settings.device, "--ranks", ranks, "--budget-s", "75",
                        "--out", str(profile), "--json")
    summary = run_step(report, clock, f"{ranks} ranks: calibrate collectives", calibrate, 180.0)
    block = report.result("multi_gpu")
    block.update(ranks=settings.ranks, backend=settings.backend)
    if summary is not None:
        block["calibration"] = {"profile": str(profile), "fit": summary.get("fit"), "notes": summary.get("notes"),
                                "command": shown(calibrate)}
    if not profile.exists():
        return
    split_run(settings, clock, report, model, profile)
    validate(settings, clock, report, model, profile)


def split_run(settings: Settings, clock: Clock, report: Report, model: list[str], profile: Path) -> None:
    layout = f"h{settings.ranks}"
    command = parplan("run", *model, "--layout", layout, "--nproc", str(settings.ranks), "--backend",
                      settings.backend, "--steps", str(settings.steps), "--warmup", str(settings.warmup), "--verify",
                      "--profile", str(profile), "--out", str(settings.fresh_path(f"unet-{layout}-measurement.json")),
                      "--json")
    found = run_step(report, clock, f"{settings.ranks} ranks: run --verify {layout}", command, 240.0)
    if found is not None:
        report.result("multi_gpu")["split_run"] = {
            "layout": layout, "plan": found.get("plan", {}).get("summary"), "verify": found.get("verify"),
            "median_step_s": found.get("iteration_s"), "predicted_step_s": found.get("predicted_iteration_s"),
            "step_rel_err": rel_err(found.get("predicted_iteration_s"), found.get("iteration_s")),
            "peak_memory_bytes": found.get("memory_bytes_max"), "memory": found.get("memory"),
            "command": shown(command)}
        report.write()


def validate(settings: Settings, clock: Clock, report: Report, model: list[str], profile: Path) -> None:
    out = settings.fresh_path("unet-validation.json")
    command = parplan("validate", *model, "--profile", str(profile), "--nproc", str(settings.ranks), "--plans", "3",
                      "--steps", "5", "--rounds", "1", "--warmup", "2", "--backend", settings.backend,
                      "--max-stages", "2", "--out", str(out), "--json")
    found = run_step(report, clock, f"{settings.ranks} ranks: validate", command, 300.0)
    if found is not None:
        report.result("multi_gpu")["validate"] = {
            **{key: found.get(key) for key in ("median_rel_err", "p90_rel_err", "kendall_tau", "regret",
                                               "best_measured", "left_out")},
            "plans": [{key: plan.get(key) for key in ("name", "role", "summary", "predicted_s", "measured_s",
                                                       "rel_err")} for plan in found.get("plans", [])],
            "report": str(out), "command": shown(command)}
        report.write()


def peers(settings: Settings, clock: Clock, report: Report) -> None:
    """``benchmarks/peers.py`` when it exists (its own options, asked for with --help), to the time left."""
    script = REPO / "benchmarks" / "peers.py"
    if not script.exists():
        report.record({"step": "peers", "skipped": "benchmarks/peers.py does not exist"})
        return
    out = settings.fresh_path("peers.json")
    command = [sys.executable, str(script.relative_to(REPO)), "--json", str(out)]
    if clock.left_s() < MIN_STEP_S:
        report.record({"step": "peers", "command": shown(command), "skipped": "budget"})
        return
    helped = communicate([sys.executable, str(script.relative_to(REPO)), "--help"], min(30.0, clock.left_s()))[1]
    if "--backend" in helped:
        command += ["--backend", settings.backend]
    run_step(report, clock, "peers", command, clock.left_s(), parse=False)
    if out.exists():
        report.result("multi_gpu")["peers"] = {"report": str(out), "document": parsed(out.read_text()),
                                               "command": shown(command)}
        report.write()


# --- the whole check -----------------------------------------------------------------


def cases(resnet_shape: str, unet_shape: str, calibrate_s: float, multi: bool) -> tuple[ModelCase, ...]:
    """ResNet-50 and the UNet; the UNet (fewer layers) calibrates in 3/4 of ResNet-50's budget."""
    share = 0.65 if multi else 1.0  # leave time to the multi-GPU steps
    return (ModelCase("resnet50", "torchvision:resnet50", resnet_shape, "256,3,224,224", round(calibrate_s * share)),
            ModelCase("unet", UNET, unet_shape, "4,3,2048,2048", round(0.75 * calibrate_s * share)))


def check(settings: Settings) -> dict[str, Any]:
    """Every step within the budget; returns the report document (also written to ``settings.out``)."""
    started = time.monotonic()
    clock, report = Clock(started + settings.budget_s), Report(settings, started)
    found = machine()
    preset = nearest_preset(found["gpu_name"])
    report.document.update(format=FORMAT, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           commit=commit(), machine=found, device=settings.device, budget_s=settings.budget_s,
                           cwd=str(REPO), env={"PYTHONPATH": str(REPO)}, links_preset=preset, results={})
    report.write()
    linked = {case.key: check_case(case, settings, clock, report, preset) for case in settings.cases}
    for case in settings.cases:
        if linked.get(case.key):
            whatif_case(case, settings, clock, report, linked[case.key])
    if settings.ranks >= 2:
        multi_gpu(settings, clock, report, settings.cases[-1])
        peers(settings, clock, report)
    written = settings.out.parent.glob(f"{settings.out.stem}-*profile.json")
    report.document["profiles"] = sorted(str(path) for path in written if "-linked-" not in path.name)
    report.write()
    return report.document


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def power_of_two_at_most(count: int, cap: int = 8) -> int:
    ranks = 1
    while ranks * 2 <= min(count, cap):
        ranks *= 2
    return ranks


def settings_from(args: argparse.Namespace, gpus: int) -> Settings:
    ranks = args.ranks if args.ranks is not None else power_of_two_at_most(gpus)
    return Settings(out=Path(args.out).resolve(), budget_s=args.budget_s, device=args.device, ranks=ranks,
                    steps=args.steps, warmup=args.warmup, whatif_devices=args.whatif_devices,
                    cases=cases(args.resnet_shape, args.unet_shape, args.calibrate_s, ranks >= 2))


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    made.add_argument("--out", default="gpu_check.json", help="the report (default gpu_check.json); profiles, "
                      "plans and measurements are written next to it as <stem>-*.json")
    made.add_argument("--budget-s", type=float, default=450.0, help="wall-time bound of the whole check (default 450)")
    made.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                      help="cuda (default); cpu runs the same steps with gloo, a dry run of this script")
    made.add_argument("--ranks", type=int, default=None,
                      help="ranks of the multi-GPU part (default: the largest power of two of GPUs up to 8)")
    made.add_argument("--resnet-shape", default="32,3,224,224", help="ResNet-50's training shape")
    made.add_argument("--unet-shape", default="4,3,512,512", help="the UNet's training shape")
    made.add_argument("--whatif-devices", default="8..1024", help="the what-if's device counts (default 8..1024)")
    made.add_argument("--calibrate-s", type=float, default=60.0,
                      help="ResNet-50's calibration budget; the UNet's is 3/4 of it (default 60)")
    made.add_argument("--steps", type=int, default=20, help="timed training steps per run (default 20)")
    made.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    made.add_argument("--overhead", nargs=2, metavar=("MODEL", "SHAPE"), help=argparse.SUPPRESS)
    return made


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.overhead:
        print(json.dumps(overhead(args.overhead[0], args.overhead[1], args.device, args.steps)))
        return 0
    gpus = gpu_count()
    if args.device == "cuda" and gpus == 0:
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is false); nothing to check")
        return 0
    settings = settings_from(args, gpus)
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    document = check(settings)
    failed = [step["step"] for step in document.get("steps", []) if "error" in step]
    print(f"gpu_check: {len(document.get('steps', []))} steps in {document['seconds']:.0f} s, "
          f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; report in {settings.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
