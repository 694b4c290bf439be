"""Errors as answers, in one place: the HTTP status of every stable code.

Handlers raise :class:`ApiError` (or let a domain error propagate);
:func:`problem_for` turns either into an RFC 9457 problem response, and the
OpenAPI document derives each operation's error responses from the same
table, so the code, the status and the spec cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from importer.domain.errors import DomainError

#: code -> HTTP status. A code missing here is a 500 (and a bug).
HTTP_STATUS: dict[str, int] = {
    "request.bad_json": 400,
    "request.incomplete": 400,
    "request.bad_length": 400,
    "request.bad_digest": 400,
    "request.digest_mismatch": 400,
    "auth.required": 401,
    "auth.invalid": 401,
    "auth.scope_required": 403,
    "request.not_found": 404,
    "job.not_found": 404,
    "shipment.not_found": 404,
    "location.not_found": 404,
    "receipt.not_recorded": 404,
    "rejections.not_found": 404,
    "request.method_not_allowed": 405,
    "request.not_acceptable": 406,
    "request.timeout": 408,
    "batch.conflict": 409,
    "job.not_retryable": 409,
    "request.length_required": 411,
    "request.too_large": 413,
    "request.unsupported_media_type": 415,
    "request.invalid": 422,
    "request.rate_limited": 429,
    "internal": 500,
    "request.stream_unsupported": 501,
    "response.too_large": 501,
    "service.unavailable": 503,
    "service.busy": 503,
    "contract.no_worker": 503,
    "ledger.unavailable": 503,
    "intake.paused": 503,
    "store.behind_ledger": 503,
}

#: Response headers that come with a code (documented in the OpenAPI document).
HEADERS_OF: dict[str, dict[str, str]] = {
    "auth.required": {"WWW-Authenticate": "The authentication scheme (Bearer)."},
    "auth.invalid": {"WWW-Authenticate": "The authentication scheme (Bearer)."},
    "request.method_not_allowed": {"Allow": "The methods of this path."},
    "request.rate_limited": {"Retry-After": "Seconds to wait."},
    "service.unavailable": {"Retry-After": "Seconds to wait."},
    "service.busy": {"Retry-After": "Seconds to wait."},
    "contract.no_worker": {"Retry-After": "Seconds to wait."},
    "ledger.unavailable": {"Retry-After": "Seconds to wait."},
    "intake.paused": {"Retry-After": "Seconds to wait."},
    "store.behind_ledger": {"Retry-After": "Seconds to wait."},
}


class BodyTooLarge(Exception):
    """The body is larger than the transport's limit."""


class BodyIncomplete(Exception):
    """The connection ended before the whole body arrived."""


class BodyTimeout(Exception):
    """The body did not arrive before its deadline."""


class UploadsBusy(Exception):
    """Every upload slot of this process is taken."""


@dataclass
class ApiError(Exception):
    """A request refused with a stable code; ``extra`` members go into the problem document."""

    code: str
    headers: tuple[tuple[str, str], ...] = ()
    extra: dict[str, Any] | None = None
    #: The request path, for answers about what was sent (RFC 9457 ``instance``).
    instance: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.code)


def status_of(code: str) -> int:
    return HTTP_STATUS.get(code, 500)


def api_error_for(exc: DomainError, *, instance: str | None = None) -> ApiError:
    """The answer to a domain error a use case raised (e.g. batch.conflict, request.rate_limited)."""
    retry_after = getattr(exc, "retry_after_s", None)
    headers = (("Retry-After", str(retry_after)),) if retry_after is not None else ()
    if exc.code not in HTTP_STATUS:
        return ApiError("internal")
    # Members an error documents about itself (contract.no_worker: the versions).
    members = getattr(exc, "public_members", None)
    return ApiError(exc.code, headers, extra=members() if members is not None else None, instance=instance)
