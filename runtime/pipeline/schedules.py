"""The order in which one pipeline stage runs its forwards, backwards and updates: pure event lists.

An :class:`Event` is ``F b`` (forward of batch or micro-batch ``b``), ``B b``
(its backward; under the stale schedule the forward is first recomputed from
the stashed input) or ``U`` (optimizer step). A stage executes its list in
order; every send is non-blocking and every receive waits, so the lists of
neighbouring stages only have to agree on the order of the batches.

* :func:`gpipe` — fill/drain: all ``M`` forwards, all ``M`` backwards, one
  update. Stage-independent.
* :func:`one_f_one_b` — PipeDream-flush: stage ``k`` of ``K`` runs
  ``min(K−1−k, M)`` forwards to fill, then alternates a forward and a
  backward, then drains; one update. Same result as GPipe, fewer activations
  alive (at most ``K−k`` micro-batches instead of ``M``).
* :func:`dsp` — Diversely Stale Parameters: whole batches, no flush. A stage
  runs the next forward while fewer than ``staleness + 1`` batches are in
  flight (forwarded, not yet backwarded), otherwise the oldest backward and an
  update. With DSP's ``2(K−1−k)`` this is the paper's timeline (at each tick
  one forward, then the backward of the batch that entered ``2(K−1−k)`` ticks
  before); batch ``b``'s update then follows ``staleness`` updates made after
  its forward (:func:`staleness_of`). Staleness 0 is plain sequential SGD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Event", "EventKind", "dsp", "dsp_after", "gpipe", "forwarded_after", "one_f_one_b", "staleness_of"]

EventKind = Literal["F", "B", "U"]
"""A forward, a backward or an update (optimizer step)."""


@dataclass(frozen=True)
class Event:
    """One step of a stage's schedule: ``kind`` is ``"F"``, ``"B"`` or ``"U"``; ``batch`` is -1 for ``U``."""

    kind: EventKind
    batch: int = -1

    def __str__(self) -> str:
        return self.kind if self.kind == "U" else f"{self.kind}{self.batch}"


def gpipe(micro_batches: int) -> tuple[Event, ...]:
    """Fill/drain: ``F0 … F(M−1)``, ``B0 … B(M−1)``, ``U``."""
    _positive(micro_batches, "micro_batches")
    return (*(Event("F", b) for b in range(micro_batches)), *(Event("B", b) for b in range(micro_batches)),
            Event("U"))


def one_f_one_b(stages: int, stage: int, micro_batches: int) -> tuple[Event, ...]:
    """PipeDream-flush order for ``stage`` of ``stages`` (module docstring)."""
    _positive(micro_batches, "micro_batches")
    _stage(stages, stage)
    fill = min(stages - 1 - stage, micro_batches)
    events = [Event("F", b) for b in range(fill)]
    for b in range(micro_batches - fill):
        events += [Event("F", fill + b), Event("B", b)]
    events += [Event("B", b) for b in range(micro_batches - fill, micro_batches)]
    return (*events, Event("U"))


def dsp(batches: int, staleness: int) -> tuple[Event, ...]:
    """The stale schedule of one stage over ``batches`` batches with at most ``staleness`` stale updates."""
    _positive(batches, "batches")
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    events: list[Event] = []
    forwarded = backwarded = 0
    while backwarded < batches:
        if forwarded < batches and forwarded - backwarded <= staleness:
            events.append(Event("F", forwarded))
            forwarded += 1
        else:
            events += [Event("B", backwarded), Event("U")]
            backwarded += 1
    return tuple(events)


def dsp_after(batches: int, staleness: int, updates: int) -> tuple[Event, ...]:
    """What is left of :func:`dsp` ``(batches, staleness)`` after its ``updates``-th update: the events of a stage
    resumed from a checkpoint taken there (``runtime.pipeline.worker``)."""
    events = dsp(batches, staleness)
    if updates == 0:
        return events
    done = [index for index, event in enumerate(events) if event.kind == "U"]
    if not 0 < updates <= len(done):
        raise ValueError(f"a stale schedule of {batches} batches has {len(done)} updates, not {updates}")
    return events[done[updates - 1] + 1:]


def forwarded_after(batches: int, staleness: int, updates: int) -> int:
    """How many batches :func:`dsp` ``(batches, staleness)`` has forwarded by its ``updates``-th update (``≥ 1``):
    ``updates + staleness``, within the ``batches``; those from ``updates`` on are in flight."""
    return min(batches, updates + staleness)


def staleness_of(events: Sequence[Event]) -> dict[int, int]:
    """Per batch: how many updates ran between its forward and its backward."""
    updates = 0
    at_forward: dict[int, int] = {}
    found: dict[int, int] = {}
    for event in events:
        if event.kind == "U":
            updates += 1
        elif event.kind == "F":
            at_forward[event.batch] = updates
        elif event.batch in at_forward:
            found[event.batch] = updates - at_forward[event.batch]
    return found


def _positive(value: int, name: str) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _stage(stages: int, stage: int) -> None:
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} is not one of the {stages} stages 0…{stages - 1}")
