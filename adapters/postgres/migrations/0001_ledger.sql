-- 0001: the ledger. Every primary key starts with the location, so the
-- tables distribute by location on a distributed PostgreSQL (Citus:
-- create_distributed_table(..., 'location')) without change.

-- One row per shipment applied at a location: what its done marker and its
-- journal entry held in Redis. `result` is the stored result JSON as the
-- done marker holds it (answers stay byte-identical). `applied_at_ms` is
-- the Redis server's clock at the apply; (journal_ms, journal_seq) the
-- journal entry's stream id, two integers, never compared as a string.
CREATE TABLE ledger_shipments (
    location        text    NOT NULL,
    batch_id        text    NOT NULL,
    owner           text    NOT NULL,
    job_id          text    NOT NULL,
    content_sha256  text    NOT NULL,
    row_count       integer NOT NULL,
    result          text    NOT NULL,
    applied_at_ms   bigint  NOT NULL,
    journal_ms      bigint  NOT NULL,
    journal_seq     bigint  NOT NULL,
    -- 'whole': every line of the receipt is in ledger_movements;
    -- 'missing': the receipt had been deleted from Redis before the export.
    receipt         text    NOT NULL CHECK (receipt IN ('whole', 'missing')),
    exported_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (location, batch_id)
);
CREATE INDEX ledger_shipments_by_owner ON ledger_shipments (owner, applied_at_ms DESC, location, batch_id);
CREATE INDEX ledger_shipments_by_time ON ledger_shipments (location, applied_at_ms DESC, batch_id);

-- One row per line of an applied shipment, in file order (line 1 first):
-- the SKU's stock just before, the quantity added, the stock just after.
CREATE TABLE ledger_movements (
    location       text    NOT NULL,
    batch_id       text    NOT NULL,
    line           integer NOT NULL,
    sku            text    NOT NULL,
    before         bigint  NOT NULL,
    quantity       bigint  NOT NULL,
    after          bigint  NOT NULL,
    owner          text    NOT NULL,
    applied_at_ms  bigint  NOT NULL,
    journal_ms     bigint  NOT NULL,
    journal_seq    bigint  NOT NULL,
    PRIMARY KEY (location, batch_id, line)
);
-- The reads, newest first by (applied_at_ms, location, batch_id, line): a SKU's
-- history at a location (and stock as of a time), every owner's by SKU, one owner's.
CREATE INDEX ledger_movements_by_sku ON ledger_movements (location, sku, applied_at_ms DESC, batch_id DESC);
CREATE INDEX ledger_movements_by_sku_anywhere ON ledger_movements (sku, applied_at_ms DESC, location, batch_id, line);
CREATE INDEX ledger_movements_by_owner ON ledger_movements (owner, applied_at_ms DESC, location, batch_id, line);
CREATE INDEX ledger_movements_by_time ON ledger_movements (applied_at_ms DESC, location, batch_id, line);

-- Per location, the stream id of the last journal entry committed here.
-- The exporter locks its row (FOR UPDATE SKIP LOCKED): one exporter per
-- location at a time, however many run.
CREATE TABLE ledger_export_cursors (
    location     text   PRIMARY KEY,
    journal_ms   bigint NOT NULL,
    journal_seq  bigint NOT NULL,
    shipments    bigint NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
