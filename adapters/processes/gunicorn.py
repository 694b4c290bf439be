"""``importer serve --server gunicorn``: the WSGI app under gunicorn.

The default server is granian (adapters/processes/granian.py). gunicorn stays
available: pre-fork workers (each builds its own Redis clients after the
fork), graceful SIGTERM handling, request timeouts, a threaded worker class;
but a connection that trickles its headers holds one of its threads (behind
a reverse proxy that buffers requests, that does not matter). Any other WSGI
server works too: ``importer.adapters.processes.wsgi_app:wsgi_app`` is a factory.

Shutdown, in each gunicorn worker, on the first SIGTERM or SIGINT:
1. the app marks itself closing: ``/health`` answers 503 ``closing``;
2. for ``IMPORTER_HTTP_DRAIN_DELAY`` seconds it keeps serving, so a load
   balancer polling /health takes it out before it stops accepting;
3. gunicorn stops accepting and finishes in-flight requests;
4. the broker and Redis clients are closed (gunicorn's worker_exit hook).
Later signals are ignored. SIGINT is graceful too (gunicorn's own SIGINT is a
quick shutdown that would cut in-flight requests).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.glogging import Logger as GunicornLogger

from importer.adapters.bootstrap import HttpSide, build_http
from importer.adapters.logs import configure_logging, formatter_class, log_event
from importer.adapters.settings import Settings
from importer.adapters.processes.signals import StopOnce

log = logging.getLogger("importer.http")


class LineGunicornLogger(GunicornLogger):  # type: ignore[misc]
    """gunicorn's own error (and access) lines in the format of every other
    line (IMPORTER_LOG_FORMAT: JSON, or text).

    gunicorn's Logger installs its handlers with its own plain-text formatters;
    this keeps its handlers (file, level, reopen on USR1) and swaps the formatter."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        cls = formatter_class()
        for logger in (self.error_log, self.access_log):
            for handler in logger.handlers:
                handler.setFormatter(cls())


class _GracefulArbiter(Arbiter):  # type: ignore[misc]
    def handle_int(self) -> None:
        self.handle_term()


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def run(self) -> None:
        _GracefulArbiter(self).run()

    def load(self) -> Any:
        # Runs in each gunicorn worker after the fork: its own clients.
        configure_logging()
        settings = Settings.from_env()
        side = build_http(settings)
        # gunicorn installed the worker's signal handlers before loading the app.
        gunicorn_exit = signal.getsignal(signal.SIGTERM)

        def begin(signum: int) -> None:
            side.api.lifecycle.begin_closing()

            def stop_accepting() -> None:
                if callable(gunicorn_exit):
                    gunicorn_exit(signal.SIGTERM, None)

            timer = threading.Timer(settings.http_drain_delay_s, stop_accepting)
            timer.daemon = True
            timer.start()

        StopOnce(begin, name="http").install(signal.SIGTERM, signal.SIGINT)
        self.cfg.set("worker_exit", _close_on_exit(side))
        return side.app


def _close_on_exit(side: HttpSide) -> Any:
    def worker_exit(server: Any, worker: Any) -> None:
        side.close()
        log_event(log, "http.closed")

    return worker_exit


def serve(bind: str, workers: int, threads: int, timeout: int, graceful_timeout: int) -> None:
    _Gunicorn(
        {
            "bind": bind,
            "workers": workers,
            "threads": threads,
            "worker_class": "gthread" if threads > 1 else "sync",
            "timeout": timeout,
            "graceful_timeout": graceful_timeout,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "logger_class": "importer.adapters.processes.gunicorn.LineGunicornLogger",
        }
    ).run()
