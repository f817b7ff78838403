"""Cutting the traced model into the plan's pipeline stages: which nodes each stage runs, what crosses a cut.

A layer runs on the stage the plan gives it. Stages must be contiguous in
the traced (topological) order: a layer may not sit on an earlier stage than
a layer before it. The model's inputs (every one, for a model taking several
tensors) belong to stage 0 and the output node
to the last stage. Nodes that are not layers (``x.size(0)``, attribute reads)
run on the stage of their first user; one that nothing reads (the discarded
half of ``x, _ = attention(x)``) runs on the stage of its latest input. A
value crossing a cut — an activation, a skip connection over any number of
stages, a model input read by a later stage — is sent by its producer
straight to every later stage that reads it; its gradient comes back the
same way. Only tensors the plan places (layers and the inputs) may cross —
and values computed from traced shapes alone (``runtime.shapes``: every
stage evaluates them, nothing is sent).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from torch.fx import Node

from cost_models.errors import PlanError

__all__ = ["Crossing", "StageCut", "cut_stages"]


@dataclass(frozen=True)
class Crossing:
    """A value that leaves stage ``producer`` for the later ``consumers``; ``tag`` numbers it on the wire."""

    name: str
    producer: int
    consumers: tuple[int, ...]
    tag: int


@dataclass(frozen=True)
class StageCut:
    """The nodes stage ``index`` runs (in order), the crossings it receives and those it sends."""

    index: int
    nodes: tuple[str, ...]
    receives: tuple[Crossing, ...]
    sends: tuple[Crossing, ...]


def cut_stages(nodes: Sequence[Node], stage_of_layer: Mapping[str, int], stages: int, *,
               static: Collection[str] = ()) -> tuple[StageCut, ...]:
    """The stages' cuts of the traced ``nodes`` (module docstring).

    Args:
        nodes: The traced graph's nodes in order.
        stage_of_layer: The plan's stage of each layer (node name).
        stages: How many stages the plan has.
        static: Nodes whose values every stage computes from traced shapes (``runtime.shapes.static_nodes``).

    Raises:
        PlanError: Stages out of order, or a value that is not a placed tensor crossing a cut (named).
    """
    stage = _node_stages(nodes, stage_of_layer, stages)
    crossings = _crossings(nodes, stage, stage_of_layer, frozenset(static))
    return tuple(StageCut(k, tuple(n.name for n in nodes if stage[n.name] == k),
                          tuple(c for c in crossings if k in c.consumers),
                          tuple(c for c in crossings if c.producer == k))
                 for k in range(stages))


def _node_stages(nodes: Sequence[Node], stage_of_layer: Mapping[str, int], stages: int) -> dict[str, int]:
    found: dict[str, int | None] = {}
    for node in reversed(nodes):  # users first: a non-layer node takes its first user's stage
        if node.op == "placeholder":
            found[node.name] = 0
        elif node.op == "output":
            found[node.name] = stages - 1
        elif node.name in stage_of_layer:
            found[node.name] = stage_of_layer[node.name]
        else:
            used = [taken for user in node.users if (taken := found.get(user.name)) is not None]
            found[node.name] = min(used) if used else None  # read by nobody (``x, _ = attention(x)``)
    stage: dict[str, int] = {}
    for node in nodes:  # what nobody reads runs with its latest input: nothing crosses for it
        known = found[node.name]
        stage[node.name] = known if known is not None else max((stage[n.name] for n in node.all_input_nodes),
                                                               default=0)
    latest, latest_name = 0, ""
    for node in nodes:
        if node.name in stage_of_layer:
            if stage[node.name] < latest:
                raise PlanError(f"layer '{node.name}' is on stage {stage[node.name]} but comes after '{latest_name}' "
                                f"on stage {latest}; stages must be contiguous in the model's order")
            latest, latest_name = stage[node.name], node.name
    return stage


def _crossings(nodes: Sequence[Node], stage: Mapping[str, int], placed: Mapping[str, int],
               static: frozenset[str]) -> list[Crossing]:
    crossings: list[Crossing] = []
    for node in nodes:
        later = sorted({stage[user.name] for user in node.users
                        if stage[user.name] > stage[node.name] and user.name not in static})
        if not later or node.name in static:
            continue
        if node.op != "placeholder" and node.name not in placed:
            raise PlanError(f"'{node.name}' ({node.op} {node.target}) is computed on stage {stage[node.name]} and read "
                            f"on stage {later[0]}, but only layers' tensors can cross a cut; move the cut")
        crossings.append(Crossing(node.name, stage[node.name], tuple(later), len(crossings)))
    return crossings
