"""[door] Each worker process announces that it is alive and which contract
versions it accepts (IMPORTER_ACCEPTED_VERSIONS), so that a producer refuses
work no live worker can run (enqueue.lua, ``503 contract.no_worker``).

A thread per worker process runs presence.lua every third of
IMPORTER_HEARTBEAT_TIMEOUT; each beat makes the worker live until the
server's clock + IMPORTER_HEARTBEAT_TIMEOUT (the same window in which
dramatiq counts a worker as alive before redelivering its messages). A worker
that stops cleanly removes its entry as it stops fetching; a SIGKILLed one
drops out once its window has passed. The store is always Redis, on either
message transport.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from importlib import metadata
from typing import Any

from dramatiq.middleware import Middleware

from importer.adapters.logs import log_event
from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings

log = logging.getLogger("importer.worker")


def new_worker_id() -> str:
    """host:pid:random, readable in `importer doctor` and unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class WorkerPresence(Middleware):
    """The presence beat of one worker process (a dramatiq middleware: it
    starts when the worker has booted and leaves when it starts stopping)."""

    def __init__(self, store: RedisStore, settings: Settings, worker_id: str | None = None) -> None:
        self.store = store
        self.accepts = settings.accepted_versions
        self.window_ms = max(1, int(settings.heartbeat_timeout_s * 1000))
        self.interval_s = settings.heartbeat_timeout_s / 3
        self.worker_id = worker_id or new_worker_id()
        #: IMPORTER_LOCATIONS and the default location, declared with the first beat Redis takes
        #: (a worker started while Redis was away declares them once it is back).
        self.to_declare = settings.declared_locations
        self._stop = threading.Event()
        # A beat and the goodbye never overlap: a beat in flight must not
        # announce the worker again after it has left.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: [ops] Messages this process is running now, and what it tells the operators' view.
        self.in_flight = 0
        self._count_lock = threading.Lock()
        self._started_at_ms = int(time.time() * 1000)
        self._release = _release()

    def info(self) -> str:
        """The JSON the operators' view shows for this worker (GET /api/ops/overview)."""
        return json.dumps({
            "release": self._release, "host": socket.gethostname(), "pid": os.getpid(),
            "startedAt": self._started_at_ms, "inFlight": self.in_flight,
        }, separators=(",", ":"))

    def _count(self, by: int) -> None:
        with self._count_lock:
            self.in_flight = max(0, self.in_flight + by)

    def before_process_message(self, broker: Any, message: Any) -> None:
        self._count(1)

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        self._count(-1)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        self._count(-1)

    def beat(self) -> bool:
        """One announcement; False when Redis could not take it (the next beat tries again)."""
        with self._lock:
            if self._stop.is_set():
                return False
            try:
                self.store.announce_worker(self.worker_id, self.accepts, self.window_ms, self.info())
                if self.to_declare:
                    self.store.declare_locations(self.to_declare)
                    self.to_declare = []
                return True
            except StoreUnavailable:
                log_event(log, "worker.presence_unavailable", logging.WARNING, workerId=self.worker_id)
            except Exception:  # never let the beat thread die
                log.exception("worker.presence_error")
            return False

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        # Live from the start: a producer may be refused until the first beat.
        self.beat()
        log_event(log, "worker.presence", workerId=self.worker_id, accepts=sorted(self.accepts))
        self._thread = threading.Thread(target=self._loop, name="importer-presence", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        # It fetches no more work from here on: stop counting it at once. If
        # a beat is stuck on a sick Redis, leave it: the entry expires.
        self._stop.set()
        if not self._lock.acquire(timeout=1):
            return
        try:
            self.store.remove_worker(self.worker_id)
        except StoreUnavailable:
            log_event(log, "worker.presence_unavailable", logging.WARNING, workerId=self.worker_id)
        finally:
            self._lock.release()


def _release() -> str:
    """This install's Importer version (its package metadata)."""
    try:
        return metadata.version("importer")
    except metadata.PackageNotFoundError:
        return "unknown"
