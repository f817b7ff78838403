"""Errors parplan reports to a person, as opposed to bugs.

Every error a user can cause (a bad model spec, a malformed plan file, an input
shape the model rejects) is an :class:`InputError`. The command line prints its
message as one line and exits with code 2; anything else is a bug and exits 1.
Messages carry the offending values and a hint how to fix them.
"""

from __future__ import annotations

__all__ = ["InputError", "PlanError", "TraceError"]


class InputError(ValueError):
    """Something the user supplied is wrong; the message says what and how to fix it."""


class TraceError(InputError):
    """The model could not be traced or rejected the input shape."""


class PlanError(InputError):
    """A plan file is malformed, of another version, or made for another model."""
