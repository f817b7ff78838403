"""A root forward behind a ``(*args, **kwargs)`` decorator, traced with the signature it wraps.

Hugging Face transformers (v5) decorates its models' forwards with wrappers of the form
``def wrapper(self, *args, **kwargs)`` carrying ``functools.wraps`` (``can_return_tuple``,
``check_model_inputs``). torch.fx reads the *wrapped* function's parameters (``inspect.unwrap``) but calls the
wrapper with them, positionally, after rewriting the wrapper's code to take that many plain arguments: the
wrapper's ``kwargs`` then receives the input after the first (``None``), and ``kwargs.pop(…)`` fails
(``'NoneType' object has no attribute 'pop'``).

:func:`plain_root_forward` swaps such a root forward, for the trace only, for a generated function with the
wrapped function's named parameters (defaults kept) that calls the wrapper with them — what ``model(x)``
does. Its ``*args``/``**kwargs`` are left out: parplan calls the model with its inputs alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = ["plain_root_forward"]

_VARIADIC = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


@contextmanager
def plain_root_forward(root: Any) -> Iterator[None]:
    """While inside, ``type(root).forward`` is a plain stand-in when it is a variadic decorator's wrapper."""
    cls = type(root) if isinstance(root, nn.Module) else None
    forward: Callable[..., Any] | None = getattr(cls, "forward", None)
    stand_in = _stand_in(forward) if forward is not None else None
    if cls is None or forward is None or stand_in is None:
        yield
        return
    own = "forward" in cls.__dict__  # else inherited: the stand-in shadows it, and is deleted after
    cls.forward = stand_in
    try:
        yield
    finally:
        if own:
            cls.forward = forward
        else:
            del cls.forward


def _stand_in(forward: Callable[..., Any]) -> Callable[..., Any] | None:
    """A function with the parameters ``forward`` wraps that calls ``forward``; ``None`` when ``forward`` is no
    variadic wrapper of another function."""
    inner = inspect.unwrap(forward)
    code = getattr(forward, "__code__", None)
    if inner is forward or code is None or not code.co_flags & _VARIADIC:
        return None
    try:
        parameters = list(inspect.signature(inner).parameters.values())
    except (TypeError, ValueError):
        return None
    named = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if any(p.kind is p.POSITIONAL_ONLY for p in named[1:]):
        return None
    header, call, defaults = [], [], {}
    for index, p in enumerate(named):
        if p.kind is p.KEYWORD_ONLY and "*" not in header:
            header.append("*")
        default = ""
        if p.default is not p.empty:
            defaults[f"_default_{index}"] = p.default
            default = f"=_default_{index}"
        header.append(f"{p.name}{default}")
        call.append(p.name if p.kind is not p.KEYWORD_ONLY else f"{p.name}={p.name}")
    source = f"def forward({', '.join(header)}):\n    return _wrapper({', '.join(call)})\n"
    namespace: dict[str, Any] = {"_wrapper": forward, **defaults}
    exec(compile(source, f"<parplan: {forward.__qualname__} as traced>", "exec"), namespace)  # noqa: S102
    stand_in: Callable[..., Any] = namespace["forward"]
    stand_in.__qualname__ = forward.__qualname__
    return stand_in
