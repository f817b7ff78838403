"""Tier 2: ``parplan whatif`` — device lists, scaled profiles, the sweep's invariants, the files it writes."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from calibrate.presets import preset_profile
from cost_models.errors import InputError
from parplan.cli import main
from parplan.cli.whatif import parse_devices
from planner.settings import SearchSettings
from planner.whatif import scaled_profile

MODEL = ["--model", "torchvision:resnet18", "--input-shape", "8,3,64,64", "--profile", "h100"]


def test_device_lists_and_ranges() -> None:
    assert parse_devices("1..16") == [1, 2, 4, 8, 16]
    assert parse_devices("64, 8,8,1") == [1, 8, 64]
    assert parse_devices("3..40,6") == [4, 6, 8, 16, 32]
    for bad in ("0", "a", "8..2", ",", "1..x"):
        with pytest.raises(InputError, match="--devices"):
            parse_devices(bad)


def test_scaled_links_and_memory() -> None:
    profile = preset_profile("h100", "float32")
    faster = scaled_profile(profile, intra_bw=2.0, inter_bw=4.0, memory_bytes=2**30)
    nbytes = 2**28
    for level, factor in (("intra", 2.0), ("inter", 4.0)):
        alpha = profile.comm_time_s("allreduce", level, 8, 0)
        slow, fast = profile.comm_time_s("allreduce", level, 8, nbytes), faster.comm_time_s("allreduce", level, 8, nbytes)
        assert fast - alpha == pytest.approx((slow - alpha) / factor)
    assert faster.device.memory_bytes == 2**30
    with pytest.raises(InputError, match="bandwidth factor must be > 0"):
        scaled_profile(profile, inter_bw=0.0)


@pytest.fixture(scope="module")
def strong() -> dict:
    os.environ.setdefault("COLUMNS", "200")
    from parplan.cli import build_parser
    from parplan.cli.whatif import run_sweep

    args = build_parser().parse_args(["whatif", *MODEL, "--devices", "1..32", "--max-stages", "2", "--jobs", "1"])
    return run_sweep(args, parse_devices(args.devices))


def test_strong_scaling_invariants(strong: dict) -> None:
    rows = strong["rows"]
    assert [row["devices"] for row in rows] == [1, 2, 4, 8, 16, 32] and all(row["feasible"] for row in rows)
    first = rows[0]
    assert strong["one_device"]["fits"] and strong["one_device"]["iteration_s"] == pytest.approx(first["iteration_s"])
    assert first["speedup"] == pytest.approx(1.0) and first["efficiency"] == pytest.approx(1.0)
    assert first["speedup_vs_sample"] == pytest.approx(1.0) and first["plan"].endswith("1 stage")
    for row in rows:
        assert row["batch"] == 8 and row["efficiency"] <= 1.0 + 1e-9
        assert row["samples_per_s"] == pytest.approx(8 / row["iteration_s"])
        assert row["iteration_s"] <= row["one_stage_s"] * (1 + 1e-9)  # stages only ever add options
        assert row["speedup_vs_sample"] >= 1.0 - 1e-9  # pure sample is one of the plans considered
    for field in ("iteration_s", "one_stage_s", "pure_sample_s"):  # idle devices (with_idle): never slower with more
        times = [row[field] for row in rows]
        assert times == sorted(times, reverse=True), field
    assert all(1 <= row["devices_used"] <= row["devices"] for row in rows)
    at_batch = next(row for row in rows if row["devices"] == 8)
    for row in rows:
        if row["devices"] >= 8:  # pure sample parallelism has run out of samples: no faster than at 8
            assert row["sample_parallel"] == 8
            assert row["pure_sample_samples_per_s"] <= at_batch["pure_sample_samples_per_s"] * (1 + 1e-9)


def test_a_size_slower_than_a_smaller_one_takes_its_plan_and_leaves_devices_idle() -> None:
    from planner.whatif import WhatIfRow, with_idle

    def row(devices: int, seconds: float | None, plan: str = "") -> WhatIfRow:
        if seconds is None:
            return WhatIfRow(devices, 4, False, reason="does not fit")
        return WhatIfRow(devices, 4, True, iteration_s=seconds, samples_per_s=4 / seconds, memory_bytes=devices,
                         plan=plan or f"plan {devices}", stages=2, devices_used=devices)

    rows = with_idle([row(512, None), row(256, 3.0), row(64, 2.5), row(128, 2.4), row(32, 4.0)])
    assert [(r.devices, r.iteration_s, r.devices_used, r.plan) for r in rows if r.feasible] == \
        [(32, 4.0, 32, "plan 32"), (64, 2.5, 64, "plan 64"), (128, 2.4, 128, "plan 128"), (256, 2.4, 128, "plan 128")]
    assert rows[-1].devices == 512 and not rows[-1].feasible


def test_whatif_command_writes_table_csv_plot_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot, table = tmp_path / "sweep.png", tmp_path / "sweep.csv"
    code = main(["whatif", *MODEL, "--devices", "1,4,16", "--weak-scaling", "--max-stages", "1", "--scale-inter-bw",
                 "2", "--memory-gb", "40", "--plot", str(plot), "--csv", str(table), "--json"])
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["format"] == "parplan.whatif/1" and document["scaling"] == "weak"
    assert document["memory_bytes"] == 40 * 2**30 and document["scale_inter_bw"] == 2.0
    assert [row["batch"] for row in document["rows"]] == [8, 32, 128]  # weak: the batch grows with the devices
    assert document["rows"][0]["speedup"] == pytest.approx(1.0) and document["one_device"]["batch"] == 8
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    with table.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["devices"]) for row in rows] == [1, 4, 16] and set(rows[0]) >= {"iteration_s", "plan", "efficiency"}
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind
    assert main(["whatif", *MODEL, "--devices", "1,2", "--max-stages", "1", "--jobs", "1"]) == 0
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["--devices", "0"], "--devices '0' names no device count"),
    (["--devices", "1,2", "--plot", "out.txt"], "is written as .png, .svg, .pdf"),
    (["--devices", "1,2", "--csv", "/nowhere/x.csv"], "directory /nowhere does not exist"),
    (["--devices", "1,2", "--scale-inter-bw", "0"], "--scale-inter-bw"),
])
def test_bad_whatif_input_is_one_line_and_exit_two(extra: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["whatif", *MODEL, *extra])
    except SystemExit as exit_:  # argparse's own checks exit directly
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_sizes_where_nothing_fits_are_rows_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """A 0.1 GiB device cannot hold resnet18 at 8×3×512×512: the small sizes say so; the reference still exists."""
    code = main(["whatif", "--model", "torchvision:resnet18", "--input-shape", "8,3,512,512", "--profile", "h100",
                 "--devices", "1,64", "--memory-gb", "0.1", "--max-stages", "1", "--jobs", "1", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and not document["one_device"]["fits"]
    first, last = document["rows"]
    assert not first["feasible"] and "even split perfectly" in first["reason"] and first["iteration_s"] is None
    assert last["feasible"] and last["efficiency"] <= 1.0 + 1e-9


def test_the_perfect_split_bound_only_skips_sizes_the_planner_cannot_fit() -> None:
    """Sizes the memory bound skips unsearched: the planner, asked anyway, finds nothing that fits either."""
    from dataclasses import replace

    import torch

    from calibrate.presets import preset_cluster
    from cost_models.ir.model_spec import load_model
    from cost_models.ir.tracing import trace
    from planner.search import plan_model
    from planner.whatif import _row, one_device

    graph = trace(load_model("torchvision:resnet18"), (8, 3, 512, 512), torch.float32)
    profile = preset_profile("h100", "float32")
    memory = int(0.06 * 2**30)
    for devices in (1, 2):
        cluster = replace(preset_cluster("h100", devices), memory_bytes=memory)
        assert one_device(graph, profile, cluster).resident_bytes / devices > memory  # the bound skips it
        assert "even split perfectly" in _row(graph, profile, cluster, SearchSettings(max_stages=2), "").reason
        with pytest.raises(InputError, match="no plan fits"):
            plan_model(graph, profile, cluster, SearchSettings(max_stages=2))


def test_the_baselines_are_the_best_on_at_most_that_many_devices() -> None:
    """A size whose pure sample or one-stage time is slower than a smaller size's shows the smaller's."""
    from planner.whatif import WhatIfRow, with_idle

    def row(devices: int, sample_s: float, one_stage_s: float) -> WhatIfRow:
        return WhatIfRow(devices, 8, True, iteration_s=one_stage_s, samples_per_s=8 / one_stage_s,
                         one_stage_s=one_stage_s, pure_sample_s=sample_s, pure_sample_samples_per_s=8 / sample_s,
                         sample_parallel=min(devices, 8), devices_used=devices)

    rows = with_idle([row(4, 2.0, 1.5), row(8, 1.0, 0.9), row(16, 1.2, 1.1), row(32, 1.3, 0.5)])
    assert [r.pure_sample_s for r in rows] == [2.0, 1.0, 1.0, 1.0]
    assert [r.sample_parallel for r in rows] == [4, 8, 8, 8]
    assert [r.one_stage_s for r in rows] == [1.5, 0.9, 0.9, 0.5]
