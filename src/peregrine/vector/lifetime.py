"""A child process that must not outlive its parent: vector workers, training ranks.

An orphan keeps stepping envs or training and writing the run directory next to
whatever replaces it, and holds shared memory until it ends. Two mechanisms, both
cheap:

* `die_with_parent()`: on Linux, `prctl(PR_SET_PDEATHSIG, SIGKILL)`, so the
  kernel kills this process the moment its parent dies, even while it is stuck
  inside an env's C step or a `time.sleep`. The signal is tied to the parent
  *thread* that forked this process, so it is asked for only by processes whose
  parent forked them from its main thread (the caller says so).
* `watch_parent()`: a daemon thread that looks every `period` seconds whether
  the parent is still the one this process started under, and ends the process
  when it is not: the portable fallback (and the only guard of a worker whose
  parent forked it from another thread). It runs whenever the stuck code lets
  Python threads run (a sleep, a C call that releases the GIL, Python code).

"Still the parent" is `os.getppid()` against the parent seen at start: an orphan
is re-parented (to init or a subreaper), so its parent pid changes; a pid check
on the parent itself would be fooled by a parent that is dead but not yet reaped.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> bool:
    """Asks the kernel to SIGKILL this process when its parent dies (Linux). Exits
    at once if the parent `expected_parent` is already gone (it may have died before
    the request). Returns whether the kernel took the request."""
    taken = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            taken = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            taken = False
    if os.getppid() != expected_parent:
        os._exit(1)
    return taken


def watch_parent(expected_parent: int, period: float = 0.5) -> threading.Thread:
    """Starts a daemon thread that ends this process (exit status 1, no clean-up:
    the parent that would have wanted one is gone) once its parent is no longer
    `expected_parent`."""
    def watch():
        while os.getppid() == expected_parent:
            time.sleep(period)
        os._exit(1)

    thread = threading.Thread(target=watch, name="peregrine-parent-watch", daemon=True)
    thread.start()
    return thread
