"""Collective calibration: α-β fits on synthetic samples (tier 1), and a real 2-rank gloo run (tier 3)."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from calibrate.comm_bench import DEFAULT_SIZES_BYTES, default_group_sizes, measure_collectives
from calibrate.comm_fit import fit_comm
from calibrate.comm_ranks import in_existing_group, init_from_environment, run_comm_calibration
from cost_models.collectives import comm_terms
from cost_models.errors import InputError
from cost_models.profile import CommSample

ALPHA_S = 25e-6
BETA_S_PER_BYTE = 1 / 12e9  # 12 GB/s
SIZES_BYTES = [1024 * 4**k for k in range(9)]  # 1 KiB .. 64 MiB


def _synthetic(collectives: list[str], groups: list[int], noise: float = 0.02, seed: int = 0) -> list[CommSample]:
    rng = random.Random(seed)
    samples = []
    for collective in collectives:
        for group in groups:
            for nbytes in SIZES_BYTES:
                count, volume = comm_terms(collective, group, nbytes)
                time_s = (count * ALPHA_S + volume * BETA_S_PER_BYTE) * (1 + rng.uniform(-noise, noise))
                samples.append(CommSample(collective, "intra", group, nbytes, time_s, 0.0, 5))
    rng.shuffle(samples)  # the fit must not depend on the order it is given
    return samples


def test_fit_recovers_alpha_and_beta_from_noisy_samples() -> None:
    collectives = ["allreduce", "allgather", "all_to_all", "sendrecv"]
    fits, error = fit_comm(_synthetic(collectives, [2, 4, 8]))
    assert sorted(f.collective for f in fits) == sorted(collectives)
    for fit in fits:
        assert fit.alpha_s == pytest.approx(ALPHA_S, rel=0.05), fit
        assert fit.beta_s_per_byte == pytest.approx(BETA_S_PER_BYTE, rel=0.05), fit
        assert fit.n_train == 3 * len(SIZES_BYTES)
        assert fit.error.n > 0 and fit.error.median_rel_err is not None and fit.error.median_rel_err < 0.05
    assert error.n == sum(f.error.n for f in fits)
    assert error.median_rel_err is not None and error.median_rel_err < 0.05


def test_held_out_samples_spread_over_sizes() -> None:
    fits, _ = fit_comm(_synthetic(["allreduce"], [2], noise=0.0))
    assert fits[0].error.n == 2  # 9 sizes, every 4th from index 1: 4 KiB and 256 KiB
    assert fits[0].error.median_rel_err == pytest.approx(0.0, abs=1e-6)


def test_sendrecv_only_and_single_collective_inputs() -> None:
    fits, error = fit_comm(_synthetic(["sendrecv"], [2]))
    assert [(f.collective, f.level) for f in fits] == [("sendrecv", "intra")]
    assert fits[0].beta_s_per_byte == pytest.approx(BETA_S_PER_BYTE, rel=0.05)
    few = [CommSample("allgather", "inter", 4, n, 1e-4 + n * 1e-9, 0.0, 5) for n in (1024, 1 << 20, 1 << 24)]
    fits, error = fit_comm(few)
    assert len(fits) == 1 and fits[0].level == "inter" and fits[0].error.n == 0
    assert error.n == 0 and error.median_rel_err is None  # too few samples to hold any out


def test_fit_ignores_one_rank_groups_and_handles_no_samples() -> None:
    fits, error = fit_comm([])
    assert fits == [] and error.n == 0 and error.median_rel_err is None
    assert fit_comm([CommSample("allreduce", "intra", 1, 1024, 1e-5, 0.0, 5)])[0] == []


def test_default_sizes_and_group_sizes() -> None:
    assert DEFAULT_SIZES_BYTES[0] == 1024 and DEFAULT_SIZES_BYTES[-1] == 64 << 20
    assert [default_group_sizes(n) for n in (1, 2, 3, 8, 12)] == [[], [2], [2, 3], [2, 4, 8], [2, 4, 8, 12]]


def test_launcher_detection() -> None:
    assert not in_existing_group({})
    assert in_existing_group({"RANK": "0", "WORLD_SIZE": "2"})
    assert in_existing_group({"OMPI_COMM_WORLD_SIZE": "4"}) and in_existing_group({"PMI_SIZE": "4"})
    assert not in_existing_group({"RANK": "0"})


def test_init_from_environment_outside_a_launcher_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS",
                 "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InputError, match="torchrun, mpirun or srun"):
        init_from_environment("gloo")


def test_refused_collective_is_skipped_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("all_to_all is not supported by this backend")

    monkeypatch.setattr(dist, "all_to_all_single", refuse)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        result = measure_collectives([1024], [1], ["allreduce", "all_to_all"], time.monotonic() + 10)
    finally:
        dist.destroy_process_group()
    assert list(result.skipped) == ["all_to_all"] and "not supported" in result.skipped["all_to_all"]
    assert result.samples == () and result.unfinished == 0 and result.backend == "gloo"


def test_one_rank_is_an_input_error() -> None:
    with pytest.raises(InputError, match="at least 2 ranks"):
        run_comm_calibration(1, [1024], budget_s=5)


@pytest.mark.multirank
def test_two_gloo_ranks_time_every_collective_and_fit() -> None:
    samples = run_comm_calibration(2, sizes_bytes=[1024, 65536, 1 << 20], budget_s=20)
    measured = {s.collective for s in samples}
    assert {"allreduce", "allgather", "all_to_all", "sendrecv"} <= measured
    assert all(s.median_s > 0 and s.iqr_s >= 0 and s.group == 2 and s.level == "intra" for s in samples)
    assert {s.bytes for s in samples if s.collective == "sendrecv"} == {1024, 65536, 1 << 20}
    fits, _ = fit_comm(samples)
    assert {f.collective for f in fits} == measured
    for fit in fits:
        assert math.isfinite(fit.alpha_s) and math.isfinite(fit.beta_s_per_byte)
        assert fit.alpha_s >= 0 and fit.beta_s_per_byte >= 0


@pytest.mark.multirank
def test_budget_spent_before_the_ranks_start_is_an_input_error() -> None:
    with pytest.raises(InputError, match="budget"):
        run_comm_calibration(2, sizes_bytes=[1024], budget_s=0.5)
