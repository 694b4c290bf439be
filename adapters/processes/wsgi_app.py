"""The app factory for any WSGI server: ``waitress-serve --call importer.adapters.processes.wsgi_app:wsgi_app``."""

from __future__ import annotations

import logging
import sys
from typing import Any

from importer.adapters.bootstrap import build_http
from importer.adapters.logs import configure_logging, log_event
from importer.adapters.settings import Settings
from importer.handlers.wsgi import body_limit

log = logging.getLogger("importer.http")


def wsgi_app() -> Any:
    """Factory for other WSGI servers: ``waitress-serve --call importer.adapters.processes.wsgi_app:wsgi_app``.

    Under waitress it also sets waitress's default ``max_request_body_size``
    to the app's body limit: waitress buffers a whole body (to a temp file)
    before it calls the app, by default up to 1 GiB. The factory runs before
    waitress reads its options, and an explicit ``--max-request-body-size``
    still wins.
    """
    configure_logging()
    settings = Settings.from_env()
    side = build_http(settings)
    _bound_waitress_bodies(body_limit(side.api))
    return side.app


def _bound_waitress_bodies(limit: int) -> None:
    if "waitress" not in sys.modules:
        return
    from waitress.adjustments import Adjustments

    # waitress refuses a body when its size >= max_request_body_size.
    Adjustments.max_request_body_size = limit + 1
    log_event(log, "http.waitress_body_limit", max_request_body_size=limit + 1)
