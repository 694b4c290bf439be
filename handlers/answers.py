"""Every error, as the answer a client gets: the one place they are mapped.

The edge (for a body that could not be read), the route steps (a handler's
or a before-body check's error), the serverless transport (a stream that
failed before it was sent) and ``/health`` all answer through here, with the
statuses of handlers/problems.py and the Retry-After values below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from importer.domain.errors import DomainError, LedgerUnreachable
from importer.handlers.http import Response, internal_error, problem, problem_of
from importer.handlers.problems import (
    ApiError, BodyIncomplete, BodyTimeout, BodyTooLarge, UploadsBusy, api_error_for,
)

log = logging.getLogger("importer.http")

#: Seconds to wait after the store was unavailable (503 service.unavailable, /health 503).
RETRY_AFTER_UNAVAILABLE_S = 5
#: Seconds to wait for a body-read or upload slot of this process (503 service.busy).
RETRY_AFTER_BODY_SLOT_S = 1
#: Seconds to wait for a live event stream slot (503 service.busy; or poll instead).
RETRY_AFTER_STREAM_SLOT_S = 5


def retry_after(seconds: int) -> tuple[tuple[str, str], ...]:
    return (("Retry-After", str(seconds)),)


def answer_for(
    exc: BaseException, *, path: str, unavailable: tuple[type[BaseException], ...] = (),
    on_store_error: Callable[[], None] | None = None,
) -> Response:
    """The answer to ``exc`` raised while handling a request for ``path``;
    logs what the answer does not say. ``unavailable``: the store's and
    broker's "sick" errors (503 service.unavailable)."""
    if isinstance(exc, ApiError):
        return problem_of(exc)
    if isinstance(exc, DomainError):
        if isinstance(exc, LedgerUnreachable):  # the answer says "ledger.unavailable"; the log says why
            log.warning("ledger unavailable", extra={"event": "http.ledger_unavailable", "path": path, "detail": exc.detail[:300]})
        return problem_of(api_error_for(exc, instance=path))
    if isinstance(exc, BodyTimeout):
        log.warning("body too slow", extra={"event": "http.body_timeout"})
        return problem("request.timeout", instance=path)
    if isinstance(exc, BodyTooLarge):
        return problem("request.too_large", instance=path)
    if isinstance(exc, BodyIncomplete):
        log.warning("incomplete body", extra={"event": "http.body_incomplete", "reason": str(exc)})
        return problem("request.incomplete", instance=path)
    if isinstance(exc, UploadsBusy):
        log.warning("upload slots busy", extra={"event": "http.uploads_busy"})
        return problem("service.busy", instance=path, headers=retry_after(RETRY_AFTER_BODY_SLOT_S))
    if unavailable and isinstance(exc, unavailable):
        if on_store_error is not None:
            on_store_error()
        log.warning("store unavailable", extra={"event": "http.store_unavailable", "path": path})
        return problem("service.unavailable", headers=retry_after(RETRY_AFTER_UNAVAILABLE_S))
    log.error("unhandled error", exc_info=exc, extra={"event": "http.internal_error", "path": path})
    return internal_error()
