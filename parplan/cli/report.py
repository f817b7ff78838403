"""Human-readable renderings of parplan's results (rich tables), free of torch."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypedDict

from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.progress import TaskID

    from parplan.api import WhatIfDocument

__all__ = [
    "CalibrationSummary", "calibration_progress", "format_bytes", "format_count", "print_calibration_summary",
    "print_estimate", "print_layer_table", "print_plan_summary", "print_profile", "print_validation", "progress_bar",
]

ErrorFigures = Mapping[str, float | None]
"""A fit's or a prediction's error figures (``median_rel_err``, ``p90_rel_err``, ``n``, …; ``None``: not measured)."""


class CalibrationSummary(TypedDict):
    """What ``parplan calibrate`` reports: the profile written, its fit errors, what it measured, its notes."""

    profile: str
    fit: Mapping[str, ErrorFigures]  # ``compute`` and ``comm``: the profile's fit errors on held-out samples
    measured: int
    left_to_fit: int
    interrupted: bool
    notes: list[str]
    seconds: float


def format_count(value: float) -> str:
    """``25557032`` → ``25.56M``; small numbers stay as they are."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:g}"


def format_bytes(value: float) -> str:
    """Binary units: ``3221225472`` → ``3.00 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:g} B"


def print_layer_table(document: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the ``parplan inspect`` table: one row per layer, then totals.

    Args:
        document: The ``inspect`` JSON document (graph dict plus ``totals``).
        console: Where to print (stdout by default).
    """
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    shapes = _shape(document.get("input_shapes") or document["input_shape"])  # "4×3×32×32 4×8" for two inputs
    table = Table(title=f"{document.get('model', 'model')} at {shapes} ({document['dtype']})")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("layer", "left"), ("kind", "left"), ("module", "left"), ("output", "left"),
        ("params", "right"), ("FLOP fwd", "right"), ("activation", "right"))
    for header, justify in columns:
        table.add_column(header, justify=justify)
    for index, layer in enumerate(document["layers"]):
        table.add_row(
            str(index), layer["name"], layer["kind"], layer["module"] or "-", _shape(layer["output_shape"]),
            format_count(layer["params"]) if layer["params"] else "", format_count(layer["flops_fwd"]),
            format_bytes(layer["activation_bytes"]),
        )
    console.print(table)
    totals = document["totals"]
    console.print(
        f"{totals['layers']} layers · {totals['params']:,} parameters ({format_bytes(totals['param_bytes'])}) · "
        f"{format_count(totals['flops_fwd'])}FLOP forward, {format_count(totals['flops_bwd'])}FLOP backward · "
        f"{format_bytes(totals['activation_bytes'])} of activations · fingerprint {document['fingerprint']}"
    )
    if document.get("unused_params"):
        console.print(f"[yellow]{document['unused_params']:,} parameters are never used by forward at this input[/]")
    if document.get("specialized"):
        decisions = "; ".join(f"{where} ({code}) → {value}" for where, code, value in document["specialized"])
        console.print(f"traced for this input shape: {len(document['specialized'])} Python decision(s) on shapes: "
                      f"{decisions}", markup=False, highlight=False)


def _shape(shape: Sequence[int] | Sequence[list[int]]) -> str:
    """``4×3×32×32``; a list of shapes (several inputs) ``4×3×32×32 4×8``."""
    if shape and isinstance(shape[0], list):
        return " ".join(_shape(s) for s in shape if isinstance(s, list))
    return "×".join(str(d) for d in shape)


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar with ETA on stderr, only on a terminal and when ``enabled`` (not under ``--json``);
    yields the ``(done, total)`` callback the search or sweep calls."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not (enabled and console.is_terminal):
        yield lambda done, total: None
        return
    bar = Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                   TimeRemainingColumn(), console=console, transient=True)
    task = bar.add_task(description, total=None)
    with bar:
        yield lambda done, total: bar.update(task, completed=done, total=total)


@contextmanager
def calibration_progress(enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar with ETA on stderr; yields the ``(phase, done, total)`` callback calibration calls."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:  # logs and pipes get one line per phase instead of a bar
        started: set[str] = set()

        def announce(phase: str, done: int, total: int) -> None:
            if phase not in started:
                started.add(phase)
                print(f"timing {phase} kernels: {total} problems", file=sys.stderr, flush=True)

        yield announce
        return
    if not enabled:
        yield lambda phase, done, total: None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True)
    tasks: dict[str, TaskID] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(f"timing {phase} kernels", total=total)
        bar.update(tasks[phase], completed=done, total=total)

    with bar:
        yield update


def print_calibration_summary(summary: CalibrationSummary, console: Console | None = None) -> None:
    """What ``parplan calibrate`` did: problems measured, left to the fit, fit errors, notes."""
    console = console or Console()
    fit = summary["fit"]
    console.print(f"wrote {summary['profile']} in {summary['seconds']:.1f} s: {summary['measured']} kernel timings, "
                  f"{summary['left_to_fit']} problems left to the fitted model"
                  + (" (interrupted)" if summary["interrupted"] else ""))
    console.print(f"compute fit error on held-out problems: {_error_text(fit['compute'])}")
    console.print(f"collective fit error on held-out sizes: {_error_text(fit['comm'])}")
    for note in summary["notes"]:
        console.print(f"[yellow]note:[/] {note}")


def print_profile(shown: Mapping[str, Any], console: Console | None = None) -> None:
    """``parplan profile show``: device, provenance, fitted models and their errors."""
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    device, meta = shown["device"], shown["meta"]
    console.print(f"[bold]{device['name']}[/] · {format_bytes(device['memory_bytes'])} · source: {meta['source']}"
                  + (f" ({meta.get('note')})" if meta.get("note") else ""))
    context = ", ".join(f"{key} {meta[key]}" for key in ("host", "torch_version", "backend", "dtype",
                                                           "threads_per_rank", "ranks", "date", "calibration_s")
                        if key in meta)
    if context:
        console.print(context)
    console.print(f"compute fit: {_error_text(shown['fit']['compute'])} · "
                  f"collective fit: {_error_text(shown['fit']['comm'])}")
    console.print(_compute_table(shown["compute_fits"]))
    console.print(_comm_table(shown["comm_fits"]))
    for warning in shown.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")


def _compute_table(fits: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="compute: t = overhead + FLOPs / rate + bytes / bandwidth")
    for header in ("kind", "pass", "overhead", "FLOP rate", "bandwidth", "n", "held-out error"):
        table.add_column(header)
    for fit in fits:
        table.add_row(fit["kind"], fit["phase"], f"{fit['overhead_s'] * 1e6:.1f} µs",
                      _rate(fit["s_per_flop"], "FLOP/s"), _rate(fit["s_per_byte"], "B/s"), str(fit["n_train"]),
                      _error_text(fit["error"]))
    return table


def _comm_table(fits: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="collectives: t = count·α + volume·β")
    for header in ("collective", "link", "α", "1/β", "n", "held-out error"):
        table.add_column(header)
    for fit in fits:
        table.add_row(fit["collective"], fit["level"], f"{fit['alpha_s'] * 1e6:.1f} µs",
                      _rate(fit["beta_s_per_byte"], "B/s"), str(fit["n_train"]), _error_text(fit["error"]))
    return table


def _rate(seconds_per_unit: float, unit: str) -> str:
    return "∞" if seconds_per_unit == 0 else f"{format_count(1 / seconds_per_unit)}{unit}"


def _error_text(error: ErrorFigures) -> str:
    if error.get("median_rel_err") is None:
        return "not measured"
    return f"median {error['median_rel_err']:.1%} · p90 {error['p90_rel_err']:.1%} · n={error['n']}"


def print_estimate(document: Mapping[str, Any], console: Console | None = None) -> None:
    """``parplan estimate``: one row per layer with its terms, then the totals."""
    console = console or Console(width=None if sys.stdout.isatty() else 180)
    table = Table(title="estimate per layer (ms)")
    for header in ("layer", "kind", "layout", "fwd", "bwd", "halo", "allreduce", "norm", "chan", "redist", "memory",
                   "src"):
        table.add_column(header, justify="left" if header in ("layer", "kind", "layout", "src") else "right")
    for layer in document["layers"]:
        table.add_row(layer["name"], layer["kind"], layer["layout"],
                      *(f"{layer[key] * 1e3:.3f}" for key in ("forward_s", "backward_s", "halo_s", "allreduce_s",
                                                              "norm_s", "channel_reduce_s", "redistribution_s")),
                      format_bytes(layer["memory_bytes"]), layer["compute_source"])
    console.print(table)
    parts = ", ".join(f"{key} {value * 1e3:.2f} ms" for key, value in document["breakdown_s"].items())
    console.print(f"iteration {document['iteration_s'] * 1e3:.2f} ms ({parts})")
    memory = ", ".join(f"{key} {format_bytes(value)}" for key, value in document["memory_bytes"].items())
    console.print(f"peak memory per rank {format_bytes(document['memory_bytes_max'])} ({memory})")
    for warning in document.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")


def print_plan_summary(document: Mapping[str, Any], path: str, console: Console | None = None,
                       explain: bool = False, table: bool = False) -> None:
    """``parplan plan``: the plan in one line, its prediction and speedups first; the search; the baselines side by
    side; the per-layer table (layout, stage, time, memory) with ``table`` or ``explain`` (runner-ups too)."""
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    predicted, solver = document["predicted"], document["solver"]
    used = sum(document["pipeline"]["devices_per_stage"])  # the rest of the cluster idle
    devices = document.get("devices_given", document["cluster"]["devices"])
    where = f"{used} devices" if used == devices else f"{used} of the {devices} devices (the rest idle)"
    console.print(f"[bold]{document['summary']}[/] on {where}: {predicted['iteration_s'] * 1e3:.2f} ms per "
                  f"iteration, {format_bytes(predicted['memory_bytes_max'])} per rank"
                  + "".join(f"; {b['speedup']:.2f}× {_baseline_label(b['name'], b['devices'], devices)}"
                            for b in document["baselines"]))
    if document.get("staleness_why"):
        console.print(document["staleness_why"])
    if table or explain:
        console.print(_decision_table(document["decisions"], explain))
    how = f"solver {solver['name']} {solver['status']} in {solver['seconds']:.2f} s" if solver else "no exact solve"
    if document["chosen_from"] != "search":
        how += f"; the full estimate priced the baseline '{document['chosen_from']}' fastest, so it is the plan"
    console.print(f"wrote {path} · {how} · {document['candidates']} candidates kept, {document['pruned']} pruned · "
                  f"search {document['search_s']:.1f} s")
    if len(document["considered"]) > 2 or document["skipped_configurations"]:
        fitting = [c for c in document["considered"] if c["fits"]]
        console.print(f"stage search priced {len(document['considered'])} plans ({len(fitting)} fit in memory); "
                      f"{document['skipped_configurations']} stage/schedule configurations skipped by the lower bound")
    baselines = Table(title="against the plans a user would pick by hand")
    for header in ("plan", "devices", "iteration", "memory per rank", "parplan's speedup"):
        baselines.add_column(header)
    for baseline in document["baselines"]:
        baselines.add_row(baseline["name"], f"{baseline['devices']} of {devices}",
                          f"{baseline['iteration_s'] * 1e3:.2f} ms", format_bytes(baseline["memory_bytes_max"]),
                          f"{baseline['speedup']:.2f}×")
    console.print(baselines)
    if not (table or explain):
        console.print("per-layer layouts: --table (or --explain, with each layer's runner-up)")


def _baseline_label(baseline: str, used: int, devices: int) -> str:
    """``over pure sample`` for the baseline named ``baseline`` on ``used`` of the ``devices`` devices."""
    name = baseline.split(" (")[0]
    return f"over {name}" + (f" (on {used} of the {devices} devices)" if used != devices else "")


def _decision_table(rows: Sequence[Mapping[str, Any]], explain: bool) -> Table:
    table = Table(title="plan per layer (followers share their layer's layout)")
    headers = ["layer", "kind", "stage", "layout", "time", "memory"] + (["runner-up", "extra"] if explain else [])
    for header in headers:
        table.add_column(header, justify="right" if header in ("stage", "time", "memory", "extra") else "left")
    for row in rows:
        name = row["layer"] + (f" +{len(row['followers'])}" if row["followers"] else "")
        cells = [name, row["kind"], str(row["stage"]), row["layout"], f"{row['time_s'] * 1e3:.3f} ms",
                 format_bytes(row["memory_bytes"])]
        if explain:
            extra = row.get("runner_up_extra_s")
            cells += [row.get("runner_up") or "—", "—" if extra is None else f"+{extra * 1e3:.3f} ms"]
        table.add_row(*cells)
    return table


def print_measurement(document: Mapping[str, Any], console: Console | None = None) -> None:
    """``parplan run``'s summary: the plan, the measured step times and losses, the prediction, the check."""
    console = console or Console()
    model = document["model"]
    console.print(f"[bold]{model['spec']}[/bold] {_shape(model['input_shape'])} {model['dtype']} — "
                  f"{document['plan']['summary']} on {document['nproc']} ranks ({document['backend']}, "
                  f"{document['launcher']})")
    table = Table("step", "seconds", "loss")
    for index, (seconds, loss) in enumerate(zip(document["per_step_s"], document["loss"]), start=1):
        table.add_row(str(index), f"{seconds:.4f}", f"{loss:.6f}")
    if document["per_step_s"]:
        console.print(table)
        predicted = document["predicted_iteration_s"]
        tail = (f", predicted {predicted:.4f} s ({predicted / document['iteration_s']:.2f}× measured)" if predicted
                else "")
        console.print(f"median step {document['iteration_s']:.4f} s{tail}; peak memory per rank "
                      f"{format_bytes(document['memory_bytes_max'])}")
    if document.get("memory"):
        console.print(_peak_line(document["memory"]))
    if document.get("pipeline"):
        _print_stages(document["pipeline"], console)
    verified = document.get("verify")
    if verified is not None:
        conclusive = verified.get("conclusive", True)
        verdict = ("[red]FAILED[/red]" if not verified["passed"] else "[green]passed[/green]" if conclusive
                   else "[yellow]inconclusive[/yellow] (within its rounding floor)")
        console.print(f"verify {verdict}: output max err {verified['output_max_abs_err']:.2e} of its scale "
                      f"({verified['output_max_rel_err']:.2e} of its own), gradient max err "
                      f"{verified['grad_max_abs_err']:.2e} of the model's largest gradient "
                      f"({verified['grad_max_rel_err']:.2e} of its own tensor's)"
                      + (f", loss err {verified['loss_rel_err']:.2e}" if "loss_rel_err" in verified else "")
                      + (f" ({verified['grad_zero_tensors']} gradients zero up to rounding, compared to the "
                         f"model's scale)" if verified.get("grad_zero_tensors") else "")
                      + "; allowed: "
                      f"{verified['tolerance']:.0e} of each tensor's own"
                      + (f" + {verified['grad_floor']:.1e} of the model's largest gradient"
                         if "grad_floor" in verified else ""))
        if not conclusive:
            console.print(f"[yellow]why inconclusive[/yellow]: {verified['note']}")
        if verified.get("float64"):
            from runtime.verify import float64_verdict

            console.print(f"rechecked in float64: {verified.get('note') if verified['passed'] else ''}"
                          f"{'' if verified['passed'] else float64_verdict(verified['float64'])}")


def _peak_line(memory: Mapping[str, Any]) -> str:
    """``peak tensor memory per rank 41.2 MiB (predicted 39.0 MiB, −5.3 %; held tensors + torch.profiler)``."""
    predicted = memory["predicted_bytes"]
    against = (f"predicted {format_bytes(predicted)}, {memory['rel_err'] * 100:+.1f} %; " if predicted is not None
               and memory["rel_err"] is not None else "")
    return f"peak tensor memory per rank {format_bytes(memory['peak_bytes'])} ({against}{memory['method']})"


def _print_stages(pipeline: Mapping[str, Any], console: Console) -> None:
    """Per stage of a pipeline run: busy and waiting time, busy fraction, staleness achieved/planned, slowdown."""
    table = Table("stage", "busy s", "waiting s", "busy", "staleness (planned)", "slowdown",
                  title=f"{pipeline['stages']} stages, {pipeline['schedule']} ({pipeline['order']}, "
                        f"M={pipeline['micro_batches']}), {pipeline['wall_s']:.3f} s in all")
    for row in pipeline["per_stage"]:
        table.add_row(str(row["stage"]), f"{row['busy_s']:.3f}", f"{row['wait_s']:.3f}",
                      f"{row['busy_fraction']:.0%}", f"{row['staleness_achieved']} ({row['staleness_planned']})",
                      f"{row.get('slowdown') or 1.0:g}×")
    console.print(table)


def print_whatif(document: WhatIfDocument, console: Console | None = None) -> None:
    """``parplan whatif``'s table: per device count the best plan's time, throughput, speedups and memory."""
    console = console or Console()
    shape = _shape(document.get("input_shapes") or document["input_shape"])
    table = Table("devices", "batch", "iter ms", "samples/s", "speedup", "eff.", "vs sample", "mem/device", "plan",
                  title=f"{document['model']} {shape} {document['dtype']} — {document['scaling']} scaling on "
                        f"{document['device']}, {document['devices_per_node']} per node", box=box.SIMPLE_HEAD)
    for row in document["rows"]:
        if not row["feasible"]:
            table.add_row(str(row["devices"]), str(row["batch"]), "[red]—[/red]", "", "", "", "", "",
                          f"[red]infeasible:[/red] {row['reason']}")
            continue
        versus = f"{row['speedup_vs_sample']:.2f}×" if row["speedup_vs_sample"] else "no fit"
        table.add_row(str(row["devices"]), str(row["batch"]), f"{row['iteration_s'] * 1e3:.3g}",
                      f"{row['samples_per_s']:,.0f}", f"{row['speedup']:.2f}×", f"{row['efficiency']:.0%}", versus,
                      format_bytes(row["memory_bytes"]), row["plan"] + _idle(row["devices"], row.get("devices_used")))
    console.print(table)
    one = document["one_device"]
    fits = "" if one["fits"] else f" (it would need {format_bytes(one['memory_bytes'])}, more than one device has)"
    console.print(f"speedup and efficiency: throughput against one device running the unsplit model, predicted "
                  f"{one['iteration_s'] * 1e3:.3g} ms per batch of {one['batch']}{fits}; vs sample: pure sample "
                  f"parallelism's time over the plan's at the same size")


def _idle(devices: int, devices_used: int | None) -> str:
    """A row whose plan leaves devices idle (``planner.whatif.with_idle``) says on how many it runs."""
    used = devices_used or devices
    return f" — on {used} of the {devices} devices, the rest idle" if used < devices else ""


def print_validation(document: Mapping[str, Any], console: Console | None = None) -> None:
    """``parplan validate``'s tables: per plan predicted against measured, the accuracy, per layer key, refinement."""
    console = console or Console()
    shape = "×".join(str(s) for s in document["model"]["input_shape"])
    table = Table("plan", "layouts", "predicted ms", "measured ms", "IQR ms", "error", "peak tensors",
                  "memory error",
                  title=f"{document['model']['spec']} {shape} on {document['nproc']} ranks ({document['backend']}), "
                        f"median of {document['steps']} steps", box=box.SIMPLE_HEAD)
    for row in document["plans"]:
        best = " [green](fastest)[/green]" if row["name"] == document["best_measured"] else ""
        peak = format_bytes(row["peak_bytes"]) if "peak_bytes" in row else ""
        memory = f"{row['memory_signed_err']:+.1%}" if "memory_signed_err" in row else ""
        table.add_row(row["name"] + best, row["summary"], f"{row['predicted_s'] * 1e3:.2f}",
                      f"{row['measured_s'] * 1e3:.2f}", f"{row['measured_iqr_s'] * 1e3:.2f}",
                      f"{row['signed_err']:+.1%}", peak, memory)
    console.print(table)
    if document["shared_cores"] is not None:
        console.print(f"predictions for {document['nproc']} ranks sharing this host's cores: at most "
                      f"{document['shared_cores']:g} compute at once")
    console.print(f"prediction: {_accuracy_text(document)}")
    if document.get("calibration_runs"):
        console.print(f"calibration ran {', '.join(document['calibration_runs'])} to fit this profile's corrections")
    if document.get("unseen"):
        console.print(f"on the other plans: {_accuracy_text(document['unseen'])}")
    for reason in document["left_out"]:
        console.print(f"[yellow]left out[/yellow] {reason}")
    if document.get("per_layer"):
        layers = Table("layer kind · split", "layers", "predicted ms", "measured ms", "measured/predicted",
                       title="per layer, summed over all runs (forward + backward of one batch, redistribution into "
                             "the layer included)", box=box.SIMPLE_HEAD)
        for row in document["per_layer"]:
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}×"
            layers.add_row(row["key"], str(row["layers"]), f"{row['predicted_s'] * 1e3:.2f}",
                           f"{row['measured_s'] * 1e3:.2f}", ratio)
        console.print(layers)
    if document.get("refine"):
        refine = document["refine"]
        corrections = refine["corrections"]
        console.print(f"refined profile written to {refine['profile']}: step overhead "
                      f"{corrections['step_overhead_s'] * 1e3:.2f} ms, per pipeline event "
                      f"{corrections['event_overhead_s'] * 1e3:.2f} ms, allreduce exposed "
                      f"{corrections['allreduce_exposed_fraction']:.0%} of what overlap hides, common factor "
                      f"{corrections['fitted_on']['common_factor']:.2f}, {len(corrections['layer_scale'])} layer "
                      "factors")
        console.print(f"before: {_accuracy_text(refine['before'])}")
        console.print(f"after ({refine['method']}, each run predicted by a fit without it; first choice "
                      f"{refine['first_choice_after']}): {_accuracy_text(refine['after'])}")


def _accuracy_text(figures: ErrorFigures) -> str:
    tau = "n/a" if figures["kendall_tau"] is None else f"{figures['kendall_tau']:.2f}"
    return (f"median error {figures['median_rel_err']:.1%}, p90 {figures['p90_rel_err']:.1%}, Kendall τ {tau}, "
            f"regret of the first choice {figures['regret']:.1%} (n={figures['n']})")
