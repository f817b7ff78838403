"""What calibration measured, and the models fitted to it: the ``Profile``.

A Profile holds, for one kind of device and its links:

* ``compute``: timed local problems (:class:`ComputeSample`, keyed by a
  canonical problem key) and, per layer kind and pass, a fitted model
  (:class:`ComputeFit`) for problems that were not timed:
  ``t = overhead_s + flops · s_per_flop + bytes · s_per_byte`` — a roofline
  whose two rates add instead of taking the max, so small problems pay their
  fixed overhead and large ones their dominant rate;
* ``comm``: timed collectives (:class:`CommSample`) and per collective and
  link level an α-β fit (:class:`CommFit`) over the algorithm terms of
  :mod:`cost_models.collectives`;
* ``device``: name, memory, and datasheet peaks when known;
* ``meta``: where and how it was measured (host, torch version, backend,
  dtype, threads, date, seconds) or, for presets, the datasheets used;
* ``optimizer``: per optimizer, the seconds of its step over a rank's
  parameters (:class:`OptimizerFit`: per tensor and per byte), timed by
  calibration on the model's own parameter shapes; absent in older profiles
  and presets, whose plans then price the step at zero;
* fit errors measured on held-out samples (:class:`FitError`);
* optionally ``corrections`` fitted to whole measured runs by
  ``parplan validate --refine`` (:mod:`cost_models.corrections`).

Stored as ``parplan.profile/1`` JSON, schema ``schemas/profile-1.schema.json``.

Assumptions: a timed problem's median stands for every occurrence of the same
key; unmeasured problems of a kind with no fit of its own use the pooled fit
of kind ``*`` for the same pass.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cost_models.cluster import Cluster, Link
from cost_models.collectives import comm_terms
from cost_models.corrections import Corrections
from cost_models.errors import InputError
from cost_models.formats.jsonio import read_json, write_json_atomic
from cost_models.formats.schema import check_document

__all__ = [
    "CPU_NAME_PREFIX", "PROFILE_FORMAT", "CommFit", "CommSample", "ComputeFit", "ComputeSample", "DeviceSpec",
    "FitError", "OptimizerFit", "Profile", "ProfileError", "load_profile", "save_profile",
]

PROFILE_FORMAT = "parplan.profile/1"
POOLED_KIND = "*"


class ProfileError(InputError):
    """A profile file is malformed, of another version, or lacks what is asked of it."""


@dataclass(frozen=True)
class FitError:
    """Relative error of a fitted model on samples it was not fitted to."""

    median_rel_err: float | None
    p90_rel_err: float | None
    n: int

    @classmethod
    def of(cls, predicted: Iterable[float], measured: Iterable[float]) -> FitError:
        """Median and 90th percentile of ``|predicted − measured| / measured``."""
        errors = sorted(abs(p - m) / m for p, m in zip(predicted, measured) if m > 0)
        if not errors:
            return cls(None, None, 0)
        p90 = statistics.quantiles(errors, n=10, method="inclusive")[-1] if len(errors) > 1 else errors[0]
        return cls(statistics.median(errors), p90, len(errors))

    def short(self) -> str:
        """``median 4.1% · p90 9.8% · n=37`` or ``not measured``."""
        if self.median_rel_err is None or self.p90_rel_err is None:
            return "not measured"
        return f"median {self.median_rel_err:.1%} · p90 {self.p90_rel_err:.1%} · n={self.n}"


@dataclass(frozen=True)
class ComputeSample:
    """One timed local problem: a layer kind's pass on concrete shapes."""

    kind: str
    phase: str
    key: str
    flops: int
    bytes: int
    median_s: float
    iqr_s: float
    repeats: int
    peak_bytes: int | None = None
    """The most bytes the pass had allocated at once (its outputs and workspace), when measured."""
    peak_bytes_per_thread: int | None = None
    """How much ``peak_bytes`` grows per thread beyond the calibration's threads per rank (CPU: measured again at
    another thread count; oneDNN's weight-gradient convolution keeps a workspace per thread), when measured."""


@dataclass(frozen=True)
class ComputeFit:
    """``t = overhead_s + flops·s_per_flop + bytes·s_per_byte`` for one kind and pass."""

    kind: str
    phase: str
    overhead_s: float
    s_per_flop: float
    s_per_byte: float
    n_train: int
    error: FitError = FitError(None, None, 0)

    def time_s(self, flops: float, nbytes: float) -> float:
        """Predicted seconds for a problem of ``flops`` and ``nbytes`` moved."""
        return self.overhead_s + flops * self.s_per_flop + nbytes * self.s_per_byte


@dataclass(frozen=True)
class CommSample:
    """One timed collective: its group size, link level and message bytes."""

    collective: str
    level: str
    group: int
    bytes: int
    median_s: float
    iqr_s: float
    repeats: int


@dataclass(frozen=True)
class CommFit:
    """α (seconds per message) and β (seconds per byte) of one collective on one link level."""

    collective: str
    level: str
    alpha_s: float
    beta_s_per_byte: float
    n_train: int
    error: FitError = FitError(None, None, 0)

    def time_s(self, group: int, nbytes: float) -> float:
        """Predicted seconds of the collective over ``group`` ranks (see ``comm_terms``)."""
        count, volume = comm_terms(self.collective, group, nbytes)
        return count * self.alpha_s + volume * self.beta_s_per_byte


@dataclass(frozen=True)
class OptimizerFit:
    """``t = s_per_tensor·tensors + s_per_byte·bytes``: one optimizer's step over a rank's parameters."""

    optimizer: str
    s_per_tensor: float
    s_per_byte: float
    n_train: int

    def time_s(self, tensors: int, nbytes: float) -> float:
        """Predicted seconds of one step over ``tensors`` parameters of ``nbytes`` bytes in all."""
        return tensors * self.s_per_tensor + nbytes * self.s_per_byte


@dataclass(frozen=True)
class DeviceSpec:
    """The device: its name, memory, and datasheet peaks where known."""

    name: str
    memory_bytes: int
    peak_flops: float | None = None
    memory_bandwidth_bps: float | None = None

    @property
    def is_cpu(self) -> bool:
        """A host CPU (calibration names it ``CPU <model> (<n> cores)``: :data:`CPU_NAME_PREFIX`)."""
        return self.name.startswith(CPU_NAME_PREFIX)


CPU_NAME_PREFIX = "CPU "
"""How a calibrated CPU device's name starts (``calibrate.session``)."""


@dataclass(frozen=True)
class Profile:
    """Measurements and fitted models of one device type and its links."""

    device: DeviceSpec
    meta: Mapping[str, Any]
    compute_samples: tuple[ComputeSample, ...] = ()
    compute_fits: tuple[ComputeFit, ...] = ()
    comm_samples: tuple[CommSample, ...] = ()
    comm_fits: tuple[CommFit, ...] = ()
    compute_error: FitError = FitError(None, None, 0)
    comm_error: FitError = FitError(None, None, 0)
    corrections: Corrections | None = None
    optimizer_fits: tuple[OptimizerFit, ...] = ()
    _index: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index["samples"] = {(s.kind, s.phase, s.key): s for s in self.compute_samples}
        self._index["timed"] = frozenset(s.kind for s in self.compute_samples)
        self._index["compute"] = {(f.kind, f.phase): f for f in self.compute_fits}
        rates: dict[tuple[str, str], float] = {}
        for sample in self.compute_samples:  # the least seconds per flop any timed problem of a kind and pass took
            rate = sample.median_s / sample.flops if sample.flops > 0 else 0.0
            rates[sample.kind, sample.phase] = min(rate, rates.get((sample.kind, sample.phase), rate))
        self._index["least_rate"] = rates
        self._index["comm"] = {(f.collective, f.level): f for f in self.comm_fits}

    @property
    def overlaps_halos(self) -> bool:
        """Whether the runtime computes a convolution tile's interior while its halos travel on this device:
        on GPUs. On CPUs the exchange is priced exposed: most tiles are convolved joined with their halos, and
        where the superposed form posts the exchange before the tile's kernel (``runtime.spatial.conv_form``)
        the step times measured the same (the wait on a shared 2-core machine is the neighbour's jitter, which
        no overlap hides: docs/performance.md)."""
        return not self.device.is_cpu

    @property
    def is_measured(self) -> bool:
        """Whether this profile was measured (rather than built from datasheets)."""
        return self.meta.get("source") == "measured"

    def missing_parts(self) -> list[str]:
        """What a measured profile of several ranks lacks that its calibration should have measured: the
        collectives the planner prices every multi-device plan with (``sendrecv`` for links, ``allreduce``
        for gradients). One line each, with the fix; empty when complete (and for presets, one-rank profiles)."""
        if not self.is_measured or int(self.meta.get("ranks") or 1) <= 1:
            return []
        measured = {fit.collective for fit in self.comm_fits}
        lacking = [name for name in ("sendrecv", "allreduce") if name not in measured]
        if not lacking:
            return []
        what = "no collective" if not measured else f"no {' or '.join(lacking)}"
        return [f"profile is incomplete: its calibration measured {what} (the budget ran out before them), so "
                f"plans on several devices cannot be priced from it; re-run parplan calibrate with a larger "
                f"--budget-s"]

    def compatibility_warnings(self, torch_version: str, dtype: str | None = None, amp: str | None = None) -> list[str]:
        """Why this profile may not fit a run with ``torch_version``, ``dtype`` and mixed precision ``amp`` (the
        graph's autocast dtype, ``""`` for none; ``None``: not checked) (empty when it does); first, what it
        lacks (:meth:`missing_parts`)."""
        warnings = self.missing_parts()
        recorded_torch, recorded_dtype = self.meta.get("torch_version"), self.meta.get("dtype")
        if self.is_measured and recorded_torch and recorded_torch != torch_version:
            warnings.append(f"profile measured with torch {recorded_torch}, running torch {torch_version}: "
                            f"kernel times may differ; re-run parplan calibrate")
        if dtype is not None and recorded_dtype and recorded_dtype != dtype:
            warnings.append(f"profile is for {recorded_dtype}, the model runs in {dtype}: times will be off; "
                            f"calibrate with --dtype {dtype}")
        if amp is not None and self.is_measured and (self.meta.get("amp") or "") != amp:
            ran, runs = self.meta.get("amp") or "no mixed precision", amp or "no mixed precision"
            warnings.append(f"profile was calibrated with {ran}, the model runs with {runs}: kernel times will be off; "
                            f"calibrate with the run's --amp")
        return warnings

    def cluster(self, devices: int, devices_per_node: int | None = None) -> Cluster:
        """``devices`` devices of this profile's kind: links from its send/receive fits, its memory, its nodes.

        ``devices_per_node`` defaults to the profile's (a preset's ``meta["devices_per_node"]``), else one node.

        Raises:
            InputError: A device count the Cluster rejects (says how to fix it).
        """
        links = []
        for level in ("intra", "inter"):
            try:
                small_s = self.comm_time_s("sendrecv", level, 2, 0)
                large_s = self.comm_time_s("sendrecv", level, 2, 2**26)
            except ProfileError:
                if devices != 1:
                    raise
                links.append(Link(0.0, sys.float_info.max))  # one device sends nothing: a one-rank profile plans it
                continue
            links.append(Link(small_s, 2**26 / max(large_s - small_s, 1e-12)))
        per_node = devices_per_node or self.meta.get("devices_per_node") or devices
        return Cluster(devices, per_node, self.device.memory_bytes, links[0], links[1],
                       self.meta.get("preset") or self.device.name)

    def compute_time_s(self, kind: str, phase: str, key: str, flops: float, nbytes: float) -> tuple[float, str]:
        """Seconds of one local problem and where they came from: ``measured`` or ``fitted``.

        Raises:
            ProfileError: No sample and no fit for this pass of this kind or of ``*``.
        """
        sample = self._index["samples"].get((kind, phase, key))
        if sample is not None:
            return sample.median_s, "measured"
        return self.compute_fit(kind, phase).time_s(flops, nbytes), "fitted"

    def least_device_s(self, kind: str, phase: str, flops: float, nbytes: float) -> float:
        """A lower bound on the device-seconds of ``kind``'s pass ``phase`` over a problem of ``flops`` and
        ``nbytes`` split among any number of ranks (each rank's local problem at least its share: the ranks' flops
        and bytes add up to at least these): the fit's non-negative terms (its overhead once), or a timed
        problem's seconds per flop where that is less, times the least correction factor; 0 without a model."""
        fit = self._index["compute"].get((kind, phase)) or self._index["compute"].get((POOLED_KIND, phase))
        bounds = [] if fit is None else [max(0.0, fit.overhead_s) + max(0.0, fit.s_per_flop) * flops
                                         + max(0.0, fit.s_per_byte) * nbytes]
        rate = self._index["least_rate"].get((kind, phase))
        if rate is not None:
            bounds.append(rate * flops)
        factors = () if self.corrections is None else tuple(self.corrections.layer_scale.values())
        return min(bounds, default=0.0) * min((1.0, *factors))

    def timed(self, kind: str) -> bool:
        """Whether calibration timed some local problem of ``kind`` (else every one of them is ``fitted``, and its
        key need not be built to look it up)."""
        return kind in self._index["timed"]

    def kernel_peak_bytes(self, kind: str, key: str, threads: int | None = None) -> dict[str, int | None]:
        """Per pass, the measured peak bytes of the local problem ``key`` of ``kind`` (passes never timed: absent),
        on ``threads`` threads per rank (default: the calibration's; others move it by what it grew per thread)."""
        samples = self._index["samples"]
        calibrated = self.meta.get("threads_per_rank")
        extra = 0 if threads is None or not isinstance(calibrated, int) else threads - calibrated
        return {phase: _on_threads(sample, extra) for phase in ("fwd", "bwd", "bwd_data", "bwd_weight")
                if (sample := samples.get((kind, phase, key))) is not None}

    def compute_fit(self, kind: str, phase: str) -> ComputeFit:
        """The fit for ``kind``'s ``phase``, or the pooled one."""
        fits = self._index["compute"]
        fit = fits.get((kind, phase)) or fits.get((POOLED_KIND, phase))
        if fit is None:
            raise ProfileError(
                f"profile for {self.device.name} has no compute model for {kind}/{phase}; re-run parplan calibrate"
            )
        return fit

    def optimizer_step_s(self, optimizer: str, tensors: int, nbytes: float) -> float:
        """Seconds of ``optimizer``'s step over ``tensors`` parameters of ``nbytes``; 0 when it was not timed."""
        fit = next((f for f in self.optimizer_fits if f.optimizer == optimizer), None)
        return 0.0 if fit is None or tensors == 0 else fit.time_s(tensors, nbytes)

    def comm_time_s(self, collective: str, level: str, group: int, nbytes: float) -> float:
        """Seconds of one collective over ``group`` ranks on link ``level`` (``intra`` or ``inter``)."""
        if group <= 1:
            return 0.0
        fits = self._index["comm"]
        fit = fits.get((collective, level)) or (fits.get((collective, "intra")) if level == "inter" else None)
        if fit is None:
            known = sorted({f"{c}/{lvl}" for c, lvl in fits})
            hint = "; ".join(self.missing_parts()) or "re-run parplan calibrate with more ranks"
            raise ProfileError(
                f"profile for {self.device.name} has no fit for {collective} on the {level} link "
                f"(it has {', '.join(known) or 'none'}); {hint}"
            )
        return fit.time_s(group, nbytes)

    def to_dict(self) -> dict[str, Any]:
        """The ``parplan.profile/1`` JSON document."""
        return {
            "format": PROFILE_FORMAT,
            "meta": dict(self.meta),
            "device": _fields(self.device),
            "compute": {"samples": [_without_none(_fields(s)) for s in self.compute_samples],
                        "fits": [_fields(f) for f in self.compute_fits]},
            "comm": {"samples": [_fields(s) for s in self.comm_samples],
                     "fits": [_fields(f) for f in self.comm_fits]},
            "fit": {"compute": _fields(self.compute_error), "comm": _fields(self.comm_error)},
            **({} if self.corrections is None else {"corrections": self.corrections.to_dict()}),
            **({"optimizer": [_fields(f) for f in self.optimizer_fits]} if self.optimizer_fits else {}),
        }

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], source: str = "profile") -> Profile:
        """Validate a ``parplan.profile/1`` document and build the Profile."""
        check_document(document, PROFILE_FORMAT, "profile-1", source, ProfileError)
        compute, comm, fit = document["compute"], document["comm"], document["fit"]
        return cls(
            device=DeviceSpec(**document["device"]),
            meta=dict(document["meta"]),
            compute_samples=tuple(ComputeSample(**s) for s in compute["samples"]),
            compute_fits=tuple(ComputeFit(**{**f, "error": FitError(**f["error"])}) for f in compute["fits"]),
            comm_samples=tuple(CommSample(**s) for s in comm["samples"]),
            comm_fits=tuple(CommFit(**{**f, "error": FitError(**f["error"])}) for f in comm["fits"]),
            compute_error=FitError(**fit["compute"]),
            comm_error=FitError(**fit["comm"]),
            corrections=Corrections.from_dict(document["corrections"]) if "corrections" in document else None,
            optimizer_fits=tuple(OptimizerFit(**f) for f in document.get("optimizer", ())),
        )


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as ``parplan.profile/1`` JSON, atomically."""
    write_json_atomic(path, profile.to_dict())


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file.

    Raises:
        InputError: Missing file or invalid JSON.
        ProfileError: Wrong format version or schema violation.
    """
    return Profile.from_dict(read_json(path, "profile"), source=str(path))


def _on_threads(sample: ComputeSample, extra_threads: int) -> int | None:
    """``sample``'s peak bytes with ``extra_threads`` more threads than calibration ran it on (fewer: negative)."""
    if sample.peak_bytes is None or not extra_threads or sample.peak_bytes_per_thread is None:
        return sample.peak_bytes
    return max(0, sample.peak_bytes + extra_threads * sample.peak_bytes_per_thread)


def _without_none(fields: dict[str, object]) -> dict[str, object]:
    return {name: value for name, value in fields.items() if value is not None}


def _fields(value: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in getattr(value, "__dataclass_fields__", ()):
        if name.startswith("_"):
            continue
        item = getattr(value, name)
        out[name] = _fields(item) if hasattr(item, "__dataclass_fields__") else item
    return out
