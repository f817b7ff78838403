"""How a failed rank is named: by itself, where it waited, and by whoever started the ranks (runtime, calibrate).

Shared by ``runtime`` (``parplan run``, whose modules import it through
``runtime.waiting``, where the why is told) and ``calibrate`` (the ranks
that time collectives), which may import nothing of each other. Two halves:

* in a rank: :func:`exchange` turns a backend's error inside a collective or a
  point-to-point exchange into a :class:`RankFailure` of one line, naming this
  rank, the exchange, its peers and the place (the labels :func:`at` pushed);
  :func:`reason` says in a few words what gloo's and NCCL's error texts mean;
* in the process that started the ranks: :func:`failure_line` reports how each
  failed rank ended (a signal, an exit code and its last error line) in one
  line, the rank killed by a signal first; :class:`RankFailedError` carries it
  to the command, which prints it as ``parplan …: error: …`` (exit 1).

Torch is imported inside the functions that call it, so the module loads without it.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup, ReduceOp, Work

__all__ = ["LOST", "NCCL_ERROR_HANDLING", "NCCL_RAISES", "Failure", "RankExit", "RankFailedError", "RankFailure",
           "all_reduce", "at", "barrier", "describe", "exchange", "failure_line", "failure_message", "in_backward",
           "nccl_errors_raised", "place", "raise_nccl_errors", "reason", "wait_all"]

_PLACE: ContextVar[tuple[str, ...]] = ContextVar("parplan_place", default=())

LOST = "lost the connection to a peer (it died)"

_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
         "Socket closed", "ProcessGroup aborted",
         # NCCL: a socket the remote end closed, and a communicator aborted after an error (its reason, when it
         # gives one, was looked at first)
         "closed by remote peer", "NCCL communicator was aborted")

_NCCL_REMOTE = ("ncclRemoteError", "remote process exited or there was a network error")
"""NCCL's words for a peer that exited or a network that failed (``ncclRemoteError``, since NCCL 2.13)."""

_NCCL_TIMEOUT = ("Watchdog caught collective operation timeout", "before timing out")
"""ProcessGroupNCCL's watchdog, on a collective that ran past its ``Timeout(ms)``."""

_NCCL_SYSTEM = "ncclSystemError"

_LOG_PREFIX = re.compile(r"^\[(?:PG [^\]]*|Rank \d+)\]\s*")
"""ProcessGroupNCCL's prefix of every message: ``[PG ID 0 PG GUID 0(default_pg) Rank 1] ``."""

NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_RAISES = "2"
"""``CleanUpOnly``: on a timeout or an error the watchdog aborts the communicators and leaves the process running,
so the error reaches the rank's next call into the group (``runtime.waiting`` tells why not 1 or 3)."""


class RankFailure(RuntimeError):
    """An exchange failed because a peer rank died, hung past the timeout, or closed its connection."""

    @property
    def peer_died(self) -> bool:
        """Whether a peer's connection closed (it died) rather than the wait timing out."""
        return LOST in str(self)


class RankFailedError(RuntimeError):
    """A rank of the group failed (and the restarts, if any, were used up); the message names it."""


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
    except RuntimeError as err:  # gloo/MPI raise RuntimeError, NCCL DistBackendError (one too)
        raise RankFailure(describe(what, peers, place() if where is None else where, err)) from err


def wait_all(requests: Iterable[Work], what: str, peers: Iterable[int] | None = None,
             where: Sequence[str] | None = None) -> None:
    """Wait for every request of a point-to-point exchange, under :func:`exchange`."""
    with exchange(what, peers, where):
        for request in requests:
            request.wait()


def describe(what: str, peers: Iterable[int] | None, where: Sequence[str], err: BaseException) -> str:
    """One line: ``rank 1: timed out after 5 s in the halo exchange with rank 0 (step 4, forward, layer conv2)``."""
    rank = _rank()
    others = sorted(set(peers or ()) - {rank})
    whom = "" if not others else f" with rank {others[0]}" if len(others) == 1 else \
        f" with ranks {', '.join(map(str, others))}"
    context = f" ({', '.join(where)})" if where else ""
    return f"rank {rank}: {reason(err)} in {what}{whom}{context}"


def reason(err: BaseException) -> str:
    """What the backend's error means, in a few words.

    gloo: ``Timed out waiting 4000ms for recv operation to complete`` → timed out after 4 s;
    ``Connection closed by peer`` (reset, broken pipe, …) → :data:`LOST`. NCCL (``ProcessGroupNCCL``): the
    watchdog's ``Watchdog caught collective operation timeout: WorkNCCL(…, Timeout(ms)=4000) ran for 4123
    milliseconds before timing out.`` → timed out after 4 s, also inside ``NCCL communicator was aborted on rank
    0. Original reason for failure was: …``; ``ncclRemoteError`` (a remote process exited) → :data:`LOST`;
    ``ncclSystemError`` → :data:`LOST` when its last error is a connection the peer closed or reset, else a
    reason of its own; a communicator aborted for no reason given → :data:`LOST`.
    """
    text = str(err)
    timed_out = re.search(r"Timed out waiting (\d+)\s*ms", text)  # gloo
    if not timed_out and any(words in text for words in _NCCL_TIMEOUT):  # a Work's Timeout(ms) is its limit
        timed_out = re.search(r"Timeout\(ms\)=(\d+)", text)
    timed_out = timed_out or re.search(r"timed out after (\d+)\s*(?:ms|milliseconds)\b", text, re.IGNORECASE)
    if timed_out:
        return f"timed out after {int(timed_out.group(1)) / 1000:g} s (a peer hung or is far behind)"
    if any(marker in text for marker in _NCCL_REMOTE):
        return LOST
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "timed out (a peer hung or is far behind)"
    if any(marker in text for marker in _LOST):
        return LOST
    if _NCCL_SYSTEM in text:
        return "a system call of NCCL failed (ncclSystemError: a socket, memory or device error)"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return _LOG_PREFIX.sub("", first)[:200]


def all_reduce(tensor: torch.Tensor, what: str, op: ReduceOp | ReduceOp.RedOpType | None = None,
               group: ProcessGroup | None = None) -> None:
    """``dist.all_reduce`` (sum unless ``op``) in place, under :func:`exchange` named ``what``."""
    import torch.distributed as dist

    with exchange(what, dist.get_process_group_ranks(group) if group is not None else None):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group)


def barrier(what: str, group: ProcessGroup | None = None) -> None:
    """``dist.barrier`` of every rank (of ``group``), under :func:`exchange` named ``what``."""
    import torch.distributed as dist

    with exchange(what, dist.get_process_group_ranks(group) if group is not None else None):
        dist.barrier(group=group)


def _rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


# --- NCCL's watchdog --------------------------------------------------------------------------------------------

def raise_nccl_errors(backend: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Under nccl, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` in this process (before its group starts), unless set.

    Then the watchdog's timeout or error reaches this rank's :func:`exchange` as an error instead of ending the
    process (``runtime.waiting`` tells the modes apart). A value the user set is kept.
    """
    if backend == "nccl":
        (os.environ if environ is None else environ).setdefault(NCCL_ERROR_HANDLING, NCCL_RAISES)


@contextmanager
def nccl_errors_raised(backend: str) -> Iterator[None]:
    """:func:`raise_nccl_errors` for the duration only: for ranks started meanwhile, which inherit this environment
    (torchrun's agent passes its own value on, ``1`` when unset)."""
    before = os.environ.get(NCCL_ERROR_HANDLING)
    raise_nccl_errors(backend)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NCCL_ERROR_HANDLING, None)


# --- the starter's report ---------------------------------------------------------------------------------------

class Failure(Protocol):
    """How one rank ended: a :class:`RankExit`, or torchrun's ``ProcessFailure`` (the same attributes)."""

    @property
    def exitcode(self) -> int | None: ...

    @property
    def timestamp(self) -> float: ...

    @property
    def message(self) -> str | Mapping[str, object]: ...


@dataclass(frozen=True)
class RankExit:
    """How one rank ended, as torchrun's agent reports it (``ProcessFailure``): exit code (negative: the signal that
    killed it), when it was seen (seconds), and its error (``ExceptionType: message``, or ``""``)."""

    exitcode: int | None
    timestamp: float
    message: str | Mapping[str, object] = ""


def failure_line(failures: Mapping[int, Failure], max_restarts: int = 0) -> str:
    """One line: the rank that failed first, how, and its error; then what the other failed ranks reported.

    ``failures``: rank → a :class:`RankExit` or anything with its attributes (torchrun's ``ProcessFailure``).
    A rank killed by a signal comes first (the others' errors are what its death did to them), then by time.
    """
    if not failures:
        return "a rank failed without a report"

    def order(rank: int) -> tuple[bool, float, int]:
        failure = failures[rank]
        return (not (failure.exitcode is not None and failure.exitcode < 0), failure.timestamp, rank)

    first_rank = min(failures, key=order)
    parts = [_one_failure(first_rank, failures[first_rank])]
    parts += [_one_failure(rank, failure) for rank, failure in sorted(failures.items()) if rank != first_rank]
    tried = f" (after {max_restarts} restart{'s' if max_restarts != 1 else ''})" if max_restarts else ""
    return "; ".join(parts) + tried


def failure_message(failure: Failure) -> str:
    """A failed rank's error text: torchrun's error file gives ``{"message": …}``, a :class:`RankExit` a string."""
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
    return str(message).strip()


def _one_failure(rank: int, failure: Failure) -> str:
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        return f"rank {rank} died ({name})"
    message = failure_message(failure)
    last = message.splitlines()[-1] if message else ""
    return f"rank {rank} failed (exit code {failure.exitcode})" + (f": {last}" if last else "")
