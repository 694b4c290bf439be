"""Every key a script reads or writes is one it declared in KEYS (Redis Cluster's rule).

A script that touches an undeclared key works on one node, and on a cluster
too while its slot stays put; while the slot migrates it recreates, on the
old node, a key that already moved (the migration then stops with BUSYKEY,
and the job's data is split). So this is checked on a real server: MONITOR
shows every command a script runs (as client "lua", right after the script's
EVALSHA, which nothing interleaves with), COMMAND GETKEYS names the keys of
each, and each must be among the EVALSHA's KEYS. The store's calls below run
every script of SCRIPT_NAMES through its branches that touch other keys
(retention, the reconciler's stalls and failures, a retry, presence pruning).

fetch.lua is not checked: it is dramatiq's own dispatch script (its keys are
made from its namespace) plus the read of each fetched message's upload.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from importer.adapters.redis.scripts import SCRIPT_NAMES, lua_source
from importer.adapters.settings import Settings
from importer.domain.errors import CsvIssue, PublicError
from importer.domain.ports import EnqueueCall
from importer.domain.shipment import Row, Shipment, bytes_sha256, job_id_for
from tests.integration.support import ProbeStore

pytestmark = pytest.mark.integration

SHIPMENT = Shipment((Row("A", 2), Row("B", 3)))
CSV = b"sku,quantity\nA,2\nB,3\n"
_TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b", b'"': b'"', b"\\": b"\\"}


def _unquote(raw: bytes) -> bytes:
    """One argument as MONITOR prints it (sdscatrepr) back to its bytes."""
    out, i = bytearray(), 0
    while i < len(raw):
        c = raw[i:i + 1]
        if c == b"\\":
            nxt = raw[i + 1:i + 2]
            if nxt == b"x":
                out += bytes([int(raw[i + 2:i + 4], 16)])
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt)
            i += 2
            continue
        out += c
        i += 1
    return bytes(out)


class Monitor:
    """MONITOR on its own connection, read by a thread until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url)
        self.marker = f"declared-keys-end-{uuid.uuid4().hex}"
        self.lines: list[bytes] = []
        self._monitor = self.client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        conn = self._monitor.connection
        while True:
            line = conn.read_response(disable_decoding=True)
            if isinstance(line, bytes):
                if self.marker.encode() in line:
                    return
                self.lines.append(line)

    def stop(self) -> list[bytes]:
        other = redis.Redis.from_url(self.url)
        other.echo(self.marker)
        other.close()
        self._thread.join(timeout=30)
        self._monitor.__exit__(None, None, None)
        self.client.close()
        return self.lines


def _script_groups(lines: list[bytes]) -> Iterator[tuple[list[bytes], list[bytes], list[list[bytes]]]]:
    """(the EVALSHA's arguments, its declared KEYS, the commands its script ran)."""
    current: tuple[list[bytes], list[bytes], list[list[bytes]]] | None = None
    for line in lines:
        head, _, rest = line.partition(b"] ")
        args = [_unquote(m.group(1)) for m in _TOKEN.finditer(rest)]
        if not args:
            continue
        if head.endswith(b" lua"):
            if current is not None:
                current[2].append(args)
            continue
        if current is not None:
            yield current
            current = None
        if args[0].upper() in (b"EVALSHA", b"EVAL", b"EVALSHA_RO", b"EVAL_RO"):
            numkeys = int(args[2])
            current = (args, args[3:3 + numkeys], [])
    if current is not None:
        yield current


@pytest.fixture
def store(redis_url: str) -> Iterator[ProbeStore]:
    client = redis.Redis.from_url(redis_url)
    prefix = "{d" + uuid.uuid4().hex[:12] + "}:"
    settings = Settings(
        key_prefix=prefix, waiting_grace_s=0.2, attempt_lease_s=0.2, stall_margin_s=0.2, time_limit_s=1,
        max_stalls=1, keep_completed_count=1, keep_failed_count=1, keep_completed_age_s=3600, keep_failed_age_s=1,
    )
    probe = ProbeStore(client, settings, clock_ms=lambda: int(time.time() * 1000))
    probe.declare_locations(["paris"])  # as an operator does before the first shipment there
    yield probe
    keys = [key for pattern in (prefix, prefix.replace("}", "@paris}"))
            for key in client.scan_iter(match=pattern.replace("{", "\\{").replace("}", "\\}") + "*", count=1000)]
    if keys:
        client.delete(*keys)
    client.close()


def _enqueue(store: ProbeStore, batch_id: str, location: str = "main", owner: str = "o") -> tuple[str, str]:
    job_id, upload_id = job_id_for(batch_id, location), uuid.uuid4().hex
    out = store.enqueue(job_id=job_id, batch_id=batch_id, owner=owner, content_sha256=SHIPMENT.content_sha256,
                        upload_id=upload_id, csv=CSV)
    assert out.kind == "created", out
    return job_id, upload_id


def _exercise_every_script(store: ProbeStore) -> None:
    """The store's calls, as the producers, workers and reconciler make them."""
    # [door] presence: a worker whose entry expires is pruned by the next one's beat.
    store.announce_worker("gone", frozenset({1, 2}), 1)
    time.sleep(0.01)
    store.announce_worker("w1", frozenset({1}), 60_000)
    assert "w1" in store.live_workers()

    # [ops] the operators' view of a location's queue.
    assert store.location_queue("paris").location == "paris"

    # A bulk's enqueue steps (enqueue_many.lua), at two locations, one job twice.
    bulk = [EnqueueCall(job_id_for(b, loc), b, "o", uuid.uuid4().hex, CSV, bytes_sha256(CSV), rate_token=True,
                        send_later=later)
            for b, loc, later in (("bulk-1", "main", True), ("bulk-2", "paris", False), ("bulk-1", "main", True))]
    assert [o.kind for o in store.enqueue_many(bulk)] == ["created", "created", "exists"]

    # Separate steps, then one step (start_apply), at main and at another location.
    for location in ("main", "paris"):
        job_id, upload_id = _enqueue(store, f"sep-{location}", location)
        store.mark_sent(job_id)
        started = store.start_attempt(job_id, upload_id)
        assert started.kind == "started" and started.started is not None
        assert store.renew([(job_id, started.started.token)]) == 1
        assert store.validated_and_apply(
            job_id=job_id, upload_id=upload_id, attempt=started.attempt, batch_id=f"sep-{location}",
            owner="o", shipment=SHIPMENT, token=started.started.token,
        ).kind == "applied"
        job_id, upload_id = _enqueue(store, f"one-{location}", location)
        outcome, applied = store.start_and_apply(job_id=job_id, upload_id=upload_id, batch_id=f"one-{location}",
                                                 shipment=SHIPMENT)
        assert outcome.kind == "started" and applied is not None and applied.kind == "applied"
        assert store.get_owned_job(job_id, "o") is not None
        assert store.get_owned_receipt(f"one-{location}", "o", 64, location=location) is not None

    # A validation failure (final, with a rejection report), then one a retry can change.
    job_id, upload_id = _enqueue(store, "bad")
    started = store.start_attempt(job_id, upload_id)
    assert started.started is not None
    invalid = PublicError.from_code("csv.invalid", issues=(CsvIssue(2, 2, "csv.bad_quantity", "bad", "x"),))
    assert store.record_failure(job_id=job_id, attempt=started.attempt, final=True, error=invalid, diagnostic="",
                                next_attempt_at_ms=None, token=started.started.token) == "failed"
    assert store.get_owned_rejections(job_id, "o") is not None
    job_id, upload_id = _enqueue(store, "late")
    started = store.start_attempt(job_id, upload_id)
    assert started.started is not None
    late = PublicError.from_code("import.time_limit")
    assert store.record_failure(job_id=job_id, attempt=started.attempt, final=False, error=late, diagnostic="",
                                next_attempt_at_ms=int(time.time() * 1000), token=started.started.token) == "retrying"
    started = store.start_attempt(job_id, upload_id)
    assert started.started is not None
    assert store.record_failure(job_id=job_id, attempt=started.attempt, final=True, error=late, diagnostic="",
                                next_attempt_at_ms=None, token=started.started.token) == "failed"
    retried = store.retry_job(job_id=job_id, owner="o", upload_id=uuid.uuid4().hex,
                              retryable=frozenset({"import.time_limit"}))
    assert retried.kind == "retried", retried

    # The reconciler: a job never sent, a stalled attempt (retrying, then
    # failed after max_stalls), and retention (keep 1 of each; failed age 1 s).
    _enqueue(store, "unsent")
    job_id, upload_id = _enqueue(store, "stalls")
    store.reconcile()
    for _ in range(2):
        assert store.start_attempt(job_id, upload_id).kind == "started"
        time.sleep(0.5)
        store.reconcile()
    assert store.get_job(job_id) is None or store.get_job(job_id).state.value == "failed"  # type: ignore[union-attr]
    time.sleep(1.1)
    for _ in range(3):
        store.reconcile()
    store.remove_worker("w1")

    # [ledger] The exporter's read of the receipts (the first read ahead, the rest when reached),
    # then the trims it makes once the ledger committed the journal
    # (here as if it had committed all of it), then the pruning of the markers.
    entries = store.read_journal("main", (0, 0), 100)
    source = store.receipt_source("main", entries, read_ahead=1)
    assert len(entries) >= 2 and all(source(e) is not None for e in entries)
    now = store.server_time_ms()
    assert store.trim_exported("main", (now + 1, 0), now + 1) >= 2
    store.prune_markers("main", now + 1, recheck_ms=1000)
    # [ledger] Where this Redis stands against the ledger (a batch with a marker, a pruned one, none).
    assert store.redis_position("main", entries[0].batch_id).journal_last >= entries[-1].stream_id
    store.redis_position("main", "never-applied")
    assert store.renew_gate("main", verified=True, ttl_ms=1000) and store.renew_gate("main", verified=False, ttl_ms=1000)


def test_no_script_touches_a_key_it_did_not_declare(store: ProbeStore, redis_url: str) -> None:
    monitor = Monitor(redis_url)
    try:
        _exercise_every_script(store)
    finally:
        lines = monitor.stop()
    names = {hashlib.sha1(lua_source(name).encode()).hexdigest().encode(): name for name in SCRIPT_NAMES}
    prefix = store.settings.key_prefix.encode()
    tag = prefix[:prefix.index(b"}")]
    probe = redis.Redis.from_url(redis_url)
    ran: set[str] = set()
    undeclared: set[tuple[str, str, bytes]] = set()
    for args, declared, commands in _script_groups(lines):
        if not any(key.startswith(tag) for key in declared):
            continue  # another test's script on the shared server
        name = names.get(args[1], "?")
        ran.add(name)
        for command in commands:
            try:
                keys = probe.command_getkeys(*command)
            except redis.ResponseError:
                keys = []  # no key (TIME)
            for key in keys:
                key = key.encode() if isinstance(key, str) else key
                if key not in declared:
                    undeclared.add((name, command[0].decode().upper(), key))
    probe.close()
    assert undeclared == set()
    assert ran >= set(SCRIPT_NAMES) - {"?"}, sorted(set(SCRIPT_NAMES) - ran)
    assert store.client.exists(store.keys.job(job_id_for("sep-main"))) == 0  # retention ran (keep 1)
