"""The HTTP handlers: enqueue, status, shipment, health, spec, metrics.

Each is ``(Api, Request) -> Response``: it reads the request, calls a use case
or a port, and dumps the answer. A refused request raises :class:`ApiError`
(the one code -> status table is handlers/problems.py). Handlers receive
their ports in :class:`Api`; they never read the environment or build
clients. The transports (handlers/wsgi.py, handlers/serverless.py) only turn
their own request shape into :class:`Request`.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from marshmallow import ValidationError

from importer.domain.contract import CURRENT_VERSION, live_workers_can_run
from importer.domain.errors import RateLimited
from importer.domain.jobs import JobRecord
from importer.domain.ledger import ArchiveLookup, History
from importer.domain.operations import OpsStore
from importer.domain.ports import JobStore, MessageSender
from importer.domain.retry_import import retry_refusal
from importer.domain.locations import LOCATION_PATTERN, MAIN, is_valid_location, location_of_job
from importer.domain.shipment import BATCH_ID_PATTERN, is_valid_batch_id
from importer.domain.submit_import import Accepted, submit_import
from importer.handlers.answers import RETRY_AFTER_UNAVAILABLE_S, retry_after
from importer.handlers.auth import bearer_token
from importer.handlers.downloads import Downloads
from importer.handlers.event_stream import EventStreams
from importer.handlers.http import Request, Response, json_response
from importer.handlers.problems import ApiError
from importer.handlers.query import whole_number
from importer.handlers.schemas import EnqueueRequestSchema, JobStatusSchema, ShipmentSchema, plainly_valid_enqueue_request


# Schemas are stateless once built; building one per request costs more than
# the rest of the handler.
_ENQUEUE_REQUEST = EnqueueRequestSchema()
_JOB_STATUS = JobStatusSchema()
_SHIPMENT = ShipmentSchema()


class Lifecycle:
    """Whether the process is shutting down (then /health answers 503 'closing')."""

    def __init__(self) -> None:
        self._closing = threading.Event()

    def begin_closing(self) -> bool:
        """Mark closing; returns False when it was already closing (second signal)."""
        if self._closing.is_set():
            return False
        self._closing.set()
        return True

    @property
    def closing(self) -> bool:
        return self._closing.is_set()


@dataclass
class Api:
    store: JobStore
    sender: MessageSender
    max_upload_bytes: int
    max_rows: int
    openapi_yaml: Callable[[], str]
    uuidgen: Callable[[], str]
    #: Exceptions meaning "the store cannot be reached": answered 503.
    unavailable_errors: tuple[type[BaseException], ...] = ()
    #: Why the message transport cannot take a message now ('' = it can):
    #: ``broker_blocked`` or ``broker_unreachable``, for /health (RabbitMQ only).
    broker_sickness: Callable[[], str] = lambda: ""
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    #: Renders Prometheus text: (body, content type). None: /metrics is off.
    metrics: Callable[[], tuple[bytes, str]] | None = None
    #: The bearer token /metrics requires ('' = /metrics is off).
    metrics_token: str = ""
    #: Called when the store was unreachable (counts Redis errors).
    on_store_error: Callable[[], None] = lambda: None
    #: Live event streams: settings and this process's open-stream limit.
    event_streams: EventStreams = field(default_factory=EventStreams)
    #: Long downloads (the movements as CSV): this process's slots, per owner and in all.
    downloads: Downloads = field(default_factory=Downloads)
    #: Large uploads (over 1 MiB) one process reads at once; more get 503 service.busy (0 = no bound).
    max_concurrent_uploads: int = 1
    #: Request bodies one process reads at once (each until it arrived, or its
    #: deadline and the client left); one more gets 503 service.busy (0 = no bound).
    max_body_reads: int = 2
    #: Seconds a request body may take to arrive whole; then 408 request.timeout.
    body_timeout_s: float = 60.0
    #: Called after a large upload was handled, its buffers freed (returns free heap memory to the OS).
    release_memory: Callable[[], None] = lambda: None
    #: The contract version this process's messages carry (IMPORTER_PRODUCER_VERSION), for /health.
    producer_version: int = CURRENT_VERSION
    #: The stock location of a request that names none (IMPORTER_DEFAULT_LOCATION).
    default_location: str = MAIN
    #: [ledger] The history's reads (PostgreSQL); None: no ledger (those routes answer 503 ledger.unavailable).
    history: History | None = None
    #: [ledger] Where a POST asks about a batch whose done marker may have been pruned; None: no ledger.
    archive: ArchiveLookup | None = None
    #: [ledger] /health's view of the ledger ({up, lagEntries, lagSeconds}); None: no ledger.
    ledger_status: Callable[[], dict[str, Any] | None] = lambda: None
    #: [trace] Runs a request inside its server span: (request, request id, handle) -> response;
    #: None: tracing is off (the request runs as it is).
    trace_request: Callable[[Request, str, Callable[[], Response]], Response] | None = None
    #: [ops] The operators' view and actions (routes under /api/ops/); None: those routes answer 503.
    operations: OpsStore | None = None
    #: [ops] [ledger] location -> {lagEntries, lagSeconds}; None: no ledger.
    ledger_lags: Callable[[], dict[str, dict[str, Any]] | None] = lambda: None
    #: A bulk request's shipments up to this many bytes travel in group messages
    #: (contract version 3, many imports a message) while every live worker reads
    #: them; 0: one message each (IMPORTER_GROUP_MESSAGES=0, or the separate steps).
    group_max_bytes: int = 0


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def rejections_path(job_id: str) -> str:
    """Where a failed validation's rejection report is (handlers/rejections.py)."""
    return f"/api/imports/{job_id}/rejections.csv"


def job_status(record: JobRecord) -> dict[str, Any]:
    """The public view of a job record (an allow-list: nothing else leaves)."""
    error = record.error
    rejections = error.get("rejections") if isinstance(error, dict) else None
    if isinstance(error, dict) and isinstance(rejections, dict):
        error = {**error, "rejections": {**rejections, "url": rejections_path(record.id)}}
    payload = {
        "id": record.id,
        "batchId": record.batch_id,
        "location": location_of_job(record.id),
        "state": record.state,
        "attempt": record.attempt,
        "progress": record.progress,
        "result": record.result,
        "error": error,
        "createdAt": _time(record.created_at_ms),
        "updatedAt": _time(record.updated_at_ms),
        "startedAt": _time(record.started_at_ms),
        "finishedAt": _time(record.finished_at_ms),
        "nextAttemptAt": _time(record.next_attempt_at_ms),
        "retries": record.retries,
        # Its upload is kept as long as its record (docs/reliability.md, "Retrying a failed import").
        "retryable": retry_refusal(record.state, str(error.get("code")) if isinstance(error, dict) else None) is None,
    }
    dumped: dict[str, Any] = _JOB_STATUS.dump(payload)
    return dumped


def request_location(api: Api, req: Request, given: object = None) -> str:
    """The stock location a request names (?location=, or ``given``: the JSON
    body's field), else the default one; 400 request.invalid for a bad one."""
    query = req.query.get("location")
    if given is not None and query is not None and query != given:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"location": ["The query location differs from the body's."]}})
    location = given if given is not None else query
    if location is None:
        return api.default_location
    if not is_valid_location(location):
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"location": [f"Must match {LOCATION_PATTERN}."]}})
    return str(location)


_CSV_TYPES = ("text/csv", "application/csv")


def _content_type(req: Request) -> str:
    return req.headers.get("content-type", "").split(";")[0].strip().lower()


def json_of(req: Request, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: '[' nested thousands deep
        raise ApiError("request.bad_json", instance=req.path) from None


def enqueue_request_of(api: Api, req: Request, data: Any) -> tuple[str, bytes, str]:
    """(batchId, CSV bytes, location) of one JSON shipment ``{batchId, csv, location?}``: a POST's
    JSON body, or one shipment of a bulk request (handlers/bulk.py)."""
    loaded = plainly_valid_enqueue_request(data)
    if loaded is None:
        try:
            loaded = _ENQUEUE_REQUEST.load(data if isinstance(data, dict) else {"_": data})
        except ValidationError as err:
            raise ApiError("request.invalid", instance=req.path, extra={"fields": _field_errors(err)}) from None
    if "batchId" in req.query and req.query["batchId"] != loaded["batchId"]:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"batchId": ["The query batchId differs from the body's."]}})
    return loaded["batchId"], loaded["csv"].encode(), request_location(api, req, loaded.get("location"))


def accepted_body(accepted: Accepted, location: str) -> dict[str, str]:
    """A 202's body (JobAcceptedSchema's strings, as its dump() gives them: tests/unit/test_http_handlers.py
    holds the two to the same bytes), without the schema machinery on every POST."""
    return {"jobId": accepted.job_id, "batchId": accepted.batch_id, "location": location, "state": accepted.state}


def _read_enqueue_body(api: Api, req: Request) -> tuple[str, bytes, str]:
    """(batchId, CSV bytes, location) from a JSON body or a raw text/csv body with ?batchId= (and ?location=)."""
    content_type = _content_type(req)
    if content_type == "application/json":
        return enqueue_request_of(api, req, json_of(req, req.body))
    if content_type in _CSV_TYPES:
        batch_id = req.query.get("batchId", "")
        if not is_valid_batch_id(batch_id):
            raise ApiError("request.invalid", instance=req.path, extra={"fields": {"batchId": [f"Must match {BATCH_ID_PATTERN}."]}})
        return batch_id, req.body, request_location(api, req)
    raise ApiError("request.unsupported_media_type", instance=req.path)


def _field_errors(err: ValidationError) -> dict[str, list[str]]:
    messages = err.messages if isinstance(err.messages, dict) else {"_schema": err.messages}
    out: dict[str, list[str]] = {}
    for key, value in messages.items():
        if key == "_":
            key = "_schema"
            value = ["The body must be a JSON object."]
        out[str(key)] = [str(v) for v in (value if isinstance(value, list) else [value])]
    return out


#: A POST that declares at most this many body bytes has its rate-limit token
#: taken by the enqueue script itself (one Redis round trip per POST): such a
#: body arrives with its headers or a packet or two later, so reading it
#: before the refusal costs next to nothing. A larger or undeclared (chunked)
#: body is refused before a byte of it is read.
RATE_TOKEN_WITH_ENQUEUE_BYTES = 64 * 1024


def rate_token_with_enqueue(req: Request) -> bool:
    """Whether this POST's rate-limit token is taken in the enqueue step (a
    small declared body) rather than before the body is read."""
    declared = whole_number(req.headers.get("content-length", "").strip())
    return declared is not None and declared <= RATE_TOKEN_WITH_ENQUEUE_BYTES


def take_rate_token(api: Api, req: Request) -> None:
    """Before the body of POST /api/imports is read: one POST of the owner's
    rate limit, unless the enqueue step takes it (rate_token_with_enqueue).
    A small POST refused by validation before the enqueue step (bad JSON,
    bad batchId) takes no token: it costs the server what a GET costs."""
    if rate_token_with_enqueue(req):
        return
    wait_ms = api.store.take_rate_token(req.owner or "")
    if wait_ms:
        raise RateLimited.after_ms(wait_ms)


def refuse_operator_key(api: Api, req: Request) -> None:
    """Before an upload's body is read: an operator's key (the ``ops`` scope, without
    ``imports``) does not upload (403 auth.scope_required). Operators act on others'
    imports; stock comes from producers' keys (docs/security.md, "Scopes")."""
    if req.principal is not None and not req.principal.uploads:
        raise ApiError("auth.scope_required")


def refuse_forbidden_location(api: Api, req: Request) -> None:
    """Before the body of POST /api/imports is read: a location the key does
    not allow (404 location.not_found), when the head already names the
    location: ?location=, or a CSV body (whose location is ?location= or the
    default). A JSON body may name its location inside: enqueue checks it then."""
    if req.principal is None or req.principal.locations is None:
        return
    query = req.query.get("location")
    if query is not None:
        if is_valid_location(query):
            req.principal.require(query)
    elif _content_type(req) in _CSV_TYPES:
        req.principal.require(api.default_location)


def enqueue(api: Api, req: Request) -> Response:
    """POST /api/imports: the use case "take an upload" (importer.domain.submit_import)."""
    batch_id, csv, location = _read_enqueue_body(api, req)
    if req.principal is not None:
        req.principal.require(location)  # 404 location.not_found, before anything is recorded
    if len(csv) > api.max_upload_bytes:
        raise ApiError("request.too_large", instance=req.path)
    accepted = submit_import(
        api.store, api.sender, owner=req.owner or "", batch_id=batch_id, csv=csv,
        upload_id=api.uuidgen(), max_rows=api.max_rows, rate_token=rate_token_with_enqueue(req), location=location,
        archive=api.archive,
    )
    return json_response(202, accepted_body(accepted, location), (("Location", f"/api/imports/{accepted.job_id}"),))


def get_import(api: Api, req: Request) -> Response:
    """GET /api/imports/{jobId}: the stored record of the caller's own job."""
    job_id = req.path_params["jobId"]
    owner = req.owner_at(location_of_job(job_id))
    record = api.store.get_owned_job(job_id, owner) if owner else None
    if record is None:
        # The same bytes for "no such job", "another owner's job" and a job at a
        # location the key does not allow (no instance member: it would echo
        # the id, the only thing that could differ).
        raise ApiError("job.not_found")
    return json_response(200, job_status(record))


def get_shipment(api: Api, req: Request) -> Response:
    """GET /api/shipments/{batchId}: the durable history of one of the caller's batches."""
    location = request_location(api, req)
    owner = req.owner_at(location)
    batch_id = req.path_params["batchId"]
    # A batchId no batch can have was never applied: the same 404, without asking the stores.
    record = api.store.get_owned_shipment(batch_id, owner, location) if owner and is_valid_batch_id(batch_id) else None
    if record is None:
        raise ApiError("shipment.not_found")
    payload = {
        "batchId": record.batch_id,
        "location": location,
        "state": "applied",
        "appliedAt": _time(record.applied_at_ms),
        "result": record.result,
        "contentSha256": record.content_sha256,
    }
    return json_response(200, _SHIPMENT.dump(payload))


def health(api: Api, req: Request) -> Response:
    """GET /health: 200 when not closing, Redis answers and accepts writes, and
    the message transport takes messages.

    503 reasons: ``closing``, ``redis_unreachable``, ``redis_refuses_writes``
    (full, read-only, loading...); on RabbitMQ, ``broker_blocked`` (it blocks
    publishers: a memory or disk alarm) and ``broker_unreachable`` (refused,
    closed, or no confirm within the bound). With 200, ``workers``: the live
    workers as the door check sees them. No live worker, or none accepting this
    server's version, is still 200: it is not this process that is sick, and
    its GETs keep serving (its POSTs wait, or answer 503 contract.no_worker).
    With a ledger, ``ledger``: whether it answers and how far it is behind; a
    ledger down or late is still 200 (imports go on, the history is late)."""
    if api.lifecycle.closing:
        return json_response(503, {"status": "unavailable", "reason": "closing"})
    reason = "redis_unreachable"
    try:
        answered = api.store.ping()
        live = list(api.store.live_workers().values()) if answered else []
    except api.unavailable_errors as exc:
        answered = False
        reason = getattr(exc, "reason", reason)
    if answered:
        reason = api.broker_sickness()  # '' when the transport takes messages
    if not answered or reason:
        return json_response(503, {"status": "unavailable", "reason": reason}, retry_after(RETRY_AFTER_UNAVAILABLE_S))
    workers = {
        "alive": len(live),
        "acceptedVersions": sorted(frozenset().union(*live)),
        "producerVersion": api.producer_version,
        "acceptsImports": live_workers_can_run(api.producer_version, live),
    }
    payload: dict[str, Any] = {"status": "ok", "workers": workers}
    if api.operations is not None:
        try:
            paused = sorted(api.operations.intake())
        except api.unavailable_errors:
            paused = []
        payload["intake"] = {"paused": bool(paused), "locations": paused}
    ledger = api.ledger_status()
    if ledger is not None:
        payload["ledger"] = ledger  # late history is no sickness: still 200
        if ledger.get("behind"):
            # [ledger] a location's Redis came back behind the ledger: it takes nothing until
            # brought forward; the others go on (200, as for a paused intake)
            payload["status"], payload["reason"] = "degraded", "store_behind_ledger"
    return json_response(200, payload)


def openapi_document(api: Api, req: Request) -> Response:
    return Response(200, api.openapi_yaml().encode(), (("Content-Type", "application/yaml"),))


def metrics(api: Api, req: Request) -> Response:
    """GET /metrics: Prometheus text, for the holder of the metrics token only.

    With no IMPORTER_METRICS_TOKEN set, no token matches: a deployment never
    exposes queue internals by accident.
    """
    token = bearer_token(req.headers.get("authorization")) or ""
    if api.metrics is None or not api.metrics_token or not hmac.compare_digest(token.encode(), api.metrics_token.encode()):
        raise ApiError("auth.required", (("WWW-Authenticate", 'Bearer realm="importer-metrics"'),))
    body, content_type = api.metrics()
    return Response(200, body, (("Content-Type", content_type),))
