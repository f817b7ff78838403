"""Proxies a forward stored on its modules while traced, taken back when the trace ends.

Models cache on their modules what a forward computed — neuraloperator's grid embedding keeps the last
resolution and its grid (``self._res = spatial_dims``), Hugging Face's Swin its window size, timm's ConViT its
relative indices in a registered buffer (``self.rel_indices = self.get_rel_indices(N)``). Under torch.fx those
values are proxies of *that* trace's graph; the next trace of the same model (parplan traces a model more than
once: the output check, a retrace with a module kept opaque) compares them with its own and asks about a node of
another graph. :func:`restored_attributes` puts back, when the trace ends (failed or not), every module
attribute or buffer that then holds a proxy: its value from before the trace, or none where there was none.
Other attributes stay (torch.fx stores the trace's tensor constants on the root, and the graph module reads them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.fx import Proxy

__all__ = ["restored_attributes"]

_REGISTRIES = frozenset({"_parameters", "_buffers", "_modules"})


@contextmanager
def restored_attributes(root: Any) -> Iterator[None]:
    """While inside, modules of ``root`` (an ``nn.Module``; anything else: nothing done) may store proxies; on
    leaving, each attribute that holds one is as it was on entering."""
    modules = list(root.modules()) if isinstance(root, nn.Module) else []
    saved = [(module, dict(vars(module)), dict(module._buffers)) for module in modules]
    try:
        yield
    finally:
        for module, attributes, buffers in saved:
            _put_back(vars(module), attributes, skip=_REGISTRIES)
            _put_back(module._buffers, buffers)


def _put_back(now: dict[str, Any], before: dict[str, Any], skip: frozenset[str] = frozenset()) -> None:
    """Each entry of ``now`` (but ``skip``) that holds a proxy: its value in ``before``, or gone."""
    for key in [k for k, value in now.items() if k not in skip and _holds_proxy(value)]:
        if key in before:
            now[key] = before[key]
        else:
            del now[key]


def _holds_proxy(value: Any, depth: int = 3) -> bool:
    """Whether ``value`` is a proxy or a list, tuple or dict holding one (``depth`` levels down)."""
    if isinstance(value, Proxy):
        return True
    if depth == 0:
        return False
    if isinstance(value, (list, tuple)):
        return any(_holds_proxy(item, depth - 1) for item in value)
    if isinstance(value, dict):
        return any(_holds_proxy(item, depth - 1) for item in value.values())
    return False
