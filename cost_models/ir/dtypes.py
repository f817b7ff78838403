"""What a model's tensors become when it runs in another dtype: floating ones take it, complex ones its complex
counterpart (``complex64`` ↔ ``complex128`` with ``float32`` ↔ ``float64``), the rest keep theirs.

``torch.nn.Module.to(dtype=…)`` casts complex parameters to the *real* dtype, dropping their imaginary parts
(a Fourier neural operator's spectral weights): the tracer's fake copy and every rank's model cast with
:func:`run_dtype` instead, so both agree with the complex activations the forward computes.
"""

from __future__ import annotations

import torch

__all__ = ["COMPLEX_OF", "run_dtype"]

COMPLEX_OF: dict[torch.dtype, torch.dtype] = {torch.float32: torch.complex64, torch.float64: torch.complex128,
                                              torch.float16: torch.complex32}
"""The complex dtype whose parts are each real dtype (bfloat16 has none)."""


def run_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype ``tensor`` takes in a model run in ``dtype`` (its own where none applies)."""
    if tensor.is_floating_point():
        return dtype
    if tensor.is_complex():
        return COMPLEX_OF.get(dtype, tensor.dtype)
    return tensor.dtype
