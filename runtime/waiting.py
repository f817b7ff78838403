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

The code lives in ``processes.rank_failures``, shared with calibration's
ranks (``parplan calibrate --timeout-s``), which may not import the runtime;
this module is the runtime's name for it. :func:`reason` reads gloo's and
NCCL's error texts alike (its docstring lists them).

NCCL does not fail the waiting call itself: its watchdog thread sees a
collective run past the group's timeout, or the communicator's asynchronous
error (``ncclRemoteError`` when a peer exited), and then acts as
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` says (``ProcessGroupNCCL.hpp``,
``WorkNCCL::handleException``): ``1`` (TearDown, torchrun's default) and
``3`` (SkipCleanUp, torch's own default) rethrow the error on the watchdog
thread, which ends the process with SIGABRT — the rank cannot say where it
waited, and the launcher reports only ``rank 0 died (SIGABRT)``; ``0`` does
nothing (the rank hangs for ever). ``2`` (CleanUpOnly) aborts the
communicators and leaves the process running: the kernel that waited ends,
and the rank's next call into the group raises ``DistBackendError("NCCL
communicator was aborted on rank 0. Original reason for failure was: …
Watchdog caught collective operation timeout: WorkNCCL(…, Timeout(ms)=4000)
ran for 4123 milliseconds …")``, which :func:`exchange` labels like gloo's
(the exchange named is the one that waited, or the next one when the wait was
a stream's). So a rank of ``parplan run`` or ``parplan calibrate`` with
backend nccl gets ``2`` (``runtime.launch``, ``calibrate.comm_ranks``;
``raise_nccl_errors``), unless the variable is set already; a job started by
the user's own ``torchrun`` keeps torchrun's ``1``.
"""

from __future__ import annotations

from processes.rank_failures import (
                                       LOST,
                                       RankFailure,
                                       all_reduce,
                                       at,
                                       barrier,
                                       describe,
                                       exchange,
                                       in_backward,
                                       place,
                                       reason,
                                       wait_all,
)

__all__ = ["LOST", "RankFailure", "all_reduce", "at", "barrier", "describe", "exchange", "in_backward", "place",
           "reason", "wait_all"]
