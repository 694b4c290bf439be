"""dramatiq's Prometheus middleware for ``importer worker`` (IMPORTER_WORKER_METRICS_PORT),
whose exporter process stops when the dramatiq main process that forked it dies."""

from __future__ import annotations

import os
import signal
from typing import Any

from dramatiq.middleware.prometheus import Prometheus

from importer.adapters.dramatiq import private

from importer.adapters.logs import configure_logging
from importer.adapters.processes.signals import on_parent_death


def exposition_server() -> Any:
    """dramatiq forks one process per host for this (the fork's own SIGTERM handler exits it)."""
    configure_logging()
    on_parent_death(lambda: os.kill(os.getpid(), signal.SIGTERM), name="worker_metrics")
    return private.run_exposition_server()


class WorkerPrometheus(Prometheus):
    """dramatiq's Prometheus middleware, which also counts the import messages
    finished as riders of another delivery's call (adapters/dramatiq/handover.py):
    they never go through dramatiq's middleware, and each is a message processed."""

    @property
    def forks(self) -> list[Any]:
        return [exposition_server]

    def after_process_boot(self, broker: Any) -> None:
        super().after_process_boot(broker)  # the metrics are made here
        handover = getattr(broker, "handover", None)
        if handover is not None:
            handover.finished_listeners.append(self.rider_finished)

    def rider_finished(self, queue_name: str, actor_name: str, duration_ms: float) -> None:
        """As after_process_message counts a message that raised nothing."""
        labels = (queue_name, actor_name)
        self.message_durations.labels(*labels).observe(duration_ms)
        self.total_messages.labels(*labels).inc()
