"""Ranks forked from a fork server: the launcher's environment, and death with the launcher.

``multiprocessing``'s fork server is started once per process, with the environment of that moment; a rank it
forks inherits that environment, not the one its launcher has when it starts the rank. A launcher that changed
its environment since (a test that sets ``PARPLAN_FAULT``, a caller that sets a variable its model reads) would
start ranks that do not see the change, where spawned ranks would. So the fork server imports this module
(its ``preload``), which records the server's environment (:data:`SERVER_ENVIRONMENT`); a forked rank then
takes its launcher's environment (:func:`take_environment`), keeping what its starter set on top of the
server's (torch elastic's ``RANK``, ``MASTER_PORT``, …). :func:`server_preload` lists the modules such a server imports:
this one first, :mod:`processes.preloaded` (which freezes them for the garbage collector) last.

A forked rank's parent is the fork server, not its launcher: :func:`die_with` asks the kernel for SIGKILL
when the fork server dies (it exits when its launcher does) and polls the launcher itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence

__all__ = ["SERVER_ENVIRONMENT", "alive", "die_with", "server_preload", "take_environment"]

SERVER_ENVIRONMENT = dict(os.environ)
"""The environment of the process that first imported this module: a fork server's when it preloads it."""

_IMPORTED_BY = os.getpid()
_POLL_S = 0.5


def server_preload(modules: Sequence[str]) -> list[str]:
    """What a fork server that forks ranks should import: this module first (it records the server's
    environment), ``modules``, and :mod:`processes.preloaded` last (it freezes what they made)."""
    first, last = __name__, "processes.preloaded"
    return [first, *(name for name in dict.fromkeys(modules) if name not in (first, last)), last]


def take_environment(launcher: Mapping[str, str]) -> None:
    """Make ``os.environ`` the ``launcher``'s plus what this process's starter set over the fork server's.

    Where this module was not imported by the fork server (another caller started it with other preloads) the
    server's environment is unknown: the launcher's variables are added and changed values are kept as they are.
    """
    inherited = SERVER_ENVIRONMENT if _IMPORTED_BY != os.getpid() else dict(launcher)
    starter = {name: value for name, value in os.environ.items() if inherited.get(name) != value}
    wanted = {**launcher, **starter}
    for name in [name for name in os.environ if name not in wanted]:
        del os.environ[name]
    os.environ.update(wanted)


def die_with(pid: int) -> None:
    """SIGKILL from the kernel when this process's parent dies (Linux), and a thread that ends this process when
    ``pid`` (its launcher) is gone or a zombie."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while alive(pid):
            time.sleep(_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parplan-launcher-watch", daemon=True).start()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, and not a zombie (killed, not yet reaped by its own parent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel (a zombie then counts as alive until reaped)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
