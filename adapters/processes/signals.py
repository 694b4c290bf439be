"""Signal handling shared by the three kinds of process: the first SIGTERM or
SIGINT starts shutdown, later ones are logged and ignored (never a second
shutdown, never a crash). A child process whose supervisor dies stops the
same way (``on_parent_death``)."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from importer.adapters.logs import log_event

log = logging.getLogger("importer")

#: prctl(2) option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1
#: Delivered on parent death (by the kernel on Linux, by the watch thread
#: elsewhere) to run ``on_parent_death``'s handler in the main thread.
PARENT_DEATH_SIGNAL = signal.SIGUSR1


class StopOnce:
    def __init__(self, on_first: Callable[[int], None] | None = None, name: str = "process") -> None:
        self.event = threading.Event()
        self._on_first = on_first
        self._name = name
        # Taken once, never released: which call is the first.
        self._first = threading.Lock()

    def __call__(self, signum: int, frame: Any = None) -> None:
        # One non-blocking acquire (a single C call) decides, atomically against
        # other threads and against a run of this handler nested in this one:
        # Python runs a signal handler in the main thread between two
        # bytecodes, so a second signal (a terminal's SIGINT and granian's
        # SIGTERM reach a granian worker together) can run it again before the
        # first run is done. A lock held here would make that nested run wait
        # for itself forever (a granian worker would hang until its main process
        # killed it: "Killing worker-1 after it refused to gracefully stop"); a
        # re-entrant one would let both runs start a shutdown.
        first = self._first.acquire(blocking=False)
        self.event.set()
        if first:
            log_event(log, f"{self._name}.stopping", signal=signal.Signals(signum).name)
            if self._on_first is not None:
                self._on_first(signum)
        else:
            log_event(log, f"{self._name}.already_stopping", signal=signal.Signals(signum).name)

    def install(self, *signals: int) -> "StopOnce":
        for sig in signals or (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self)
        return self


def _set_parent_death_signal(signum: int) -> bool:
    """Linux only: ask the kernel to send signum when the parent dies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _log_to_own_stderr() -> None:
    """Logs and prints go to the process's own stderr/stdout again: the parent
    that read them through a pipe is gone (and a sibling may still hold the
    pipe open, so writes would block once its buffer is full, not fail)."""
    if sys.__stderr__ is None:
        return
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setStream(sys.__stderr__)


def on_parent_death(stop: Callable[[], None], *, name: str, interval_s: float = 0.25) -> bool:
    """In a multiprocessing child (a dramatiq worker process): call ``stop``
    once, in the main thread, when the parent that supervises this process
    dies, even by SIGKILL, so the process never runs on unsupervised.

    Two triggers, one handler: the kernel's parent-death signal (Linux,
    immediate) and a thread polling ``os.getppid()`` (every platform; it also
    covers a parent that died before the signal was armed). Returns False,
    doing nothing, when this process is not a multiprocessing child.
    """
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return False
    expected = parent.pid
    fired = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if fired.is_set() or os.getppid() == expected:
            return  # a stray SIGUSR1 while the parent lives changes nothing
        fired.set()
        _log_to_own_stderr()
        log_event(log, f"{name}.parent_died", logging.WARNING, parent=expected)
        stop()

    def watch() -> None:
        while os.getppid() == expected:
            time.sleep(interval_s)
        if not fired.is_set():
            os.kill(os.getpid(), PARENT_DEATH_SIGNAL)

    signal.signal(PARENT_DEATH_SIGNAL, handler)
    _set_parent_death_signal(PARENT_DEATH_SIGNAL)
    threading.Thread(target=watch, name=f"{name}-parent-watch", daemon=True).start()
    return True
