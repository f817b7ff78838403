"""The model-coverage suite: every model of eight zoos traced, planned and verified by ``parplan check``'s code.

Models are chosen by rule, so that nobody picks the easy ones:

* torchvision — every classification and segmentation model
  (``torchvision.models.list_models(module=…)``) with at most 100 M parameters;
* timm — per architecture family (the model's module in ``timm.models``) the
  model of ``timm.list_models()`` with the fewest parameters, at most 100 M
  (``pretrained=False``: nothing is downloaded);
* MONAI — its 2-D networks at the small sizes of ``MONAI_NETWORKS`` (stated in
  the table), and its 3-D ones (``MONAI_VOLUME_NETWORKS``, named ``NAME 3d``)
  on ``4×1×S×S×S`` volumes of ``VOLUME_SIZES``; one that does not build here is
  listed as skipped, with why;
* segmentation_models_pytorch (``smp``) — every architecture of
  ``smp.MODEL_ARCHITECTURES_MAPPING`` as it builds by default (its default encoder), with random weights
  and two classes (``SMP_OPTIONS``);
* Hugging Face transformers (``hf``) — ``HF_MODELS``: ConvNeXt (V1, V2), DINOv2, MobileViT, ResNet, SegFormer,
  Swin and ViT at their default configurations, two classes (``HF_OPTIONS``);
* diffusers — ``DIFFUSERS_MODELS``: ``UNet2DModel`` (narrower than its default; its forward takes the image
  and a timestep per sample), ``AutoencoderKL`` and ``VQModel`` as they build by default, and a 3-level
  ``AutoencoderKL``;
* neuraloperator (``neuralop``: FNO, TFNO) and NVIDIA physicsnemo (``physicsnemo``: FNO, AFNO, Pix2Pix) —
  ``SCIENCE_MODELS``, at small configurations (their constructors have no default sizes).

Parameters are counted on the meta device (nothing allocated); larger models
are listed as skipped with their count. Input: a batch of 4, float32, the
smallest square side of ``SIZES`` that the model accepts in training mode (a
real forward pass), else a timm model's own fixed side; a timm model that takes ``img_size`` is built for that
side. Each model gets the checks of ``parplan.cli.check.check_model`` (one
implementation, two front ends): trace; plan on 2 and 4 devices of one node
(the default search of ``parplan plan``); ``--verify`` of each plan; ``--verify``
under n2, h2, w2, c2 (2 ranks) and h2·w2 (4 ranks) — on persistent pools of
ranks (``runtime.rank_pool``). A model has at most ``--cap-s`` (300) seconds
for all its checks; what is left when they run out fails as timed out. The
cap is hard: the models run in a worker process, and a supervisor kills it
with its ranks when a model is still running ``GRACE_S`` (60 s) past its cap,
records the model as failed and starts a worker for the next
(``benchmarks.zoo_supervisor``).

Results go to ``--out`` (JSON, rewritten atomically after every model, so a
crashed or stopped run resumes where it was; the chosen models are cached in
it too, and shipped in ``benchmarks/zoo_catalogue.json`` for the library versions they were chosen at:
choosing anew counts every timm model's parameters, about 10 minutes on 2 cores; ``--save-catalogue``
rewrites it) and the table to ``--markdown`` (``docs/model-coverage.md``: generated,
never edited by hand). Usage::

    .venv/bin/python benchmarks/model_zoo.py [--zoo torchvision,timm,…,neuralop,physicsnemo] [--only NAME ...]
        [--limit K] [--out results.json] [--markdown docs/model-coverage.md] [--cap-s 300] [--table-only]
        [--save-catalogue]

``--limit K`` takes K models of each zoo, evenly spaced in its sorted list; the zoos take turns, so that a run
stopped early (Ctrl-C; a rerun with the same ``--out`` resumes) has a sample of each.

Importing this file is cheap (the standard library only): the ranks import it to
build ``timm__NAME__SIDE`` and ``monai__NAME`` models by spec
(``/path/to/model_zoo.py:timm__resnet10t__32``), through the module's ``__getattr__``; torchvision's
segmentation models are built so too (``torchvision:NAME`` would download their backbones' weights).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
if str(REPO) not in sys.path:  # run as a script, or imported by path in the ranks (a model spec)
    sys.path.insert(0, str(REPO))

from benchmarks.zoo_models import (  # noqa: E402
    DIFFUSERS_MODELS,
    HF_MODELS,
    MONAI_NETWORKS,
    MONAI_VOLUME_NETWORKS,
    SCIENCE_MODELS,
    VOLUME_SUFFIX,
    ZooModel,
    diffusers_catalogue,
    diffusers_model,
    first_line,
    hf_catalogue,
    hf_model,
    is_volume,
    monai_catalogue,
    monai_model,
    output_of,
    science_catalogue,
    science_model,
    smp_catalogue,
    smp_model,
    spec_of,
    takes_timestep,
    timm_catalogue,
    timm_model,
    torchvision_catalogue,
    torchvision_model,
)
from benchmarks.zoo_table import COLUMNS, ZOOS, checks_of, markdown  # noqa: E402 - after the path above

SIZES = (32, 64, 96, 128, 224)
VOLUME_SIZES = (16, 32)
"""The sides a 3-D network is tried at: volumes are checked small (``S³`` voxels, one channel)."""
BATCH = 4
CAP_S = 300.0
FORMAT = "parplan.model-zoo/1"
CATALOGUE = HERE.with_name("zoo_catalogue.json")
"""The models the rule chose, shipped so that a run need not count timm's parameters again (same versions)."""
CATALOGUE_FORMAT = "parplan.model-zoo-catalogue/1"

# ----------------------------------------------------------------------------------------------- factories
def __getattr__(name: str) -> Callable[[], Any]:
    """Factories for model specs: ``timm__NAME__SIDE`` (SIDE 0: no img_size), ``monai__NAME`` and
    ``torchvision__NAME`` (a segmentation model, its backbone without weights too), ``smp__NAME``, ``hf__NAME``,
    ``diffusers__NAME`` (spaces as ``_``)."""
    zoo, _, rest = name.partition("__")
    if zoo == "timm" and "__" in rest:
        model, _, side = rest.rpartition("__")
        if side.isdigit():
            return lambda: timm_model(model, int(side))
    if zoo == "monai" and rest in MONAI_NETWORKS:
        return lambda: monai_model(rest)
    if zoo == "monai" and rest.endswith("__3d") and rest[:-4] in MONAI_VOLUME_NETWORKS:
        return lambda: monai_model(rest[:-4] + VOLUME_SUFFIX)
    if zoo == "torchvision" and rest:
        return lambda: torchvision_model(rest)
    if zoo == "smp" and rest:
        return lambda: smp_model(rest)
    if zoo == "hf" and rest in HF_MODELS:
        return lambda: hf_model(rest)
    if zoo == "diffusers" and rest.replace("_", " ") in DIFFUSERS_MODELS:
        return lambda: diffusers_model(rest.replace("_", " "))
    if zoo in SCIENCE_MODELS and rest in SCIENCE_MODELS[zoo]:
        return lambda: science_model(zoo, rest)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------- input side
def input_side(entry: ZooModel) -> tuple[int | None, str, str]:
    """The smallest side of ``SIZES`` the model accepts in training mode, its spec at that side, and the last error."""
    import torch

    error = ""
    takes_img_size = entry.zoo == "timm"
    for side in VOLUME_SIZES if is_volume(entry) else (*SIZES, *_fixed_side(entry)):
        try:
            model, takes_img_size = _build_for(entry, side, takes_img_size and side in SIZES)
            torch.manual_seed(0)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.train()(*(torch.randn(shape) for shape in input_shapes(entry, side)))
        except Exception as err:
            error = f"{side}: {type(err).__name__}: {first_line(err)}"
            continue
        spec = entry.spec or spec_of(f"timm__{entry.name}__{side if takes_img_size else 0}")
        return side, spec, ""
    return None, entry.spec, error


def input_shape(entry: ZooModel, side: int) -> tuple[int, ...]:
    """The batch the entry is checked on: ``BATCH×3×side×side`` images, ``BATCH×1×side³`` volumes."""
    return (BATCH, 1, side, side, side) if is_volume(entry) else (BATCH, 3, side, side)


def input_shapes(entry: ZooModel, side: int) -> tuple[tuple[int, ...], ...]:
    """Every input of the entry's forward: the batch, then a timestep per sample for a diffusion UNet."""
    return (input_shape(entry, side), *([(BATCH,)] if takes_timestep(entry) else []))


def _fixed_side(entry: ZooModel) -> tuple[int, ...]:
    """The model's own input side, when it is none of ``SIZES``: a timm model's ``pretrained_cfg``, a torchvision
    classifier's weights' crop size — the fixed size of a model that accepts only it (crossvit_tiny_240), or
    nothing smaller in training mode (inception_v3 at 299)."""
    try:
        if entry.zoo == "timm":
            side = int(timm_model(entry.name).pretrained_cfg["input_size"][-1])
        elif entry.zoo == "torchvision":
            import torchvision

            side = int(next(iter(torchvision.models.get_model_weights(entry.name))).transforms().crop_size[0])
        else:
            return ()
    except Exception:  # no configuration to read: only SIZES are tried
        return ()
    return () if side in SIZES else (side,)


def _build_for(entry: ZooModel, side: int, takes_img_size: bool) -> tuple[Any, bool]:
    from cost_models.ir.model_spec import load_model

    if entry.zoo != "timm":
        return load_model(entry.spec), False
    if takes_img_size:
        try:
            return timm_model(entry.name, side), True
        except TypeError as err:
            if "img_size" not in str(err):
                raise
    return timm_model(entry.name), False


# ----------------------------------------------------------------------------------------------- running
@functools.cache
def code_commit() -> str:
    """The commit of the parplan checkout this file runs from (``unknown`` outside git), read once per worker —
    at its first model, the code it imported: each model's row says which code it was checked with, as a results
    file resumed across commits mixes them (read per model, a commit made while a worker ran was named for code
    the worker had not loaded)."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def run_model(entry: ZooModel, pools: Any, cap_s: float,
              on_check: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Every check of one model (``check_model``; ``on_check`` after each), as the results document's entry."""
    from cost_models.errors import InputError
    from parplan.cli.check import CheckRequest, check_model

    started = time.perf_counter()
    side, spec, error = input_side(entry)
    result = {**asdict(entry), "spec": spec, "side": side, "commit": code_commit()}
    if side is None and "No module named" in error:  # an optional dependency of the zoo is not installed here
        return {**result, "report": None, "seconds": round(time.perf_counter() - started, 2),
                "skip": f"does not run here: {error.split(': ', 1)[-1]}"}
    if side is None:
        result["report"] = _no_trace(f"accepts none of the sides {list(SIZES)} in training mode (last: {error})")
    else:
        request = CheckRequest(spec, input_shape(entry, side), timeout_s=cap_s, budget_s=cap_s,
                               input_shapes=input_shapes(entry, side), output=output_of(entry))
        try:
            result["report"] = check_model(request, pools, on_check).to_dict()
        except InputError as err:
            result["report"] = _no_trace(f"the model does not build: {first_line(err)}")
        except Exception as err:  # a bug of the harness or the tracer's caller: recorded, and the suite goes on
            result["report"] = _no_trace(f"internal error: {type(err).__name__}: {first_line(err)}")
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def _no_trace(reason: str) -> dict[str, Any]:
    return {"checks": [{"name": "trace", "check": "trace", "layout": None, "devices": None, "result": "fail",
                        "reason": reason, "seconds": 0.0, "detail": {}}]}


def select(entries: Sequence[ZooModel], only: Sequence[str], limit: int | None) -> list[ZooModel]:
    """The entries named by ``only`` (name, family or spec), then ``limit`` of them evenly spaced."""
    chosen = [e for e in entries if not only or e.name in only or e.family in only or e.spec in only]
    if limit is not None and 0 < limit < len(chosen):
        chosen = [chosen[round(i * (len(chosen) - 1) / max(1, limit - 1))] for i in range(limit)]
    return chosen


def load_results(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        return {"format": FORMAT, "catalogue": {}, "models": {}}
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT:
        raise SystemExit(f"{path} is not a {FORMAT} results file; give another --out")
    return document


def save_results(path: Path | None, document: dict[str, Any]) -> None:
    if path is not None:
        from cost_models.formats.jsonio import write_json_atomic

        write_json_atomic(path, document)


def catalogue(zoo: str, results: dict[str, Any], out: Path | None) -> list[ZooModel]:
    """The zoo's entries, from the results file or the shipped catalogue when either has them for the same
    library versions, else chosen anew by the rule (timm's takes about 10 minutes on 2 cores)."""
    versions = library_versions(zoo)
    for cached in (results["catalogue"].get(zoo), shipped_catalogue().get(zoo)):
        if cached and cached.get("versions") == versions:
            results["catalogue"][zoo] = cached
            return [ZooModel(**{**entry, "spec": _this_file(entry["spec"])}) for entry in cached["entries"]]
    print(f"choosing the {zoo} models …", file=sys.stderr, flush=True)
    entries = {"torchvision": torchvision_catalogue, "timm": timm_catalogue, "monai": monai_catalogue,
               "smp": smp_catalogue, "hf": hf_catalogue, "diffusers": diffusers_catalogue,
               "neuralop": lambda: science_catalogue("neuralop"),
               "physicsnemo": lambda: science_catalogue("physicsnemo")}[zoo]()
    results["catalogue"][zoo] = {"versions": versions, "entries": [asdict(e) for e in entries]}
    save_results(out, results)
    return entries


def shipped_catalogue() -> dict[str, Any]:
    """The catalogue shipped beside this file (``--save-catalogue``), by zoo; empty when there is none."""
    return read_catalogue(CATALOGUE)


def read_catalogue(path: Path) -> dict[str, Any]:
    """A catalogue file's zoos; empty when the file does not exist."""
    if not path.exists():
        return {}
    document = json.loads(path.read_text())
    if document.get("format") != CATALOGUE_FORMAT:
        raise SystemExit(f"{path}: format {document.get('format')!r}, expected {CATALOGUE_FORMAT!r}; delete it, "
                         f"or rewrite it with --save-catalogue")
    return dict(document["zoos"])


def save_catalogue(results: dict[str, Any], path: Path = CATALOGUE) -> None:
    """Ship the results file's catalogue (the models the rule chose, with the library versions it chose them at)."""
    from cost_models.formats.jsonio import write_json_atomic

    zoos = {zoo: {**cached, "entries": [{**entry, "spec": _relative(entry["spec"])} for entry in cached["entries"]]}
            for zoo, cached in results["catalogue"].items()}
    write_json_atomic(path, {"format": CATALOGUE_FORMAT, "zoos": zoos})


def _relative(spec: str) -> str:
    """A spec of one of this file's factories with the file's path from the repository root (machine-independent)."""
    source, _, factory = spec.rpartition(":")
    return f"benchmarks/model_zoo.py:{factory}" if source.endswith("benchmarks/model_zoo.py") else spec


def _this_file(spec: str) -> str:
    """A cached spec of one of this file's factories, pointing at this copy of the file (not where it was cached)."""
    source, _, factory = spec.rpartition(":")
    return spec_of(factory) if source.endswith("benchmarks/model_zoo.py") else spec


def library_versions(zoo: str = "") -> dict[str, str]:
    """The versions a zoo's catalogue is chosen at (a catalogue of other versions is chosen anew): torch,
    torchvision, timm and MONAI; with segmentation_models_pytorch's, transformers' or diffusers' for its zoo
    (``""``: every library)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    extra = tuple(package for package, of in (("segmentation_models_pytorch", "smp"), ("transformers", "hf"),
                                              ("diffusers", "diffusers"), ("neuraloperator", "neuralop"),
                                              ("nvidia-physicsnemo", "physicsnemo")) if zoo in (of, ""))
    for package in ("torch", "torchvision", "timm", "monai", *extra):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def machine() -> dict[str, Any]:
    import torch

    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            **{k: v for k, v in library_versions().items() if k != "torch"}}


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    """The supervisor (``benchmarks.zoo_supervisor``): a worker runs the models; one stuck past the cap is killed."""
    from benchmarks.zoo_supervisor import GRACE_S, supervise

    out = Path(args.out)
    results = load_results(out)
    results["cap_s"] = args.cap_s
    results.setdefault("commands", []).append(" ".join(["benchmarks/model_zoo.py", *args.argv]))
    save_results(out, results)
    since, started = _now(), time.perf_counter()
    worker = [sys.executable, str(HERE), *args.argv, "--worker", "--since", since]
    heartbeat = out.with_name(out.name + ".heartbeat")

    def record(last: dict[str, Any], why: str) -> None:
        document = load_results(out)
        document["models"][last["key"]] = _stuck(last, why)
        save_results(out, document)
        print(f"[{last['key']}] {why}", file=sys.stderr, flush=True)

    supervise(worker, heartbeat=heartbeat, limit_s=args.cap_s + GRACE_S, on_stuck=record)
    heartbeat.unlink(missing_ok=True)
    results = load_results(out)
    results["wall_s"] = round(results.get("wall_s", 0.0) + time.perf_counter() - started, 1)
    save_results(out, results)
    return results


def run_worker(args: argparse.Namespace) -> None:
    """The models not yet done (with ``--rerun``: not done since ``--since``), one after another, on one pool."""
    from benchmarks.zoo_supervisor import beat
    from runtime.rank_pool import RankPools

    out = Path(args.out)
    results = load_results(out)
    results["machine"] = machine()
    chosen = [select(catalogue(zoo, results, out), args.only, args.limit) for zoo in args.zoo]
    todo = [e for e in _round_robin(chosen) if _to_do(results["models"].get(_key(e)), args)]
    preload = [name for name, zoo in (("timm", "timm"), ("monai.networks.nets", "monai"),
                                      ("segmentation_models_pytorch", "smp"), ("transformers", "hf"),
                                      ("diffusers", "diffusers"), ("neuralop", "neuralop"),
                                      ("physicsnemo", "physicsnemo")) if zoo in args.zoo]
    heartbeat = out.with_name(out.name + ".heartbeat")
    with RankPools(group_timeout_s=args.cap_s, preload=preload) as pools:
        for index, entry in enumerate(todo, 1):
            last = {"key": _key(entry), "entry": asdict(entry), "started": time.time(), "checks": []}
            beat(heartbeat, last)

            def finished(check: Any, last: dict[str, Any] = last) -> None:
                last["checks"].append(check.to_dict())
                beat(heartbeat, last)

            result = _skipped(entry) if entry.skip else run_model(entry, pools, args.cap_s, finished)
            result["finished"] = _now()
            results["models"][_key(entry)] = result
            save_results(out, results)
            print(f"[{index}/{len(todo)}] {_progress_line(result)}", file=sys.stderr, flush=True)


def _to_do(done: dict[str, Any] | None, args: argparse.Namespace) -> bool:
    return done is None or (args.rerun and done.get("finished", "") < args.since)


def _stuck(last: dict[str, Any], why: str) -> dict[str, Any]:
    """The results entry of a model its worker was killed or died on: the checks it finished, then a failure."""
    done = [check["name"] for check in last["checks"]]
    running = next((column for column in COLUMNS if column not in done), "trace")
    failed = {"name": running, "check": running.split()[0] if running != "trace" else "trace", "layout": None,
              "devices": None, "result": "fail", "reason": why, "seconds": 0.0, "detail": {}}
    return {**last["entry"], "side": None, "report": {"checks": [*last["checks"], failed]},
            "seconds": round(time.time() - last["started"], 2), "finished": _now()}


def _round_robin(lists: Sequence[Sequence[ZooModel]]) -> list[ZooModel]:
    """The zoos' models taken in turn, so that a run stopped early has a sample of each."""
    return [items[index] for index in range(max(map(len, lists), default=0)) for items in lists if index < len(items)]


def _skipped(entry: ZooModel) -> dict[str, Any]:
    return {**asdict(entry), "side": None, "report": None, "seconds": 0.0}


def _key(entry: ZooModel) -> str:
    return f"{entry.zoo}:{entry.name}"


def _progress_line(result: dict[str, Any]) -> str:
    head = f"{result['zoo']}/{result['name']}"
    if result.get("report") is None:
        return f"{head}: skipped ({result['skip']})"
    cells = ", ".join(f"{c['name']} {c['result']}" for c in result["report"]["checks"])
    return f"{head} at {result['side']}: {cells} ({result['seconds']:.1f} s)"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The model-coverage suite (parplan check over model zoos).")
    parser.add_argument("--zoo", default=",".join(ZOOS), help="zoos to run, comma-separated (default all)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these models (name or family)")
    parser.add_argument("--limit", type=int, help="at most K models per zoo, evenly spaced in its sorted list")
    parser.add_argument("--out", default="model-zoo-results.json",
                        help="results JSON (incremental: a rerun resumes it; default model-zoo-results.json)")
    parser.add_argument("--markdown", help="write the table here (e.g. docs/model-coverage.md)")
    parser.add_argument("--cap-s", type=float, default=CAP_S, help="seconds per model for all its checks (300)")
    parser.add_argument("--rerun", action="store_true", help="run models the results file already has again")
    parser.add_argument("--table-only", action="store_true", help="write --markdown from --out without running")
    parser.add_argument("--save-catalogue", action="store_true",
                        help=f"write --out's catalogue to {CATALOGUE.name} (shipped: later runs skip choosing)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the supervisor's child
    parser.add_argument("--since", default="", help=argparse.SUPPRESS)  # with --rerun: models done since are done
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.zoo = [z.strip() for z in args.zoo.split(",") if z.strip()]
    unknown = sorted(set(args.zoo) - set(ZOOS))
    if unknown:
        parser.error(f"--zoo {','.join(unknown)}: choose from {','.join(ZOOS)}")
    if args.table_only and not args.markdown and not args.save_catalogue:
        parser.error("--table-only needs --markdown (where to write the table)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    results = load_results(Path(args.out)) if args.table_only else run_suite(args)
    if args.save_catalogue:
        save_catalogue(results)
        print(f"wrote {CATALOGUE}", file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(markdown(results))
        print(f"wrote {args.markdown}", file=sys.stderr)
    failed = any(c["result"] == "fail" for r in results["models"].values() for c in checks_of(r).values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
