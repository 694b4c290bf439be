"""The serverless transport: AWS Lambda behind an HTTP API (API Gateway v2,
payload format 2.0) or a Lambda Function URL (same event shape).

Like the WSGI transport (handlers/wsgi.py) it only turns its own request shape
into the plain :class:`importer.handlers.http.Request`, calls
:func:`importer.handlers.edge.handle` and turns the :class:`importer.handlers.http.Response`
back into the event response shape. Same routes, same authentication, same
problem documents, same body limit. No AWS SDK is needed or imported.

Deployment entry point: ``importer.adapters.processes.aws_lambda.handler`` (the composition
root of a Lambda function, beside the worker's entry point).
"""

from __future__ import annotations

import base64
import logging
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, unquote

from importer.handlers.api import Api
from importer.handlers.auth import KeyRing
from importer.handlers.answers import answer_for
from importer.handlers.edge import MemoryBody, UploadSlots, finish, handle
from importer.handlers.http import Request, Response, problem, request_id_from
from importer.handlers.query import whole_number
from importer.handlers.wsgi import body_limit

Event = dict[str, Any]
EventResponse = dict[str, Any]
LambdaHandler = Callable[[Event, object], EventResponse]

log = logging.getLogger("importer.http")

#: Response media types sent as text; every other body is sent base64-encoded.
_TEXT_TYPES = frozenset({
    "application/json",
    "application/problem+json",
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
})


class UnsupportedEvent(ValueError):
    """The event is not an HTTP API payload format 2.0 / Function URL event.

    A deployment error (e.g. an HTTP API integration left on payload format
    1.0, or a REST API), not a client error: raised, so Lambda reports it.
    """


def _header_items(raw: Mapping[str, Any] | None) -> Iterable[tuple[str, str]]:
    for name, value in (raw or {}).items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        yield str(name).lower(), str(value)


def _headers(raw: Mapping[str, Any] | None) -> dict[str, str]:
    """Header names in lower case; a name given more than once has its values joined with ','."""
    headers: dict[str, str] = {}
    for name, value in _header_items(raw):
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def _query(event: Mapping[str, Any]) -> dict[str, str]:
    raw = event.get("rawQueryString")
    if raw is not None:
        # The same parsing as the WSGI transport (last value of a repeated name wins).
        return dict(parse_qsl(str(raw), keep_blank_values=True))
    params = event.get("queryStringParameters") or {}
    return {str(k): "" if v is None else str(v) for k, v in params.items()}


def _body(event: Mapping[str, Any], limit: int | None) -> bytes | None:
    """The request body as bytes, or None when it is larger than limit."""
    raw = event.get("body")
    if raw is None or raw == "":
        return b""
    text = str(raw)
    if event.get("isBase64Encoded"):
        # Refuse before decoding: n base64 characters decode to at least 3n/4 - 2 bytes.
        if limit is not None and len(text) * 3 // 4 - 2 > limit:
            return None
        try:
            body = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise UnsupportedEvent("isBase64Encoded is true but the body is not valid base64") from None
    else:
        # Every character is at least one UTF-8 byte: refuse before encoding.
        if limit is not None and len(text) > limit:
            return None
        # (A lone surrogate from a hand-made event becomes invalid UTF-8, which
        # the handlers refuse like any other undecodable body.)
        body = text.encode("utf-8", "surrogatepass")
    if limit is not None and len(body) > limit:
        return None
    return body


def to_request(event: Event, *, limit: int | None = None) -> Request | Response:
    """The plain Request of a payload format 2.0 event, or the 413 problem response.

    ``limit`` is the body limit in bytes; :func:`make_handler` passes
    ``importer.handlers.wsgi.body_limit(api)``, the WSGI transport's limit, so a larger
    body gets the same ``413 request.too_large`` as there. ``None``: no limit
    (only for callers that enforce one themselves).

    The path is ``rawPath`` percent-decoded, as a WSGI server decodes PATH_INFO
    (Function URLs deliver it encoded, HTTP APIs already decoded; the routes
    only use unreserved characters, so both give the same route).
    """
    try:
        method = str(event["requestContext"]["http"]["method"]).upper()
    except (KeyError, TypeError):
        raise UnsupportedEvent(
            "not an HTTP API payload format 2.0 / Function URL event (no requestContext.http.method); "
            "set the integration's payload format version to 2.0"
        ) from None
    body = _body(event, limit)
    if body is None:
        return problem("request.too_large")
    headers = _headers(event.get("headers"))
    if "content-length" in headers and whole_number(headers["content-length"].strip()) is None:
        return problem("request.bad_length")
    return Request(
        method=method,
        path=unquote(str(event.get("rawPath") or "/")) or "/",
        headers=headers,
        query=_query(event),
        body=body,
    )


def _is_text(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type in _TEXT_TYPES or media_type.startswith("text/") or media_type.endswith("+json")


def to_event_response(response: Response) -> EventResponse:
    """The payload format 2.0 response of a Response.

    Header names that repeat (case-insensitively) have their values joined
    with ','. The body is text for JSON, problem+json, YAML and text/* content
    (when it is valid UTF-8), else base64 with ``isBase64Encoded`` true.
    API Gateway / the Function URL adds Content-Length itself.
    """
    headers: dict[str, str] = {}
    spelling: dict[str, str] = {}
    for name, value in response.headers:
        key = spelling.setdefault(name.lower(), name)
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    content_type = next((v for k, v in response.headers if k.lower() == "content-type"), "")
    if _is_text(content_type):
        try:
            text = response.body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return {"statusCode": response.status, "headers": headers, "body": text, "isBase64Encoded": False}
    elif not response.body:
        return {"statusCode": response.status, "headers": headers, "body": "", "isBase64Encoded": False}
    return {
        "statusCode": response.status,
        "headers": headers,
        "body": base64.b64encode(response.body).decode("ascii"),
        "isBase64Encoded": True,
    }


def _declared_length(request: Request) -> int | None:
    """The Content-Length the client declared, when the event carries one."""
    return whole_number(request.headers.get("content-length", "").strip())


def make_handler(api: Api, keys: KeyRing) -> LambdaHandler:
    """A Lambda handler ``(event, context) -> response`` around the handlers; all dependencies injected."""
    limit = body_limit(api)
    slots = UploadSlots(api.max_concurrent_uploads)

    def handle_event(event: Event, context: object) -> EventResponse:
        request = to_request(event, limit=limit)
        if isinstance(request, Response):
            response = finish(_method(event), request, request_id_from(_headers(event.get("headers"))))
        else:
            head = replace(request, body=b"")
            body = MemoryBody(request.body, _declared_length(request))
            response = handle(api, keys, head, body, limit=limit, slots=slots)
        if response.stream is not None:
            response = _whole(event, response, api.unavailable_errors)
        return to_event_response(response)

    return handle_event


#: The largest body collected from a download stream: a Lambda response carries
#: at most 6 MB (headers and encoding included).
MAX_WHOLE_BODY = 5 * 1024 * 1024


def _whole(event: Event, response: Response, unavailable_errors: tuple[type[BaseException], ...]) -> Response:
    """A Lambda response is sent whole: a download stream (a receipt) is collected
    up to MAX_WHOLE_BODY; a live stream (events) cannot be held open here."""
    stream = response.stream
    assert stream is not None
    failure: Response
    try:
        if response.download:
            parts: list[bytes] = []
            size = 0
            for part in stream:
                size += len(part)
                if size > MAX_WHOLE_BODY:
                    break
                parts.append(part)
            else:
                return replace(response, body=b"".join(parts), stream=None, download=False)
            failure = problem("response.too_large")
        else:
            failure = problem("request.stream_unsupported")
    except Exception as exc:  # the answer is not sent yet
        failure = answer_for(exc, path=str(event.get("rawPath") or "/"), unavailable=unavailable_errors)
    finally:
        stream.close()
    request_id = next((v for k, v in response.headers if k == "X-Request-Id"), "") or request_id_from({})
    return finish(_method(event), failure, request_id)


def _method(event: Event) -> str:
    return str(event["requestContext"]["http"]["method"]).upper()
