"""Checkpoints of ``parplan run``: one shard per rank, a manifest, and the plan-independent (gathered) form.

``--checkpoint-dir D`` holds one folder per checkpoint::

    D/step-00000006/rank-00000.pt    rank 0's shard (torch.save; loads with weights_only=True)
    D/step-00000006/manifest.json    parplan.checkpoint/4: step, plan, fingerprint, each shard's bytes and sha256,
                                     the run's flags, the torch version
    D/step-00000006/full.pt          the plan-independent form, written on request (:func:`write_full`)

Writing (:func:`save`, collective): every rank writes its shard atomically
(a temporary file in the same folder, fsync, rename, fsync of the folder);
the shards' sizes and digests reach rank 0, which then writes the manifest
the same way. A checkpoint is *complete* when its manifest exists, so a crash
at any moment leaves the newest complete checkpoint intact, and the two
newest complete ones are kept. D must be one folder every rank sees (a
shared filesystem across hosts). A rank that cannot write its shard (a full
disk) tells the others in the same exchange: none writes the manifest, the
folder is removed, every rank stops with one line naming the rank, the error
and the checkpoint still intact (:class:`CheckpointWriteError`).

A shard holds this rank's parameters (a channel-split layer's weights are its
slice; a pipeline stage holds only its own), its buffers, the optimizer's
state by parameter name, the CPU (and CUDA) RNG state, the step, the losses
and step times measured so far, and the plan's digest and fingerprint. A
stale pipeline's shard also holds its batches in flight (``in_flight``:
stashed inputs and RNG states, activations received ahead;
``runtime.pipeline.worker``), so its run continues without a drain.

Resuming (:func:`restore`) under the same plan on the same number of ranks
loads each rank's own shard, so training continues bit for bit; a
checkpoint one of whose shards is damaged (its digest differs) is passed over
for the one before, with one line saying so (:func:`usable`). Under
another plan — other layouts, stages or device count, same model and input —
every rank takes its part of the gathered form (:func:`gather`: slices
joined, replicas taken from the lowest rank holding them). The RNG state is
then rank 0's, and the running statistics of layers split by sample are
their lowest rank's (as DDP broadcasts rank 0's), so that resume is equal to
the unsplit model's training but not bit for bit the interrupted run's.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import torch

from cost_models.errors import InputError
from cost_models.formats.jsonio import read_json, write_bytes_atomic, write_json_atomic

if TYPE_CHECKING:
    from runtime.options import PipelineOrder
    from runtime.pipeline.stash import InFlight
    from runtime.slicing import ParameterSlice

__all__ = ["FORMAT", "CheckpointWriteError", "Progress", "RunFlags", "RunMeta", "Shard", "State", "check_compatible",
           "check_sizes", "complete", "gather", "latest", "plan_digest", "restore", "run_flags", "same_run", "save",
           "usable", "write_full"]

FORMAT = "parplan.checkpoint/4"
READABLE_FORMATS = {FORMAT: "checkpoint-4", "parplan.checkpoint/3": "checkpoint-3",
                    "parplan.checkpoint/2": "checkpoint-2", "parplan.checkpoint/1": "checkpoint-1"}
"""Manifest formats this code reads, newest first (``/3`` has no run flags, torch version nor batches in flight,
``/2`` embeds a ``parplan.plan/2`` document, ``/1`` a ``parplan.plan/1`` one)."""
SHARD_FORMAT = "parplan.checkpoint-shard/1"
FULL_FORMAT = "parplan.checkpoint-full/1"
KEEP = 2
"""Complete checkpoints kept; older ones are removed after a newer one is complete."""


@dataclass
class Progress:
    """How far a run got: updates done (warm-up included) and what it measured so far."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    per_step_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class State:
    """What one rank trains: named parameters and buffers (its own), their slices, the optimizer."""

    parameters: Mapping[str, torch.Tensor]
    buffers: Mapping[str, torch.Tensor]
    slices: Mapping[str, ParameterSlice]
    optimizer: torch.optim.Optimizer


class RunFlags(TypedDict):
    """The flags of a run that shape its trajectory or its recovery besides its plan (:func:`run_flags`)."""

    checkpoint_every: int
    order: PipelineOrder
    staleness: int | None
    lr: float


class _RunMetaFields(TypedDict):
    plan: Mapping[str, Any]
    """The plan document (``parplan.plan/3``)."""
    seed: int
    warmup: int


class RunMeta(_RunMetaFields, total=False):
    """What a checkpoint records of a run, and a resume must match (:func:`check_compatible`; ``steps`` there)."""

    run: RunFlags
    steps: int


class _ShardReportFields(TypedDict):
    rank: int


class _ShardReport(_ShardReportFields, total=False):
    """A shard's manifest entry (``file``, ``bytes``, ``sha256``), or ``error`` where it could not be written."""

    file: str
    bytes: int
    sha256: str
    error: str


class _NamedOptimizerState(TypedDict):
    """An optimizer's state dict with parameter names for indices."""

    state: dict[str, dict[str, object]]
    param_groups: list[dict[str, object]]


class _Trained(TypedDict):
    """What a shard and the gathered form both hold: the training state by name, the RNG, the progress."""

    format: str
    step: int
    plan_digest: str
    fingerprint: str
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    optimizer: _NamedOptimizerState
    rng: dict[str, torch.Tensor]
    losses: list[float]
    per_step_s: list[float]


class _ShardFields(_Trained):
    rank: int
    slices: dict[str, list[int]]
    """Per sliced tensor: ``[dim, start, stop, extent]``."""


class Shard(_ShardFields, total=False):
    """One rank's shard (``rank-RANK.pt``); a stale pipeline's holds its batches in flight."""

    in_flight: InFlight


_Value = TypeVar("_Value")


def plan_digest(plan: Mapping[str, Any]) -> str:
    """A digest of what decides the shards' contents: layouts, stages, pipeline and device count (a layout's
    unsplit depth and the stages' recomputation left out, so ``parplan.plan/1``, ``/2`` and ``/3`` forms of one
    plan digest alike: recomputing changes no parameter)."""
    layers = [{**layer, "layout": {axis: parts for axis, parts in layer["layout"].items()
                                   if not (axis == "d" and parts == 1)}} for layer in plan["layers"]]
    pipeline = {key: value for key, value in plan["pipeline"].items() if key != "recompute"}
    key = {"layers": layers, "pipeline": pipeline, "devices": plan["cluster"]["devices"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def step_folder(directory: str | Path, step: int) -> Path:
    """The folder of the checkpoint after ``step`` updates."""
    return Path(directory) / f"step-{step:08d}"


def complete(directory: str | Path) -> list[Path]:
    """The complete checkpoints in ``directory`` (those with a manifest), oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir() and (p / "manifest.json").is_file())


def latest(directory: str | Path) -> dict[str, Any] | None:
    """The manifest of the newest complete checkpoint (schema-checked), ``None`` when there is none."""
    folders = complete(directory)
    return read_manifest(folders[-1]) if folders else None


def read_manifest(folder: Path) -> dict[str, Any]:
    """``folder/manifest.json``, checked against ``parplan.checkpoint/4`` (or ``/3``, ``/2``, ``/1``), with ``folder``
    added."""
    from cost_models.formats.schema import check_versioned

    path = folder / "manifest.json"
    document = read_json(path, "checkpoint manifest")
    check_versioned(document, READABLE_FORMATS, str(path), InputError)
    return {**document, "folder": str(folder)}


def check_compatible(manifest: Mapping[str, Any], meta: RunMeta) -> None:
    """Refuse to resume a run described by ``meta`` from the checkpoint of ``manifest``, naming both values.

    ``meta``: ``plan`` (the plan document: model fingerprint and dtype), ``seed``, ``warmup`` and ``steps``.
    """
    made, plan = manifest["model"], meta["plan"]["model"]
    source = f"the checkpoint in {manifest['folder']}"
    if made["fingerprint"] != plan["fingerprint"]:
        raise InputError(f"{source} is of model {made['spec']} at input {made['input_shape']} (fingerprint "
                         f"{made['fingerprint']}), this run's is {plan['fingerprint']}; resume with the same model "
                         "and --input-shape")
    ours = (plan["dtype"], meta["seed"], meta["warmup"])
    theirs = (made["dtype"], manifest["seed"], manifest["warmup"])
    if ours != theirs:
        raise InputError(f"{source} was made with --dtype {theirs[0]} --seed {theirs[1]} --warmup {theirs[2]}, this "
                         f"run has --dtype {ours[0]} --seed {ours[1]} --warmup {ours[2]}; give the same")
    if manifest["step"] > meta["warmup"] + meta["steps"]:
        raise InputError(f"{source} is after step {manifest['step']}, past this run's end (--warmup {meta['warmup']} "
                         f"+ --steps {meta['steps']}); raise --steps")


def check_sizes(manifest: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose shard files are missing or of another size than its manifest says."""
    folder = Path(manifest["folder"])
    for entry in manifest["shards"]:
        path = folder / entry["file"]
        size = path.stat().st_size if path.is_file() else None
        if size != entry["bytes"]:
            found = "missing" if size is None else f"{size} bytes"
            raise InputError(f"checkpoint file {path} is {found}, its manifest says {entry['bytes']} bytes; remove "
                             f"{folder} to resume from the checkpoint before")


class CheckpointWriteError(RuntimeError):
    """A rank could not write its shard (a full disk, a folder it may not write): no rank wrote the checkpoint."""


def save(directory: str | Path, progress: Progress, state: State, meta: RunMeta,
         in_flight: InFlight | None = None) -> Path:
    """Write the checkpoint after ``progress.step`` updates; collective (every rank calls it). Returns its folder.

    ``meta``: ``plan`` (the plan document), ``seed``, ``warmup`` and ``run`` (the flags of :func:`run_flags`) —
    recorded for :func:`check_compatible`. ``in_flight``: this rank's batches in flight (``runtime.pipeline.worker``).

    Raises:
        CheckpointWriteError: Some rank could not write its shard (every rank raises it, naming that rank).
    """
    import torch.distributed as dist

    from runtime.waiting import exchange

    folder = step_folder(directory, progress.step)
    rank = dist.get_rank()
    name = f"rank-{rank:05d}.pt"
    entry = _write_shard(folder, name, _shard(progress, state, meta, rank, in_flight), progress.step, rank)
    entries = [entry] * dist.get_world_size()  # every rank's, once gathered
    with exchange("the checkpoint's exchange of shard digests"):
        dist.all_gather_object(entries, entry)
    failed = [e for e in entries if "error" in e]
    if failed:
        _abandon(folder, name, rank)
        raise CheckpointWriteError(_write_failure(directory, folder, failed))
    if rank == 0:
        write_json_atomic(folder / "manifest.json", _manifest(progress, meta, entries, in_flight is not None))
        _prune(directory)
    return folder


def _write_shard(folder: Path, name: str, shard: Shard, step: int, rank: int) -> _ShardReport:
    """Write one shard atomically; its manifest entry, or ``{"rank", "error"}`` when it could not be written."""
    from runtime.fault_injection import disk_full

    try:
        folder.mkdir(parents=True, exist_ok=True)
        data = _serialise(shard)
        disk_full(rank, step, folder / name)  # PARPLAN_FAULT=full:RANK:STEP: as if the disk filled up here
        write_bytes_atomic(folder / name, data)
    except (OSError, InputError) as err:
        return {"rank": rank, "error": str(err.__cause__ or err)}
    return {"rank": rank, "file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _abandon(folder: Path, name: str, rank: int) -> None:
    """Remove this rank's shard of a checkpoint that will never be complete (rank 0: the whole folder)."""
    (folder / name).unlink(missing_ok=True)
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)


def _write_failure(directory: str | Path, folder: Path, failed: Sequence[_ShardReport]) -> str:
    before = complete(directory)
    kept = f"the checkpoint in {before[-1]} is intact" if before else "no earlier checkpoint exists"
    first = failed[0]
    return (f"could not write checkpoint {folder} (rank {first['rank']}: {first['error']}); {kept}; free space in "
            f"{directory} or give another --checkpoint-dir, and resume")


def _shard(progress: Progress, state: State, meta: RunMeta, rank: int, in_flight: InFlight | None = None) -> Shard:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    shard: Shard = {
        "format": SHARD_FORMAT, "rank": rank, "step": progress.step, "plan_digest": plan_digest(meta["plan"]),
        "fingerprint": meta["plan"]["model"]["fingerprint"],
        "parameters": {n: t.detach().cpu().clone() for n, t in state.parameters.items()},
        "buffers": {n: t.detach().cpu().clone() for n, t in state.buffers.items()},
        "slices": {s.name: [s.dim, s.start, s.stop, s.extent] for s in state.slices.values()},
        "optimizer": _optimizer_by_name(state), "rng": rng,
        "losses": list(progress.losses), "per_step_s": list(progress.per_step_s)}
    if in_flight is not None:
        shard["in_flight"] = in_flight.copy()
    return shard


def _optimizer_by_name(state: State) -> _NamedOptimizerState:
    """The optimizer's state dict with parameter names for indices (plan-independent keys)."""
    names = {id(t): n for n, t in state.parameters.items()}
    order = [names[id(p)] for group in state.optimizer.param_groups for p in group["params"]]
    saved = state.optimizer.state_dict()
    return {"state": {order[i]: {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v)
                                 for k, v in entry.items()} for i, entry in saved["state"].items()},
            "param_groups": [{**group, "params": [order[i] for i in group["params"]]}
                             for group in saved["param_groups"]]}


def run_flags(*, checkpoint_every: int, order: PipelineOrder, staleness: int | None, lr: float) -> RunFlags:
    """The flags of a run that shape its trajectory or its recovery besides its plan (``run`` in the manifest): a
    resume that does not give them again keeps them (``parplan.cli.resume``)."""
    return {"checkpoint_every": checkpoint_every, "order": order, "staleness": staleness, "lr": lr}


def _manifest(progress: Progress, meta: RunMeta, entries: Sequence[_ShardReport],
              in_flight: bool = False) -> dict[str, object]:
    import datetime as dt

    plan = meta["plan"]
    return {"format": FORMAT, "step": progress.step, "world_size": len(entries),
            "model": {"spec": plan["model"]["spec"], "fingerprint": plan["model"]["fingerprint"],
                      "input_shape": list(plan["model"]["input_shape"]), "dtype": plan["model"]["dtype"]},
            "seed": meta["seed"], "warmup": meta["warmup"], "plan_digest": plan_digest(plan), "plan": plan,
            "run": dict(meta.get("run") or run_flags(checkpoint_every=0, order="1f1b", staleness=None, lr=0.01)),
            "torch": torch.__version__, "in_flight": in_flight, "shards": list(entries),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def _prune(directory: str | Path) -> None:
    """Remove all but the ``KEEP`` newest complete checkpoints, and incomplete ones older than those."""
    kept = complete(directory)[-KEEP:]
    if not kept:
        return
    for folder in Path(directory).glob("step-*"):
        if folder.is_dir() and folder not in kept and folder.name < kept[0].name:
            shutil.rmtree(folder, ignore_errors=True)


def _serialise(document: Mapping[str, object]) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(document), buffer)
    return buffer.getvalue()


def load_shard(manifest: Mapping[str, Any], rank: int) -> Shard:
    """Rank ``rank``'s shard of the checkpoint ``manifest`` describes, its size and digest checked."""
    entry = next((e for e in manifest["shards"] if e["rank"] == rank), None)
    folder = Path(manifest["folder"])
    if entry is None:
        raise InputError(f"checkpoint {folder} has no shard of rank {rank} (it has {len(manifest['shards'])}); "
                         "it is damaged — remove it to resume from the one before")
    return _load(folder / entry["file"], entry["sha256"], manifest.get("torch"))


def _load(path: Path, sha256: str, written_by: str | None = None) -> Any:
    """The document ``torch.save`` wrote to ``path`` (a shard, or the gathered form), its digest checked."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read checkpoint file {path}: {err}; remove its folder to resume from the "
                         "checkpoint before") from err
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"checkpoint file {path} does not match the digest in its manifest (damaged or "
                         "replaced); remove its folder to resume from the checkpoint before")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 — any unpickling failure is this one line
        versions = (f"written by torch {written_by}, this is torch {torch.__version__}" if written_by else
                    f"written by an unrecorded torch version, this is torch {torch.__version__}")
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "Weights only load failed" in first:  # torch's hint (weights_only=False) is not one parplan takes
            first = "not a tensor archive this torch reads without unpickling code"
        raise InputError(f"cannot load checkpoint file {path} ({versions}): {first[:200]}; resume with the torch "
                         "that wrote it, or remove its folder to resume from the checkpoint before") from err


def same_run(manifest: Mapping[str, Any], meta: RunMeta) -> bool:
    """Whether the checkpoint was written under this run's plan on as many ranks (each rank loads its own shard)."""
    import torch.distributed as dist

    return manifest["plan_digest"] == plan_digest(meta["plan"]) and manifest["world_size"] == dist.get_world_size()


def usable(manifest: Mapping[str, Any], meta: RunMeta) -> str | None:
    """Why this rank cannot load its part of the checkpoint (a shard missing, of another size or digest), or
    ``None``; not collective: the caller agrees over the ranks."""
    try:
        check_sizes(manifest)
        if same_run(manifest, meta):
            load_shard(manifest, _rank())
    except InputError as err:
        return str(err)
    return None


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def restore(manifest: Mapping[str, Any], state: State, meta: RunMeta,
            device: torch.device) -> tuple[Progress, InFlight | None]:
    """Load the checkpoint of ``manifest`` into this rank's ``state``; returns the progress it records and this
    rank's batches in flight (``None`` when it has none to continue from).

    The own shard under the same plan and rank count (bit for bit); else this rank's part of :func:`gather`
    (batches in flight are then not continued: the stages refill from the checkpoint's step).
    """
    import torch.distributed as dist

    shard = load_shard(manifest, dist.get_rank()) if same_run(manifest, meta) else None
    source = shard if shard is not None else gather(manifest)
    where = f"the checkpoint in {manifest['folder']}"
    _copy_into(source["parameters"], state.parameters, state, "parameter", where)
    _copy_into(source["buffers"], state.buffers, state, "buffer", where)
    state.optimizer.load_state_dict(_optimizer_for(source["optimizer"], state))
    torch.set_rng_state(source["rng"]["cpu"])
    if "cuda" in source["rng"] and device.type == "cuda":
        torch.cuda.set_rng_state(source["rng"]["cuda"], device)
    progress = Progress(int(source["step"]), [float(x) for x in source["losses"]],
                        [float(x) for x in source["per_step_s"]])
    return progress, (shard.get("in_flight") if shard is not None else None)


def _local(name: str, tensor: torch.Tensor, state: State) -> torch.Tensor:
    """``tensor`` (whole, or already this rank's slice) as this rank holds it."""
    piece = state.slices.get(name)
    if piece is not None and tensor.dim() > piece.dim and tensor.shape[piece.dim] == piece.extent:
        return tensor.narrow(piece.dim, piece.start, piece.stop - piece.start)
    return tensor


def _copy_into(saved: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor], state: State,
               kind: str, source: str = "the checkpoint") -> None:
    for name, target in targets.items():
        if name not in saved:
            raise InputError(f"{source} has no {kind} {name}: it was made for another model; resume with that "
                             "model, or start afresh in an empty --checkpoint-dir")
        value = _local(name, saved[name], state)
        if tuple(value.shape) != tuple(target.shape):
            raise InputError(f"{source}'s {kind} {name} has shape {tuple(value.shape)} where this run holds "
                             f"{tuple(target.shape)}: it was made for another model; resume with that model, or "
                             "start afresh in an empty --checkpoint-dir")
        with torch.no_grad():
            target.copy_(value)


def _optimizer_for(saved: _NamedOptimizerState, state: State) -> dict[str, object]:
    """An optimizer state dict for this rank's parameters from one keyed by names.

    The per-parameter state (momentum, Adam's moments) comes from the checkpoint; the hyperparameters are this
    run's own (a resume may change ``--lr``).
    """
    names = {id(t): n for n, t in state.parameters.items()}
    groups: list[dict[str, object]] = []
    entries: dict[int, dict[str, object]] = {}
    index = 0
    for group in state.optimizer.param_groups:
        members = []
        for param in group["params"]:
            name = names[id(param)]
            if name in saved["state"]:
                entries[index] = {k: _local(name, v, state).clone() if isinstance(v, torch.Tensor) and v.dim() else v
                                  for k, v in saved["state"][name].items()}
            members.append(index)
            index += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": members})
    return {"state": entries, "param_groups": groups}


def gather(manifest: Mapping[str, Any]) -> _Trained:
    """The plan-independent form of a checkpoint: every parameter, buffer and optimizer tensor whole, by name.

    Slices are joined along their dimension; a tensor held whole by several ranks is taken from the lowest.
    ``full.pt`` in the checkpoint's folder, when :func:`write_full` made it, is read instead of the shards.
    """
    folder = Path(manifest["folder"])
    if "full" in manifest:
        return _load(folder / manifest["full"]["file"], manifest["full"]["sha256"])
    shards = [load_shard(manifest, entry["rank"]) for entry in sorted(manifest["shards"], key=lambda e: e["rank"])]
    first = shards[0]
    states = [{f"{name}/{key}": value for name, entry in s["optimizer"]["state"].items()
               for key, value in entry.items()} for s in shards]
    joined_state = _join(list(zip(shards, states)), folder, optimizer=True)
    optimizer_state: dict[str, dict[str, object]] = {}
    for compound, value in joined_state.items():
        name, key = compound.rsplit("/", 1)
        optimizer_state.setdefault(name, {})[key] = value
    return {"format": FULL_FORMAT, "step": first["step"], "fingerprint": first["fingerprint"],
            "plan_digest": first["plan_digest"],
            "parameters": _join([(s, s["parameters"]) for s in shards], folder),
            "buffers": _join([(s, s["buffers"]) for s in shards], folder),
            "optimizer": {"state": optimizer_state, "param_groups": first["optimizer"]["param_groups"]},
            "rng": first["rng"], "losses": first["losses"], "per_step_s": first["per_step_s"]}


def _join(parts: Sequence[tuple[Shard, Mapping[str, _Value]]], folder: Path,
          optimizer: bool = False) -> dict[str, _Value | torch.Tensor]:
    """Whole tensors from the shards' pieces (``(shard, {name: tensor})`` in rank order).

    With ``optimizer`` the names are ``parameter/key`` and slice like their parameter.
    """
    whole: dict[str, _Value | torch.Tensor] = {}
    pieces: dict[str, tuple[list[int], dict[tuple[int, int], torch.Tensor]]] = {}
    for shard, tensors in parts:
        for name, tensor in tensors.items():
            piece = shard["slices"].get(name.rsplit("/", 1)[0] if optimizer else name)
            if piece is not None and isinstance(tensor, torch.Tensor) and tensor.dim() > piece[0] \
                    and tensor.shape[piece[0]] == piece[2] - piece[1]:
                pieces.setdefault(name, (piece, {}))[1].setdefault((piece[1], piece[2]), tensor)
            else:
                whole.setdefault(name, tensor)
    for name, (span, found) in pieces.items():
        whole[name] = _joined(name, span[0], span[3], found, folder)
    return whole


def _joined(name: str, dim: int, extent: int, found: Mapping[tuple[int, int], torch.Tensor],
            folder: Path) -> torch.Tensor:
    """The slices ``found`` (by row span) joined along ``dim``; they must cover ``0 … extent`` exactly."""
    covered = 0
    for start, stop in sorted(found):
        if start != covered:
            raise InputError(f"checkpoint {folder} lacks rows {covered}…{start} of {name}; it is damaged")
        covered = stop
    if covered != extent:
        raise InputError(f"checkpoint {folder} lacks rows {covered}…{extent} of {name}; it is damaged")
    return torch.cat([found[span] for span in sorted(found) if span[1] > span[0]], dim=dim)


def write_full(manifest: Mapping[str, Any]) -> Path:
    """Write the gathered form into the checkpoint's folder as ``full.pt`` and record it in the manifest."""
    folder = Path(manifest["folder"])
    data = _serialise(gather({k: v for k, v in manifest.items() if k != "full"}))
    write_bytes_atomic(folder / "full.pt", data)
    document = {k: v for k, v in manifest.items() if k != "folder"}
    document["full"] = {"file": "full.pt", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_json_atomic(folder / "manifest.json", document)
    return folder / "full.pt"
