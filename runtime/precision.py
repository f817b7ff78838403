"""Mixed precision as users train on GPUs: ``torch.autocast`` over the forward, float32 master weights.

``--amp bf16`` runs each forward (and the loss) under ``torch.autocast`` in
bfloat16: convolutions and matrix products in half precision, the weights,
their gradients and the optimizer in the run's dtype (float32). ``--amp fp16``
does the same in float16 and scales the loss (a gradient scaler) so that small
gradients do not flush to zero; the scaler's overflow check is shared by every
rank (``ShardedGradScaler``: a rank holding a slice of a weight may overflow
where another does not), so that all ranks skip the same steps.

``--verify`` runs the unsplit reference under the same autocast, and its
tolerance floors scale with that reference's own distance from float64
(``runtime.verify``): the tolerance follows the precision the run computes in.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

__all__ = ["AMP_DTYPES", "Precision", "autocast", "check_amp", "grad_scaler"]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_amp(amp: str, dtype: str) -> str | None:
    """Why ``--amp amp`` cannot run with ``--dtype dtype``, or ``None``."""
    if amp and amp not in AMP_DTYPES:
        return f"--amp {amp}: unknown precision; use one of {', '.join(AMP_DTYPES)}"
    if amp and dtype != "float32":
        return (f"--amp {amp} keeps float32 master weights; it cannot run with --dtype {dtype} "
                f"(drop --dtype, or drop --amp to train in {dtype} throughout)")
    return None


def autocast(amp: str, device: torch.device) -> AbstractContextManager[None]:
    """The forward's context: autocast in ``amp``'s precision, or nothing."""
    if not amp:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp])


def grad_scaler(amp: str, device: torch.device) -> ShardedGradScaler | None:
    """A loss scaler shared by every rank for ``fp16``; ``None`` otherwise (bfloat16 needs none)."""
    if amp != "fp16":
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device=device.type)


@dataclass
class Precision:
    """How a rank's training steps compute: the autocast of the forward, and the loss scaler (``fp16``)."""

    amp: str
    device: torch.device
    scaler: ShardedGradScaler | None = None

    @classmethod
    def of(cls, amp: str, device: torch.device) -> Precision:
        return cls(amp, device, grad_scaler(amp, device))

    def forward(self) -> AbstractContextManager[None]:
        """The context the forward and the loss run in."""
        return autocast(self.amp, self.device)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The update (skipped by every rank alike when a scaled gradient overflowed)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()
