"""Bounds on long downloads (``GET /api/stock-movements`` as CSV), so that one
producer cannot hold what every other one needs.

What an open download costs its HTTP process: one slot here and one server
thread (``importer serve`` adds a thread per slot, as for event streams), and
never a database connection while it waits on its client: the CSV is read a
page at a time, each page one short query on a pooled connection returned
before the page is sent.

* at most :attr:`Downloads.limit` open in one process, and at most
  :attr:`Downloads.per_owner` of them for one owner; one more answers ``429
  request.rate_limited`` with ``Retry-After`` at once;
* a download whose client took no page for :attr:`Downloads.stall_s` seconds
  ends there, cut (no closing chunk: HTTP clients report it as incomplete).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

#: Seconds a producer refused a download slot waits before asking again.
RETRY_AFTER_DOWNLOAD_S = 5


class DownloadStalled(Exception):
    """The client took nothing for longer than the bound: the download ends, cut."""


class DownloadSlots:
    """At most ``limit`` downloads open in this process, ``per_owner`` of them per owner."""

    def __init__(self, limit: int, per_owner: int) -> None:
        self.limit = limit
        self.per_owner = per_owner
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    def try_acquire(self, owner: str) -> bool:
        with self._lock:
            if sum(self._open.values()) >= self.limit or self._open[owner] >= self.per_owner:
                return False
            self._open[owner] += 1
            return True

    def release(self, owner: str) -> None:
        with self._lock:
            self._open[owner] -= 1
            if self._open[owner] <= 0:
                del self._open[owner]

    @property
    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())


@dataclass
class Downloads:
    """Settings and the per-process slots of the long downloads."""

    limit: int = 2
    per_owner: int = 1
    stall_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    slots: DownloadSlots = field(init=False)

    def __post_init__(self) -> None:
        self.slots = DownloadSlots(self.limit, self.per_owner)
