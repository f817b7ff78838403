"""What every ``parplan`` command's front end shares: the parser, argument types, the model options, JSON out.

``planner.cli`` and each ``*_cli`` module (check, checkpoint, validate,
what-if) build their commands from these, so that a usage error reads the
same in every command (one line, exit 2) and ``--model``/``--input-shape``
mean the same everywhere. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

__all__ = ["OneLineParser", "add_model_arguments", "cluster_for", "int_at_least", "non_negative_int",
           "positive_float", "positive_int", "print_json"]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--input-shape``, ``--dtype`` and ``--leaf-module``."""
    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="torchvision:NAME, package.module:factory or path/to/file.py:factory")
    parser.add_argument("--input-shape", required=True, action="append", metavar="N,C,H,W",
                        help="global input shape, e.g. 64,3,224,224; repeatable: a model whose forward takes several "
                             "tensors gets one per positional argument, in order, each batch first (e.g. "
                             "--input-shape 64,3,224,224 --input-shape 64,16)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "float64"),
                        help="element type of inputs and activations (default float32)")
    parser.add_argument("--leaf-module", action="append", default=[], metavar="NAME",
                        help="keep this module (qualified or class name) opaque to torch.fx; repeatable")


def positive_int(text: str) -> int:
    return int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return int_at_least(text, 0)


def int_at_least(text: str, minimum: int) -> int:
    """``text`` as an integer of at least ``minimum``; else argparse's one-line type error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def cluster_for(text: str, profile: Any, devices: int, per_node: int | None) -> Any:
    """The cluster a plan is made for: a preset's nodes and links, or a measured profile's."""
    from dataclasses import replace

    from calibrate.presets import is_preset, preset_cluster
    from cost_models.cluster import Cluster, Link

    if is_preset(text) and not os.path.exists(text):
        cluster = preset_cluster(text, devices)
        return replace(cluster, devices_per_node=per_node) if per_node else cluster
    links = []
    for level in ("intra", "inter"):
        seconds_small = profile.comm_time_s("sendrecv", level, 2, 0)
        seconds_large = profile.comm_time_s("sendrecv", level, 2, 2**26)
        links.append(Link(seconds_small, 2**26 / max(seconds_large - seconds_small, 1e-12)))
    return Cluster(devices, per_node or devices, profile.device.memory_bytes, links[0], links[1],
                   profile.device.name)


def print_json(document: Any) -> None:
    """``document`` on stdout, indented, UTF-8 kept."""
    json.dump(document, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
