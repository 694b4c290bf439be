"""The Redis apply script and the pure apply rule agree on every sequence of
shipments, replays, conflicts and overflows (hypothesis, real Redis): outcome,
stock, generation, journal, and each batch's stored receipt, byte for byte."""

from __future__ import annotations

import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings, strategies as st

from importer.adapters.settings import Settings
from importer.domain.receipt import encode_receipt
from importer.domain.shipment import Row, Shipment
from importer.domain.stock import MAX_STOCK, StockState, apply_shipment
from tests.integration.support import ProbeStore

pytestmark = pytest.mark.integration

SKUS = ["A", "B", "C", "D"]
QUANTITIES = st.sampled_from([1, 2, 7, 1_000_000, MAX_STOCK // 2, MAX_STOCK - 1, MAX_STOCK])
shipments = st.dictionaries(st.sampled_from(SKUS), QUANTITIES, min_size=1, max_size=4).map(
    lambda rows: Shipment(tuple(Row(sku, qty) for sku, qty in rows.items()))
)
steps = st.lists(st.tuples(st.sampled_from(["b1", "b2", "b3"]), shipments), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps)
def test_redis_script_and_pure_rule_agree(redis_url: str, sequence: list[tuple[str, Shipment]]) -> None:
    client = redis.Redis.from_url(redis_url)
    prefix = "{p" + uuid.uuid4().hex[:12] + "}:"
    store = ProbeStore(client, Settings(key_prefix=prefix), clock_ms=lambda: 1_000)
    state = StockState()
    try:
        for n, (batch_id, shipment) in enumerate(sequence):
            job_id = f"job-{n}"
            # An active job record, as start.lua leaves it.
            client.hset(store.keys.job(job_id), mapping={"id": job_id, "batchId": batch_id, "state": "active", "attempt": 1})
            got = store.validated_and_apply(
                job_id=job_id, upload_id="0" * 32, attempt=1, batch_id=batch_id, owner="o", shipment=shipment
            )
            state, expected = apply_shipment(state, batch_id, shipment, owner="o", job_id=job_id, now_ms=1_000)
            assert got.kind == expected.kind
            if expected.result is not None:
                assert got.result == expected.result.to_dict()
            assert client.hget(store.keys.job(job_id), "state") == (b"completed" if expected.result else b"failed")
            if expected.receipt is not None:
                # applied: what this step changed; replayed: the original's receipt, untouched.
                assert client.get(store.keys.receipt(batch_id)) == encode_receipt(expected.receipt)

        raw = client.hgetall(store.keys.stock)
        assert {k.decode(): int(v) for k, v in raw.items()} == state.stock
        assert store.generation() == state.generation
        assert client.xlen(store.keys.journal) == len(state.journal)
        for batch_id in ("b1", "b2", "b3"):
            marker = state.done.get(batch_id)
            stored = client.get(store.keys.receipt(batch_id))
            assert stored == (encode_receipt(marker.receipt) if marker else None)
    finally:
        keys = list(client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
        if keys:
            client.delete(*keys)


def test_large_shipments_agree_across_the_scripts_chunks(redis_url: str) -> None:
    """9,001 rows: more than two of apply.lua's HMGET chunks (4,000 SKUs) and its HSET
    chunks (2,000 pairs), on stock that already holds values near the cap."""
    client = redis.Redis.from_url(redis_url)
    prefix = "{p" + uuid.uuid4().hex[:12] + "}:"
    store = ProbeStore(client, Settings(key_prefix=prefix), clock_ms=lambda: 1_000)
    state = StockState()
    first = Shipment(tuple(Row(f"S{n:05d}", MAX_STOCK - 11 if n % 3 == 0 else n + 1) for n in range(9_001)))
    second = Shipment(tuple(Row(f"S{n:05d}", 7 + n % 5) for n in range(0, 9_001, 2)))
    try:
        for n, (batch_id, shipment) in enumerate([("b1", first), ("b2", second)]):
            job_id = f"job-{n}"
            client.hset(store.keys.job(job_id), mapping={"id": job_id, "batchId": batch_id, "state": "active", "attempt": 1})
            got = store.validated_and_apply(
                job_id=job_id, upload_id="0" * 32, attempt=1, batch_id=batch_id, owner="o", shipment=shipment
            )
            state, expected = apply_shipment(state, batch_id, shipment, owner="o", job_id=job_id, now_ms=1_000)
            assert got.kind == expected.kind == "applied"
            assert client.get(store.keys.receipt(batch_id)) == encode_receipt(expected.receipt)
        raw = client.hgetall(store.keys.stock)
        assert len(raw) == 9_001
        assert {k.decode(): int(v) for k, v in raw.items()} == state.stock
    finally:
        keys = list(client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
        if keys:
            client.delete(*keys)
