"""Running a user's loss function on this rank's boxes of the output and target, kept split
(:func:`split_loss_share`): a ``TorchFunctionMode`` follows every tensor the loss computes from them
(:class:`values.Parts`) and applies each operation by its rule (``rules``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from runtime.split_loss.global_sum import global_sum
from runtime.split_loss.rules import FACTORIES, RULES, Call, completed, factory, op_name, tensors_in
from runtime.split_loss.values import LossGrid, Parts, Unsplittable

__all__ = ["SplitEvaluation", "split_loss_share"]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def split_loss_share(loss_fn: Loss, output: torch.Tensor, target: torch.Tensor, output_parts: Parts,
                     target_parts: Parts, grid: LossGrid) -> torch.Tensor:
    """This rank's share of ``loss_fn(whole output, whole target)`` from its boxes of them: the shares of every
    rank sum to the loss, and their gradients to its gradient.

    Raises:
        Unsplittable: the loss does something that cannot be kept split (what, in its message); every rank
            raises it at the same operation.
    """
    with SplitEvaluation(grid) as evaluation:
        evaluation.mark(output, output_parts)
        evaluation.mark(target, target_parts)
        loss = loss_fn(output, target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise Unsplittable(f"a loss that is not one number ({type(loss).__name__})")
    parts = evaluation.parts(loss)
    if parts is not None and parts.split:
        raise Unsplittable("a loss that is split itself")
    return loss.reshape(()) * grid.share(parts.partial if parts is not None else frozenset())


class SplitEvaluation(TorchFunctionMode):
    """Follows the tensors a loss computes from split ones and applies their operations by ``rules.RULES``."""

    def __init__(self, grid: LossGrid) -> None:
        super().__init__()
        self.grid = grid
        self._parts: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._complete: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def parts(self, value: object) -> Parts | None:
        return self._parts.get(value) if isinstance(value, torch.Tensor) else None

    def mark(self, tensor: torch.Tensor, parts: Parts) -> torch.Tensor:
        if len(parts.axes) != tensor.dim():
            raise AssertionError(f"parts {parts} for a {tensor.dim()}-d tensor")
        if parts.trivial and not parts.uniform:
            self._parts.pop(tensor, None)
        else:
            self._parts[tensor] = parts
        return tensor

    def complete(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = self.parts(tensor)
        if parts is None or not parts.partial:
            return tensor
        if tensor not in self._complete:
            replicated = frozenset(self.grid.parts) - parts.split - parts.partial
            group, replicas = self.grid.group_for(parts.partial, replicated)
            total = global_sum(tensor, group, replicas)
            self._complete[tensor] = self.mark(total, Parts(parts.axes, parts.extents))
        return self._complete[tensor]

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        call = Call(func, op_name(func), tuple(args), dict(kwargs or {}))
        followed = [parts for t in tensors_in((call.args, call.kwargs)) if (parts := self.parts(t)) is not None]
        if call.name in FACTORIES:
            return factory(self, call)
        if any(parts.split for parts in followed):
            rule = RULES.get(call.name)
            if rule is None:
                raise Unsplittable(f"{call.name} on a split value")
            return rule(self, call)
        if any(parts.partial for parts in followed):
            rule = RULES.get(call.name)
            return rule(self, call) if rule is not None else self._whole(call)
        return self._whole(call)

    def _whole(self, call: Call) -> Any:
        """An operation on ordinary (and partial, added up first) tensors: run as it is; a write into a constant
        tensor makes it an ordinary one."""
        call = completed(self, call)
        result = call.run()
        if call.args and isinstance(call.args[0], torch.Tensor) and (call.name.endswith("_") or
                                                                     call.name == "__setitem__"):
            self._parts.pop(call.args[0], None)
        return result
