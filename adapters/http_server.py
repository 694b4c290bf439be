"""``importer serve``: the WSGI app under gunicorn.

gunicorn because it is the most used WSGI server for Python services on
Unix: pre-fork workers (each builds its own Redis clients after the fork),
graceful SIGTERM handling (stop accepting, finish in-flight requests within
``graceful_timeout``), request timeouts, and a threaded worker class. Any
other WSGI server works too: point it at ``adapters.http_server:wsgi_app()``.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

from gunicorn.app.base import BaseApplication

from adapters.bootstrap import HttpSide, build_http
from adapters.logs import configure_logging, log_event
from adapters.settings import Settings

log = logging.getLogger("importer.http")


def wsgi_app() -> Any:
    """Factory for other WSGI servers: ``waitress-serve --call adapters.http_server:wsgi_app``."""
    configure_logging()
    return build_http(Settings.from_env()).app


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.side: HttpSide | None = None
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        # Runs in each gunicorn worker after the fork: its own clients.
        configure_logging()
        self.side = build_http(Settings.from_env())
        side = self.side

        # gunicorn installed its worker signal handlers before loading the app.
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:
            # Mark closing first so /health answers 503 while in-flight
            # requests drain; gunicorn's own handler then stops the worker.
            if side.api.lifecycle.begin_closing():
                log_event(log, "http.closing")
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_term)
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
        }
    ).run()
