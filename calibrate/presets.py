"""Datasheet presets: Profiles and Clusters for V100, A100 and H100 machines nobody measured here.

A preset is what calibration would write for a machine you do not have, built
from public numbers instead of timings. Three machines:

* ``v100`` — V100-SXM2-16GB, 4 per node, NVLink2, dual-rail EDR InfiniBand
  (LLNL Sierra/Lassen: IBM AC922, two POWER9 sockets with two GPUs each);
* ``a100`` — A100-SXM4-80GB, 8 per node on NVSwitch (NVLink3), HDR InfiniBand
  with one HCA per GPU (DGX A100);
* ``h100`` — H100-SXM5-80GB, 8 per node on NVSwitch (NVLink4), NDR InfiniBand
  with one HCA per GPU (DGX H100).

Assumptions:
    * Compute follows the additive roofline that calibration fits (see "the
      compute model" below), with datasheet peaks derated to 70 %; one pooled
      fit (kind ``*``) serves every layer kind and pass.
    * ``float32`` is priced at the FP32 CUDA-core peak. On A100/H100 PyTorch
      lets cuDNN use TF32 for float32 convolutions by default
      (``torch.backends.cudnn.allow_tf32``), so real float32 convolutions may
      run faster than this preset says; it stays with FP32 on purpose, the
      conservative choice. ``float16``/``bfloat16`` run on the tensor cores at
      their *dense* peak (figures quoted with 2:4 sparsity are halved).
    * Device memory: the datasheet "GB" read as 10⁹ bytes — a little below the
      total the driver reports, which leaves room for the CUDA context.
    * Links: bandwidth is one direction per GPU (links are full duplex, as
      :mod:`cost_models.collectives` assumes); ``inter`` is the GPU's share of
      its node's InfiniBand ports when every GPU sends at once. Latency α is
      NCCL's own per-step ring latency (LL128 protocol) from its tuning model;
      NCCL's constant per-call base latency has no place in the α-β terms and
      is left out. No efficiency factor is applied to links.
    * Nothing here was measured: ``meta["source"] == "datasheet"``, fits carry
      ``n_train=0`` and no error, and every number's origin is in
      ``meta["sources"]``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cost_models.cluster import Cluster, Link
from cost_models.collectives import COLLECTIVES
from cost_models.errors import InputError
from cost_models.profile import POOLED_KIND, CommFit, ComputeFit, DeviceSpec, FitError, Profile

__all__ = ["DTYPES", "PRESET_NAMES", "is_preset", "preset_cluster", "preset_profile"]

PRESET_NAMES: tuple[str, ...] = ("v100", "a100", "h100")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
PHASES: tuple[str, ...] = ("fwd", "bwd", "bwd_data", "bwd_weight")
LEVELS: tuple[str, ...] = ("intra", "inter")

_GB = 1e9  # datasheets use decimal units: 1 GB = 10⁹ bytes, 1 GB/s = 10⁹ B/s
_TFLOPS = 1e12

# --- sources -------------------------------------------------------------------
_V100_DATASHEET = ("NVIDIA Tesla V100 datasheet, SXM2 column: "
                   "https://images.nvidia.com/content/technologies/volta/pdf/"
                   "tesla-volta-v100-datasheet-letter-fnl-web.pdf")
_V100_WHITEPAPER = ("NVIDIA Tesla V100 GPU Architecture whitepaper (6 NVLink2 links, 25 GB/s per direction "
                    "each): https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf")
_AC922 = ("IBM Redpaper REDP-5472 'IBM Power System AC922 Introduction and Technical Overview' "
          "(4-GPU configuration: 3 NVLink2 bricks GPU-CPU and 3 bricks GPU-GPU per socket); "
          "https://www.redbooks.ibm.com/abstracts/redp5472.html")
_LASSEN = ("LLNL Lassen: 4 V100-16GB per node, dual-rail Mellanox EDR InfiniBand, "
           "https://hpc.llnl.gov/hardware/compute-platforms/lassen")
_EDR = ("InfiniBand Trade Association roadmap, EDR 4x = 100 Gb/s = 12.5 GB/s per port: "
        "https://www.infinibandta.org/infiniband-roadmap/")
_A100_DATASHEET = ("NVIDIA A100 datasheet, A100 80GB SXM column: "
                   "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                   "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_DGX_A100 = ("NVIDIA DGX A100 User Guide, hardware overview: 8 GPUs on 6 NVSwitches, 8 single-port "
             "ConnectX-6 200 Gb/s HDR InfiniBand (one per GPU): "
             "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html")
_HDR = ("InfiniBand Trade Association roadmap, HDR 4x = 200 Gb/s = 25 GB/s per port: "
        "https://www.infinibandta.org/infiniband-roadmap/")
_H100_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: "
                   "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_DGX_H100 = ("NVIDIA DGX H100 User Guide, hardware overview: 8 GPUs on 4 NVSwitches, 8 ConnectX-7 "
             "400 Gb/s NDR InfiniBand (one per GPU): "
             "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html")
_NDR = ("InfiniBand Trade Association roadmap, NDR 4x = 400 Gb/s = 50 GB/s per port: "
        "https://www.infinibandta.org/infiniband-roadmap/")
_NCCL_TUNING = ("NCCL tuning model, hwLat[NVLINK|NET][Ring][LL128] per-step latency in µs: "
                "https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc")
_AUTOPARALLEL = ("meta-pytorch/autoparallel cost_models/compute_estimation.py: datasheet peaks × 0.70 "
                 "efficiency for compute and for memory traffic, 7 µs kernel launch overhead: "
                 "https://github.com/meta-pytorch/autoparallel")
_CUDA_GRAPHS = ("NVIDIA Technical Blog 'Getting Started with CUDA Graphs' (launch overhead of a few µs per "
                "kernel): https://developer.nvidia.com/blog/cuda-graphs/")

# --- the compute model ---------------------------------------------------------
# Every pass of every layer kind costs t = overhead_s + flops·s_per_flop + bytes·s_per_byte,
# the additive roofline that calibration fits to measured kernels (cost_models.profile.ComputeFit,
# calibrate.fitting): here its three coefficients come from the datasheet instead of a fit.
KERNEL_OVERHEAD_S = 5e-6  # a few µs per CUDA launch (_CUDA_GRAPHS) plus eager dispatch; autoparallel uses 7 µs
COMPUTE_EFFICIENCY = 0.7  # achievable fraction of peak FLOP/s, as in _AUTOPARALLEL ("suppose 70% efficiency")
MEMORY_EFFICIENCY = 0.7  # achievable fraction of peak HBM bandwidth, as in _AUTOPARALLEL

# --- link latencies (α), shared by all presets -------------------------------------
NVLINK_LATENCY_S = 1.9e-6  # NCCL hwLat NVLINK/Ring/LL128 = 1.9 µs per step (_NCCL_TUNING)
IB_LATENCY_S = 4.0e-6  # NCCL hwLat NET/Ring/LL128 = 4.0 µs per step (_NCCL_TUNING)

_SHARED_SOURCES: Mapping[str, str] = MappingProxyType({
    "overhead_s": f"{KERNEL_OVERHEAD_S:g} s: {_CUDA_GRAPHS}; cf. {_AUTOPARALLEL}",
    "compute_efficiency": f"{COMPUTE_EFFICIENCY:g}: {_AUTOPARALLEL}",
    "memory_efficiency": f"{MEMORY_EFFICIENCY:g}: {_AUTOPARALLEL}",
    "intra_latency_s": f"{NVLINK_LATENCY_S:g} s: {_NCCL_TUNING}",
    "inter_latency_s": f"{IB_LATENCY_S:g} s: {_NCCL_TUNING}",
})


@dataclass(frozen=True)
class _Preset:
    """One machine's datasheet numbers and where each came from (keys of ``sources``)."""

    device_name: str
    memory_bytes: int
    peak_flops: Mapping[str, float]  # by dtype; a dtype the device lacks is absent
    memory_bandwidth_bps: float
    devices_per_node: int
    intra_bandwidth_bps: float
    inter_bandwidth_bps: float
    sources: Mapping[str, str]


_V100 = _Preset(
    device_name="NVIDIA V100-SXM2-16GB",
    memory_bytes=16_000_000_000,  # 16 GB HBM2 (_V100_DATASHEET)
    peak_flops=MappingProxyType({
        "float32": 15.7 * _TFLOPS,  # single precision 15.7 TFLOPS (_V100_DATASHEET)
        "float16": 125 * _TFLOPS,  # tensor performance 125 TFLOPS (_V100_DATASHEET); no bf16 on Volta
    }),
    memory_bandwidth_bps=900 * _GB,  # HBM2 900 GB/s (_V100_DATASHEET)
    devices_per_node=4,  # 4 GPUs per node (_LASSEN)
    # 6 links × 25 GB/s = 150 GB/s per direction per GPU (_V100_WHITEPAPER), but an AC922 node gives
    # 3 links to the CPU and 3 to the peer GPU (_AC922): 75 GB/s per direction GPU to GPU; the two
    # sockets' GPUs meet over the POWER9 X-bus (64 GB/s), so 75 GB/s is optimistic across sockets.
    intra_bandwidth_bps=3 * 25 * _GB,
    # 2 EDR ports × 12.5 GB/s per node (_LASSEN, _EDR) shared by its 4 GPUs = 6.25 GB/s per GPU.
    inter_bandwidth_bps=2 * 12.5 * _GB / 4,
    sources=MappingProxyType({
        "memory_bytes": f"16 GB: {_V100_DATASHEET}",
        "peak_flops_float32": f"15.7 TFLOPS FP32: {_V100_DATASHEET}",
        "peak_flops_float16": f"125 TFLOPS tensor (dense): {_V100_DATASHEET}",
        "memory_bandwidth_bps": f"900 GB/s HBM2: {_V100_DATASHEET}",
        "devices_per_node": f"4: {_LASSEN}",
        "intra_bandwidth_bps": f"3 NVLink2 links × 25 GB/s per direction GPU-GPU: {_V100_WHITEPAPER}; {_AC922}",
        "inter_bandwidth_bps": f"2 EDR ports × 12.5 GB/s per node / 4 GPUs: {_LASSEN}; {_EDR}",
    }),
)

_A100 = _Preset(
    device_name="NVIDIA A100-SXM4-80GB",
    memory_bytes=80_000_000_000,  # 80 GB HBM2e (_A100_DATASHEET)
    peak_flops=MappingProxyType({
        "float32": 19.5 * _TFLOPS,  # FP32 19.5 TFLOPS (_A100_DATASHEET); TF32 tensor would be 156 dense
        "float16": 312 * _TFLOPS,  # FP16 tensor 312 TFLOPS dense, 624 with sparsity (_A100_DATASHEET)
        "bfloat16": 312 * _TFLOPS,  # BF16 tensor 312 TFLOPS dense, 624 with sparsity (_A100_DATASHEET)
    }),
    memory_bandwidth_bps=2039 * _GB,  # HBM2e 2,039 GB/s (_A100_DATASHEET)
    devices_per_node=8,  # DGX A100 / HGX A100 8-GPU (_DGX_A100)
    # NVLink3: 600 GB/s total = 12 links × 25 GB/s per direction = 300 GB/s (_A100_DATASHEET);
    # NVSwitch gives every pair the full rate (_DGX_A100).
    intra_bandwidth_bps=300 * _GB,
    inter_bandwidth_bps=25 * _GB,  # one HDR 200 Gb/s = 25 GB/s HCA per GPU (_DGX_A100, _HDR)
    sources=MappingProxyType({
        "memory_bytes": f"80 GB: {_A100_DATASHEET}",
        "peak_flops_float32": f"19.5 TFLOPS FP32 (not TF32): {_A100_DATASHEET}",
        "peak_flops_float16": f"312 TFLOPS FP16 tensor (dense): {_A100_DATASHEET}",
        "peak_flops_bfloat16": f"312 TFLOPS BF16 tensor (dense): {_A100_DATASHEET}",
        "memory_bandwidth_bps": f"2,039 GB/s HBM2e: {_A100_DATASHEET}",
        "devices_per_node": f"8: {_DGX_A100}",
        "intra_bandwidth_bps": f"NVLink 600 GB/s bidirectional = 300 GB/s per direction: {_A100_DATASHEET}",
        "inter_bandwidth_bps": f"1 HDR HCA (25 GB/s) per GPU: {_DGX_A100}; {_HDR}",
    }),
)

_H100 = _Preset(
    device_name="NVIDIA H100-SXM5-80GB",
    memory_bytes=80_000_000_000,  # 80 GB HBM3 (_H100_DATASHEET)
    peak_flops=MappingProxyType({
        "float32": 67 * _TFLOPS,  # FP32 67 TFLOPS (_H100_DATASHEET); TF32 tensor would be 494.5 dense
        "float16": 1979 / 2 * _TFLOPS,  # FP16 tensor 1,979 TFLOPS with sparsity → 989.5 dense (_H100_DATASHEET)
        "bfloat16": 1979 / 2 * _TFLOPS,  # BF16 tensor 1,979 TFLOPS with sparsity → 989.5 dense (_H100_DATASHEET)
    }),
    memory_bandwidth_bps=3350 * _GB,  # HBM3 3.35 TB/s (_H100_DATASHEET)
    devices_per_node=8,  # DGX H100 / HGX H100 8-GPU (_DGX_H100)
    # NVLink4: 900 GB/s total = 18 links × 25 GB/s per direction = 450 GB/s (_H100_DATASHEET);
    # NVSwitch gives every pair the full rate (_DGX_H100).
    intra_bandwidth_bps=450 * _GB,
    inter_bandwidth_bps=50 * _GB,  # one NDR 400 Gb/s = 50 GB/s HCA per GPU (_DGX_H100, _NDR)
    sources=MappingProxyType({
        "memory_bytes": f"80 GB: {_H100_DATASHEET}",
        "peak_flops_float32": f"67 TFLOPS FP32 (not TF32): {_H100_DATASHEET}",
        "peak_flops_float16": f"1,979 TFLOPS FP16 tensor with sparsity, halved to dense: {_H100_DATASHEET}",
        "peak_flops_bfloat16": f"1,979 TFLOPS BF16 tensor with sparsity, halved to dense: {_H100_DATASHEET}",
        "memory_bandwidth_bps": f"3.35 TB/s HBM3: {_H100_DATASHEET}",
        "devices_per_node": f"8: {_DGX_H100}",
        "intra_bandwidth_bps": f"NVLink 900 GB/s bidirectional = 450 GB/s per direction: {_H100_DATASHEET}",
        "inter_bandwidth_bps": f"1 NDR HCA (50 GB/s) per GPU: {_DGX_H100}; {_NDR}",
    }),
)

_PRESETS: Mapping[str, _Preset] = MappingProxyType({"v100": _V100, "a100": _A100, "h100": _H100})


def is_preset(name: str) -> bool:
    """Whether ``name`` names a preset (case and surrounding blanks ignored)."""
    return isinstance(name, str) and name.strip().lower() in _PRESETS


def preset_profile(name: str, dtype: str = "float32") -> Profile:
    """The datasheet-derived Profile of preset ``name`` for ``dtype``.

    Args:
        name: One of :data:`PRESET_NAMES` (case-insensitive).
        dtype: ``float32``, ``float16`` or ``bfloat16``.

    Returns:
        A Profile with one pooled compute fit per pass, an α-β fit per collective
        and link level, and ``meta["source"] == "datasheet"``.

    Raises:
        InputError: Unknown preset or dtype, or a dtype the device has no peak for.
    """
    key = _key(name)
    preset = _PRESETS[key]
    peak_flops = _peak_flops(key, preset, dtype)
    device = DeviceSpec(
        name=preset.device_name,
        memory_bytes=preset.memory_bytes,
        peak_flops=peak_flops,
        memory_bandwidth_bps=preset.memory_bandwidth_bps,
    )
    return Profile(
        device=device,
        meta=_meta(key, preset, dtype),
        compute_fits=_compute_fits(peak_flops, preset.memory_bandwidth_bps),
        comm_fits=_comm_fits(_links(preset)),
    )


def preset_cluster(name: str, devices: int) -> Cluster:
    """A Cluster of ``devices`` GPUs of preset ``name``, grouped in its nodes.

    Fewer devices than a node holds make one partly used node; more must fill
    whole nodes (``Cluster`` says how to fix it otherwise).

    Raises:
        InputError: Unknown preset, or a device count the Cluster rejects.
    """
    key = _key(name)
    preset = _PRESETS[key]
    intra, inter = _links(preset)
    return Cluster(
        devices=devices,
        devices_per_node=preset.devices_per_node,
        memory_bytes=preset.memory_bytes,
        intra=intra,
        inter=inter,
        name=key,
    )


def _key(name: str) -> str:
    """The table key of ``name``, or an InputError naming the known presets."""
    if is_preset(name):
        return name.strip().lower()
    guess = difflib.get_close_matches(str(name).strip().lower(), PRESET_NAMES, n=1)
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    raise InputError(
        f"unknown preset {name!r}{hint}; known presets: {', '.join(PRESET_NAMES)} "
        f"(or give the path of a profile JSON written by parplan calibrate)"
    )


def _peak_flops(key: str, preset: _Preset, dtype: str) -> float:
    """The preset's peak FLOP/s for ``dtype``, or an InputError saying what to use instead."""
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r} for preset {key!r}; use one of {', '.join(DTYPES)}")
    peak = preset.peak_flops.get(dtype)
    if peak is None:
        others = [name for name in PRESET_NAMES if dtype in _PRESETS[name].peak_flops]
        raise InputError(
            f"preset {key!r} has no {dtype} peak (the {preset.device_name} datasheet gives none); "
            f"use dtype {' or '.join(d for d in DTYPES if d in preset.peak_flops)} with {key!r}, "
            f"or preset {' or '.join(others)} for {dtype}"
        )
    return peak


def _links(preset: _Preset) -> tuple[Link, Link]:
    """``(intra, inter)`` α-β links of the preset."""
    return (Link(NVLINK_LATENCY_S, preset.intra_bandwidth_bps), Link(IB_LATENCY_S, preset.inter_bandwidth_bps))


def _compute_fits(peak_flops: float, memory_bandwidth_bps: float) -> tuple[ComputeFit, ...]:
    """One pooled additive-roofline fit per pass, from datasheet peaks derated by the efficiencies."""
    s_per_flop = 1.0 / (peak_flops * COMPUTE_EFFICIENCY)
    s_per_byte = 1.0 / (memory_bandwidth_bps * MEMORY_EFFICIENCY)
    return tuple(
        ComputeFit(POOLED_KIND, phase, KERNEL_OVERHEAD_S, s_per_flop, s_per_byte, n_train=0,
                   error=FitError(None, None, 0))
        for phase in PHASES
    )


def _comm_fits(links: tuple[Link, Link]) -> tuple[CommFit, ...]:
    """An α-β fit per collective and link level: α the link latency, β one over its bandwidth."""
    return tuple(
        CommFit(collective, level, link.latency_s, 1.0 / link.bandwidth_bps, n_train=0,
                error=FitError(None, None, 0))
        for collective in COLLECTIVES
        for level, link in zip(LEVELS, links)
    )


def _meta(key: str, preset: _Preset, dtype: str) -> dict[str, object]:
    """The profile's ``meta``: origin, dtype, efficiencies, and the source of every number."""
    sources = {name: text for name, text in preset.sources.items() if not name.startswith("peak_flops_")}
    sources["peak_flops"] = preset.sources[f"peak_flops_{dtype}"]
    sources.update(_SHARED_SOURCES)
    return {
        "source": "datasheet",
        "note": "datasheet-derived, not measured",
        "preset": key,
        "device_name": preset.device_name,
        "devices_per_node": preset.devices_per_node,
        "dtype": dtype,
        "compute_efficiency": COMPUTE_EFFICIENCY,
        "memory_efficiency": MEMORY_EFFICIENCY,
        "sources": sources,
    }
