"""What is checked of a JSON document when ``jsonschema`` is not installed: required fields, types and enums.

A bare machine (a GPU node with only torch and SciPy) may lack ``jsonschema``.
Plans and profiles are then still refused when they are structurally wrong —
a missing field, a field of the wrong JSON type, a value outside an ``enum``
or ``const`` — by walking the same schema files for those keywords only
(``properties``, ``items``, ``additionalProperties`` given as a schema,
``$ref`` to ``#/$defs/…``, and ``oneOf``/``anyOf`` as "one alternative
passes"). Ranges, lengths, patterns and forbidden extra fields are not
checked: :mod:`cost_models.formats.schema` says so in a warning, once per process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["first_problem"]

Path = tuple[str | int, ...]
"""Where in a document: the keys and indices from its root."""
Problem = tuple[Path, str]
"""Where and what."""

_TYPES: Mapping[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float)
                                                                            and v.is_integer()),
}


def first_problem(document: object, schema: Mapping[str, Any]) -> Problem | None:
    """The first violation of ``schema``'s required/type/enum/const keywords in ``document``, or ``None``."""
    return _check(document, schema, schema, ())


def _check(value: object, schema: Mapping[str, Any], root: Mapping[str, Any], path: Path) -> Problem | None:
    schema = _resolve(schema, root)
    return (_own(value, schema, path) or _alternatives(value, schema, root, path)
            or _members(value, schema, root, path))


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        reference = schema["$ref"]
        if not reference.startswith("#/$defs/"):
            raise ValueError(f"schema reference {reference!r} is not of the form #/$defs/NAME")
        schema = root["$defs"][reference[len("#/$defs/"):]]
    return schema


def _own(value: object, schema: Mapping[str, Any], path: Path) -> Problem | None:
    """``type``, ``enum``, ``const`` and ``required`` of the value itself."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds is not None and not any(_TYPES[kind](value) for kind in kinds):
        return path, f"{_show(value)} is not of type {', '.join(repr(kind) for kind in kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return path, f"{_show(value)} is not one of {schema['enum']!r}"
    if "const" in schema and value != schema["const"]:
        return path, f"{schema['const']!r} was expected"
    if isinstance(value, dict):
        missing = [name for name in schema.get("required", ()) if name not in value]
        if missing:
            return path, f"{missing[0]!r} is a required property"
    return None


def _alternatives(value: object, schema: Mapping[str, Any], root: Mapping[str, Any],
                  path: Path) -> Problem | None:
    """``oneOf``/``anyOf``: at least one alternative passes these checks (the first one's problem otherwise)."""
    for keyword in ("oneOf", "anyOf"):
        options: Sequence[Mapping[str, Any]] = schema.get(keyword, ())
        problems = [_check(value, option, root, path) for option in options]
        if problems and all(problems):
            return problems[0]
    return None


def _members(value: object, schema: Mapping[str, Any], root: Mapping[str, Any], path: Path) -> Problem | None:
    """Each property, extra property (when ``additionalProperties`` is a schema) and array item, in order."""
    if isinstance(value, dict):
        properties, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for name, member in value.items():
            below = properties.get(name, extra if isinstance(extra, dict) else None)
            problem = None if below is None else _check(member, below, root, path + (name,))
            if problem:
                return problem
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problem = _check(item, schema["items"], root, path + (index,))
            if problem:
                return problem
    return None


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
