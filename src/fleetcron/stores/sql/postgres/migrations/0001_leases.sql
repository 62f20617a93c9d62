-- Lease rows: one per (namespace, name), never deleted except by prune.
CREATE TABLE IF NOT EXISTS fleetcron_lease (
    namespace   text        NOT NULL,
    name        text        NOT NULL,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    min_until   timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);
