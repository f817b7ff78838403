"""``parplan whatif``: the planner at each cluster size of a sweep, as a table, CSV, JSON and a figure.

Checks first (one line, exit 2): the device list, the factors, the output
paths' directories and the plot's format; then traces the model, plans every
size (``parplan.whatif``, ``planner.whatif.sweep``) and reports. Files are written atomically.
"""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cost_models.errors import InputError

if TYPE_CHECKING:
    from parplan.api import WhatIfDocument
    from parplan.cli.args import Commands, OneLineParser

__all__ = ["add_whatif", "parse_devices", "run_sweep"]


def add_whatif(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan whatif``."""
    from parplan.cli.args import (
        add_model_arguments,
        add_search_arguments,
        non_negative_int,
        positive_float,
        positive_int,
    )

    parser = commands.add_parser(
        "whatif", parents=[common], help="predict training speed over a range of cluster sizes",
        description="Plan MODEL at each device count (strong scaling: the input shape's batch is global; "
                    "--weak-scaling: per device) and report time, throughput, speedup, efficiency and the plan.")
    add_model_arguments(parser)
    parser.add_argument("--profile", required=True, metavar="PROFILE",
                        help="a profile JSON or a preset (v100, a100, h100)")
    parser.add_argument("--devices", required=True, metavar="D,D,…|A..B",
                        help="device counts, e.g. 1,8,64 or 1..4096 (the powers of two from 1 to 4096)")
    parser.add_argument("--devices-per-node", type=positive_int, help="devices per node (default: the preset's)")
    parser.add_argument("--scale-inter-bw", type=positive_float, default=1.0, metavar="X",
                        help="multiply the inter-node bandwidth by X (default 1)")
    parser.add_argument("--scale-intra-bw", type=positive_float, default=1.0, metavar="X",
                        help="multiply the intra-node bandwidth by X (default 1)")
    parser.add_argument("--memory-gb", type=positive_float, metavar="X",
                        help="device memory in GiB (default: the profile's)")
    parser.add_argument("--weak-scaling", action="store_true", help="the input shape's batch is per device")
    parser.add_argument("--jobs", type=non_negative_int, default=0,
                        help="processes planning sizes in parallel (default 0: one per core)")
    parser.add_argument("--csv", metavar="F.csv", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="F.png", help="draw time and efficiency against devices (png, svg, pdf)")
    add_search_arguments(parser)
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
    from parplan.cli.args import amp_argument

    devices = parse_devices(args.devices)
    _check_outputs(args.csv, args.plot)
    amp_argument(args.amp, args.dtype)  # --amp with another --dtype: refused before any work
    document = run_sweep(args, devices)
    if args.csv:
        _write_csv(args.csv, document["rows"])
    if args.plot:
        from parplan.cli.plot import plot_sweep
        from planner.whatif import OneDevice, WhatIfRow

        rows = [WhatIfRow(**row) for row in document["rows"]]
        plot_sweep(rows, args.plot, _title(document), OneDevice(**document["one_device"]), weak=args.weak_scaling)
    if args.json:
        from parplan.cli.args import print_json

        print_json(document)
    else:
        from parplan.cli.report import print_whatif

        print_whatif(document)
    return 0


def run_sweep(args: argparse.Namespace, devices: list[int]) -> WhatIfDocument:
    """The command's sweep from its arguments (``parplan.whatif``)."""
    from parplan.api import whatif
    from parplan.cli.args import amp_argument, search_settings
    from parplan.cli.report import progress_bar

    with progress_bar("planning cluster sizes", enabled=not args.json) as progress:
        return whatif(args.model, args.input_shape, profile=args.profile, devices=devices,
                      devices_per_node=args.devices_per_node, scale_inter_bw=args.scale_inter_bw,
                      scale_intra_bw=args.scale_intra_bw, memory_gb=args.memory_gb, weak_scaling=args.weak_scaling,
                      settings=search_settings(args), dtype=args.dtype, jobs=args.jobs or None,
                      leaf_modules=tuple(args.leaf_module), progress=progress,
                      amp=amp_argument(args.amp, args.dtype))


def _check_outputs(csv_path: str | None, plot_path: str | None) -> None:
    from parplan.cli.args import check_out_dir, check_plot_path

    if csv_path:
        check_out_dir(csv_path, "--csv")
    if plot_path:
        check_plot_path(plot_path)


def _write_csv(path: str, rows: Sequence[Mapping[str, object]]) -> None:
    from cost_models.formats.jsonio import write_bytes_atomic

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_bytes_atomic(path, text.getvalue().encode("utf-8"))


def _title(document: WhatIfDocument) -> str:
    shape = "×".join(str(s) for s in document["input_shape"])
    return (f"{document['model']} at {shape} ({document['scaling']} scaling) on {document['device']}, "
            f"{document['devices_per_node']} per node")
