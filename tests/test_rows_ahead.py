"""The helper process that computes the search's layer-cost rows ahead (``planner.ahead``, ``planner.ahead``):
what it sends is what the planner would make, a search plans the same with it or without, and nothing it does —
failing, or still running at the end — reaches the planner."""

from __future__ import annotations

import time

import pytest
from conftest import build_model

import planner.ahead as rows_ahead_module
from calibrate.presets import preset_cluster, preset_profile
from cost_models.cluster import stage_cluster
from cost_models.estimate import CostMemo
from cost_models.ir.tracing import trace
from planner.ahead import ahead, rows_ahead
from planner.search import plan_model
from planner.settings import SearchSettings
from planner.space import LayerCosts

pytestmark = pytest.mark.skipif(ahead(lambda send: None) is None, reason="no second core or no fork here")


def _finished(side) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 120
    while side.gather() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not side.helper.open


def test_the_helper_sends_every_row_the_planner_would_make() -> None:
    graph, profile = trace(build_model("resnet18"), (2, 3, 64, 64)), preset_profile("h100")
    cluster = preset_cluster("h100", 16)
    settings = SearchSettings(max_stages=4)
    side = rows_ahead(graph, profile, cluster, settings, CostMemo(profile, "float32"), least=0)
    assert side is not None
    try:
        _finished(side)
        tables = {table for table, _ in side.jobs}
        assert tables == {(16, False), (8, True), (4, True)}  # the one-stage space; 2 and 3 stages of 8, 4 stages of 4
        for devices, recompute in sorted(tables):
            mine = LayerCosts(graph, profile, stage_cluster(cluster, devices), devices, "sgd",
                              recompute=recompute, memo=CostMemo(profile, "float32"))
            mine.arrivals = side.arrivals
            for members in mine.groups.values():
                got = mine.rows(members)
                alone = LayerCosts(graph, profile, stage_cluster(cluster, devices), devices, "sgd",
                                   recompute=recompute, memo=CostMemo(profile, "float32")).rows(members)
                assert got == alone, (devices, members)
        assert side.taken == len(side.jobs)  # every row arrived from the helper, none was made twice
    finally:
        side.close()


def test_a_search_plans_the_same_with_the_helper_as_without(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, profile = trace(build_model("resnet18"), (2, 3, 512, 512)), preset_profile("h100")
    cluster, settings = preset_cluster("h100", 256), SearchSettings(max_stages=6)
    found = []
    for least in (0, 10**12):  # always a helper; never one
        monkeypatch.setattr(rows_ahead_module, "LEAST_WORK", least)
        result = plan_model(graph, profile, cluster, settings)
        found.append((result.plan.layers, result.plan.pipeline, result.estimate.iteration_s,
                      [(c.summary, c.iteration_s) for c in result.considered]))
    assert found[0] == found[1]


def test_a_failing_helper_sends_nothing_and_says_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    def produce(send) -> None:  # noqa: ANN001
        send("first", 1)
        raise RuntimeError("the helper failed")
    helper = ahead(produce)
    assert helper is not None
    helper.process.join(timeout=60)
    assert helper.arrived() == [("first", 1)] and helper.arrived() == [] and not helper.open
    helper.close()
    assert "failed" not in capfd.readouterr().err


def test_closing_ends_a_helper_that_is_still_working() -> None:
    def produce(send) -> None:  # noqa: ANN001
        while True:
            time.sleep(0.01)
    helper = ahead(produce)
    assert helper is not None
    helper.close()
    assert not helper.process.is_alive() and helper.arrived() == []


def test_the_helper_does_not_stall_on_a_full_pipe_while_the_planner_is_busy() -> None:
    """The planner takes values only when it needs one: a helper that has sent 640 KiB meanwhile has not waited
    for it (the pipe holds 1 MiB where the system allows; 64 KiB by default)."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("pipes keep their default size here")

    def produce(send) -> None:  # noqa: ANN001
        for key in range(64):
            send(key, b"x" * 10_000)
    helper = ahead(produce)
    assert helper is not None
    helper.process.join(timeout=30)
    try:
        assert not helper.process.is_alive()
        assert [key for key, _ in helper.arrived()] == list(range(64))
    finally:
        helper.close()


def test_closing_ends_a_helper_that_inherited_a_sigterm_handler() -> None:
    """A SIGTERM handler the planner's process has (torch's elastic agent leaves one behind; a training script may
    install one that returns) is inherited by the forked helper: closing must not wait on it."""
    import signal
    import threading

    def produce(send) -> None:  # noqa: ANN001
        while True:
            time.sleep(0.01)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        helper = ahead(produce)
        assert helper is not None
        closing = threading.Thread(target=helper.close, daemon=True)
        closing.start()
        closing.join(timeout=30)
        if closing.is_alive():  # unblock the suite, then fail
            helper.process.kill()
            pytest.fail("Ahead.close waited on a helper that ignored SIGTERM")
        assert not helper.process.is_alive()
    finally:
        signal.signal(signal.SIGTERM, previous)
