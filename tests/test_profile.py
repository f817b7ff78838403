"""Tier 1: profiles — round trip, lookups, fallbacks, schema and version refusal; compute fit recovery."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from calibrate.compute_fit import fit_compute
from cost_models.errors import InputError
from cost_models.profile import (
    CommFit,
    ComputeFit,
    ComputeSample,
    DeviceSpec,
    FitError,
    Profile,
    ProfileError,
    load_profile,
    save_profile,
)


def make_profile() -> Profile:
    return Profile(
        device=DeviceSpec("test device", 16 * 2**30),
        meta={"source": "measured", "torch_version": "2.14.1", "dtype": "float32"},
        compute_samples=(ComputeSample("conv", "fwd", "conv|k1", 10**9, 10**6, 0.01, 0.001, 5),),
        compute_fits=(ComputeFit("*", "fwd", 1e-5, 1e-10, 1e-9, 3), ComputeFit("conv", "fwd", 2e-5, 2e-10, 0.0, 3)),
        comm_fits=(CommFit("allreduce", "intra", 1e-5, 1e-9, 9, FitError(0.05, 0.1, 3)),),
        compute_error=FitError(0.06, 0.2, 40),
    )


def test_round_trip(tmp_path: Path) -> None:
    profile = make_profile()
    save_profile(profile, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == profile
    assert json.loads((tmp_path / "p.json").read_text())["fit"]["compute"] == {"median_rel_err": 0.06,
                                                                             "p90_rel_err": 0.2, "n": 40}


def test_measured_entries_win_over_the_fit() -> None:
    profile = make_profile()
    assert profile.compute_time_s("conv", "fwd", "conv|k1", 1, 1) == (0.01, "measured")
    seconds, source = profile.compute_time_s("conv", "fwd", "conv|other", 10**9, 10**6)
    assert source == "fitted" and seconds == pytest.approx(2e-5 + 0.2)
    assert profile.compute_time_s("pool", "fwd", "k", 10**9, 10**6)[0] == pytest.approx(1e-5 + 0.1 + 1e-3)
    with pytest.raises(ProfileError, match="no compute model for pool/bwd"):
        profile.compute_time_s("pool", "bwd", "k", 1, 1)


def test_comm_lookups() -> None:
    profile = make_profile()
    assert profile.comm_time_s("allreduce", "intra", 1, 10**6) == 0.0
    assert profile.comm_time_s("allreduce", "intra", 4, 10**6) == pytest.approx(6e-5 + 1.5e6 * 1e-9)
    assert profile.comm_time_s("allreduce", "inter", 4, 10**6) == profile.comm_time_s("allreduce", "intra", 4, 10**6)
    with pytest.raises(ProfileError, match="no fit for all_to_all on the intra link"):
        profile.comm_time_s("all_to_all", "intra", 2, 10)


def test_refusals(tmp_path: Path) -> None:
    document = make_profile().to_dict()
    (tmp_path / "v2.json").write_text(json.dumps(document | {"format": "parplan.profile/2"}))
    with pytest.raises(ProfileError, match="'parplan.profile/2' but this parplan reads 'parplan.profile/1'"):
        load_profile(tmp_path / "v2.json")
    document["compute"]["samples"][0]["median_s"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(document))
    with pytest.raises(ProfileError, match=r"\$.compute.samples\[0\].median_s"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "cut.json").write_text(json.dumps(make_profile().to_dict())[:100])
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(tmp_path / "cut.json")


def test_fit_error_statistics() -> None:
    error = FitError.of([1.1, 0.9, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    assert error.median_rel_err == pytest.approx(0.1) and error.n == 4
    assert FitError.of([], []) == FitError(None, None, 0)
    assert error.short().startswith("median 10.0%")


def test_compute_fit_recovers_known_rates() -> None:
    rng = random.Random(7)
    samples = []
    for index in range(60):
        flops, nbytes = rng.uniform(1e6, 1e10), rng.uniform(1e4, 1e8)
        seconds = (3e-5 + flops / 4e10 + nbytes / 8e9) * rng.uniform(0.98, 1.02)
        samples.append(ComputeSample("conv", "fwd", f"k{index}", int(flops), int(nbytes), seconds, 0.0, 5))
    fits, error = fit_compute(samples)
    conv = next(f for f in fits if f.kind == "conv")
    assert 1 / conv.s_per_flop == pytest.approx(4e10, rel=0.05)
    assert 1 / conv.s_per_byte == pytest.approx(8e9, rel=0.1)
    assert error.median_rel_err is not None and error.median_rel_err < 0.03 and error.n == 15
    assert {f.kind for f in fits} == {"conv", "*"}


def test_a_profile_of_several_ranks_without_its_collectives_says_so_everywhere() -> None:
    """Calibration's budget can run out before the collectives (issue 52): the profile is still written — its
    kernels are worth keeping — but says what it lacks in its warnings and in the error of any plan priced
    from it. Presets and one-rank profiles lack nothing."""
    from dataclasses import replace

    complete = replace(make_profile(), meta={**make_profile().meta, "ranks": 2}, comm_fits=tuple(
        CommFit(name, "intra", 1e-5, 1e-9, 9) for name in ("sendrecv", "allreduce")))
    assert complete.missing_parts() == [] and complete.compatibility_warnings("2.14.1") == []
    without = replace(complete, comm_fits=())
    (line,) = without.missing_parts()
    assert "measured no collective" in line and "--budget-s" in line
    assert without.compatibility_warnings("2.14.1")[0] == line
    with pytest.raises(ProfileError, match="measured no collective.*--budget-s"):
        without.cluster(2)
    assert "no sendrecv" in replace(complete, comm_fits=complete.comm_fits[1:]).missing_parts()[0]
    assert replace(without, meta={**without.meta, "ranks": 1}).missing_parts() == []
    assert replace(without, meta={**without.meta, "source": "preset"}).missing_parts() == []
