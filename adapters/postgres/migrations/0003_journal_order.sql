-- 0003: the shipments in journal order per location, for the check that Redis is
-- not behind the ledger (the shipment at a location's cursor) and for how far
-- behind it is (the shipments past a journal id): adapters/postgres/ledger.py positions().
CREATE INDEX IF NOT EXISTS ledger_shipments_by_journal ON ledger_shipments (location, journal_ms, journal_seq);
