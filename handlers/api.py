"""The handlers: enqueue, status, health, spec. Each is ``(Api, Request) -> Response``.

They receive their ports explicitly in :class:`Api`; they never read the
environment or build clients. The WSGI transport (handlers/wsgi.py) and any
other transport only turn their own request shape into :class:`Request`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from marshmallow import ValidationError

from importer.domain.errors import CsvInvalid
from importer.domain.jobs import JobRecord, ShipmentRecord
from importer.domain.shipment import is_valid_batch_id, job_id_for, parse_shipment
from importer.handlers.auth import bearer_token
from importer.handlers.http import Request, Response, json_response, problem
from importer.handlers.schemas import EnqueueRequestSchema, JobAcceptedSchema, JobStatusSchema, ShipmentSchema


# Schemas are stateless once built; building one per request costs more than
# the rest of the handler.
_ENQUEUE_REQUEST = EnqueueRequestSchema()
_JOB_ACCEPTED = JobAcceptedSchema()
_JOB_STATUS = JobStatusSchema()
_SHIPMENT = ShipmentSchema()


class EnqueueOutcomeLike(Protocol):
    kind: str
    state: str
    reason: str
    retry_after_ms: int


class JobStore(Protocol):
    def enqueue(self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes) -> EnqueueOutcomeLike: ...
    def mark_sent(self, job_id: str) -> None: ...
    def get_job(self, job_id: str) -> JobRecord | None: ...
    def get_shipment(self, batch_id: str) -> ShipmentRecord | None: ...
    def ping(self) -> bool: ...


class MessageSender(Protocol):
    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None: ...


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
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    fault: Callable[[str], None] = lambda point: None
    #: Renders Prometheus text: (body, content type). None: /metrics is off.
    metrics: Callable[[], tuple[bytes, str]] | None = None
    #: The bearer token /metrics requires ('' = /metrics is off).
    metrics_token: str = ""
    #: Called when the store was unreachable (counts Redis errors).
    on_store_error: Callable[[], None] = lambda: None


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def job_status(record: JobRecord) -> dict[str, Any]:
    """The public view of a job record (an allow-list: nothing else leaves)."""
    payload = {
        "id": record.id,
        "batchId": record.batch_id,
        "state": record.state,
        "attempt": record.attempt,
        "progress": record.progress,
        "result": record.result,
        "error": record.error,
        "createdAt": _time(record.created_at_ms),
        "updatedAt": _time(record.updated_at_ms),
        "startedAt": _time(record.started_at_ms),
        "finishedAt": _time(record.finished_at_ms),
        "nextAttemptAt": _time(record.next_attempt_at_ms),
    }
    return _JOB_STATUS.dump(payload)


def _read_enqueue_body(req: Request) -> tuple[str, bytes] | Response:
    content_type = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            data = json.loads(req.body)
        except (ValueError, UnicodeDecodeError):
            return problem(400, "request.bad_json", instance=req.path)
        try:
            loaded = _ENQUEUE_REQUEST.load(data if isinstance(data, dict) else {"_": data})
        except ValidationError as err:
            return problem(422, "request.invalid", instance=req.path, fields=_field_errors(err))
        if "batchId" in req.query and req.query["batchId"] != loaded["batchId"]:
            return problem(422, "request.invalid", instance=req.path, fields={"batchId": ["The query batchId differs from the body's."]})
        return loaded["batchId"], loaded["csv"].encode()
    if content_type in ("text/csv", "application/csv"):
        batch_id = req.query.get("batchId", "")
        if not is_valid_batch_id(batch_id):
            return problem(422, "request.invalid", instance=req.path, fields={"batchId": ["Must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$."]})
        return batch_id, req.body
    return problem(415, "request.unsupported_media_type", instance=req.path)


def _field_errors(err: ValidationError) -> dict[str, list[str]]:
    messages = err.messages if isinstance(err.messages, dict) else {"_schema": err.messages}
    out: dict[str, list[str]] = {}
    for key, value in messages.items():
        if key == "_":
            key = "_schema"
            value = ["The body must be a JSON object."]
        out[str(key)] = [str(v) for v in (value if isinstance(value, list) else [value])]
    return out


def content_key(csv: bytes, max_rows: int) -> str:
    """What identifies a batch's content: the canonical hash when the CSV is valid.

    An invalid file cannot be canonicalised; its raw bytes identify it (the
    worker will fail it with its located issues).
    """
    parsed = parse_shipment(csv, max_rows=max_rows)
    if isinstance(parsed, CsvInvalid):
        return "bytes:" + hashlib.sha256(csv).hexdigest()
    return parsed.content_sha256


def enqueue(api: Api, req: Request) -> Response:
    """POST /api/imports: record the job (once per batchId) and send its message."""
    body = _read_enqueue_body(req)
    if isinstance(body, Response):
        return body
    batch_id, csv = body
    if len(csv) > api.max_upload_bytes:
        return problem(413, "request.too_large", instance=req.path)
    owner = req.owner or ""
    job_id = job_id_for(batch_id)
    upload_id = api.uuidgen()
    outcome = api.store.enqueue(
        job_id=job_id, batch_id=batch_id, owner=owner,
        content_sha256=content_key(csv, api.max_rows), upload_id=upload_id, csv=csv,
    )
    if outcome.kind == "rate_limited":
        retry_after = max(1, -(-outcome.retry_after_ms // 1000))
        return problem(429, "request.rate_limited", instance=req.path, headers=(("Retry-After", str(retry_after)),))
    if outcome.kind == "conflict":
        # Same answer whether another owner or other content holds the batchId:
        # nothing about the other shipment is revealed.
        return problem(409, "batch.conflict", instance=req.path)
    if outcome.kind == "created":
        api.fault("before_send")
        api.sender.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
        api.store.mark_sent(job_id)
    accepted = _JOB_ACCEPTED.dump({"jobId": job_id, "batchId": batch_id, "state": outcome.state})
    return json_response(202, accepted, (("Location", f"/api/imports/{job_id}"),))


def get_import(api: Api, req: Request) -> Response:
    """GET /api/imports/{jobId}: the stored record of the caller's own job."""
    record = api.store.get_job(req.path_params["jobId"])
    if record is None or record.owner != req.owner:
        return not_found_job(req)
    return json_response(200, job_status(record))


def get_shipment(api: Api, req: Request) -> Response:
    """GET /api/shipments/{batchId}: the durable history of one of the caller's batches."""
    record = api.store.get_shipment(req.path_params["batchId"])
    if record is None or record.owner != req.owner:
        return problem(404, "shipment.not_found")
    payload = {
        "batchId": record.batch_id,
        "state": "applied",
        "appliedAt": _time(record.applied_at_ms),
        "result": record.result,
        "contentSha256": record.content_sha256,
    }
    return json_response(200, _SHIPMENT.dump(payload))


def not_found_job(req: Request) -> Response:
    # Identical for "no such job" and "another owner's job" (no instance
    # member: it would echo the id and is the only thing that could differ).
    return problem(404, "job.not_found")


def health(api: Api, req: Request) -> Response:
    """GET /health: 200 when not closing and Redis answers PING."""
    if api.lifecycle.closing:
        return json_response(503, {"status": "unavailable", "reason": "closing"})
    try:
        answered = api.store.ping()
    except api.unavailable_errors:
        answered = False
    if not answered:
        return json_response(503, {"status": "unavailable", "reason": "redis_unreachable"})
    return json_response(200, {"status": "ok"})


def openapi_document(api: Api, req: Request) -> Response:
    return Response(200, api.openapi_yaml().encode(), (("Content-Type", "application/yaml"),))


def metrics(api: Api, req: Request) -> Response:
    """GET /metrics: Prometheus text, for the holder of the metrics token only.

    With no IMPORTER_METRICS_TOKEN set, no token matches: a deployment never
    exposes queue internals by accident.
    """
    token = bearer_token(req.headers.get("authorization")) or ""
    if api.metrics is None or not api.metrics_token or not hmac.compare_digest(token.encode(), api.metrics_token.encode()):
        return problem(401, "auth.required", headers=(("WWW-Authenticate", 'Bearer realm="importer-metrics"'),))
    body, content_type = api.metrics()
    return Response(200, body, (("Content-Type", content_type),))
