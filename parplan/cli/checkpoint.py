"""``parplan checkpoint``: inspect the checkpoints ``parplan run`` wrote, and gather one to its plan-independent form.

* ``parplan checkpoint show --checkpoint-dir D``: every complete checkpoint —
  step, ranks, plan, size — newest last.
* ``parplan checkpoint gather --checkpoint-dir D [--step K]``: join the
  per-rank shards of the newest checkpoint (or step ``K``'s) into
  ``full.pt`` in its folder: every parameter, buffer and optimizer tensor
  whole, by name (``runtime.checkpoint.gather``; loads with
  ``torch.load(..., weights_only=True)``). The manifest records it, and a
  resume under another plan then reads it instead of every shard.

Bad input (no such folder, no complete checkpoint, no such step, a damaged
shard) is one line and exit code 2; ``full.pt`` is written atomically.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cost_models.errors import InputError

if TYPE_CHECKING:
    from parplan.cli.args import Commands, OneLineParser

__all__ = ["add_checkpoint"]


def add_checkpoint(commands: Commands, common: OneLineParser) -> None:
    """Register ``parplan checkpoint show|gather``."""
    from parplan.cli.args import OneLineParser, positive_int

    parser = commands.add_parser("checkpoint", help="show checkpoints; gather one to its plan-independent form")
    actions = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser, metavar="ACTION")
    show = actions.add_parser("show", parents=[common], help="the complete checkpoints in a folder")
    show.add_argument("--checkpoint-dir", required=True, metavar="D", help="the folder parplan run wrote")
    show.set_defaults(handler=_show)
    gather = actions.add_parser("gather", parents=[common], help="write full.pt: every tensor whole, by name")
    gather.add_argument("--checkpoint-dir", required=True, metavar="D", help="the folder parplan run wrote")
    gather.add_argument("--step", type=positive_int, metavar="K",
                        help="the checkpoint after K updates (default: the newest)")
    gather.set_defaults(handler=_gather)


def _manifests(directory: str) -> list[dict[str, Any]]:
    from runtime.checkpoint import complete, read_manifest

    if not Path(directory).is_dir():
        raise InputError(f"--checkpoint-dir {directory} is not a folder; give the folder parplan run wrote")
    manifests = [read_manifest(folder) for folder in complete(directory)]
    if not manifests:
        raise InputError(f"--checkpoint-dir {directory} holds no complete checkpoint (no step-*/manifest.json)")
    return manifests


def _show(args: argparse.Namespace) -> int:
    from parplan.cli.args import print_json

    rows = [{"step": m["step"], "ranks": m["world_size"], "plan_digest": m["plan_digest"], "folder": m["folder"],
             "bytes": sum(s["bytes"] for s in m["shards"]), "gathered": "full" in m, "created": m["created"],
             "model": m["model"]["spec"], "input_shape": m["model"]["input_shape"]}
            for m in _manifests(args.checkpoint_dir)]
    if args.json:
        print_json({"format": "parplan.checkpoints/1", "checkpoints": rows})
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"checkpoints in {args.checkpoint_dir}")
    for column in ("step", "ranks", "plan", "MiB", "gathered", "created"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["step"]), str(row["ranks"]), row["plan_digest"], f"{row['bytes'] / 2**20:.1f}",
                      "yes" if row["gathered"] else "no", row["created"])
    Console().print(table)
    return 0


def _gather(args: argparse.Namespace) -> int:
    from parplan.cli.args import print_json
    from runtime.checkpoint import write_full

    manifests = _manifests(args.checkpoint_dir)
    chosen = manifests[-1] if args.step is None else next((m for m in manifests if m["step"] == args.step), None)
    if chosen is None:
        steps = ", ".join(str(m["step"]) for m in manifests)
        raise InputError(f"--step {args.step}: {args.checkpoint_dir} has checkpoints after steps {steps}; pick one")
    path = write_full(chosen)
    document = {"format": "parplan.gathered/1", "step": chosen["step"], "from_ranks": chosen["world_size"],
                "file": str(path), "bytes": path.stat().st_size}
    if args.json:
        print_json(document)
    else:
        print(f"step {document['step']}: {document['from_ranks']} shard(s) gathered into {path} "
              f"({document['bytes'] / 2**20:.1f} MiB)")
    return 0
