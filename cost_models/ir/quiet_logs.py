"""A logger held above a level while inside: what torch logs while parplan traces, which it reports itself."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["quiet"]


@contextmanager
def quiet(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """The logger ``name``'s records below ``level`` left out while inside."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
