"""Tier 1: datasheet presets (no torch) — valid Profiles, sane numbers, the right order of machines."""

from __future__ import annotations

import math

import pytest

from calibrate.presets import DTYPES, PRESET_NAMES, is_preset, preset_cluster, preset_profile
from cost_models.collectives import COLLECTIVES
from cost_models.errors import InputError
from cost_models.profile import POOLED_KIND, Profile

SUPPORTED = [(name, dtype) for name in PRESET_NAMES for dtype in DTYPES if (name, dtype) != ("v100", "bfloat16")]
LARGE_CONV_FLOPS = 1e12
LARGE_CONV_BYTES = 1e9


def _conv_s(profile: Profile) -> float:
    seconds, origin = profile.compute_time_s("conv", "fwd", "nokey", LARGE_CONV_FLOPS, LARGE_CONV_BYTES)
    assert origin == "fitted"
    return seconds


@pytest.mark.parametrize(("name", "dtype"), SUPPORTED)
def test_preset_round_trips_through_the_schema(name: str, dtype: str) -> None:
    profile = preset_profile(name, dtype)
    assert Profile.from_dict(profile.to_dict()) == profile
    assert profile.meta["source"] == "datasheet"
    assert profile.meta["note"] == "datasheet-derived, not measured"
    assert profile.meta["dtype"] == dtype
    assert profile.meta["device_name"] == profile.device.name
    assert not profile.is_measured


@pytest.mark.parametrize(("name", "dtype"), SUPPORTED)
def test_every_number_has_a_source(name: str, dtype: str) -> None:
    sources = preset_profile(name, dtype).meta["sources"]
    for key in ("memory_bytes", "peak_flops", "memory_bandwidth_bps", "overhead_s", "compute_efficiency",
                "memory_efficiency", "intra_bandwidth_bps", "inter_bandwidth_bps", "intra_latency_s",
                "inter_latency_s"):
        assert isinstance(sources[key], str) and "http" in sources[key], key


@pytest.mark.parametrize(("name", "dtype"), SUPPORTED)
def test_fits_cover_every_pass_and_collective_with_positive_finite_values(name: str, dtype: str) -> None:
    profile = preset_profile(name, dtype)
    assert {(f.kind, f.phase) for f in profile.compute_fits} == {
        (POOLED_KIND, phase) for phase in ("fwd", "bwd", "bwd_data", "bwd_weight")
    }
    assert {(f.collective, f.level) for f in profile.comm_fits} == {
        (c, level) for c in COLLECTIVES for level in ("intra", "inter")
    }
    values = [v for f in profile.compute_fits for v in (f.overhead_s, f.s_per_flop, f.s_per_byte)]
    values += [v for f in profile.comm_fits for v in (f.alpha_s, f.beta_s_per_byte)]
    values += [profile.device.peak_flops, profile.device.memory_bandwidth_bps, profile.device.memory_bytes]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)
    assert all(f.n_train == 0 for f in (*profile.compute_fits, *profile.comm_fits))


@pytest.mark.parametrize("name", ["a100", "h100"])
def test_bfloat16_is_faster_per_flop_than_float32(name: str) -> None:
    bf16 = preset_profile(name, "bfloat16").compute_fit("conv", "fwd")
    fp32 = preset_profile(name, "float32").compute_fit("conv", "fwd")
    assert bf16.s_per_flop < fp32.s_per_flop


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_newer_machines_are_faster_on_a_large_conv(dtype: str) -> None:
    v100, a100, h100 = (_conv_s(preset_profile(name, dtype)) for name in ("v100", "a100", "h100"))
    assert h100 < a100 < v100


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_nvlink_is_faster_than_infiniband(name: str) -> None:
    profile = preset_profile(name)
    assert profile.comm_time_s("allreduce", "intra", 8, 64e6) < profile.comm_time_s("allreduce", "inter", 8, 64e6)


def test_v100_cluster_has_nodes_of_four() -> None:
    cluster = preset_cluster("v100", 16)
    assert (cluster.nodes, cluster.devices_per_node, cluster.name) == (4, 4, "v100")
    assert cluster.memory_bytes == preset_profile("v100").device.memory_bytes
    assert cluster.intra.bandwidth_bps > cluster.inter.bandwidth_bps
    assert cluster.intra.latency_s < cluster.inter.latency_s


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_cluster_links_match_the_profile(name: str) -> None:
    cluster, profile = preset_cluster(name, 2), preset_profile(name)
    assert cluster.nodes == 1
    for level, link in (("intra", cluster.intra), ("inter", cluster.inter)):
        fit = next(f for f in profile.comm_fits if (f.collective, f.level) == ("sendrecv", level))
        assert fit.alpha_s == link.latency_s
        assert fit.beta_s_per_byte == pytest.approx(1 / link.bandwidth_bps)


def test_cluster_rejects_partial_nodes_beyond_one() -> None:
    with pytest.raises(InputError, match="whole nodes of 8"):
        preset_cluster("a100", 12)


def test_is_preset() -> None:
    assert all(is_preset(name) for name in PRESET_NAMES)
    assert is_preset(" A100 ")
    assert not is_preset("a100.json")
    assert not is_preset("")


def test_unknown_preset_names_the_known_ones_and_a_close_match() -> None:
    with pytest.raises(InputError, match=r"unknown preset 'a10'.*did you mean 'a100'.*v100, a100, h100"):
        preset_profile("a10")
    with pytest.raises(InputError, match=r"unknown preset 'tpu'; known presets: v100, a100, h100"):
        preset_cluster("tpu", 8)


def test_v100_has_no_bfloat16() -> None:
    message = r"preset 'v100' has no bfloat16 peak.*use dtype float32 or float16 with 'v100', or preset a100 or h100"
    with pytest.raises(InputError, match=message):
        preset_profile("v100", "bfloat16")


def test_unknown_dtype() -> None:
    message = r"unknown dtype 'int8' for preset 'h100'; use one of float32, float16, bfloat16"
    with pytest.raises(InputError, match=message):
        preset_profile("h100", "int8")
