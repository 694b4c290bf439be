"""Use case "take an upload": content identity, record the job once, send its message.

Called by every producer: the HTTP and serverless handlers, the CLI's tools
and the bench. It raises :class:`BatchConflict`, or :class:`NoWorkerAccepts`
when live workers exist and none accepts the producer's contract version
(nothing recorded), or :class:`RateLimited`; the transport maps its code to
an answer. (The per-owner rate limit: the HTTP edge takes it before it reads
a large or undeclared body, and has the recorder take it in the enqueue step
for a small declared one: handlers/api.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from importer.domain.errors import (
    BatchConflict, BatchUnsettled, DomainError, IntakePaused, LedgerUnreachable, LocationNotAllowed, NoWorkerAccepts, RateLimited,
    StoreBehindLedger,
)
from importer.domain.contract import GROUP_MAX
from importer.domain.ledger import ArchiveLookup
from importer.domain.locations import MAIN, location_of_job
from importer.domain.ports import EnqueueCall, EnqueueOutcome, JobRecorder, MessageSender
from importer.domain.shipment import bytes_sha256, content_key, job_id_for


@dataclass(frozen=True)
class Accepted:
    """A job exists for the batch (new, or the one already recorded)."""

    job_id: str
    batch_id: str
    state: str
    location: str = MAIN


def submit_import(
    recorder: JobRecorder, sender: MessageSender, *, owner: str, batch_id: str, csv: bytes, upload_id: str, max_rows: int,
    rate_token: bool = False, location: str = MAIN, archive: ArchiveLookup | None = None,
    send_later: list[tuple[str, str, str]] | None = None,
) -> Accepted:
    """Record the job of ``batch_id`` at ``location`` (once) and send its message.

    A job whose record exists is returned as it is and nothing is sent again.
    On the Redis transport the store writes the message with the record, in
    one atomic step (``outcome.sent``). Otherwise the message is sent after
    the record exists; a producer that dies in between leaves the job in the
    store's *unsent* index, which the workers' reconciler sends later (so does
    a send that failed: the caller answers 503, and a retry of the same POST
    is harmless).

    Content identity, cheapest first: the upload's bytes are hashed (fast,
    whatever the size), and its content key (the rows in canonical order:
    content_key, which sorts them) is computed only when the batch is
    already known with other bytes: the same rows in another order, with
    other line endings or quotes, are the same content (202, the same job);
    other rows are a conflict. A new batch, and a retry of the same bytes,
    cost one hash of the bytes.

    ``rate_token``: the recorder takes the owner's rate-limit token in the
    same step (an HTTP edge that took it before reading the body passes
    False); :class:`RateLimited` when it is used up, nothing recorded.

    ``send_later``: a new job is recorded without its message and its
    (jobId, batchId, uploadId) appended here; the caller sends it with
    others (:func:`send_recorded`) and marks them sent.
    """
    job_id = job_id_for(batch_id, location)
    raw = bytes_sha256(csv)
    outcome = recorder.enqueue(
        job_id=job_id, batch_id=batch_id, owner=owner, content_sha256="", raw_sha256=raw,
        upload_id=upload_id, csv=csv, rate_token=rate_token, send_later=send_later is not None,
    )
    call = EnqueueCall(job_id, batch_id, owner, upload_id, csv, raw, rate_token, send_later is not None)
    return _settled(recorder, sender, call, outcome, location=location, max_rows=max_rows, archive=archive,
                    send_later=send_later)


@dataclass(frozen=True)
class Upload:
    """One shipment of a bulk request, for :func:`submit_imports`."""

    batch_id: str
    csv: bytes
    upload_id: str
    location: str = MAIN
    #: record it without its message, for :func:`send_recorded` (small ones)
    send_later: bool = False


def submit_imports(
    recorder: JobRecorder, sender: MessageSender, uploads: Sequence[Upload], *, owner: str, max_rows: int,
    archive: ArchiveLookup | None = None, send_later: list[tuple[str, str, str]] | None = None,
) -> list[Accepted | Exception]:
    """:func:`submit_import` of each upload (each with its own rate token),
    in order, its first enqueue step made for all of them together
    (:meth:`JobRecorder.enqueue_many`: one round trip where the store can).
    Returns, per upload, what :func:`submit_import` would return, or what it
    would raise: a domain error (a refusal), or what the store or the
    transport raised in its later steps (then each upload after it that
    needs such a step gets the same, untried). A new job whose upload asks
    ``send_later`` is appended to ``send_later`` instead of being sent. What
    the first, shared step raises propagates: nothing is known of any of
    them, and a resend of the same uploads is harmless."""
    calls = [
        EnqueueCall(job_id_for(u.batch_id, u.location), u.batch_id, owner, u.upload_id, u.csv, bytes_sha256(u.csv),
                    rate_token=True, send_later=u.send_later and send_later is not None)
        for u in uploads
    ]
    results: list[Accepted | Exception] = []
    failed: Exception | None = None
    for upload, call, outcome in zip(uploads, calls, recorder.enqueue_many(calls)):
        later = send_later if call.send_later else None
        if failed is not None and _more_to_do(outcome, later is not None):
            results.append(failed)  # the store or the transport failed: not tried (each would wait out its timeout)
            continue
        try:
            results.append(_settled(recorder, sender, call, outcome, location=upload.location, max_rows=max_rows,
                                    archive=archive, send_later=later))
        except DomainError as exc:
            results.append(exc)
        except Exception as exc:  # the store or the transport: this one is not known to be done (503, resend)
            failed = exc
            results.append(exc)
    return results


def _more_to_do(outcome: EnqueueOutcome, later: bool) -> bool:
    """The first enqueue step's outcome needs more calls to the store or the transport."""
    return outcome.kind in ("content_needed", "ask_ledger") or (outcome.kind == "created" and not outcome.sent and not later)


def _settled(
    recorder: JobRecorder, sender: MessageSender, call: EnqueueCall, outcome: EnqueueOutcome, *, location: str,
    max_rows: int, archive: ArchiveLookup | None, send_later: list[tuple[str, str, str]] | None,
) -> Accepted:
    """From the first enqueue step's outcome to the job accepted (or the
    refusal raised): the content compared, the ledger asked, the message sent."""
    job_id, batch_id, owner, upload_id, csv, raw = call.job_id, call.batch_id, call.owner, call.upload_id, call.csv, call.raw_sha256
    later = send_later is not None
    # Known with other bytes: compare contents. At most a few rounds (the
    # live job may change between two calls: then it is looked at again).
    key = ""
    for _ in range(_CONTENT_ROUNDS):
        if outcome.kind != "content_needed":
            break
        key = key or content_key(csv, max_rows)
        stored = None
        if outcome.stored_upload_id:
            stored_csv = recorder.read_upload(outcome.stored_upload_id, location)
            stored = (outcome.stored_upload_id, content_key(stored_csv, max_rows) if stored_csv is not None else "")
        outcome = recorder.enqueue(
            job_id=job_id, batch_id=batch_id, owner=owner, content_sha256=key,
            raw_sha256=raw, stored_content=stored, upload_id=upload_id, csv=csv, send_later=later,
        )
    if outcome.kind == "ask_ledger":
        outcome = _asked_ledger(recorder, archive, job_id=job_id, batch_id=batch_id, owner=owner, csv=csv,
                                raw=raw, upload_id=upload_id, location=location, max_rows=max_rows, send_later=later)
    if outcome.kind == "paused":
        raise IntakePaused()
    if outcome.kind == "behind":
        raise StoreBehindLedger()
    if outcome.kind == "undeclared":
        raise LocationNotAllowed()  # 404 location.not_found, as for a location the key does not name
    if outcome.kind == "content_needed":
        raise BatchUnsettled()
    if outcome.kind == "rate_limited":
        raise RateLimited.after_ms(outcome.retry_after_ms)
    if outcome.kind == "conflict":
        raise BatchConflict()
    if outcome.kind == "no_worker":
        raise NoWorkerAccepts(outcome.producer_version, outcome.workers_accept)
    if outcome.kind == "created" and not outcome.sent:
        if send_later is not None:
            send_later.append((job_id, batch_id, upload_id))
        else:
            sender.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
            recorder.mark_sent(job_id)
    return Accepted(job_id, batch_id, outcome.state, location)


def _asked_ledger(
    recorder: JobRecorder, archive: ArchiveLookup | None, *, job_id: str, batch_id: str, owner: str, csv: bytes,
    raw: str, upload_id: str, location: str, max_rows: int, send_later: bool = False,
) -> EnqueueOutcome:
    """[ledger] The batch's done marker may have left Redis: the ledger says whether it
    was applied, by whom and with what content. Another owner's, or other content:
    a conflict (409, as with a marker). The same content, or not there: recorded
    (the worker's apply asks the ledger again and replays or applies).
    No ledger answer: LedgerUnreachable (503), nothing recorded."""
    if archive is None:
        raise LedgerUnreachable()
    found = archive.archived(location, [batch_id]).get(batch_id)
    if found is not None and (found.owner != owner or found.content_sha256 != content_key(csv, max_rows)):
        return EnqueueOutcome("conflict")
    return recorder.enqueue(
        job_id=job_id, batch_id=batch_id, owner=owner, content_sha256="", raw_sha256=raw,
        upload_id=upload_id, csv=csv, ledger_asked=True, send_later=send_later,
    )


def send_recorded(
    recorder: JobRecorder, sender: MessageSender, jobs: Sequence[tuple[str, str, str]], *, grouped: bool,
    mark_sent: bool = True,
) -> list[tuple[str, BaseException | None]]:
    """Send the messages of jobs recorded with ``send_later`` (jobId, batchId,
    uploadId), and mark them sent: with ``grouped``, one message of contract
    version 3 per location and per :data:`GROUP_MAX` jobs (the worker runs them
    in one call, each with its own attempt and outcome); otherwise one message
    each. Returns each jobId with what its send raised (None: sent); after a
    send raised, the rest are not tried (each would wait out the store's
    timeout) and get the same exception. A job whose send failed stays in the unsent index, which the workers' reconciler sends:
    it is never lost, and the caller answers 503 (a resend is safe).
    ``mark_sent`` False: the caller's store step already gave them their
    deadlines (the reconciler's re-sends)."""
    outcomes: list[tuple[str, BaseException | None]] = []
    by_location: dict[str, list[tuple[str, str, str]]] = {}
    for job in jobs:
        by_location.setdefault(location_of_job(job[0]), []).append(job)
    step = GROUP_MAX if grouped else 1
    failed: BaseException | None = None
    for located in by_location.values():
        for start in range(0, len(located), step):
            chunk = located[start:start + step]
            if failed is None:
                try:
                    if grouped:
                        sender.send_group(chunk)
                    else:
                        sender.send(job_id=chunk[0][0], batch_id=chunk[0][1], upload_id=chunk[0][2])
                    if mark_sent:
                        recorder.mark_sent_many([job_id for job_id, _, _ in chunk])
                except Exception as exc:  # the transport or the store: the rest are not tried either
                    failed = exc
            outcomes += [(job_id, failed) for job_id, _, _ in chunk]
    return outcomes


#: Calls after a 'content_needed' answer before giving up (503): each round
#: sees a live job replaced since the round before (retention, a new POST).
_CONTENT_ROUNDS = 3
