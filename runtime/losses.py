"""The loss a run trains with (``--loss``), and the synthetic target it takes.

``--loss`` is one of:

* ``ce`` (the default, ``cross_entropy``), ``mse``, ``l1`` or ``dice`` (a soft Dice: softmax over the classes,
  one-hot class indices, overlap over each sample's positions, ``1 − mean(2·overlap / total)``);
* ``package.module:name`` or ``path/to/file.py:name``: a function ``(output, target) → scalar`` written for
  the unsplit model, or a class whose instance built with no arguments is one (``monai.losses:DiceCELoss``).

Every form runs split as written (``runtime.split_loss``), or on the gathered output where it cannot.

What target the loss takes is found once, before any rank starts (:func:`target_kind`), by calling it on a small
output of the model's class count: class indices ``(N, *spatial)`` (:data:`TargetKind` ``classes``), then
with a channel of one ``(N, 1, *spatial)`` (``classes_channel``, MONAI's form), then a tensor of the output's
shape with values in ``[0, 1)`` (``output``: a regression or probability target). The synthetic target of a
run without ``--data`` is of that kind (``runtime.batches.synthetic_target``), and a ``--data`` factory is
given that kind's box.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Literal, get_args

import torch
from torch.nn import functional as F

from cost_models.errors import InputError
from cost_models.loss_cost import LossCost

__all__ = ["BUILT_IN", "Loss", "TargetKind", "loss_cost", "resolve_loss", "soft_dice", "target_kind", "target_shape"]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
TargetKind = Literal["classes", "classes_channel", "output"]


def soft_dice(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A soft Dice loss over classes, per sample: ``target`` holds class indices ``(N, *spatial)``."""
    probabilities = output.softmax(dim=1)
    onehot = F.one_hot(target, output.shape[1]).movedim(-1, 1).to(probabilities.dtype)
    dims = tuple(range(2, output.dim()))
    overlap = (probabilities * onehot).sum(dims)
    total = probabilities.sum(dims) + onehot.sum(dims)
    return 1 - ((2 * overlap + 1e-5) / (total + 1e-5)).mean()


BUILT_IN: dict[str, tuple[Loss, TargetKind]] = {
    "ce": (F.cross_entropy, "classes"),
    "cross_entropy": (F.cross_entropy, "classes"),
    "mse": (F.mse_loss, "output"),
    "l1": (F.l1_loss, "output"),
    "dice": (soft_dice, "classes"),
}


@cache
def resolve_loss(spec: str) -> Loss:
    """The loss ``spec`` names (empty: cross-entropy).

    Raises:
        InputError: no built-in of that name and no ``module:name`` it can import, or a class that cannot be
            built with no arguments.
    """
    if not spec:
        return F.cross_entropy
    if spec in BUILT_IN:
        return BUILT_IN[spec][0]
    if ":" not in spec:
        raise InputError(f"--loss {spec!r}: not a built-in loss ({', '.join(BUILT_IN)}) nor a module:name or "
                         f"path/to/file.py:name")
    from cost_models.ir.model_spec import resolve_factory

    found = resolve_factory(spec, what="--loss")
    if isinstance(found, type):
        try:
            return found()
        except Exception as err:  # the user's class
            raise InputError(f"--loss {spec!r}: {found.__name__}() raised {type(err).__name__}: {err}; name a "
                             f"function of (output, target), or a class that builds with no arguments") from err
    return found  # type: ignore[return-value]


def target_shape(kind: TargetKind, output_shape: Sequence[int]) -> tuple[int, ...]:
    """The global target's shape for a loss taking ``kind`` of an output of ``output_shape``."""
    n, _, *spatial = output_shape
    return {"classes": (n, *spatial), "classes_channel": (n, 1, *spatial),
            "output": tuple(output_shape)}[kind]


def target_kind(spec: str, output_shape: Sequence[int], dtype: torch.dtype) -> TargetKind:
    """Which target the loss ``spec`` takes of an output of ``output_shape`` (:data:`TargetKind`), tried on a
    small output of the same class count.

    Raises:
        InputError: the loss takes none of them (each attempt's error named).
    """
    if not spec or spec in BUILT_IN:
        return BUILT_IN[spec or "ce"][1]
    loss_fn = resolve_loss(spec)
    small = (min(2, output_shape[0]), output_shape[1], *(min(4, extent) for extent in output_shape[2:]))
    output = torch.randn(small, dtype=dtype if dtype.is_floating_point else torch.float32)
    failures = []
    for kind in get_args(TargetKind):
        shape = target_shape(kind, small)
        target = torch.rand(shape, dtype=output.dtype) if kind == "output" else \
            torch.randint(0, max(small[1], 1), shape)
        try:
            value = loss_fn(output, target)
        except Exception as err:  # the user's loss refusing this target: try the next kind
            failures.append(f"{kind} {list(shape)}: {type(err).__name__}: {(str(err).splitlines() or [''])[0]}")
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return kind
        failures.append(f"{kind} {list(shape)}: returned {type(value).__name__} "
                        f"{list(value.shape) if isinstance(value, torch.Tensor) else ''}, not one number")
    raise InputError(f"--loss {spec!r} takes none of the targets tried on an output {list(small)}: "
                     + "; ".join(failures) + "; make it take (output, target) and return a scalar")


_SUMS = ("sum.dim_IntList", "mean.dim")


def loss_cost(spec: str, output_shape: Sequence[int], dtype: torch.dtype, kind: TargetKind) -> LossCost:
    """What the loss ``spec`` moves, keeps and sums per element of an output of ``output_shape``
    (``cost_models.loss_cost``), counted on a small output of the same class count: the bytes every operation
    of its forward and backward reads and writes, the tensors autograd saves, and the sums it keeps per
    sample or class (reductions over positions that leave more than one value)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    small = (min(2, output_shape[0]), output_shape[1], *(min(8, extent) for extent in output_shape[2:]))
    output = torch.randn(small, dtype=dtype, requires_grad=True)
    shape = target_shape(kind, small)
    target = torch.rand(shape, dtype=dtype) if kind == "output" else torch.randint(0, max(small[1], 1), shape)
    saved: dict[int, int] = {}

    class Traffic(TorchDispatchMode):
        moved, sums, sum_bytes = 0, 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            result = func(*args, **(kwargs or {}))
            tensors = [t for t in (*args, *(kwargs or {}).values(), result) if isinstance(t, torch.Tensor)]
            self.moved += sum(t.numel() * t.element_size() for t in tensors)
            if str(func.overloadpacket.__name__) + "." + func._overloadname in _SUMS and result.numel() > 1 \
                    and args[0].dim() == output.dim():
                self.sums += 1
                self.sum_bytes = max(self.sum_bytes, result.numel() * result.element_size())
            return result

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    forward, backward = Traffic(), Traffic()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with forward:
            value = resolve_loss(spec)(output, target)
    with backward:
        value.backward()
    saved.pop(output.untyped_storage().data_ptr(), None)  # the output itself is the model's
    elements = output.numel()
    return LossCost(forward.moved / elements, backward.moved / elements, sum(saved.values()) / elements,
                    forward.sums, forward.sum_bytes)
