"""``--verify``: how one step of the split model is compared with the unsplit model, tensor by tensor.

The unsplit reference (:func:`reference_step`) is the user's model, freshly
built with the same seed, traced by the same tracer (the same node names)
and run under an fx interpreter that draws its random ops with the same keys
as the split model (``runtime.random_ops``): random layers stay on on both
sides. It is called with every whole input (a batch's ``x`` is one tensor, or
a tuple of them for a model taking several, in argument order). Unkeyed
random ops that can be switched off are switched off on both sides, the
others are listed (:func:`random_report`).

Each tensor — every output the split model returns (this rank's box of it)
and every gradient this rank trains (its slice) — passes when::

    max|split − unsplit| <= tolerance · max|unsplit| + atol

as ``torch.testing``'s rtol + atol, with ``atol`` the floor below which a
difference is rounding (:data:`VERIFY_ATOL_EPS`): for gradients, of the
largest gradient magnitude of the whole model; for outputs, of the largest
output magnitude. Both figures are reported: the largest error relative to
each tensor's own largest magnitude (``*_max_rel_err``) and relative to the
model's scale (``*_max_abs_err``). Where the floor is so high (an
ill-conditioned float32 model) that it would let real errors pass, the report
says ``conclusive: false`` with a note (:data:`CONCLUSIVE_FLOOR`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.fx.node import Argument, map_aggregate

from cost_models.ir.tracing import symbolic_trace
from runtime.boxes import nd_box
from runtime.inputs import Inputs, as_inputs
from runtime.losses import resolve_loss
from runtime.outputs import output_loss
from runtime.placement import value_placement
from runtime.precision import autocast
from runtime.random_ops import DrawKey, KeyedInterpreter, RandomOp, inside_switched_off, random_ops
from runtime.waiting import all_reduce

if TYPE_CHECKING:
    from runtime.apply import DistributedModel

__all__ = ["CONCLUSIVE_FLOOR", "ROUNDING_FACTOR", "VERIFY_ATOL_EPS", "Comparison", "Reference", "compare_gradients",
           "compare_outputs", "compared_parameters", "float64_verdict", "floating_leaves", "held_reference",
           "keep_reference", "keep_references_of", "random_report", "recheck_in_float64", "reference_step",
           "rounding_error"]

VERIFY_ATOL_EPS = 100
"""The rounding floor in units of the dtype's epsilon times the model's scale (its largest gradient).

A gradient that is zero in exact arithmetic (a bias before batch-norm: shift-invariant) comes out of any
summation order as rounding noise, a few epsilons of the terms it cancels, which are of the size of the
model's gradients; relative to its own largest value that noise is 100 % and tells nothing. 100·eps of the
largest gradient (float32: 1.2e-5 of it, float64: 2.2e-14) lets such noise pass and stays far below what a
real error does: a wrong halo, a tile summed twice or missing, a mis-sliced weight changes a gradient by a
sizeable fraction of the gradients it feeds, so it still fails unless the whole tensor it corrupts lies
below the floor and contributes nothing measurable to training.
"""

ROUNDING_FACTOR = 4
"""Below float64, the floor is at least this many times the unsplit model's own rounding error.

A deep float32 model with batch-norm over few values can be ill-conditioned: the unsplit float32 model
itself then differs from the same model in float64 by far more than a few epsilons (fcn_resnet50 at
64×64: 1.6 % of its largest gradient). A split, which only sums in another order, cannot be closer to the
float32 model than rounding allows, so below float64 --verify also runs the reference in float64 and
takes as floor ``ROUNDING_FACTOR`` × the float32 reference's largest error (over the whole model, relative
to the model's scale): the split must be as accurate as the unsplit model in its dtype. float64 runs have
no wider reference and keep the 100·eps floor: they are the exact check.
"""


CONCLUSIVE_FLOOR = 1e-2
"""A floor above 1 % of the model's scale lets errors of that size pass: the verdict is reported inconclusive.

(regnet_x_400mf at 4×3×32×32 in float32: its unsplit float32 gradients are 59 % of the largest gradient off
the float64 ones, so no float32 comparison can check a split of it.)
"""


@dataclass(frozen=True)
class Reference:
    """The unsplit model after its step: the model (its gradients), each batch's whole output, its random ops,
    the step's loss (each batch's weighted as its gradient is)."""

    model: nn.Module
    outputs: tuple[Argument, ...]
    random: tuple[RandomOp, ...] = ()
    loss: float = float("nan")
    largest_gradient: float | None = None
    """The largest gradient magnitude over the whole model, where ``model`` holds only some of the gradients (a
    pipeline stage's rank receives its own: ``runtime.shared_reference``); ``None``: read from ``model``."""

    def gradient_scale(self) -> float:
        """The model's scale for gradients: its largest gradient magnitude (:data:`VERIFY_ATOL_EPS`)."""
        if self.largest_gradient is not None:
            return self.largest_gradient
        return _scale(p.grad for p in self.model.parameters() if p.grad is not None)


def reference_step(build: Callable[[torch.dtype], nn.Module], leaf_modules: Sequence[str], dtype: torch.dtype,
                   batches: Iterable[tuple[Inputs, torch.Tensor, DrawKey]], *,
                   reuse: Hashable | None = None, output: str | None = None, amp: str = "",
                   loss: str = "") -> Reference:
    """The unsplit model ``build(dtype)`` after forward and backward of each ``(x, labels, key)``; ``x`` is the
    whole input, or a tuple of the whole inputs of a model taking several. With ``amp`` the forward runs under
    that autocast (``runtime.precision``), as the split's does.

    Gradients accumulate over the batches, each loss divided by their number (a pipeline's micro-batches) or,
    where they differ in size, weighted by its share of their samples;
    the loss is :func:`runtime.outputs.output_loss` (``loss``, ``runtime.losses``, default cross-entropy, over
    the floating outputs, or over those of the part ``output`` names).

    ``reuse``: what identifies ``build``'s model and loss (its spec, seed and ``output``). Given, the last
    reference this process computed for the same ``reuse``, dtype, leaf modules and batches (tensors equal
    element for element, the same keys) is returned instead of computing it again — a pool of ranks verifying
    one model under several plans (``parplan check``) computes its reference once. The reference is only read
    by the comparison.
    """
    batches = list(batches)
    if reuse is not None:
        return _reused(reuse, build, leaf_modules, dtype, batches, output, amp, loss)
    return _reference(build, leaf_modules, dtype, batches, output, amp, loss)


_REUSED: dict[torch.dtype, tuple[tuple[Hashable | None, tuple[str, ...]], list[tuple[Inputs, torch.Tensor, DrawKey]],
                                 Reference]] = {}
"""Per dtype, the last reference computed with ``reuse`` (its key, its batches, itself)."""


def keep_references_of(reuse: Hashable | None, leaf_modules: Sequence[str] = ()) -> None:
    """Drop the kept references of any other model (call before building the next split: their memory back)."""
    key = (reuse, tuple(leaf_modules))
    for dtype in [dtype for dtype, known in _REUSED.items() if known[0] != key]:
        del _REUSED[dtype]


def _reused(reuse: Hashable, build: Callable[[torch.dtype], nn.Module], leaf_modules: Sequence[str],
            dtype: torch.dtype, batches: list[tuple[Inputs, torch.Tensor, DrawKey]],
            output: str | None = None, amp: str = "", loss: str = "") -> Reference:
    held = held_reference(reuse, leaf_modules, dtype, batches)
    if held is not None:
        return held
    _REUSED.pop(dtype, None)  # its memory back before the next one is built
    reference = _reference(build, leaf_modules, dtype, batches, output, amp, loss)
    keep_reference(reuse, leaf_modules, dtype, batches, reference)
    return reference


def held_reference(reuse: Hashable, leaf_modules: Sequence[str], dtype: torch.dtype,
                   batches: Sequence[tuple[Inputs, torch.Tensor, DrawKey]]) -> Reference | None:
    """The reference kept for ``reuse``, ``leaf_modules``, ``dtype`` and these batches, if this process holds it."""
    known = _REUSED.get(dtype)
    if known is not None and known[0] == (reuse, tuple(leaf_modules)) and _same_batches(known[1], list(batches)):
        return known[2]
    return None


def keep_reference(reuse: Hashable, leaf_modules: Sequence[str], dtype: torch.dtype,
                   batches: Sequence[tuple[Inputs, torch.Tensor, DrawKey]], reference: Reference) -> None:
    """Keep ``reference`` (computed here or received) as :func:`reference_step` keeps what it computes."""
    _REUSED[dtype] = ((reuse, tuple(leaf_modules)),
                      [(tuple(t.clone() for t in as_inputs(x)), labels.clone(), draw) for x, labels, draw in batches],
                      reference)


def _same_batches(known: Sequence[tuple[Inputs, torch.Tensor, DrawKey]],
                  batches: Sequence[tuple[Inputs, torch.Tensor, DrawKey]]) -> bool:
    return len(known) == len(batches) and all(
        a[2] == b[2] and _same_tensors((*as_inputs(a[0]), a[1]), (*as_inputs(b[0]), b[1]))
        for a, b in zip(known, batches))


def _same_tensors(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, second))


def _reference(build: Callable[[torch.dtype], nn.Module], leaf_modules: Sequence[str], dtype: torch.dtype,
               batches: list[tuple[Inputs, torch.Tensor, DrawKey]], output: str | None = None,
               amp: str = "", loss: str = "") -> Reference:
    model = build(dtype)
    loss_fn = resolve_loss(loss)
    outputs: list[Argument] = []
    shapes = [tuple(x.shape) for x in as_inputs(batches[0][0])] if batches else None
    traced = symbolic_trace(model, tuple(leaf_modules), shapes=shapes)
    ops = tuple(random_ops(list(traced.graph.nodes), model).values())
    samples = [int(labels.shape[0]) if labels.dim() else 1 for _, labels, _ in batches]
    even = len(set(samples)) == 1  # each loss / M; else weighted by its share of the samples
    total = 0.0
    for (x, labels, key), count in zip(batches, samples):
        interpreter = KeyedInterpreter(traced, key, root=model, switch_off=True)
        with inside_switched_off(model, ops):
            with autocast(amp, next(model.parameters(), torch.empty(0)).device):
                out = interpreter.run(*(tensor.to(dtype) for tensor in as_inputs(x)))
                value = output_loss(out, labels, loss_fn, key=output)
                value = value / len(batches) if even else value * (count / sum(samples))
            value.backward()
        total += float(value.detach())
        outputs.append(map_aggregate(out, lambda v: v.detach() if isinstance(v, torch.Tensor) else v))
    return Reference(model, tuple(outputs), ops, total)


@dataclass
class Comparison:
    """The worst errors of the outputs and gradients, each relative to its tensor and to the model's scale.

    ``output_scale`` and ``gradient_scale`` are the largest magnitudes of the whole unsplit outputs and of all
    the unsplit model's gradients; ``output_floor`` and ``gradient_floor`` the rounding floors relative to them.
    A tensor zero up to rounding (its largest magnitude within its floor of the scale: a bias before
    batch-norm) is compared against the scale only and counted (``grad_zero_tensors``): its error relative to
    itself would be rounding over rounding (a "243 %" beside ``passed``).
    """

    tolerance: float
    output_scale: float
    gradient_scale: float
    output_floor: float
    gradient_floor: float
    errors: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("output_rel", "output_abs", "grad_rel", "grad_abs", "loss_rel", "excess", "zeros"), 0.0))
    worst: str = ""
    """The parameter whose gradient comes nearest to failing (or fails most), on this rank."""
    _worst_excess: float = -1.0

    @classmethod
    def of(cls, reference: Reference, dtype: torch.dtype, tolerance: float, wide: Reference | None = None, *,
           noise: tuple[float, float] | None = None) -> Comparison:
        """A comparison with ``reference``'s scales; floors from ``dtype``'s epsilon and, given the float64
        reference ``wide`` (or its ``noise``: ``runtime.shared_reference.shared_rounding``), from the
        reference's own rounding error (:data:`ROUNDING_FACTOR`)."""
        gradients = reference.gradient_scale()
        outputs = _scale(leaf for out in reference.outputs for leaf in floating_leaves(out))
        floors = [VERIFY_ATOL_EPS * torch.finfo(dtype).eps] * 2
        if wide is not None and noise is None:
            noise = rounding_error(reference, wide)
        if noise is not None:
            output_noise, gradient_noise = noise
            floors = [max(floors[0], ROUNDING_FACTOR * output_noise / max(outputs, 1e-300)),
                      max(floors[1], ROUNDING_FACTOR * gradient_noise / max(gradients, 1e-300))]
        return cls(tolerance, outputs, gradients, floors[0], floors[1])

    def output(self, value: torch.Tensor, expected: torch.Tensor) -> None:
        """Compare (this rank's box of) an output."""
        self._add("output", value, expected, self.output_scale, self.output_floor, "")

    def gradient(self, name: str, value: torch.Tensor, expected: torch.Tensor) -> None:
        """Compare one parameter's gradient (this rank's slice of it)."""
        self._add("grad", value, expected, self.gradient_scale, self.gradient_floor, name)

    def loss(self, value: float, expected: float) -> None:
        """Compare the step's loss (summed over every rank's share) with the unsplit model's."""
        self._add("loss", torch.tensor(value), torch.tensor(expected), abs(expected), self.output_floor, "")

    def _add(self, what: str, value: torch.Tensor, expected: torch.Tensor, scale: float, floor: float,
             name: str) -> None:
        difference, own = _max_difference(value, expected), _magnitude(expected)
        if own > floor * scale:  # relative to itself only where it is more than rounding off zero
            self.errors[f"{what}_rel"] = max(self.errors[f"{what}_rel"], _ratio(difference, own))
        elif what == "grad":
            self.errors["zeros"] += 1
        if f"{what}_abs" in self.errors:
            self.errors[f"{what}_abs"] = max(self.errors[f"{what}_abs"], _ratio(difference, scale))
        excess = _ratio(difference, self.tolerance * own + floor * scale)
        self.errors["excess"] = max(self.errors["excess"], excess)
        if name and excess > self._worst_excess:
            self.worst, self._worst_excess = name, excess

    def report(self, device: torch.device) -> dict[str, object]:
        """The largest errors over all ranks and whether every tensor passed (collective when distributed)."""
        names = ("output_rel", "output_abs", "grad_rel", "grad_abs", "loss_rel", "excess", "zeros")
        errors = torch.tensor([self.errors[n] for n in names], dtype=torch.float64, device=device)
        if dist.is_available() and dist.is_initialized():
            all_reduce(errors, "the --verify error allreduce", dist.ReduceOp.MAX)
        figures = dict(zip(names, (float(e) for e in errors)))
        return {"output_max_rel_err": figures["output_rel"], "output_max_abs_err": figures["output_abs"],
                "grad_max_rel_err": figures["grad_rel"], "grad_max_abs_err": figures["grad_abs"],
                "loss_rel_err": figures["loss_rel"], "grad_zero_tensors": int(figures["zeros"]),
                "tolerance": self.tolerance, "output_atol": self.output_floor * self.output_scale,
                "grad_atol": self.gradient_floor * self.gradient_scale, "grad_floor": self.gradient_floor,
                "grad_scale": self.gradient_scale, "worst_parameter_on_rank0": self.worst,
                "passed": bool(figures["excess"] <= 1.0), **self._conclusiveness()}

    def _conclusiveness(self) -> dict[str, object]:
        """Whether the floor still tells a real error from rounding (:data:`CONCLUSIVE_FLOOR`), with a note if not."""
        conclusive = max(self.gradient_floor, self.output_floor) <= CONCLUSIVE_FLOOR
        note = ("" if conclusive else f"the unsplit model in this dtype is itself off its float64 values by "
                f"{max(self.gradient_floor, self.output_floor) / ROUNDING_FACTOR:.2g} of its largest magnitude: "
                f"this comparison cannot tell an error from rounding; rerun --verify with --dtype float64")
        return {"conclusive": conclusive, "note": note}


def compare_outputs(comparison: Comparison, split: DistributedModel, local: Argument, whole: Argument) -> None:
    """Compare each floating output of ``split`` (a DistributedModel's, ``local``) with its box of ``whole``."""
    wholes = dict(split.outputs(whole))
    for name, value in split.outputs(local):
        expected = wholes[name]
        placement = value_placement(split.plan.layers[name].layout, split.layer_graph.nodes[name])
        box = nd_box(tuple(expected.shape), placement, split.member)
        assert box is not None, f"output {name} is held under {placement}, which splits its features"
        comparison.output(value, expected[tuple(slice(a, b) for a, b in box)])


def compared_parameters(split: DistributedModel) -> frozenset[str]:
    """The names of the parameters whose gradients :func:`compare_gradients` compares on this rank: those
    ``split`` trains (a pipeline stage: only its own)."""
    mine = {id(param) for param in split.own_parameters}
    return frozenset(name for name, param in split.model.named_parameters() if id(param) in mine)


def compare_gradients(comparison: Comparison, split: DistributedModel, reference: nn.Module) -> None:
    """Compare every gradient ``split`` trains (a stage: only its own) with the reference's (its slice); a
    parameter the loss does not reach (``--output`` of another head) has no gradient or a zero one on either."""
    sliced = {piece.name: piece for piece in split.slices}
    compared = compared_parameters(split)
    expected = dict(reference.named_parameters())
    for name, param in split.model.named_parameters():
        if name not in compared:
            continue
        full = expected[name].grad
        if full is None and param.grad is None:
            continue
        full = full if full is not None else torch.zeros_like(expected[name])
        if name in sliced:
            piece = sliced[name]
            full = full.narrow(piece.dim, piece.start, piece.stop - piece.start)
        comparison.gradient(name, param.grad if param.grad is not None else torch.zeros_like(param), full)


FLOAT64_KEYS = ("output_max_rel_err", "output_max_abs_err", "grad_max_rel_err", "grad_max_abs_err", "loss_rel_err",
                "passed")
"""What a verify's float64 recheck reports (``report["float64"]``)."""


def recheck_in_float64(report: dict[str, object], dtype: torch.dtype,
                       again: Callable[[], dict[str, object]]) -> dict[str, object]:
    """A verify below float64 that fails is run ``again`` in float64 at tolerance 1e-9 (every rank, collectively):
    a wrong split is wrong in every dtype, rounding is not. Exact there, the split is right and the report passes,
    saying so (``float64``, ``note``); wrong there too, it fails with both figures."""
    if report["passed"] or dtype == torch.float64:
        return report
    try:
        wide = again()
    except RuntimeError as err:  # the model's own code refuses float64 on every rank alike (AFNO's x.float())
        return {**report, "note": f"no float64 recheck: the model does not run in float64 ({first_line(err)})"}
    rechecked = {**report, "float64": {key: wide[key] for key in FLOAT64_KEYS if key in wide}}
    if wide["passed"]:
        rechecked["passed"] = rechecked["conclusive"] = True
        worst = max(float(wide["output_max_rel_err"]), float(wide["grad_max_rel_err"]))  # type: ignore[arg-type]
        rechecked["note"] = (f"the {str(dtype).removeprefix('torch.')} gap is rounding: in float64 the split equals "
                             f"the unsplit model to {worst:.1e} of a tensor's own largest (tolerance 1e-9)")
    return rechecked


def float64_verdict(wide: Mapping[str, object]) -> str:
    """``in float64 3.1e-14 of a tensor's own largest, 2.0e-15 of the model's (passes: …)``, of a float64 recheck."""
    figures = {key: float(wide[key]) for key in FLOAT64_KEYS[:4]}  # type: ignore[arg-type]
    relative = max(figures["output_max_rel_err"], figures["grad_max_rel_err"])
    absolute = max(figures["output_max_abs_err"], figures["grad_max_abs_err"])
    verdict = "passes: float32 rounding" if wide["passed"] else "fails too: the split differs"
    return f"in float64 {relative:.1e} of a tensor's own largest, {absolute:.1e} of the model's ({verdict})"


def random_report(ops: Iterable[RandomOp]) -> dict[str, list[str]]:
    """The random ops --verify could not key: switched off on both sides, or left drawing per rank."""
    unkeyed = [op for op in ops if not op.keyed]
    return {"random_switched_off": [str(op) for op in unkeyed if op.switchable],
            "random_left_on": [str(op) for op in unkeyed if not op.switchable]}


def floating_leaves(output: Argument) -> list[torch.Tensor]:
    """The floating tensors of an output (a tensor, or a dict/tuple/list of them), in order."""
    leaves: list[Argument] = []

    def kept(value: Argument) -> Argument:
        leaves.append(value)
        return value

    map_aggregate(output, kept)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]


def rounding_error(reference: Reference, wide: Reference) -> tuple[float, float]:
    """The reference's largest error against the float64 one: over its outputs, over its gradients."""
    outputs = [_max_difference(a, b) for narrow, exact in zip(reference.outputs, wide.outputs)
               for a, b in zip(floating_leaves(narrow), floating_leaves(exact))]
    exact = dict(wide.model.named_parameters())
    gradients = [_max_difference(p.grad, wide_grad) for name, p in reference.model.named_parameters()
                 if p.grad is not None and (wide_grad := exact[name].grad) is not None]
    return max(outputs, default=0.0), max(gradients, default=0.0)


def _scale(tensors: Iterable[torch.Tensor]) -> float:
    return max((_magnitude(t) for t in tensors), default=0.0)


def _max_difference(value: torch.Tensor, expected: torch.Tensor) -> float:
    """max |value − expected|, subtracted in their dtype when they share it (two close floats subtract exactly,
    and a far one is an error anyway: no float64 copies of a whole model's gradients)."""
    if not value.numel():
        return 0.0
    if value.dtype != expected.dtype or value.dtype.itemsize < 4:  # half types: no overflow to inf
        wide = torch.complex128 if value.is_complex() or expected.is_complex() else torch.float64  # keep imaginary
        value, expected = value.to(wide), expected.to(wide)
    return float((value.detach() - expected.detach()).abs().max())


def _magnitude(tensor: torch.Tensor) -> float:
    return float(tensor.detach().abs().max()) if tensor.numel() else 0.0


def _ratio(difference: float, scale: float) -> float:
    """``difference / scale``; against a zero scale, the difference itself (0 when equal)."""
    return difference / scale if scale > 0 else difference


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type where it has none)."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
