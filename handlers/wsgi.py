"""The WSGI transport: turns a WSGI environ into a Request, a Response into WSGI.

Works under any WSGI server (gunicorn by default, see ``importer serve``).
The body is read only after the route and the API key passed (handlers/edge.py),
at most up to the limit (a larger Content-Length is refused with 413 before a
byte of the body is read), only whole: a short or cut body is refused, and
only until its deadline (IMPORTER_HTTP_BODY_TIMEOUT): a body that trickles
gets 408 request.timeout.
"""

from __future__ import annotations

import io
import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from importer.handlers.api import Api
from importer.handlers.auth import KeyRing
from importer.handlers.edge import LARGE_UPLOAD_BYTES, UploadSlots, finish, handle
from importer.handlers.problems import BodyIncomplete, BodyTimeout, BodyTooLarge
from importer.handlers.http import Request, Response, internal_error, request_id_from
from importer.handlers.query import whole_number

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

log = logging.getLogger("importer.http")

_REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 406: "Not Acceptable", 409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type",
    422: "Unprocessable Content", 429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
}

#: SERVER_SOFTWARE prefixes (lower case) of the servers whose wsgi.input
#: raises on a cut chunked body (gunicorn) or that never call the app with one
#: (waitress), checked at every cut point by tests/integration/test_cut_uploads.py.
_SERVERS_THAT_REPORT_CUTS = ("gunicorn", "waitress")

#: Bytes asked of wsgi.input per read: few calls (each may wait for the GIL
#: behind CPU-bound threads), and no more than gunicorn reads per recv().
_CHUNK = 1024 * 1024


def body_limit(api: Api) -> int:
    # A JSON body carries the CSV as an escaped string: allow for the escaping
    # of newlines and quotes; the CSV itself is checked against the limit again.
    return api.max_upload_bytes * 2 + 4096


class WsgiBody:
    """The body of a WSGI request, read only when the edge asks for it.

    Counts what arrives instead of trusting the server: fewer bytes than
    CONTENT_LENGTH (the client closed or half-closed early: gunicorn then
    returns a short read, granian an empty one) or an error from wsgi.input
    (gunicorn raises NoMoreData / ChunkMissingTerminator / InvalidHeader on a
    cut chunked body or a broken trailer) is BodyIncomplete. waitress never
    calls the app with an incomplete body.

    A body without CONTENT_LENGTH (chunked, or HTTP/2 without the header) is
    ``unprovable`` on every server but those known to report a cut one
    (gunicorn, waitress: tests/integration/test_cut_uploads.py): granian hands
    a chunked body cut at any point over as if it had ended there
    (docs/granian-chunked-body.md), and an unknown server may do the same. The
    edge refuses such a body with 411 unless a Content-Digest proves it.

    The deadline, per server: gunicorn's socket (``gunicorn.socket``) gets a
    timeout for each read, and its read side is shut after a timeout (so
    gunicorn does not wait for the rest of the body either); waitress has
    read the whole body before it calls the app; any other server (granian)
    offers no read timeout and its read cannot be interrupted: the deadline
    is checked after each read, so a body that trickles holds its thread
    (and its body-read slot, handlers/edge.py, which bounds how many threads
    such bodies hold) until it ends or the client goes, and is then refused.
    """

    def __init__(self, environ: dict[str, Any]) -> None:
        self.stream = environ.get("wsgi.input")
        length_text = (environ.get("CONTENT_LENGTH") or "").strip()
        self.declared: int | None = whole_number(length_text)
        self.chunked = "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower()
        self.socket: socket.socket | None = environ.get("gunicorn.socket")
        software = str(environ.get("SERVER_SOFTWARE", "")).lower()
        reports_cuts = software.startswith(_SERVERS_THAT_REPORT_CUTS)
        framed_by_its_end = self.chunked or str(environ.get("SERVER_PROTOCOL", "")).upper().startswith("HTTP/2")
        self.unprovable = self.declared is None and framed_by_its_end and not reports_cuts
        self.deadline = float("inf")
        self.started = False

    def left_unread(self) -> None:
        """After an answer given without reading a body the client declared
        (401, 429, 503...): under gunicorn, shut the socket's read side, so
        that gunicorn does not read (drain) that body for keep-alive on one of
        its threads, with no deadline; the connection closes after the answer."""
        if self.started or self.socket is None or not (self.declared or self.chunked):
            return
        try:
            self.socket.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def _chunk(self, size: int) -> bytes:
        if self.socket is not None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise BodyTimeout()
            self.socket.settimeout(min(remaining, 3600.0))
        try:
            chunk = self.stream.read(size)  # type: ignore[union-attr]
        except Exception as err:  # the server's own error on a broken body (gunicorn: NoMoreData, ...)
            if isinstance(err, TimeoutError) or time.monotonic() >= self.deadline:
                raise BodyTimeout() from None
            raise BodyIncomplete(type(err).__name__) from None
        if time.monotonic() > self.deadline:
            raise BodyTimeout()
        return chunk  # type: ignore[no-any-return]

    def read(self, limit: int, on_large: Callable[[], None], deadline: float, done: Callable[[], None]) -> bytes:
        self.deadline = deadline
        self.started = True
        try:
            return self._read_here(limit, on_large)
        finally:
            done()

    def _read_here(self, limit: int, on_large: Callable[[], None]) -> bytes:
        timeout = self.socket.gettimeout() if self.socket is not None else None
        try:
            return self._read(limit, on_large)
        except BodyTimeout:
            if self.socket is not None:
                try:
                    self.socket.shutdown(socket.SHUT_RD)  # gunicorn reads no more of this body
                except OSError:
                    pass
            raise
        finally:
            if self.socket is not None:
                try:
                    self.socket.settimeout(timeout)
                except OSError:
                    pass

    def _read(self, limit: int, on_large: Callable[[], None]) -> bytes:
        if self.stream is None:
            if self.declared:
                raise BodyIncomplete("no wsgi.input")
            return b""
        if self.declared is not None:
            return self._read_declared(self.declared, limit, on_large)
        return self._read_to_end(limit, on_large)

    def _read_declared(self, length: int, limit: int, on_large: Callable[[], None]) -> bytes:
        if length > limit:
            raise BodyTooLarge()
        if length == 0:
            return b""
        if length > LARGE_UPLOAD_BYTES:
            on_large()
        # Written into one growing buffer whose bytes are handed over without a
        # copy (BytesIO.getvalue() shares its buffer; growing a block of 1 MiB
        # or more is an mremap): the read costs the body once, plus one chunk.
        buffer = io.BytesIO()
        filled = 0
        while filled < length:
            chunk = self._chunk(min(_CHUNK, length - filled))
            if not chunk:
                raise BodyIncomplete(f"{filled} of {length} declared bytes")
            if len(chunk) > length - filled:
                chunk = chunk[: length - filled]
            buffer.write(chunk)
            filled += len(chunk)
            del chunk
        return buffer.getvalue()

    def _read_to_end(self, limit: int, on_large: Callable[[], None]) -> bytes:
        """No Content-Length (chunked): read until the server says the body ended."""
        buffer = io.BytesIO()
        size = 0
        while True:
            chunk = self._chunk(_CHUNK)
            if not chunk:
                return buffer.getvalue()
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge()
            if size > LARGE_UPLOAD_BYTES:
                on_large()
            buffer.write(chunk)
            del chunk


def request_from_environ(environ: dict[str, Any], body: bytes) -> Request:
    headers = {
        key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")
    }
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    if environ.get("CONTENT_LENGTH"):
        headers["content-length"] = environ["CONTENT_LENGTH"]
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
    slots = UploadSlots(api.max_concurrent_uploads)
    read_slots = UploadSlots(api.max_body_reads)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            head = request_from_environ(environ, b"")
        except Exception:  # a server handing over an environ we cannot read
            log.exception("unreadable environ", extra={"event": "http.internal_error"})
            head = Request(method="GET", path="/", headers={})
            return _respond(finish(head.method, internal_error(), request_id_from({})), start_response)
        body = WsgiBody(environ)
        response = handle(api, keys, head, body, limit=limit, slots=slots, read_slots=read_slots)
        body.left_unread()
        return _respond(response, start_response)

    return app


def _respond(response: Response, start_response: StartResponse) -> Iterable[bytes]:
    status = f"{response.status} {_REASONS.get(response.status, 'Status')}"
    if response.stream is not None:
        # Sent as it is produced (chunked on HTTP/1.1); the server calls the
        # stream's close() when it ends, which frees its slot.
        start_response(status, list(response.headers))
        return response.stream
    headers = list(response.headers)
    if not any(name.lower() == "content-length" for name, _ in headers):
        headers.append(("Content-Length", str(len(response.body))))
    start_response(status, headers)
    return [response.body] if response.body else []
