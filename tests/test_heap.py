"""``processes.heap.steady_heap``: blocks a step frees stay in the heap; the user's own allocator choice wins."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# a fresh process: optionally take the setting, then see whether an 8 MiB block comes from mmap (glibc's
# mallinfo2 counts mmapped blocks in ``hblks``)
_PROBE = """
import ctypes, json, sys
sys.path.insert(0, {root!r})
from processes.heap import steady_heap
applied = steady_heap() if {steady} else False
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
before = libc.mallinfo2().hblks
block = libc.malloc(8 << 20)
print(json.dumps({{"applied": applied, "mmapped": libc.mallinfo2().hblks - before}}))
"""

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
                           or tuple(map(int, platform.libc_ver()[1].split(".")[:2])) < (2, 33), reason="needs glibc ≥ 2.33 (mallinfo2)")


def _probe(steady: bool, **env: str) -> dict[str, object]:
    clean = {key: value for key, value in os.environ.items()
             if not key.startswith("MALLOC_") and key not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    done = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(ROOT), steady=steady)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@glibc
def test_a_freed_sized_block_comes_from_the_heap_once_steady() -> None:
    assert _probe(False) == {"applied": False, "mmapped": 1}  # glibc's default: a fresh mapping
    assert _probe(True) == {"applied": True, "mmapped": 0}


@glibc
def test_the_users_own_malloc_settings_are_left_alone() -> None:
    assert _probe(True, MALLOC_MMAP_THRESHOLD_="131072")["applied"] is False
    assert _probe(True, GLIBC_TUNABLES="glibc.malloc.trim_threshold=1")["applied"] is False
