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
    @property
    def forks(self) -> list[Any]:
        return [exposition_server]
