"""Versioned JSON documents checked against the JSON Schemas shipped in ``cost_models/schemas``.

Every document parplan writes (plans, profiles and measurements)
carries ``"format": "parplan.<kind>/<version>"``. Reading checks the format
first — an unknown version is refused with both versions named — then the
schema, reporting the first violation with its JSON path.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_models.errors import InputError

__all__ = ["check_document", "load_schema"]


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    """The schema ``cost_models/schemas/<name>.schema.json`` as a dict."""
    text = resources.files("cost_models").joinpath("schemas", f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def check_document(document: Any, expected_format: str, schema_name: str, source: str, error: type[InputError]) -> None:
    """Refuse ``document`` unless it has ``expected_format`` and satisfies the schema.

    Args:
        document: The parsed JSON.
        expected_format: E.g. ``parplan.plan/1``.
        schema_name: File stem under ``cost_models/schemas``.
        source: Where the document came from, for messages (a path).
        error: The :class:`InputError` subclass to raise.
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    if not isinstance(document, dict):
        raise error(f"{source} holds a JSON {type(document).__name__}, not an object with \"format\": \"{expected_format}\"")
    found = document.get("format")
    if found != expected_format:
        kind = expected_format.split("/")[0]
        if isinstance(found, str) and found.startswith(kind + "/"):
            raise error(
                f"{source} has format {found!r} but this parplan reads {expected_format!r}; "
                f"re-create it with this version of parplan"
            )
        raise error(f"{source} is not a {kind} document (format is {found!r}, expected {expected_format!r})")
    validator = Draft202012Validator(load_schema(schema_name))
    problem = best_match(validator.iter_errors(document))
    if problem is not None:
        raise error(f"{source} is not a valid {expected_format} document: at {_path(problem.absolute_path)}: {problem.message}")


def _path(parts: Any) -> str:
    text = "$"
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text
