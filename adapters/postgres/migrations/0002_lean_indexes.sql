-- 0002: fewer indexes on the movements, the ledger's largest table, to halve
-- PostgreSQL's work per exported line (5 B-trees per line become 2). The lists
-- that are not by SKU or by batch walk the shipments newest first and join their
-- lines by primary key instead (adapters/postgres/ledger.py list_movements).
DROP INDEX IF EXISTS ledger_movements_by_sku_anywhere;
DROP INDEX IF EXISTS ledger_movements_by_owner;
DROP INDEX IF EXISTS ledger_movements_by_time;

-- The shipments in the order the lists read them: newest first, ties by
-- location then batchId, both descending (one owner's; every owner's).
DROP INDEX IF EXISTS ledger_shipments_by_owner;
DROP INDEX IF EXISTS ledger_shipments_by_time;
CREATE INDEX ledger_shipments_by_owner ON ledger_shipments (owner, applied_at_ms DESC, location DESC, batch_id DESC);
CREATE INDEX ledger_shipments_newest ON ledger_shipments (applied_at_ms DESC, location DESC, batch_id DESC);
