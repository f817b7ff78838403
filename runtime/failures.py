"""Naming where a rank was waiting when a peer failed it: the step, the pass, the layer and the exchange.

Every collective and point-to-point exchange of the runtime runs inside
:func:`exchange` (or :func:`wait_all`). The backends give the waiting rank an
error when a peer dies (gloo: "Connection closed by peer") or does not answer
within the process group's timeout (``init_process_group(timeout=…)``, which
``parplan run --timeout-s`` sets for every group). :func:`exchange` turns that
error into a :class:`RankFailure` whose message names this rank, the exchange,
its peers and the *place*: the labels the training loop and the interpreter
pushed with :func:`at` (``step 4``, ``forward``, ``layer conv2``).

An autograd function captures :func:`place` in its forward and passes it,
turned by :func:`in_backward`, to the exchange of its backward — the backward
pass runs outside the forward's labels.

NCCL is different: its watchdog aborts the process on a timeout (the default
``TORCH_NCCL_ASYNC_ERROR_HANDLING``), so the launcher reports that rank's exit.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterable, Iterator, Sequence

import torch.distributed as dist

__all__ = ["RankFailure", "all_reduce", "at", "barrier", "exchange", "in_backward", "place", "wait_all"]

_PLACE: ContextVar[tuple[str, ...]] = ContextVar("parplan_place", default=())

LOST = "lost the connection to a peer (it died)"

_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
         "Socket closed", "ProcessGroup aborted")


class RankFailure(RuntimeError):
    """An exchange failed because a peer rank died, hung past the timeout, or closed its connection."""

    @property
    def peer_died(self) -> bool:
        """Whether a peer's connection closed (it died) rather than the wait timing out."""
        return LOST in str(self)


@contextmanager
def at(label: str) -> Iterator[None]:
    """Push ``label`` onto this thread's place for the duration (``step 4``, ``forward``, ``layer conv2``)."""
    token = _PLACE.set((*_PLACE.get(), label))
    try:
        yield
    finally:
        _PLACE.reset(token)


def place() -> tuple[str, ...]:
    """The labels pushed by the enclosing :func:`at` blocks, outermost first."""
    return _PLACE.get()


def in_backward(captured: Sequence[str]) -> tuple[str, ...]:
    """A forward's captured place, as the place of its backward (``forward`` becomes ``backward``)."""
    labels = tuple("backward" if label == "forward" else label for label in captured)
    return labels if "backward" in labels else (*labels, "backward")


@contextmanager
def exchange(what: str, peers: Iterable[int] | None = None, where: Sequence[str] | None = None) -> Iterator[None]:
    """Run an exchange; a backend error inside becomes a :class:`RankFailure` naming ``what``, peers and place."""
    try:
        yield
    except RankFailure:
        raise
    except RuntimeError as err:  # gloo/MPI raise RuntimeError (DistBackendError is one)
        raise RankFailure(describe(what, peers, place() if where is None else where, err)) from err


def wait_all(requests: Iterable[Any], what: str, peers: Iterable[int] | None = None,
             where: Sequence[str] | None = None) -> None:
    """Wait for every request of a point-to-point exchange, under :func:`exchange`."""
    with exchange(what, peers, where):
        for request in requests:
            request.wait()


def describe(what: str, peers: Iterable[int] | None, where: Sequence[str], err: BaseException) -> str:
    """One line: ``rank 1: timed out after 5 s in the halo exchange with rank 0 (step 4, forward, layer conv2)``."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    others = sorted(set(peers or ()) - {rank})
    whom = "" if not others else f" with rank {others[0]}" if len(others) == 1 else \
        f" with ranks {', '.join(map(str, others))}"
    context = f" ({', '.join(where)})" if where else ""
    return f"rank {rank}: {reason(err)} in {what}{whom}{context}"


def reason(err: BaseException) -> str:
    """What the backend's error means, in a few words."""
    text = str(err)
    timed_out = re.search(r"Timed out waiting (\d+)\s*ms", text)
    if timed_out:
        return f"timed out after {int(timed_out.group(1)) / 1000:g} s (a peer hung or is far behind)"
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "timed out (a peer hung or is far behind)"
    if any(marker in text for marker in _LOST):
        return LOST
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:200]


def all_reduce(tensor: Any, what: str, op: Any = None, group: Any = None) -> None:
    """``dist.all_reduce`` (sum unless ``op``) in place, under :func:`exchange` named ``what``."""
    with exchange(what, dist.get_process_group_ranks(group) if group is not None else None):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group)


def barrier(what: str) -> None:
    """``dist.barrier()`` of every rank, under :func:`exchange` named ``what``."""
    with exchange(what):
        dist.barrier()
