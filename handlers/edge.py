"""The HTTP edge every transport shares: what happens between the bytes a
server hands over and the handler.

In this order, for each request:

1. a request id (a sane incoming ``X-Request-Id`` or a new one), on every log
   line of the request and in the ``X-Request-Id`` answer header;
2. a declared body over the limit: ``413`` (nothing read);
3. route and API key (``404``/``405``/``401``), before any body byte is read;
4. only for a route that takes a body (POST): its cheap checks (the owner's
   rate limit: ``429``), still before any body byte is read; the body read
   takes one of the process's body-read slots (so slow bodies never hold
   every thread) and a large upload one of its upload slots, or gets ``503
   service.busy``; then the body is read, whole or refused: ``413
   request.too_large`` past the limit, ``400 request.incomplete`` when the
   connection ended early (fewer bytes than Content-Length, a chunked body cut
   before its last chunk), ``408 request.timeout`` when it did not arrive
   within the body timeout: a partial body never reaches a handler. A body
   without Content-Length on a server that cannot report a cut one (granian:
   docs/granian-chunked-body.md) is refused before it is read (``411
   request.length_required``) unless it carries a ``Content-Digest``; a body
   whose ``Content-Digest`` does not match is ``400 request.digest_mismatch``
   (handlers/digest.py);
5. the handler (the resolved route's ``answer``);
6. the common answer headers (``Cache-Control: no-store``,
   ``X-Content-Type-Options: nosniff``); a HEAD answer carries no body.

No 5xx escapes from anything a client sends: an unexpected error is a
``500 internal`` naming the request id, logged with its traceback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from importer.domain.ids import request_id_var
from importer.handlers import digest
from importer.handlers.api import Api
from importer.handlers.auth import KeyRing
from importer.handlers.answers import RETRY_AFTER_BODY_SLOT_S, answer_for, retry_after
from importer.handlers.http import Request, Response, problem, request_id_from
from importer.handlers.problems import BodyIncomplete, BodyTimeout, BodyTooLarge, UploadsBusy
from importer.handlers.routes import Resolved, resolve

log = logging.getLogger("importer.http")

#: A body over this size is a "large upload" and needs an upload slot.
LARGE_UPLOAD_BYTES = 1024 * 1024

#: Headers on every answer: never cached (answers are per owner and change),
#: never content-sniffed.
COMMON_HEADERS: tuple[tuple[str, str], ...] = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
)


class Body(Protocol):
    #: The Content-Length the client declared (None: not declared, e.g. chunked).
    declared: int | None
    #: True when the transport cannot prove this body whole: it has no
    #: Content-Length and the server hands a cut one over as if it had ended
    #: (granian with a chunked body). Only a Content-Digest can then prove it.
    unprovable: bool

    def read(self, limit: int, on_large: Callable[[], None], deadline: float, done: Callable[[], None]) -> bytes:
        """The whole body. Raises BodyTooLarge past ``limit``, BodyIncomplete
        when it ended early and BodyTimeout when it is not whole at ``deadline``
        (time.monotonic()); calls ``on_large`` (which may raise UploadsBusy)
        once the body is known to exceed LARGE_UPLOAD_BYTES, before reading on.
        Calls ``done`` once, when no thread reads the body any more: before it
        returns or raises, or later, from a read it had to leave behind at the
        deadline (the server's read cannot be interrupted)."""
        ...


class MemoryBody:
    """A body that is already in memory (the serverless transport)."""

    def __init__(self, data: bytes, declared: int | None) -> None:
        self.data = data
        self.declared = declared
        self.unprovable = False  # whoever put it in memory received all of it

    def read(self, limit: int, on_large: Callable[[], None], deadline: float, done: Callable[[], None]) -> bytes:
        done()  # nothing to wait for: the body is in memory
        if len(self.data) > limit:
            raise BodyTooLarge()
        if self.declared is not None and self.declared != len(self.data):
            raise BodyIncomplete(f"{len(self.data)} of {self.declared} declared bytes")
        if len(self.data) > LARGE_UPLOAD_BYTES:
            on_large()
        return self.data


class UploadSlots:
    """How many large uploads (or, as ``read_slots``, request bodies) one
    process reads and handles at once.

    A large body costs memory and CPU for as long as it is read, hashed and
    stored; a slow body holds a thread while it trickles. Beyond ``size`` at
    once an extra one is refused (``503 service.busy`` with Retry-After) so
    small requests keep being served. ``size`` 0 = no bound."""

    def __init__(self, size: int) -> None:
        self._semaphore = threading.BoundedSemaphore(size) if size > 0 else None

    def take(self, wait: float = 0.0) -> bool:
        """A slot; waits at most ``wait`` seconds for one (0: refused at once)."""
        if self._semaphore is None:
            return True
        return self._semaphore.acquire(timeout=wait) if wait > 0 else self._semaphore.acquire(blocking=False)

    def give_back(self) -> None:
        if self._semaphore is not None:
            self._semaphore.release()


#: Seconds a POST waits for a body-read slot: long enough for the reads of
#: fast bodies (microseconds each) to make room, short enough that requests
#: refused while slow bodies hold every slot do not hold threads themselves.
READ_SLOT_WAIT_S = 0.05


def handle(
    api: Api, keys: KeyRing, head: Request, body: Body, *, limit: int, slots: UploadSlots,
    read_slots: UploadSlots | None = None,
) -> Response:
    """Answer one request; ``head`` is the request without its body (not read yet).
    ``slots``: large uploads at once; ``read_slots``: body reads at once."""
    request_id = request_id_from(head.headers)
    token = request_id_var.set(request_id)
    try:
        try:
            if api.trace_request is None:
                response = _handle(api, keys, head, body, limit, slots, read_slots or UploadSlots(0))
            else:  # [trace] the request's server span (adapters/tracing.py)
                response = api.trace_request(
                    head, request_id, lambda: _handle(api, keys, head, body, limit, slots, read_slots or UploadSlots(0)),
                )
        except Exception as exc:
            response = answer_for(exc, path=head.path)
        return finish(head.method, response, request_id)
    finally:
        request_id_var.reset(token)


def _handle(
    api: Api, keys: KeyRing, head: Request, body: Body, limit: int, slots: UploadSlots, read_slots: UploadSlots
) -> Response:
    if body.declared is not None and body.declared > limit:
        return problem("request.too_large")
    resolved = resolve(keys, head)
    if isinstance(resolved, Response):
        return resolved
    req = resolved.request
    if not resolved.takes_body:
        return resolved.answer(api)  # no body is read
    if body.unprovable and "content-digest" not in req.headers:
        log.warning("unprovable body refused", extra={"event": "http.length_required"})
        return problem("request.length_required", instance=req.path)
    refused = resolved.check_before_body(api)  # the owner's rate limit
    if refused is not None:
        return refused
    if not read_slots.take(READ_SLOT_WAIT_S):
        log.warning("body-read slots busy", extra={"event": "http.body_reads_busy"})
        return problem("service.busy", instance=req.path, headers=retry_after(RETRY_AFTER_BODY_SLOT_S))
    taken = False

    def on_large() -> None:
        nonlocal taken
        if not taken:
            if not slots.take():
                raise UploadsBusy()
            taken = True

    try:
        return _read_and_answer(api, resolved, body, limit, on_large, read_slots.give_back)
    finally:
        if taken:
            slots.give_back()
            api.release_memory()  # the upload's buffers are freed by now: give them back to the OS


def _read_and_answer(
    api: Api, resolved: Resolved, body: Body, limit: int, on_large: Callable[[], None], done: Callable[[], None]
) -> Response:
    req = resolved.request
    try:
        data = body.read(limit, on_large, time.monotonic() + api.body_timeout_s, done)
    except (BodyTimeout, BodyTooLarge, BodyIncomplete, UploadsBusy) as exc:
        return answer_for(exc, path=req.path)
    if "content-digest" in req.headers:
        # Checked once the body is read (a refusal then leaves no unread bytes
        # for the server to reset the connection over).
        try:
            digests = digest.parse(req.headers["content-digest"])
        except digest.BadDigest as err:
            log.warning("bad Content-Digest", extra={"event": "http.bad_digest", "reason": str(err)})
            return problem("request.bad_digest", instance=req.path)
        if not digest.matches(digests, data):
            log.warning("body does not match its Content-Digest", extra={"event": "http.digest_mismatch", "bytes": len(data)})
            return problem("request.digest_mismatch", instance=req.path)
    return resolved.answer(api, data)


def finish(method: str, response: Response, request_id: str) -> Response:
    """The common headers (unless the answer sets its own, like the console's
    Cache-Control); a HEAD answer keeps the GET answer's Content-Length but no body."""
    present = {name.lower() for name, _ in response.headers}
    common = tuple((name, value) for name, value in COMMON_HEADERS if name.lower() not in present)
    headers = response.headers + common + (("X-Request-Id", request_id),)
    if method == "HEAD":
        if response.stream is not None:
            response.stream.close()  # a stream's length is unknown: no Content-Length
            return Response(response.status, b"", headers, stream=_NoBody(), download=response.download)
        return Response(response.status, b"", headers + (("Content-Length", str(len(response.body))),))
    return Response(response.status, response.body, headers, response.stream, response.download)


class _NoBody:
    """The (empty) stream of a HEAD answer to a streaming route."""

    def __iter__(self) -> Iterator[bytes]:
        return iter(())

    def close(self) -> None:
        pass
