"""``parplan whatif``: the planner at each cluster size of a sweep, as a table, CSV, JSON and a figure.

Checks first (one line, exit 2): the device list, the factors, the output
paths' directories and the plot's format; then traces the model, plans every
size (``planner.whatif.sweep``) and reports. Files are written atomically.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
from typing import Any, Sequence

from cost_models.errors import InputError

__all__ = ["add_whatif", "parse_devices", "sweep_model"]

FORMAT = "parplan.whatif/1"
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def add_whatif(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``parplan whatif``."""
    from planner.cli_args import add_model_arguments, non_negative_int, positive_float, positive_int

    parser = commands.add_parser(
        "whatif", parents=[common], help="predict training speed over a range of cluster sizes",
        description="Plan MODEL at each device count (strong scaling: the input shape's batch is global; "
                    "--weak-scaling: per device) and report time, throughput, speedup, efficiency and the plan.")
    add_model_arguments(parser)
    parser.add_argument("--profile", required=True, metavar="PROFILE", help="a profile JSON or a preset (v100, a100, h100)")
    parser.add_argument("--devices", required=True, metavar="D,D,…|A..B",
                        help="device counts, e.g. 1,8,64 or 1..4096 (the powers of two from 1 to 4096)")
    parser.add_argument("--devices-per-node", type=positive_int, help="devices per node (default: the preset's)")
    parser.add_argument("--scale-inter-bw", type=positive_float, default=1.0, metavar="X",
                        help="multiply the inter-node bandwidth by X (default 1)")
    parser.add_argument("--scale-intra-bw", type=positive_float, default=1.0, metavar="X",
                        help="multiply the intra-node bandwidth by X (default 1)")
    parser.add_argument("--memory-gb", type=positive_float, metavar="X", help="device memory in GiB (default: the profile's)")
    parser.add_argument("--weak-scaling", action="store_true", help="the input shape's batch is per device")
    parser.add_argument("--max-stages", type=positive_int, default=4, help="most pipeline stages (default 4)")
    parser.add_argument("--solver", default="cbc", choices=("cbc", "highs"), help="ILP solver (default cbc)")
    parser.add_argument("--jobs", type=non_negative_int, default=0,
                        help="processes planning sizes in parallel (default 0: one per core)")
    parser.add_argument("--csv", metavar="F.csv", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="F.png", help="draw time and efficiency against devices (png, svg, pdf)")
    parser.set_defaults(handler=whatif_command)


def parse_devices(text: str) -> list[int]:
    """``1,2,8`` or ``1..4096`` (powers of two) into sorted distinct counts."""
    counts: set[int] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, dots, high = part.partition("..")
        try:
            if dots:
                first, last = int(low), int(high)
                if first < 1 or last < first:
                    raise ValueError
                value = 1
                while value <= last:
                    counts.update([value] if value >= first else [])
                    value *= 2
            else:
                counts.add(int(part))
        except ValueError:
            raise InputError(f"--devices {text!r}: {part!r} is not a count or a range A..B of counts >= 1; "
                             f"write e.g. 1,8,64 or 1..4096") from None
    if not counts or min(counts) < 1:
        raise InputError(f"--devices {text!r} names no device count >= 1; write e.g. 1,8,64 or 1..4096")
    return sorted(counts)


def whatif_command(args: argparse.Namespace) -> int:
    """The handler: check, trace, sweep, report."""
    devices = parse_devices(args.devices)
    _check_outputs(args)
    document = run_sweep(args, devices)
    if args.csv:
        _write_csv(args.csv, document["rows"])
    if args.plot:
        from planner.whatif import OneDevice, WhatIfRow
        from planner.whatif_plot import plot_sweep

        rows = [WhatIfRow(**row) for row in document["rows"]]
        plot_sweep(rows, args.plot, _title(document), OneDevice(**document["one_device"]), weak=args.weak_scaling)
    if args.json:
        from planner.cli_args import print_json

        print_json(document)
    else:
        from planner.report import print_whatif

        print_whatif(document)
    return 0


def run_sweep(args: argparse.Namespace, devices: list[int]) -> dict[str, Any]:
    """The command's sweep from its arguments (:func:`sweep_model`)."""
    return sweep_model(args.model, args.input_shape, args.profile, devices, args.devices_per_node,
                       args.scale_inter_bw, args.scale_intra_bw, args.memory_gb, args.weak_scaling, args.max_stages,
                       args.dtype, args.solver, args.jobs or None, tuple(args.leaf_module))


def sweep_model(model: str, input_shape: str | Sequence[Any], profile: str, devices: Sequence[int],
                devices_per_node: int | None = None, scale_inter_bw: float = 1.0, scale_intra_bw: float = 1.0,
                memory_gb: float | None = None, weak_scaling: bool = False, max_stages: int = 4,
                dtype: str = "float32", solver: str = "cbc", jobs: int | None = None,
                leaf_modules: Sequence[str] = ()) -> dict[str, Any]:
    """Trace ``model``, plan it at each of ``devices`` and return the ``parplan.whatif/1`` document.

    Args:
        model: A model spec (``torchvision:resnet50``, ``path/file.py:factory``).
        input_shape: ``"N,C,H,W"`` or a sequence; N is global (strong scaling) or per device (``weak_scaling``).
            A model taking several tensors: a sequence of such shapes, one per input, each batch first (every
            input's batch scales alike).
        profile: A preset name (``v100``, ``a100``, ``h100``) or a profile JSON path.
        memory_gb: Device memory in GiB instead of the profile's.
        jobs: Processes planning in parallel (default: one per core).

    Raises:
        InputError: Bad shape, profile, factors or model (one line each).
    """
    from dataclasses import asdict, replace

    from cost_models.graph import parse_input_shapes, trace
    from cost_models.model_spec import load_model
    from planner.cli_args import cluster_for
    from planner.cli import load_profile_argument
    from planner.whatif import scaled_profile, sweep

    shapes = parse_input_shapes(input_shape)
    shape = shapes[0]
    memory = int(memory_gb * 2**30) if memory_gb else None
    scaled = scaled_profile(load_profile_argument(profile, dtype), scale_intra_bw, scale_inter_bw, memory)
    network = load_model(model)
    graphs: dict[int, Any] = {}

    def graph_for(batch: int) -> Any:
        if batch not in graphs:
            graphs[batch] = trace(network, [(batch, *each[1:]) for each in shapes], dtype,
                                  leaf_modules=list(leaf_modules))
        return graphs[batch]

    def cluster_at(count: int) -> Any:
        cluster = cluster_for(profile, scaled, count, devices_per_node)
        return replace(cluster, memory_bytes=memory) if memory else cluster

    rows, reference = sweep(graph_for, scaled, cluster_at, devices, shape[0], weak_scaling, max_stages, solver, jobs,
                            model)
    return {"format": FORMAT, "model": model, "input_shape": list(shape),
            **({"input_shapes": [list(each) for each in shapes]} if len(shapes) > 1 else {}),
            "dtype": dtype, "profile": profile,
            "device": scaled.device.name, "scaling": "weak" if weak_scaling else "strong",
            "devices_per_node": cluster_at(max(devices)).devices_per_node,
            "scale_inter_bw": scale_inter_bw, "scale_intra_bw": scale_intra_bw,
            "memory_bytes": scaled.device.memory_bytes, "max_stages": max_stages,
            "one_device": asdict(reference), "rows": [row.to_dict() for row in rows]}


def _check_outputs(args: argparse.Namespace) -> None:
    for flag, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(f"{flag} {path}: directory {os.path.dirname(os.path.abspath(path))} does not exist; "
                             f"create it first")
    if args.plot and not args.plot.lower().endswith(PLOT_SUFFIXES):
        raise InputError(f"--plot {args.plot}: the figure is written as {', '.join(PLOT_SUFFIXES)} by suffix; "
                         f"name the file e.g. whatif.png")


def _write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    from cost_models.jsonio import write_bytes_atomic

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_bytes_atomic(path, text.getvalue().encode("utf-8"))


def _title(document: dict[str, Any]) -> str:
    shape = "×".join(str(s) for s in document["input_shape"])
    return (f"{document['model']} at {shape} ({document['scaling']} scaling) on {document['device']}, "
            f"{document['devices_per_node']} per node")
