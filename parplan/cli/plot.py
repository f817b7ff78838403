"""The figures: the what-if sweep (``plot_sweep``) and one plan along its model (``plot_plan``).

The what-if figure: iteration time and parallel efficiency against device count, one line per family.

Families (``planner.whatif.WhatIfRow``): pure sample parallelism, the best
one-stage plan (sample × spatial × channel) and the best plan with pipeline
stages allowed. Both axes of the time panel are logarithmic, the device axis
of the efficiency panel too. A dotted vertical line marks the batch size,
where pure sample parallelism runs out of samples (strong scaling only).
Efficiency is throughput per device relative to one device running the
unsplit model (``planner.whatif.one_device``), for every family. Device
labels read ``1k``, ``64k`` past a thousand, every other count labelled when
a sweep has more than eleven.

The plan figure: per decision (a layer and its followers, in model order)
its predicted seconds and resident bytes, each bar coloured by its layout,
pipeline stages shaded behind.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cost_models.formats.jsonio import write_bytes_atomic
from planner.whatif import OneDevice, WhatIfRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["FAMILIES", "device_label", "plot_plan", "plot_sweep"]

FAMILIES = (("pure sample", "pure_sample_s"), ("best one stage (sample×spatial×channel)", "one_stage_s"),
            ("best with pipeline stages", "iteration_s"))


def plot_sweep(rows: Sequence[WhatIfRow], path: str, title: str, reference: OneDevice, weak: bool = False) -> None:
    """Draw the sweep's two panels and write them to ``path`` (PNG, SVG or PDF by suffix), atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (times, efficiency) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = next((row for row in rows if row.feasible), None)
    for label, field in FAMILIES:
        points = [(row.devices, getattr(row, field), row.batch) for row in rows
                  if row.feasible and getattr(row, field) is not None]
        if not points or base is None:
            continue
        devices = [d for d, _, _ in points]
        times.plot(devices, [t * 1e3 for _, t, _ in points], marker="o", label=label)
        efficiency.plot(devices, [b / t / d / reference.samples_per_s for d, t, b in points], marker="o", label=label)
    if base is not None and not weak:
        for axis in (times, efficiency):
            axis.axvline(base.batch, color="grey", linestyle=":", label=f"batch size ({base.batch})")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    times.set(xscale="log", yscale="log", xlabel="devices", ylabel="predicted iteration (ms)")
    efficiency.set(xscale="log", xlabel="devices", ylim=(0, 1.1),
                   ylabel="parallel efficiency (vs 1 device" + ("" if reference.fits else ", which would not fit")
                   + ")")
    counts = sorted({row.devices for row in rows})
    labelled = counts if len(counts) <= 11 else counts[::2]
    for axis in (times, efficiency):
        axis.grid(True, which="both", alpha=0.3)
        axis.set_xticks(labelled)
        axis.set_xticks([c for c in counts if c not in labelled], minor=True)
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: device_label(value)))
        axis.xaxis.set_minor_formatter(NullFormatter())
    times.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    times.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    _save(figure, path)


def device_label(count: float) -> str:
    """``512``, ``1k``, ``64k``: a device count short enough to sit under its tick."""
    return f"{count / 1024:g}k" if count >= 1024 and count % 1024 == 0 else f"{count:g}"


def plot_plan(document: Mapping[str, Any], path: str) -> None:
    """Draw ``parplan plan``'s document along the model: seconds and bytes per decision, by layout, stages shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = document["decisions"]
    layouts = sorted({row["layout"] for row in rows}, key=lambda text: (-sum(r["layout"] == text for r in rows), text))
    colours = {layout: plt.get_cmap("tab10" if len(layouts) <= 10 else "tab20")(i % 20)
               for i, layout in enumerate(layouts)}
    figure, (times, memory) = plt.subplots(2, 1, figsize=(12, 5.5), sharex=True)
    places = range(len(rows))
    for axis, field, scale in ((times, "time_s", 1e3), (memory, "memory_bytes", 2.0**-20)):
        axis.bar(places, [row[field] * scale for row in rows], width=0.8,
                 color=[colours[row["layout"]] for row in rows], linewidth=0)
        _shade_stages(axis, [row["stage"] for row in rows])
        axis.grid(True, axis="y", alpha=0.3)
    times.set(ylabel="predicted time (ms)")
    memory.set(ylabel="resident memory (MiB)", xlabel="layers in model order (a layer and its followers)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[layout]) for layout in layouts[:20]]
    times.legend(handles, layouts[:20], fontsize=7, ncol=min(len(handles), 6), loc="upper right", title="layout")
    predicted = document["predicted"]
    model = document["model"]
    shape = "×".join(str(extent) for extent in model["input_shape"])
    figure.suptitle(f"{model.get('spec') or 'model'} at {shape}: {document['summary']} on "
                    f"{document['cluster']['devices']} devices — {predicted['iteration_s'] * 1e3:.2f} ms per iteration",
                    fontsize=10)
    _save(figure, path)


def _shade_stages(axis: Axes, stages: Sequence[int]) -> None:
    start = 0
    for place in range(1, len(stages) + 1):
        if place == len(stages) or stages[place] != stages[start]:
            if stages[start] % 2:
                axis.axvspan(start - 0.5, place - 0.5, color="grey", alpha=0.12, linewidth=0)
            if len(set(stages)) > 1:
                axis.text((start + place - 1) / 2, 1.0, f"stage {stages[start]}", transform=axis.get_xaxis_transform(),
                          ha="center", va="bottom", fontsize=7)
            start = place


def _save(figure: Figure, path: str) -> None:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.rsplit(".", 1)[-1].lower() if "." in path else "png", dpi=120)
    plt.close(figure)
    write_bytes_atomic(path, buffer.getvalue())
