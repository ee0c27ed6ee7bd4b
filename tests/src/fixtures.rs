//! Shared test data.

/// Tables of every common type: built-ins, arrays, an enum, a composite,
/// a range and a domain, in table `t` with primary key `id`.
pub const TYPES_SCHEMA: &str = "
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TYPE pair AS (n int, label text);
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TABLE t (
  id int PRIMARY KEY,
  i2 int2, i4 int4, i8 int8,
  num numeric, num_nan numeric,
  f4 float4, f8 float8, f_nan float8, f_inf float8, f_ninf float4,
  txt text, vc varchar(10), ch char(3),
  raw bytea, flag bool,
  d date, d_bc date, tm time, tmz timetz, ts timestamp, tstz timestamptz, iv interval,
  u uuid, js json, jsb jsonb,
  ints int4[], texts text[], moods mood[],
  m mood, comp pair, rng int4range, dom positive
)";

/// One row of every type in `t`; replace `ID` with the key.
pub const TYPES_ROW: &str = "
INSERT INTO t VALUES (ID,
  -32768, 2147483647, 9223372036854775807,
  '12345678901234567890.123456789', 'NaN',
  0.1, 1.5e300, 'NaN', 'Infinity', '-Infinity',
  E'h\\u00e9\\tllo \"q\"\\n', 'short', 'ab',
  '\\xdeadbeef', true,
  '2024-02-29', '0044-03-15 BC', '13:14:15.123456', '13:14:15+05:30', '2024-02-29 13:14:15.5', '2024-02-29 13:14:15.5+02',
  '1 year 2 months 3 days 04:05:06.5',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"b\": 1, \"a\": [1, 2.50]}', '{\"b\": 1, \"a\": [1, 2.50]}',
  '{1,NULL,3}', '{{\"a b\",c},{d,NULL}}', '{happy,sad}',
  'happy', ROW(1, 'x'), '[1,5)', 7
)";
