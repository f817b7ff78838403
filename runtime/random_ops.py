"""Keyed random ops: dropout masks and other draws that every rank, and the unsplit reference, make alike.

A random layer of a split model must draw, for every element of the unsplit
tensor, the value the unsplit model would: when a sample's tiles live on
several ranks, a per-sample (stochastic depth, drop-path) or per-channel
(``Dropout2d``) draw must be the same on every tile, or the split trains
another model. So draws are not taken from a generator's stream but
*computed* from a key (:class:`DrawKey`: the run's seed, the step, the
global index of the batch's first sample — a pipeline micro-batch's offset)
and the global indices of what they are drawn for: the layer (its traced
name), the sample, the channel, the element. The value is a counter-based
hash of those integers (splitmix64's finaliser on torch int64 tensors,
wrapping arithmetic: the same bits on every device), of which 53 bits make
a uniform in ``[0, 1)``. A rank computes the draws of its box only
(``box``: global index ranges), the unsplit reference those of the whole
tensor — and both equal.

Keyed forms (:func:`random_ops` finds them in a traced program):

* ``nn.Dropout``/``F.dropout`` (per element), ``nn.Dropout1d/2d/3d`` and
  ``F.dropout1d/2d/3d`` (per sample and channel), ``nn.AlphaDropout``/
  ``F.alpha_dropout`` (per element) and ``nn.FeatureAlphaDropout``/
  ``F.feature_alpha_dropout`` (per sample and channel), with PyTorch's
  formulas;
* torchvision's ``stochastic_depth`` (``"row"``: per sample; ``"batch"``:
  one draw per batch, a micro-batch being a batch);
* ``Tensor.bernoulli_``/``bernoulli``, ``torch.bernoulli``, ``uniform_``,
  ``normal_``, ``torch.rand``/``randn`` and their ``_like`` forms (per
  element of the tensor drawn: timm's drop-path draws a ``(N, 1, …)``
  tensor, i.e. per sample).

Other random ops cannot be keyed: ``nn.RReLU``/``F.rrelu`` can be switched
off (``switch_off``: their evaluation form, what ``--verify`` runs on both
sides), and so can random modules inside an opaque module (a leaf of the
trace, run as written: timm's ``DropPath`` in a block that does not trace),
put in evaluation mode on both sides (:func:`inside_switched_off`); the
rest (``torch.randint``, ``randperm``, ``multinomial``, …) draw from
torch's generator per rank. :class:`KeyedInterpreter` runs an unsplit
model with the same keyed ops.
"""

from __future__ import annotations

import inspect
import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Interpreter, Node
from torch.fx.node import _get_qualified_name

__all__ = ["CREATIONS", "DrawKey", "KeyedInterpreter", "RandomOp", "created_shape", "inside_switched_off", "keyed_call",
           "mix", "mix_int", "normal", "random_ops", "switched_off", "uniform", "whole_box"]

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class DrawKey:
    """Which draws a forward pass makes: the run's seed, the step, and the global index of its first sample."""

    seed: int
    step: int
    first_sample: int = 0


@dataclass(frozen=True)
class RandomOp:
    """A random node of a traced program: its name, form (module docstring) and whether it is keyed."""

    name: str
    form: str
    keyed: bool
    switchable: bool = False
    """An unkeyed op with an evaluation form (``switch_off``)."""
    inside: str = ""
    """For a random module inside an opaque module (a leaf of the trace): its qualified name. Its draws cannot
    be keyed (the opaque module runs as written); ``--verify`` runs it in evaluation mode on both sides
    (:func:`inside_switched_off`)."""

    def __str__(self) -> str:
        return f"{self.name} ({self.form})"


_MODULE_FORMS: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.Dropout, "dropout"), (nn.Dropout1d, "dropout1d"), (nn.Dropout2d, "dropout2d"), (nn.Dropout3d, "dropout3d"),
    (nn.AlphaDropout, "alpha_dropout"), (nn.FeatureAlphaDropout, "feature_alpha_dropout"), (nn.RReLU, "rrelu"),
)
_FUNCTION_FORMS: dict[Callable[..., object], str] = {
    F.dropout: "dropout", F.dropout1d: "dropout1d", F.dropout2d: "dropout2d", F.dropout3d: "dropout3d",
    F.alpha_dropout: "alpha_dropout", F.feature_alpha_dropout: "feature_alpha_dropout", F.rrelu: "rrelu",
    torch.bernoulli: "bernoulli", torch.rand: "rand", torch.randn: "randn", torch.rand_like: "rand_like",
    torch.randn_like: "randn_like",
    torch.randint: "randint", torch.randint_like: "randint", torch.randperm: "randperm",
    torch.multinomial: "multinomial", torch.normal: "normal", torch.poisson: "poisson",
    F.gumbel_softmax: "gumbel_softmax",
}
_QUALIFIED_FORMS = {"torchvision.ops.stochastic_depth.stochastic_depth": "stochastic_depth"}
_METHOD_FORMS = {"bernoulli_": "bernoulli_", "bernoulli": "bernoulli", "uniform_": "uniform_", "normal_": "normal_",
                 "random_": "random_", "exponential_": "exponential_", "geometric_": "geometric_",
                 "cauchy_": "cauchy_", "log_normal_": "log_normal_", "multinomial": "multinomial"}
_KEYED = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                    "stochastic_depth", "bernoulli_", "bernoulli", "uniform_", "normal_", "rand", "randn",
                    "rand_like", "randn_like"})
_SWITCHABLE = frozenset({"rrelu"})
CREATIONS = frozenset({"rand", "randn"})
"""Forms whose output shape is written in their arguments (sizes): a rank draws its box of it."""


def random_ops(nodes: Sequence[Node], root: nn.Module) -> dict[str, RandomOp]:
    """The random nodes among ``nodes`` of a program traced from ``root``, by name."""
    found = {}
    for node in nodes:
        form = _form(node, root)
        if form is not None:
            found[node.name] = RandomOp(node.name, form, form in _KEYED, form in _SWITCHABLE)
        elif node.op == "call_module":
            found.update(_inside(node, root))
    return found


_RANDOM_MODULES = ("DropPath", "DropBlock", "DropBlock2d", "StochasticDepth")
"""Random layers known by class name (timm's, torchvision's) besides ``nn``'s dropouts and RReLU."""


def _inside(node: Node, root: nn.Module) -> dict[str, RandomOp]:
    """The random modules inside an opaque module (``node``'s), each a switchable unkeyed op named
    ``node.submodule`` (never a node's name: fx names hold no dots)."""
    found = {}
    for name, module in root.get_submodule(str(node.target)).named_modules():
        if name and _random_module(module):
            where = f"{node.target}.{name}"
            found[f"{node.name}.{name}"] = RandomOp(f"{node.name}.{name}", f"{type(module).__name__} inside opaque "
                                                    f"{node.target}", keyed=False, switchable=True, inside=where)
    return found


def _random_module(module: nn.Module) -> bool:
    kinds = tuple(kind for kind, _ in _MODULE_FORMS)
    if not (isinstance(module, kinds) or type(module).__name__ in _RANDOM_MODULES):
        return False
    p = next((getattr(module, a) for a in ("p", "drop_prob", "drop_rate") if hasattr(module, a)), None)
    return not isinstance(p, (int, float)) or p > 0


@contextmanager
def inside_switched_off(root: nn.Module, ops: Iterable[RandomOp]) -> Iterator[None]:
    """The random modules inside opaque modules (``ops`` with :attr:`RandomOp.inside`) in evaluation mode for
    the duration; their modes back afterwards."""
    modules = [root.get_submodule(op.inside) for op in ops if op.inside]
    modes = [module.training for module in modules]
    for module in modules:
        module.training = False
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.training = mode


def _form(node: Node, root: nn.Module) -> str | None:
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        return next((form for kind, form in _MODULE_FORMS if type(module) is kind), None)
    if node.op == "call_method":
        return _METHOD_FORMS.get(str(node.target))
    target = node.target
    if node.op != "call_function" or not callable(target):
        return None
    if target in _FUNCTION_FORMS:
        return _FUNCTION_FORMS[target]
    return _QUALIFIED_FORMS.get(_get_qualified_name(target))


# --- the keyed draws ---------------------------------------------------------------------------------------

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _signed(value: int) -> int:
    value &= _MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def mix_int(value: int) -> int:
    """splitmix64's finaliser on a Python integer (mod 2**64)."""
    value &= _MASK
    value = ((value ^ (value >> 30)) * _MIX[0]) & _MASK
    value = ((value ^ (value >> 27)) * _MIX[1]) & _MASK
    return value ^ (value >> 31)


def _shr(tensor: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` extends the sign)."""
    return (tensor >> bits) & ((1 << (64 - bits)) - 1)


def mix(tensor: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping multiplication: the same bits as :func:`mix_int`)."""
    tensor = (tensor ^ _shr(tensor, 30)) * _signed(_MIX[0])
    tensor = (tensor ^ _shr(tensor, 27)) * _signed(_MIX[1])
    return tensor ^ _shr(tensor, 31)


def _stream(key: DrawKey, layer: str, salt: int = 0) -> int:
    """The hash state of one layer's draws in one forward pass (before any index)."""
    state = mix_int(key.seed * _GOLDEN + 1)
    state = mix_int(state + (key.step + 1) * _GOLDEN)
    state = mix_int(state + (zlib.crc32(layer.encode()) + 1) * _GOLDEN)
    return mix_int(state + salt)


def _combine(state: torch.Tensor | int, index: torch.Tensor) -> torch.Tensor:
    return mix((index + 1) * _signed(_GOLDEN) + (state if isinstance(state, torch.Tensor) else _signed(state)))


def _indices(box: Box, shape: Sequence[int], per: str, first_sample: int, device: torch.device) -> list[torch.Tensor]:
    """The global indices the draws of ``box`` are keyed by: sample, then channel or element (``per``)."""
    dims = len(box)
    sample = _ranged(box[0], 0, dims, device) + first_sample if dims else torch.zeros((), dtype=torch.int64,
                                                                                       device=device)
    if per == "sample" or dims < 2:
        return [sample]
    if per == "channel":
        return [sample, _ranged(box[1], 1, dims, device)]
    element = torch.zeros((), dtype=torch.int64, device=device)  # row-major index inside the sample
    stride = 1
    for dim in range(dims - 1, 0, -1):
        element = element + _ranged(box[dim], dim, dims, device) * stride
        stride *= int(shape[dim])
    return [sample, element]


def _ranged(extent: tuple[int, int], dim: int, dims: int, device: torch.device) -> torch.Tensor:
    view = [1] * dims
    view[dim] = extent[1] - extent[0]
    return torch.arange(extent[0], extent[1], dtype=torch.int64, device=device).reshape(view)


def _hashes(key: DrawKey, layer: str, box: Box, shape: Sequence[int], per: str, device: torch.device,
            salt: int = 0) -> torch.Tensor:
    state: torch.Tensor | int = _stream(key, layer, salt)
    for index in _indices(box, shape, per, key.first_sample, device):
        state = _combine(state, index)
    return state if isinstance(state, torch.Tensor) else torch.tensor(_signed(state), device=device)


def uniform(key: DrawKey, layer: str, box: Box, shape: Sequence[int], per: str = "element",
            device: torch.device | str = "cpu", salt: int = 0) -> torch.Tensor:
    """float64 uniforms in ``[0, 1)`` for ``box`` of a tensor of global ``shape``, one per ``per``.

    ``per`` is ``"element"``, ``"channel"`` (one per sample and channel) or ``"sample"``; the result
    broadcasts against the box (size 1 along the dimensions a draw is shared by).
    """
    hashes = _hashes(key, layer, box, shape, per, torch.device(device), salt)
    return _shr(hashes, 11).to(torch.float64) * 2.0 ** -53


def normal(key: DrawKey, layer: str, box: Box, shape: Sequence[int], device: torch.device | str = "cpu"
           ) -> torch.Tensor:
    """float64 standard normals for ``box`` (Box–Muller on two keyed uniforms per element)."""
    first = uniform(key, layer, box, shape, "element", device)
    second = uniform(key, layer, box, shape, "element", device, salt=1)
    return torch.sqrt(-2.0 * torch.log1p(-first)) * torch.cos(2.0 * math.pi * second)


def whole_box(shape: Sequence[int]) -> Box:
    """The box of a whole tensor of ``shape``."""
    return tuple((0, int(extent)) for extent in shape)


# --- the ops -----------------------------------------------------------------------------------------------

_ALPHA = 1.7580993408473766
_DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
"""The keyed module forms (:data:`_MODULE_FORMS`)."""
_DEFAULTS = {"dropout": True, "dropout1d": True, "dropout2d": True, "dropout3d": True, "alpha_dropout": False,
             "feature_alpha_dropout": False, "stochastic_depth": True, "rrelu": False}


@dataclass(frozen=True)
class _Call:
    """What a keyed op needs besides its tensor: the op, this rank's box, the global shape, the key, and the call's
    own arguments (the program's: local tensors, probabilities, bounds, sizes, whatever it passes)."""

    op: RandomOp
    box: Box
    shape: tuple[int, ...]
    key: DrawKey
    args: Sequence[Any]
    kwargs: Mapping[str, Any]


def keyed_call(op: RandomOp, module: nn.Module | None, args: Sequence[object], kwargs: Mapping[str, object], *,
               box: Box | None, shape: Sequence[int], key: DrawKey, training: bool) -> torch.Tensor:
    """The output of the keyed random ``op`` on ``box`` (``None``: the whole tensor) of a tensor of ``shape``.

    ``args``/``kwargs`` are the call's (local tensors), ``module`` the called module (module forms);
    ``training`` is the model's mode, for function forms whose ``training`` argument the trace fixed.
    """
    call = _Call(op, box if box is not None else whole_box(shape), tuple(int(s) for s in shape), key, args, kwargs)
    if op.form in _DEFAULTS:
        x, p, extra, active = _dropout_arguments(op.form, module, call, training)
        return _DROPOUTS[op.form](call, x, p, extra) if active and p > 0.0 else x
    return _DRAWS[op.form](call)


def _dropout_arguments(form: str, module: nn.Module | None, call: _Call,
                       training: bool) -> tuple[torch.Tensor, float, str | None, bool]:
    args, kwargs = call.args, call.kwargs
    if module is not None:
        assert isinstance(module, _DROPOUT_MODULES), f"'{call.op.name}' ({form}) calls a {type(module).__name__}"
        return args[0], float(module.p), None, module.training
    function = _function_of(form)
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    x = arguments["input"]  # every dropout function's first parameter (bound above)
    return x, float(arguments["p"]), arguments.get("mode"), bool(arguments["training"]) and training


def _function_of(form: str) -> Callable[..., object]:
    if form == "stochastic_depth":
        from torchvision.ops import stochastic_depth

        return stochastic_depth
    return getattr(F, form)


def _keep(call: _Call, p: float, per: str, device: torch.device) -> torch.Tensor:
    return uniform(call.key, call.op.name, call.box, call.shape, per, device) >= p


def _channel_per(form: str, dims: int) -> str:
    """Dropout1d/2d/3d draw per sample and channel of a batched input, per first index of an unbatched one."""
    batched = {"dropout1d": dims == 3, "dropout2d": dims in (3, 4), "dropout3d": dims == 5}[form]
    return "channel" if batched else "sample"


def _scaled(call: _Call, x: torch.Tensor, p: float, per: str) -> torch.Tensor:
    if p >= 1.0:
        return x * torch.zeros((), dtype=x.dtype, device=x.device)
    noise = _keep(call, p, per, x.device).to(x.dtype) * (1.0 / (1.0 - p))
    return x * noise


def _alpha(call: _Call, x: torch.Tensor, p: float, per: str) -> torch.Tensor:
    if p >= 1.0:
        return x * torch.zeros((), dtype=x.dtype, device=x.device)
    a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
    noise = _keep(call, p, per, x.device).to(x.dtype)
    b = (noise - 1) * (_ALPHA * a) + _ALPHA * a * p
    return x * (noise * a) + b


def _stochastic_depth(call: _Call, x: torch.Tensor, p: float, mode: str | None) -> torch.Tensor:
    survival = 1.0 - p
    if mode == "row":
        noise = _keep(call, p, "sample", x.device).to(x.dtype)
    else:  # one draw for the (micro-)batch: that of its first sample, in its own stream
        first = tuple((0, 1) for _ in call.box)  # sample index 0 of the batch: key.first_sample
        noise = (uniform(call.key, call.op.name + "/batch", first, call.shape, "sample", x.device) >= p).to(x.dtype)
        noise = noise.reshape([1] * x.dim())
    return x * (noise / survival if survival > 0.0 else noise)


_DROPOUTS: dict[str, Callable[[_Call, torch.Tensor, float, str | None], torch.Tensor]] = {
    "dropout": lambda call, x, p, _: _scaled(call, x, p, "element"),
    "dropout1d": lambda call, x, p, _: _scaled(call, x, p, _channel_per("dropout1d", x.dim())),
    "dropout2d": lambda call, x, p, _: _scaled(call, x, p, _channel_per("dropout2d", x.dim())),
    "dropout3d": lambda call, x, p, _: _scaled(call, x, p, _channel_per("dropout3d", x.dim())),
    "alpha_dropout": lambda call, x, p, _: _alpha(call, x, p, "element"),
    "feature_alpha_dropout": lambda call, x, p, _: _alpha(call, x, p, "channel"),
    "stochastic_depth": _stochastic_depth,
}


def _bernoulli_(call: _Call) -> torch.Tensor:
    args, kwargs = call.args, call.kwargs
    target, p = args[0], kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    draws = uniform(call.key, call.op.name, call.box, call.shape, "element", target.device) < _probability(p)
    with torch.no_grad():
        return target.copy_(draws)


def _bernoulli(call: _Call) -> torch.Tensor:
    args, kwargs = call.args, call.kwargs
    source, p = args[0], kwargs.get("p", args[1] if len(args) > 1 else None)
    probability = source if p is None else _probability(p)
    draws = uniform(call.key, call.op.name, call.box, call.shape, "element", source.device) < probability
    return draws.to(source.dtype)


def _probability(p: torch.Tensor | float) -> torch.Tensor | float:
    return p.detach().double() if isinstance(p, torch.Tensor) else float(p)


def _uniform_(call: _Call) -> torch.Tensor:
    args, kwargs = call.args, call.kwargs
    target = args[0]
    low = kwargs.get("from", args[1] if len(args) > 1 else 0.0)
    high = kwargs.get("to", args[2] if len(args) > 2 else 1.0)
    draws = uniform(call.key, call.op.name, call.box, call.shape, "element", target.device) * (high - low) + low
    with torch.no_grad():
        return target.copy_(draws)


def _normal_(call: _Call) -> torch.Tensor:
    args, kwargs = call.args, call.kwargs
    target = args[0]
    mean = kwargs.get("mean", args[1] if len(args) > 1 else 0.0)
    std = kwargs.get("std", args[2] if len(args) > 2 else 1.0)
    with torch.no_grad():
        return target.copy_(normal(call.key, call.op.name, call.box, call.shape, target.device) * std + mean)


def _created(call: _Call, like: bool, gaussian: bool) -> torch.Tensor:
    args, kwargs = call.args, call.kwargs
    source = args[0] if like else None
    dtype = kwargs.get("dtype") or (source.dtype if source is not None else torch.get_default_dtype())
    device = kwargs.get("device") or (source.device if source is not None else torch.device("cpu"))
    draws = (normal(call.key, call.op.name, call.box, call.shape, device) if gaussian
             else uniform(call.key, call.op.name, call.box, call.shape, "element", device))
    return draws.to(dtype).requires_grad_(bool(kwargs.get("requires_grad", False)))


_DRAWS: dict[str, Callable[[_Call], torch.Tensor]] = {
    "bernoulli_": _bernoulli_, "bernoulli": _bernoulli, "uniform_": _uniform_, "normal_": _normal_,
    "rand": lambda call: _created(call, False, False),
    "randn": lambda call: _created(call, False, True),
    "rand_like": lambda call: _created(call, True, False),
    "randn_like": lambda call: _created(call, True, True),
}


def switched_off(op: RandomOp, module: nn.Module | None, args: Sequence[object],
                 kwargs: Mapping[str, object]) -> torch.Tensor:
    """The evaluation form of a switchable unkeyed op (``nn.RReLU``/``F.rrelu``: the mean slope)."""
    if module is not None:
        training = module.training
        module.eval()
        try:
            return module(*args, **kwargs)
        finally:
            module.train(training)
    bound = inspect.signature(F.rrelu).bind(*args, **kwargs)
    bound.arguments["training"] = False
    return F.rrelu(*bound.args, **bound.kwargs)


def created_shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    """The sizes a creation (``torch.rand(2, 3)``, ``torch.randn((2, 3))``, ``size=``) is called with."""
    sizes = kwargs.get("size", args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args)
    return tuple(int(s) for s in sizes)


class KeyedInterpreter(Interpreter):
    """Runs a traced unsplit model with its random ops keyed as the split model's (the whole box of each).

    ``root`` is the model traced (its mode is the function forms' ``training``); ``switch_off``: run
    switchable unkeyed ops in their evaluation form (as the split model does then).
    """

    def __init__(self, module: GraphModule, key: DrawKey, *, root: nn.Module | None = None,
                 switch_off: bool = False) -> None:
        super().__init__(module)
        self.key, self.switch_off, self.root = key, switch_off, root if root is not None else module
        self.ops = random_ops(list(module.graph.nodes), module)

    def run_node(self, n: Node) -> object:
        op = self.ops.get(n.name)
        if op is None or not (op.keyed or (op.switchable and self.switch_off)):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        module = self.module.get_submodule(str(n.target)) if n.op == "call_module" else None
        if not op.keyed:
            return switched_off(op, module, args, kwargs)
        if op.form in CREATIONS:
            shape = created_shape(args, kwargs)
        else:
            drawn = args[0]
            assert isinstance(drawn, torch.Tensor), f"random op '{n.name}' ({op.form}) draws for a tensor"
            shape = tuple(drawn.shape)
        return keyed_call(op, module, args, kwargs, box=None, shape=shape, key=self.key, training=self.root.training)
