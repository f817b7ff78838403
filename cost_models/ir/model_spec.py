"""Turning a MODEL argument into an ``nn.Module``.

Three forms (``docs/commands.md``, the MODEL argument):

* ``torchvision:NAME`` — a torchvision classification/segmentation model, built
  with random weights (``torchvision.models.get_model(NAME, weights=None)``);
* ``package.module:factory`` — an importable module and a callable in it;
* ``path/to/file.py:factory`` — a Python file and a callable in it.

The factory is called without arguments and must return an ``nn.Module``.
Every failure becomes one :class:`InputError` line that says how to fix it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from cost_models.errors import InputError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["load_model", "resolve_factory"]

_FORMS = "torchvision:NAME, package.module:factory or path/to/file.py:factory"


def load_model(spec: str) -> nn.Module:
    """Build the ``nn.Module`` a MODEL spec names.

    Raises:
        InputError: Unknown form, missing module/file/attribute, a factory that
            raises, or one that returns something other than an ``nn.Module``.
    """
    factory = resolve_factory(spec)
    try:
        model = factory()
    except Exception as err:  # the user's factory failed: report it as their input
        raise InputError(
            f"model factory {spec!r} raised {type(err).__name__}: {_first_line(err)}; "
            f"fix the factory so it builds the model when called with no arguments"
        ) from err
    from torch import nn

    if not isinstance(model, nn.Module):
        raise InputError(f"model factory {spec!r} returned an object of type {type(model).__name__}, "
                         f"not a torch.nn.Module")
    return model


def resolve_factory(spec: str, *, what: str = "model") -> Callable[..., object]:
    """The callable a MODEL spec (or another ``module:name`` spec, ``what`` naming it in errors) names, without
    calling it."""
    source, sep, name = spec.rpartition(":")
    if not sep or not source or not name:
        forms = _FORMS if what == "model" else "package.module:name or path/to/file.py:name"
        raise InputError(f"{what} {spec!r} is not of the form {forms}")
    if source == "torchvision" and what == "model":
        return _torchvision_factory(name)
    if source.endswith(".py") or "/" in source or source.startswith("."):
        module = _import_file(Path(source), spec, what)
    else:
        module = _import_module(source, spec, what)
    factory = getattr(module, name, None)
    if not callable(factory):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        hint = difflib.get_close_matches(name, public, n=3)
        raise InputError(
            f"{what} {spec!r}: {source} has no callable {name!r}"
            + (f"; did you mean {', '.join(hint)}?" if hint else f"; it defines {', '.join(public[:8]) or 'none'}")
        )
    return factory


def _torchvision_factory(name: str) -> Callable[[], nn.Module]:
    import torchvision.models as models

    available = models.list_models()
    if name not in available:
        hint = difflib.get_close_matches(name, available, n=3)
        suggestion = f"did you mean {', '.join(hint)}?" if hint else "see torchvision.models.list_models()"
        raise InputError(f"torchvision has no model {name!r}; {suggestion}")
    return lambda: models.get_model(name, weights=None)


def _import_file(path: Path, spec: str, what: str) -> ModuleType:
    if not path.is_file():
        raise InputError(f"{what} {spec!r}: file {path} does not exist; give the path to a .py file")
    module_name = f"parplan_user_model_{abs(hash(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(f"{what} {spec!r}: cannot load {path} as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:  # the user's file failed to import
        sys.modules.pop(module_name, None)
        raise InputError(f"{what} {spec!r}: importing {path} raised {type(err).__name__}: {_first_line(err)}") from err
    return module


def _import_module(name: str, spec: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise InputError(
            f"{what} {spec!r}: no module named {err.name!r}; install it or put it on PYTHONPATH "
            f"(or give a file path, path/to/file.py:{'factory' if what == 'model' else 'name'})"
        ) from err
    except Exception as err:  # the user's module failed to import
        raise InputError(f"{what} {spec!r}: importing {name} raised {type(err).__name__}: {_first_line(err)}") from err


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
