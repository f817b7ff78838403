"""Imported last by a fork server (:func:`processes.forked.server_preload`): what its preload made is frozen.

A forked rank shares the fork server's pages until it writes to them. Python's cyclic garbage collector writes
to the header of every object it examines, so the first full collection in a rank would copy every page that
holds one of the hundreds of thousands of objects ``import torch`` made: on the 2-core VM (2026-12-08),
convnext_atto's 32-stage pipeline held 82 MB of private anonymous memory per rank with them, 45 MB frozen.
``gc.freeze`` moves them to a generation no collection examines; they are the server's modules, kept for the
life of every rank anyway.
"""

from __future__ import annotations

import gc

gc.collect()
gc.freeze()
