"""What ``parplan run --resume`` takes from the checkpoint it continues: the checkpoint, its plan and its flags.

A resume that does not give again the flags its run was started with keeps
them (the manifest's ``run``: ``--checkpoint-every``, ``--order``,
``--staleness``, ``--lr``), and without ``--plan`` or ``--layout`` it keeps the
checkpoint's plan; one line on stderr says what it kept. A flag given again
with another value wins, and one line says what changed. The checkpoint is
the newest complete one whose shards have the sizes its manifest records
(one line for each passed over; the ranks also check the digests,
``runtime.recovery``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from cost_models.errors import InputError

__all__ = ["DEFAULTS", "defaults", "kept_flags", "newest_whole", "resumed"]

DEFAULTS = {"checkpoint_every": None, "order": "1f1b", "staleness": None, "lr": 0.01}
"""Each remembered flag's value when neither given nor remembered (``None``: off / the plan's)."""
_FLAGS = {"checkpoint_every": "--checkpoint-every", "order": "--order", "staleness": "--staleness", "lr": "--lr"}


def resumed(args: argparse.Namespace) -> tuple[dict[str, Any] | None, list[str]]:
    """The manifest ``--resume`` continues from (``None`` without ``--resume`` or a folder: ``run_checks``
    refuses that), after filling in the flags and the plan it keeps (module docstring), and the lines that say
    so — to print once every check has passed (bad input is one line)."""
    if not (args.resume and args.checkpoint_dir):
        return None, []
    lines: list[str] = []
    manifest = newest_whole(args.checkpoint_dir, lines)
    if manifest is None:
        return None, lines
    kept = kept_flags(args, manifest.get("run", {}), lines)
    if not (args.plan or args.layout):
        kept.append("its plan")
    if kept:
        lines.append(f"parplan run: resuming with the checkpoint's {', '.join(kept)} ({manifest['folder']})")
    return manifest, lines


def kept_flags(args: argparse.Namespace, run: Mapping[str, object], lines: list[str]) -> list[str]:
    """Fill each remembered flag not given (``None`` in ``args``) from ``run``, else its default; returns the
    kept ones as ``--flag value``, and adds to ``lines`` one saying which given ones differ from ``run``."""
    kept, changed = [], []
    for name, flag in _FLAGS.items():
        given, saved = getattr(args, name), run.get(name, DEFAULTS[name])
        if given is None:
            setattr(args, name, saved if saved is not None else DEFAULTS[name])
            if saved not in (None, 0) and saved != DEFAULTS[name]:
                kept.append(f"{flag} {saved}")
        elif name in run and given != saved:
            changed.append(f"{flag} {given} (the checkpoint's run had {saved if saved is not None else 'none'})")
    if changed:
        lines.append(f"parplan run: resuming with {', '.join(changed)}")
    return kept


def defaults(args: argparse.Namespace) -> None:
    """Each remembered flag not given and not resumed: its default."""
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def newest_whole(directory: str, lines: list[str] | None = None) -> dict[str, Any] | None:
    """The newest complete checkpoint in ``directory`` whose shards have their recorded sizes (``None``: none is
    complete); a line in ``lines`` for each newer one passed over.

    Raises:
        InputError: Every complete checkpoint is damaged.
    """
    from runtime.checkpoint import check_sizes, complete, read_manifest

    found = complete(directory)
    for folder in reversed(found):
        manifest = read_manifest(folder)
        try:
            check_sizes(manifest)
        except InputError as err:
            if lines is not None:
                lines.append(f"parplan run: warning: passing over the damaged checkpoint {folder}: {err}")
            continue
        return manifest
    if found:
        raise InputError(f"every checkpoint in {directory} is damaged (the newest: {found[-1]}); start afresh in an "
                         "empty --checkpoint-dir")
    return None
