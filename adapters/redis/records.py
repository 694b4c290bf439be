"""What the store reads and writes, decoded: job and shipment records,
rejection reports, events, contract versions, and the dramatiq message types
the store's scripts write or acknowledge."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from redis.typing import XReadResponse, ZSetRangeResponse

from importer.domain.errors import CsvIssue, PublicError
from importer.domain.jobs import JobRecord, JobState, RejectionReport, ShipmentRecord


class QueueStats(NamedTuple):
    """Queue-wide numbers for /metrics, read from Redis at scrape time."""

    waiting: int
    oldest_waiting_age_s: float
    active: int
    counters: dict[str, int]


def text_of(value: bytes | str | None) -> str:
    """A reply value as text ("" for none)."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def bytes_of(value: bytes | str) -> bytes:
    """A reply value as bytes (the store's client does not decode replies: bytes already)."""
    return value if isinstance(value, bytes) else value.encode()


def xread_entries(reply: XReadResponse | None) -> Iterator[tuple[str, dict[Any, Any]]]:
    """(id, fields) of each entry of an XREAD reply, of every stream read. The
    clients here speak RESP2: [[stream, [(id, fields), ...]], ...]."""
    if isinstance(reply, dict):
        raise TypeError("an XREAD reply in RESP3 form: the store's clients speak RESP2")
    for _stream, entries in reply or []:
        for raw_id, fields in entries:
            yield text_of(raw_id), fields


def members_of(reply: ZSetRangeResponse) -> list[str]:
    """The members of a sorted-set range read without scores, as text."""
    members = []
    for item in reply:
        if not isinstance(item, (bytes, str)):
            raise TypeError("a sorted-set range read with scores")
        members.append(text_of(item))
    return members


def scored_members(reply: ZSetRangeResponse) -> Iterator[tuple[str, Any]]:
    """(member, score) of each entry of a sorted-set range read WITHSCORES."""
    for item in reply:
        if isinstance(item, (bytes, str)):
            raise TypeError("a sorted-set range read without scores")
        member, score = item
        yield text_of(member), score


def int_or_none(value: bytes | None) -> int | None:
    return int(value) if value not in (None, b"") else None


def json_or_none(value: bytes | None) -> Any:
    return json.loads(value) if value not in (None, b"") else None


def format_versions(versions: frozenset[int]) -> str:
    """Contract versions as presence.lua stores them: "1,2"."""
    return ",".join(str(v) for v in sorted(versions))


def parse_versions(text: str) -> frozenset[int]:
    return frozenset(int(v) for v in text.split(",") if v.strip().isascii() and v.strip().isdigit())


@cache
def error_json(code: str) -> str:
    return json.dumps(PublicError.from_code(code).to_dict(), separators=(",", ":"))


def job_record(raw: dict[Any, Any]) -> JobRecord:
    f = {text_of(key): value for key, value in raw.items()}
    state = JobState(text_of(f.get("state")))
    return JobRecord(
        id=text_of(f.get("id")),
        batch_id=text_of(f.get("batchId")),
        owner=text_of(f.get("owner")),
        state=state,
        attempt=int(f.get("attempt") or 0),
        progress=json_or_none(f.get("progress")),
        result=json_or_none(f.get("result")),
        error=json_or_none(f.get("error")),
        created_at_ms=int(f.get("createdAt") or 0),
        updated_at_ms=int(f.get("updatedAt") or 0),
        started_at_ms=int_or_none(f.get("startedAt")),
        finished_at_ms=int_or_none(f.get("finishedAt")),
        next_attempt_at_ms=int_or_none(f.get("nextAttemptAt")) if state is JobState.RETRYING else None,
        content_sha256=text_of(f.get("contentSha256")),
        upload_id=text_of(f.get("uploadId")),
        retries=int(f.get("retries") or 0),
        traceparent=text_of(f.get("traceparent")),
    )


def shipment_record(raw: dict[Any, Any]) -> ShipmentRecord:
    f = {text_of(key): value for key, value in raw.items()}
    return ShipmentRecord(
        batch_id=text_of(f.get("batchId")),
        owner=text_of(f.get("owner")),
        applied_at_ms=int(f.get("appliedAt") or 0),
        result=json.loads(f["result"]),
        content_sha256=text_of(f.get("contentSha256")),
        job_id=text_of(f.get("jobId")),
    )


def report_json(error: PublicError) -> str:
    """The rejection report as stored: {"found": n, "issues": [[line, column, code, message, value], ...]}."""
    if not error.issues:
        return ""
    issues = [[i.line, i.column, i.code, i.message, i.value] for i in error.issues]
    return json.dumps({"found": error.issues_found, "issues": issues}, separators=(",", ":"), ensure_ascii=False)


def rejection_report(job_id: str, raw: bytes) -> RejectionReport:
    data = json.loads(raw)
    issues = tuple(CsvIssue(int(i[0]), i[1], str(i[2]), str(i[3]), str(i[4])) for i in data["issues"])
    return RejectionReport(job_id, issues, int(data["found"]))


@dataclass(frozen=True)
class OutgoingMessage:
    """A job's dramatiq message, encoded, with the keys dramatiq's Redis broker
    keeps it under (see adapters/dramatiq/producer.py, ImportQueue.redis_message)."""

    queue_key: str
    messages_key: str
    redis_message_id: str
    data: bytes


#: (jobId, batchId, uploadId) -> the message to write with the job record.
MessageWriter = Callable[[str, str, str, str], OutgoingMessage]  # jobId, batchId, uploadId, traceparent ('': none)


@dataclass(frozen=True)
class OutgoingGroup:
    """A group message (contract version 3) whose jobs a script fills in: its
    encoded bytes are ``head``, the entries of the jobs it carries (``entry``),
    joined by commas, then ``tail``; kept as :class:`OutgoingMessage` is."""

    queue_key: str
    messages_key: str
    redis_message_id: str
    head: bytes
    tail: bytes


#: jobId of one of its jobs (the location's queue), traceparent -> a group message to fill.
GroupWriter = Callable[[str, str], OutgoingGroup]


def group_entry(job_id: str, batch_id: str, upload_id: str) -> bytes:
    """One job's entry in a group message's list, as dramatiq's JSON encoder writes it."""
    return json.dumps({"jobId": job_id, "batchId": batch_id, "uploadId": upload_id}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class QueueAck:
    """dramatiq's acknowledgement of one fetched message, made by start_apply.lua
    in the step that ends the attempt (see adapters/dramatiq/handover.py, MessageHandover):
    the keys dramatiq's Redis broker keeps it under, and what to call once done."""

    acks_key: str
    messages_key: str
    heartbeats_key: str
    redis_message_id: str
    worker_id: str
    #: Called when the script acknowledged the message (dramatiq's consumer then skips its own ack).
    acknowledged: Callable[[], None]


def event_dict(stream_id: str, fields: dict[Any, Any]) -> dict[str, Any]:
    """One entry of an events stream as the API, the console and the observer show it."""
    f = {text_of(k): text_of(v) for k, v in fields.items()}
    try:
        data = json.loads(f.get("data") or "{}")
    except ValueError:
        data = {}
    return {
        "id": stream_id,
        "event": f.get("event", ""),
        "jobId": f.get("jobId", ""),
        "batchId": f.get("batchId", ""),
        "attempt": int(f.get("attempt") or 0),
        "data": data,
    }


def stream_id_key(stream_id: str) -> tuple[int, int]:
    """A Redis stream id ('<ms>-<seq>') as the pair streams are ordered by."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def stream_events(entry_id: str, fields: dict[Any, Any]) -> list[dict[str, Any]]:
    """The events of one entry of P:events or of a job's own stream
    P:events:<jobId>, in order, each under its own id (common.lua, emit): those
    of the entry's numbered fields (event.1, attempt.1, data.1, ...) first,
    then its own; an earlier event without an attempt of its own has the
    entry's. The call gave its events consecutive ids, the entry's own
    the last: of an entry of n events, the i-th has the entry's sequence
    number less n - i. An entry that names them (id.1, ...: written before
    the ids were left implicit, or under an id the server chose) is read as
    it says."""
    f = {text_of(k): v for k, v in fields.items()}
    earlier = 0
    while f"event.{earlier + 1}" in f:
        earlier += 1
    ms, seq = stream_id_key(entry_id)
    events = []
    for i in range(1, earlier + 1):
        named = f.get(f"id.{i}")
        events.append(event_dict(text_of(named) if named is not None else f"{ms}-{seq - earlier - 1 + i}", {
            "event": f.get(f"event.{i}"), "jobId": f.get("jobId"), "batchId": f.get("batchId"),
            "attempt": f.get(f"attempt.{i}", f.get("attempt")), "data": f.get(f"data.{i}"),
        }))
    events.append(event_dict(entry_id, f))
    return events


def events_after(entries: Iterable[tuple[str, dict[Any, Any]]], after_id: str) -> list[dict[str, Any]]:
    """The events of stream entries read after ``after_id`` (XREAD), less those
    up to it: an entry holds every event of one job's script call, and a reader
    that resumes after an event inside an entry reads that entry again."""
    after = stream_id_key(after_id)
    return [event for entry_id, fields in entries for event in stream_events(entry_id, fields)
            if stream_id_key(event["id"]) > after]
