"""Versioned JSON documents checked against the JSON Schemas shipped in ``cost_models/formats/schemas``.

Every document parplan writes (plans, profiles and measurements)
carries ``"format": "parplan.<kind>/<version>"``. Reading checks the format
first — an unknown version is refused with both versions named — then the
schema, reporting the first violation with its JSON path.

``jsonschema`` is optional. Without it (a bare GPU machine) the format and
version are checked as always, and of the schema its required fields, JSON
types and enumerations (:mod:`cost_models.formats.schema_fallback`); one line on
stderr, once per process (and not again in the ranks a command starts:
``PARPLAN_SCHEMA_WARNED`` is set for them), says that full schema validation
was skipped.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any

from cost_models.errors import InputError

__all__ = ["check_document", "check_versioned", "load_schema"]

SKIPPED_WARNING = ("parplan: warning: jsonschema is not installed: full schema validation of plan, profile, "
                   "measurement and checkpoint files skipped (format, version, required fields and types still "
                   "checked); pip install jsonschema for it")
_WARNED_ENV = "PARPLAN_SCHEMA_WARNED"
_warned = False


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema ``cost_models/formats/schemas/<name>.schema.json`` as a dict."""
    text = resources.files("cost_models.formats").joinpath("schemas", f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def check_document(document: object, expected_format: str, schema_name: str, source: str,
                   error: type[InputError]) -> None:
    """Refuse ``document`` unless it has ``expected_format`` and satisfies the schema.

    Args:
        document: The parsed JSON.
        expected_format: E.g. ``parplan.plan/3``.
        schema_name: File stem under ``cost_models/formats/schemas``.
        source: Where the document came from, for messages (a path).
        error: The :class:`InputError` subclass to raise.
    """
    if not isinstance(document, dict):
        raise error(f"{source} holds a JSON {type(document).__name__}, not an object with "
                    f"\"format\": \"{expected_format}\"")
    found = document.get("format")
    if found != expected_format:
        kind = expected_format.split("/")[0]
        if isinstance(found, str) and found.startswith(kind + "/"):
            raise error(
                f"{source} has format {found!r} but this parplan reads {expected_format!r}; "
                f"re-create it with this version of parplan"
            )
        raise error(f"{source} is not a {kind} document (format is {found!r}, expected {expected_format!r})")
    where_what = _schema_problem(document, load_schema(schema_name))
    if where_what is not None:
        raise error(f"{source} is not a valid {expected_format} document: at {_path(where_what[0])}: {where_what[1]}")


def check_versioned(document: object, formats: dict[str, str], source: str, error: type[InputError]) -> str:
    """:func:`check_document` against whichever of ``formats`` (format → schema name, newest first) the document
    declares; any other format — a newer version than this code knows — is refused naming the newest. Returns
    the document's format."""
    newest = next(iter(formats))
    found = document.get("format") if isinstance(document, dict) else None
    chosen = found if isinstance(found, str) and found in formats else newest
    check_document(document, chosen, formats[chosen], source, error)
    return chosen


def _schema_problem(document: object, schema: dict[str, Any]) -> tuple[Iterable[object], str] | None:
    """The first violation (its path and message) by jsonschema, or by the fallback's checks without it."""
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import best_match
    except ImportError:
        _warn_skipped()
        from cost_models.formats.schema_fallback import first_problem

        return first_problem(document, schema)
    problem = best_match(Draft202012Validator(schema).iter_errors(document))
    return None if problem is None else (problem.absolute_path, problem.message)


def _warn_skipped() -> None:
    """Say once that only the fallback's checks ran: once per process, and not again in the ranks it starts."""
    global _warned
    if not _warned and not os.environ.get(_WARNED_ENV):
        print(SKIPPED_WARNING, file=sys.stderr, flush=True)
        os.environ[_WARNED_ENV] = "1"  # inherited by the ranks a command starts afterwards
    _warned = True


def _path(parts: Iterable[object]) -> str:
    text = "$"
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text
