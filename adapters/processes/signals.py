"""Signal handling shared by the three kinds of process: the first SIGTERM or
SIGINT starts shutdown, later ones are logged and ignored (never a second
shutdown, never a crash). A child process whose supervisor dies stops the
same way (``on_parent_death`` in a multiprocessing child,
``signal_on_parent_death`` for a program a supervisor starts, and
``rearguard``, which stops what ``importer dev`` started once it is gone)."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
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


def signal_on_parent_death(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """For ``subprocess.Popen(preexec_fn=...)``, Linux: the child, and the
    program it then runs (the mark survives exec, so also dramatiq after
    ``importer worker``'s execve), gets ``signum`` from the kernel the moment
    the process that starts it dies, even by SIGKILL; SIGTERM makes each of
    Importer's processes stop as usual. None elsewhere (``rearguard`` covers it).

    The kernel sends it when the *thread* that started the child ends: start
    children from the main thread. In the child, between fork and exec, the
    signal gets its default action first (a Python handler inherited there
    would swallow it), and a parent already gone gets the signal at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: after fork, only call it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        signal.signal(signum, signal.SIG_DFL)
        if int(prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)

    return arm


# -- importer dev's rearguard -------------------------------------------------------


class _Watched:
    """A process that is not ours to wait for: pinned by a pidfd (Linux), else by its pid."""

    def __init__(self, pid: int, name: str, signalled: bool) -> None:
        self.pid, self.name, self.signalled = pid, name, signalled
        self.gone = False
        self.fd: int | None = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                self.fd = pidfd_open(pid)
            except ProcessLookupError:
                self.gone = True
            except OSError:
                pass

    def alive(self) -> bool:
        if self.gone:
            return False
        if self.fd is not None:  # readable once the process has exited (a zombie included)
            self.gone = bool(select.select([self.fd], [], [], 0)[0])
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.gone = True
            except PermissionError:
                pass
        return not self.gone

    def send(self, signum: int) -> None:
        if not self.alive():
            return
        send = getattr(signal, "pidfd_send_signal", None)
        try:
            if self.fd is not None and send is not None:
                send(self.fd, signum)
            else:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            self.gone = True

    def wait(self, until: float, poll_s: float) -> bool:
        while self.alive():
            if time.monotonic() >= until:
                return False
            time.sleep(poll_s)
        return True


def _stop_all(watched: list[_Watched], until: float, poll_s: float, say: Callable[[str], None]) -> None:
    for proc in watched:
        if not proc.signalled:
            proc.send(signal.SIGTERM)
    for proc in watched:
        if not proc.wait(until, poll_s):
            say(f"dev: killing {proc.name}: still running after importer dev died")
            proc.send(signal.SIGKILL)


def rearguard(lines: Iterable[str] | None = None, *, poll_s: float = 0.05) -> int:
    """``importer dev``'s rearguard: a process of its own session whose stdin
    is a pipe only ``importer dev`` writes to. It reads what dev started, one
    line each: ``stop PID NAME SIGNALLED`` (a process to stop; SIGNALLED 1:
    the kernel sends it SIGTERM when dev dies, ``signal_on_parent_death``),
    ``last PID NAME`` (the embedded server, stopped once the others have
    stopped, so they finish with Redis there), ``timeout SECONDS`` (what they
    get before they are killed). At the end of the pipe, dev has exited or
    died, SIGKILL included: whatever still runs is stopped as dev would have
    stopped it (SIGTERM, wait, kill only past the timeout). After a normal
    exit dev has stopped everything already, and this ends at once."""
    stop: list[_Watched] = []
    last: list[_Watched] = []
    timeout = 60.0
    for line in sys.stdin if lines is None else lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "stop":
            stop.append(_Watched(int(parts[1]), parts[2], parts[3] == "1"))
        elif len(parts) == 3 and parts[0] == "last":
            last.append(_Watched(int(parts[1]), parts[2], False))
        elif len(parts) == 2 and parts[0] == "timeout":
            timeout = float(parts[1])

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if any(proc.alive() for proc in stop + last):
        say("dev: importer dev is gone; stopping the processes it started")
        _stop_all(stop, time.monotonic() + timeout, poll_s, say)
        _stop_all(last, time.monotonic() + 10, poll_s, say)
    return 0


#: The command line of the rearguard (``importer dev`` starts it).
REARGUARD = "import sys; from importer.adapters.processes.signals import rearguard; sys.exit(rearguard())"
