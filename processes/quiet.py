"""Silencing what native code writes to the process's standard error (Kineto's ``USDT: profiler_start`` lines).

``torch.profiler`` — which calibration (``calibrate.sequences``) and the
runtime (``runtime.memory_peak``) use to see every allocation — makes its
native library print a banner per session straight to file descriptor 2,
past Python's ``sys.stderr`` and past ``KINETO_LOG_LEVEL``. Those lines would
break the command line's promise of one clear line per message.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["native_stderr_silenced"]


@contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Inside: file descriptor 2 goes to ``/dev/null`` (Python's own ``sys.stderr`` is flushed first)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
