"""The exporter's reads of the outbox on a real Redis-compatible server: the
receipts of a batch of journal entries, their first pieces read ahead in one
call within a byte bound (receipt_heads.lua), the rest when the exporter
reaches them."""

from __future__ import annotations

import pytest

from importer.adapters.redis.outbox import READ_AHEAD
from importer.domain.shipment import job_id_for
from tests.integration.support import ProbeStore
from tests.integration.test_declared_keys import SHIPMENT, _enqueue, store  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("read_ahead", [READ_AHEAD, 1, 0])
def test_each_entry_gets_its_own_receipt_whatever_was_read_ahead(store: ProbeStore, read_ahead: int) -> None:  # noqa: F811
    batches = [f"ahead-{n}" for n in range(4)]
    for batch_id in batches:
        job_id, upload_id = _enqueue(store, batch_id)
        _, applied = store.start_and_apply(job_id=job_id, upload_id=upload_id, batch_id=batch_id, shipment=SHIPMENT)
        assert applied is not None and applied.kind == "applied"
    k = store.partition("main")
    stored = {batch_id: store.client.get(k.receipt(batch_id)) for batch_id in batches}
    store.client.delete(k.receipt("ahead-2"))  # an operator deleted it: the exporter marks it missing
    entries = store.read_journal("main", (0, 0), 100)
    assert [e.batch_id for e in entries] == batches and job_id_for("ahead-0") == entries[0].job_id

    source = store.receipt_source("main", entries, read_ahead=read_ahead)
    got = {}
    for entry in entries:
        pieces = source(entry)
        got[entry.batch_id] = None if pieces is None else b"".join(pieces)
    # Each receipt is its own, stock before each line included (each batch saw the one before).
    assert got == {**stored, "ahead-2": None}
    assert got["ahead-0"] == b"A,0,2\nB,0,3\n" and got["ahead-1"] == b"A,2,2\nB,3,3\n"
