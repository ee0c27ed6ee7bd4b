-- Sample publisher for docker-compose.yml.
CREATE ROLE walbridge LOGIN REPLICATION PASSWORD 'walbridge';
CREATE TABLE items (id bigserial PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
INSERT INTO items (name, price) VALUES ('tea', 3.50), ('coffee', 4.20);
GRANT SELECT ON items TO walbridge;
CREATE PUBLICATION app_pub FOR TABLE items;
