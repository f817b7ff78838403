"""What the backends' error texts mean (``runtime.waiting.reason``): gloo's and NCCL's alike, without a GPU.

The NCCL texts are those torch 2.x's ``ProcessGroupNCCL`` builds (``ProcessGroupNCCL.cpp``:
``WorkNCCL::checkTimeout`` and ``operator<<(WorkNCCL)``; ``NCCLUtils.hpp``: ``C10D_NCCL_CHECK``,
``getNcclErrorDetailStr``, ``NCCLComm::getNcclComm``), with the ``[PG ID … Rank r]`` prefix of its log lines and the
C++ frames torch appends to a ``DistBackendError``.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch.distributed as dist

from processes.rank_failures import NCCL_ERROR_HANDLING, RankExit, failure_line, nccl_errors_raised, raise_nccl_errors
from runtime.waiting import LOST, RankFailure, at, describe, exchange, reason

PREFIX = "[PG ID 0 PG GUID 0(default_pg) Rank 0] "
FRAMES = ("\nException raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:688 "
          "(most recent call first):\nframe #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
          "(0x7f1c2a3b9446 in /usr/lib/python3/site-packages/torch/lib/libc10.so)\nframe #1: <unknown function> + "
          "0x1234 (0x7f1bd84 in /usr/lib/python3/site-packages/torch/lib/libtorch_cuda.so)")
WATCHDOG = (PREFIX + "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
            "NumelIn=256, NumelOut=256, Timeout(ms)=4000) ran for 4123 milliseconds before timing out.")
REMOTE = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there "
          "was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error "
          "or a remote process exiting prematurely.\nLast error:\nsocketProgress: Connection closed by remote peer "
          "node-a.cluster<42170>")
SYSTEM = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error "
          "(run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclSystemError: System call (e.g. socket, "
          "malloc) or external library call failed or device error. \nLast error:\n")
ABORTED = "NCCL communicator was aborted on rank 0. "
TIMED_OUT_4 = "timed out after 4 s (a peer hung or is far behind)"


@pytest.mark.parametrize(("text", "meaning"), [
    # gloo
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 4000ms for recv operation to "
     "complete", TIMED_OUT_4),
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40241", LOST),
    # NCCL: the watchdog's timeout, as raised (blocking wait, a Work's future) and as the reason a communicator it
    # aborted gives on the rank's next call (TORCH_NCCL_ASYNC_ERROR_HANDLING=2)
    (WATCHDOG + FRAMES, TIMED_OUT_4),
    (ABORTED + " Original reason for failure was: " + WATCHDOG.replace("Timeout(ms)=4000", "Timeout(ms)=300000")
     .replace("4123", "300046") + FRAMES.replace("checkTimeout", "getNcclComm"),
     "timed out after 300 s (a peer hung or is far behind)"),
    (PREFIX + "NCCL communicator encountered error set by ProcessGroupNCCL: " + WATCHDOG, TIMED_OUT_4),
    # NCCL: a peer that exited
    (REMOTE + FRAMES.replace("checkTimeout", "checkForNCCLErrors"), LOST),
    (PREFIX + "NCCL communicator encountered error set by ProcessGroupNCCL: " + REMOTE, LOST),
    (ABORTED + " Original reason for failure was: " + REMOTE, LOST),
    (PREFIX + "Work WorkNCCL(SeqNum=9, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) raised the "
     "following async exception: " + REMOTE, LOST),  # a Work's own Timeout(ms) is not a timeout
    # NCCL: a system error: a connection the peer reset is a lost peer, anything else says what failed
    (SYSTEM + "socketProgressOpt: Call to recv from 10.1.1.2<35321> failed : Connection reset by peer", LOST),
    (SYSTEM + "Cuda failure 'out of memory'", "a system call of NCCL failed (ncclSystemError: a socket, memory or "
                                              "device error)"),
    # NCCL: a communicator aborted with no reason given, and one that timed out while it was made
    (ABORTED + FRAMES.replace("checkTimeout", "getNcclComm"), LOST),
    ("NCCL timeout in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:92, internal error - please report this "
     "issue to the NCCL developers, NCCL version 2.21.5", "timed out (a peer hung or is far behind)"),
    # anything else: its first line, without NCCL's log prefix
    (PREFIX + "ProcessGroupNCCL is only supported with GPUs, no GPUs found!\nsecond line",
     "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"),
])
def test_gloo_and_nccl_error_texts_map_to_the_same_reasons(text: str, meaning: str) -> None:
    assert reason(dist.DistBackendError(text)) == meaning
    assert reason(RuntimeError(text)) == meaning


def test_an_nccl_error_inside_an_exchange_is_one_line_naming_the_exchange_the_peer_and_the_place() -> None:
    with pytest.raises(RankFailure) as caught, at("step 3"), at("backward"):
        with exchange("the gradient allreduce", [0, 1]):
            raise dist.DistBackendError(ABORTED + " Original reason for failure was: " + WATCHDOG + FRAMES)
    assert str(caught.value) == f"rank 0: {TIMED_OUT_4} in the gradient allreduce with rank 1 (step 3, backward)"
    assert not caught.value.peer_died
    line = describe("the timed allreduce of 1024 bytes", range(4), ("measurement 2 of 34",),
                    dist.DistBackendError(REMOTE + FRAMES))
    assert line == (f"rank 0: {LOST} in the timed allreduce of 1024 bytes with ranks 1, 2, 3 (measurement 2 of 34)")
    assert "\n" not in line and RankFailure(line).peer_died


def test_nccl_ranks_get_the_watchdog_mode_that_leaves_the_error_to_them_unless_one_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NCCL_ERROR_HANDLING, raising=False)
    environ: dict[str, str] = {}
    raise_nccl_errors("gloo", environ)
    assert environ == {}
    raise_nccl_errors("nccl", environ)
    assert environ == {NCCL_ERROR_HANDLING: "2"}
    mine = {NCCL_ERROR_HANDLING: "1"}
    raise_nccl_errors("nccl", mine)
    assert mine == {NCCL_ERROR_HANDLING: "1"}
    with nccl_errors_raised("nccl"):  # for the ranks started meanwhile (torchrun's agent passes it on)
        assert os.environ[NCCL_ERROR_HANDLING] == "2"
    assert NCCL_ERROR_HANDLING not in os.environ
    monkeypatch.setenv(NCCL_ERROR_HANDLING, "3")
    with nccl_errors_raised("nccl"):
        assert os.environ[NCCL_ERROR_HANDLING] == "3"
    assert os.environ[NCCL_ERROR_HANDLING] == "3"


def test_the_starters_line_names_a_killed_rank_first_then_by_time() -> None:
    failures = {0: RankExit(1, 10.5, "RankFailure: rank 0: lost the connection to a peer (it died) in the timed "
                                     "allreduce of 1024 bytes with rank 1 (measurement 3 of 34)"),
                1: RankExit(-signal.SIGKILL, 11.0), 2: RankExit(3, 10.0)}
    assert failure_line(failures) == (
        "rank 1 died (SIGKILL); rank 0 failed (exit code 1): RankFailure: rank 0: lost the connection to a peer (it "
        "died) in the timed allreduce of 1024 bytes with rank 1 (measurement 3 of 34); rank 2 failed (exit code 3)")
    assert failure_line({}) == "a rank failed without a report"
