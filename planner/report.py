"""Human-readable renderings of parplan's results (rich tables), free of torch."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["format_bytes", "format_count", "print_layer_table"]


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


def print_layer_table(document: dict[str, Any], console: Console | None = None) -> None:
    """Print the ``parplan inspect`` table: one row per layer, then totals.

    Args:
        document: The ``inspect`` JSON document (graph dict plus ``totals``).
        console: Where to print (stdout by default).
    """
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"{document.get('model', 'model')} at {_shape(document['input_shape'])} ({document['dtype']})")
    for header, justify in (("#", "right"), ("layer", "left"), ("kind", "left"), ("module", "left"),
                            ("output", "left"), ("params", "right"), ("FLOP fwd", "right"), ("activation", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
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


def _shape(shape: Any) -> str:
    if shape and isinstance(shape[0], list):
        return " ".join(_shape(s) for s in shape)
    return "×".join(str(d) for d in shape)
