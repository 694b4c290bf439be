"""The WSGI transport: turns a WSGI environ into a Request, a Response into WSGI.

Works under any WSGI server (gunicorn by default, see ``importer serve``).
It reads at most the upload limit from the body: a larger Content-Length is
refused with 413 before a byte of the body is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from importer.handlers.api import Api
from importer.handlers.auth import KeyRing
from importer.handlers.http import Request, Response, problem
from importer.handlers.routes import dispatch

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type",
    422: "Unprocessable Content", 429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
}

_CHUNK = 64 * 1024


def body_limit(api: Api) -> int:
    # A JSON body carries the CSV as an escaped string: allow for the escaping
    # of newlines and quotes; the CSV itself is checked against the limit again.
    return api.max_upload_bytes * 2 + 4096


def _read_body(environ: dict[str, Any], limit: int) -> bytes | None:
    """The request body, or None when it is larger than limit (stops reading at limit+1)."""
    stream = environ.get("wsgi.input")
    length_text = environ.get("CONTENT_LENGTH") or ""
    if length_text.strip():
        try:
            length = int(length_text)
        except ValueError:
            length = -1
        if length > limit:
            return None
        if length >= 0:
            return stream.read(length) if stream is not None and length else b""
    if stream is None:
        return b""
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)


def request_from_environ(environ: dict[str, Any], body: bytes) -> Request:
    headers = {
        key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")
    }
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    return Request(
        method=environ.get("REQUEST_METHOD", "GET").upper(),
        path=environ.get("PATH_INFO", "/") or "/",
        headers=headers,
        query=dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)),
        body=body,
    )


def create_app(api: Api, keys: KeyRing) -> WsgiApp:
    """The WSGI application around the handlers; all dependencies injected."""
    limit = body_limit(api)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        body = _read_body(environ, limit)
        if body is None:
            response = problem("request.too_large")
        else:
            response = dispatch(api, keys, request_from_environ(environ, body))
        return _respond(response, start_response)

    return app


def _respond(response: Response, start_response: StartResponse) -> Iterable[bytes]:
    status = f"{response.status} {_REASONS.get(response.status, 'Status')}"
    if response.stream is not None:
        # Sent as it is produced (chunked on HTTP/1.1); the server calls the
        # stream's close() when it ends, which frees its slot.
        start_response(status, list(response.headers))
        return response.stream
    headers = list(response.headers) + [("Content-Length", str(len(response.body)))]
    start_response(status, headers)
    return [response.body]
