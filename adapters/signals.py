"""Signal handling shared by the three kinds of process: the first SIGTERM or
SIGINT starts shutdown, later ones are logged and ignored (never a second
shutdown, never a crash)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from importer.adapters.logs import log_event

log = logging.getLogger("importer")


class StopOnce:
    def __init__(self, on_first: Callable[[int], None] | None = None, name: str = "process") -> None:
        self.event = threading.Event()
        self._on_first = on_first
        self._name = name
        self._lock = threading.Lock()

    def __call__(self, signum: int, frame: Any = None) -> None:
        with self._lock:
            first = not self.event.is_set()
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
