-- Sample subscriber for docker-compose.yml: the publisher's table (the
-- schema is not replicated) and a role that may apply into it.
CREATE ROLE replicator LOGIN PASSWORD 'replicator';
CREATE TABLE items (id bigserial PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON items TO replicator;
GRANT SET ON PARAMETER session_replication_role TO replicator;
-- Where the sink keeps its position (the role may not use replication origins).
CREATE SCHEMA walbridge AUTHORIZATION replicator;
