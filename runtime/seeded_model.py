"""The user's model as every rank builds it: ``torch.manual_seed(seed)``, then the MODEL spec's factory.

A pool of ranks that verifies one model under several plans (``parplan check``) builds it once: with a
``reuse`` key the first build is kept, and each later call with the same key returns a deep copy of it and
leaves the random generator as the build left it — the same weights, buffers and generator state as a fresh
build, without running the model's constructor and initialisers again (for a 90 M-parameter model, seconds
per rank per run). One model is kept per process; a call with another key drops it first.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable

import torch
from torch import nn

from cost_models.ir.dtypes import run_dtype
from runtime.options import RunOptions

__all__ = ["fresh_model", "reference_identity", "seeded_model", "sgd"]

_KEPT: dict[str, tuple[Hashable, nn.Module, torch.Tensor]] = {}
"""The kept build: its key, the model as its factory returned it, the generator state after the build."""


def seeded_model(spec: str, seed: int, dtype: torch.dtype, device: torch.device, *,
                 reuse: Hashable | None = None) -> nn.Module:
    """``load_model(spec)`` built after ``torch.manual_seed(seed)``, moved to ``device`` and ``dtype``, training.

    ``reuse``: what identifies this build across calls (``None``: build afresh, keep nothing).
    """
    if reuse is None:
        return _moved(_built(spec, seed), dtype, device)
    key = (reuse, spec, seed)
    kept = _KEPT.get("model")
    if kept is None or kept[0] != key:
        _KEPT.clear()  # the last model's memory back before the next one is built
        model = _built(spec, seed)
        kept = _KEPT["model"] = (key, model, torch.get_rng_state())
    model = copy.deepcopy(kept[1])
    torch.set_rng_state(kept[2])
    return _moved(model, dtype, device)


def _built(spec: str, seed: int) -> nn.Module:
    from cost_models.ir.model_spec import load_model

    torch.manual_seed(seed)
    return load_model(spec)


def _moved(model: nn.Module, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """On ``device``, floating tensors in ``dtype`` and complex ones in its complex counterpart
    (``cost_models.ir.dtypes``: ``Module.to(dtype=…)`` would drop their imaginary parts); training."""
    model.to(device=device)
    for param in model.parameters():  # each once: tied weights stay tied
        if run_dtype(param, dtype) != param.dtype:
            param.data = param.data.to(run_dtype(param, dtype))
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if run_dtype(buffer, dtype) != buffer.dtype:
                setattr(module, name, buffer.to(run_dtype(buffer, dtype)))
    return model.train()


def reference_identity(options: RunOptions) -> tuple[str, int, str, str | None, str, str] | None:
    """What identifies the unsplit reference's model and loss, when the caller lets ranks reuse it across runs
    (``RunOptions.reuse_reference``: ``parplan check``'s pool); ``None`` otherwise (a fresh one each run)."""
    return ((options.model, options.seed, options.data, options.output, options.amp, options.loss)
            if options.reuse_reference else None)


def fresh_model(options: RunOptions, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The user's model as every rank builds it (the seed's initial weights), in ``dtype``, training; kept and
    copied across the runs of a pool that reuses references (:func:`reference_identity`)."""
    return seeded_model(options.model, options.seed, dtype, device, reuse=reference_identity(options))


def sgd(parameters: Iterable[nn.Parameter], *, lr: float) -> torch.optim.SGD:
    """Plain SGD over ``parameters``; a rank holding none (a pipeline stage of parameter-free layers) steps an
    empty placeholder, so that every rank runs the same optimizer and checkpoint code."""
    held = list(parameters)
    return torch.optim.SGD(held or [torch.nn.Parameter(torch.zeros(0))], lr=lr)
