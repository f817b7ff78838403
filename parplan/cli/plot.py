"""The what-if figure: iteration time and parallel efficiency against device count, one line per family.

Families (``planner.whatif.WhatIfRow``): pure sample parallelism, the best
one-stage plan (sample × spatial × channel) and the best plan with pipeline
stages allowed. Both axes of the time panel are logarithmic, the device axis
of the efficiency panel too. A dotted vertical line marks the batch size,
where pure sample parallelism runs out of samples (strong scaling only).
Efficiency is throughput per device relative to one device running the
unsplit model (``planner.whatif.one_device``), for every family.
"""

from __future__ import annotations

import io
from typing import Sequence

from cost_models.jsonio import write_bytes_atomic
from planner.whatif import OneDevice, WhatIfRow

__all__ = ["FAMILIES", "plot_sweep"]

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
                   ylabel="parallel efficiency (vs 1 device" + ("" if reference.fits else ", which would not fit") + ")")
    counts = sorted({row.devices for row in rows})
    for axis in (times, efficiency):
        axis.grid(True, which="both", alpha=0.3)
        axis.set_xticks(counts)
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.xaxis.set_minor_formatter(NullFormatter())
    times.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    times.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.rsplit(".", 1)[-1].lower() if "." in path else "png", dpi=120)
    plt.close(figure)
    write_bytes_atomic(path, buffer.getvalue())
