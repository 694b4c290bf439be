"""Plain request and response values, and RFC 9457 problem responses."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from importer.domain.access import Principal
from importer.domain.errors import explain
from importer.domain.ids import random_hex, request_id_var
from importer.handlers.problems import ApiError, status_of

PROBLEM_TYPE_BASE = "https://importer.example/problems/"


#: An incoming X-Request-Id is kept when it looks like an id (a proxy's or
#: the client's); anything else is replaced by a fresh one.
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def request_id_from(headers: Mapping[str, str]) -> str:
    """The request id: a sane incoming X-Request-Id, else a new random one."""
    incoming = headers.get("x-request-id", "")
    if _SANE_REQUEST_ID.fullmatch(incoming):
        return incoming
    return random_hex()


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    #: Header names in lower case.
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    path_params: Mapping[str, str] = field(default_factory=dict)
    #: Set after authentication (the key's owner and locations); None for open routes.
    principal: Principal | None = None

    @property
    def owner(self) -> str | None:
        return self.principal.owner if self.principal is not None else None

    def owner_at(self, location: str) -> str | None:
        """The owner to read ``location`` as (domain/access.py: a location the
        key does not allow reads as nobody's), None on an open route."""
        return self.principal.owner_at(location) if self.principal is not None else None

    # The two changes the edge makes to every request, without the generic
    # (and, per request, costly) dataclasses.replace.
    def routed(self, path_params: Mapping[str, str], principal: Principal | None) -> Request:
        """This request matched to its route: its path parameters and principal."""
        return Request(self.method, self.path, self.headers, self.query, self.body, path_params, principal)

    def with_body(self, body: bytes) -> Request:
        return Request(self.method, self.path, self.headers, self.query, body, self.path_params, self.principal)


class BodyStream(Protocol):
    """A body produced while it is sent (text/event-stream). The transport
    iterates it and must call close() when it stops, whatever the reason."""

    def __iter__(self) -> Iterator[bytes]: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    #: When set, the body is this stream (sent without Content-Length) and body is unused.
    stream: BodyStream | None = None
    #: The stream is a download that ends by itself (a receipt), not a live one (events):
    #: a transport that cannot stream may collect it and send it whole.
    download: bool = False


def json_response(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(status, body, (("Content-Type", "application/json"),) + headers)


def problem(
    code: str, *, instance: str | None = None, headers: tuple[tuple[str, str], ...] = (), **extra: Any
) -> Response:
    """An RFC 9457 problem response. The status comes from the one table
    (handlers/problems.py); title and detail from the fixed explanations, never from exceptions'
    text (an error's ``public_members`` may give a detail made of plain values only, e.g.
    contract.no_worker's versions, through ``extra``)."""
    status = status_of(code)
    title, detail = explain(code)
    payload: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance is not None:
        payload["instance"] = instance
    payload.update(extra)
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(status, body, (("Content-Type", "application/problem+json"),) + headers)


def problem_of(error: ApiError) -> Response:
    return problem(error.code, instance=error.instance, headers=error.headers, **(error.extra or {}))


def internal_error() -> Response:
    """500 naming the request id (which is on every log line of the request)."""
    request_id = request_id_var.get()
    if request_id:
        return problem("internal", requestId=request_id)
    return problem("internal")
