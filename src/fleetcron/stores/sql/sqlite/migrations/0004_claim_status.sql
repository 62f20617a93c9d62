-- The slot claim answers why a slot was not claimed. PostgreSQL keeps the claim in a
-- function, which its migration 0004 replaces; in this dialect the claim is the query text
-- in queries.sql, so the schema does not change. The version is kept so every dialect has
-- the same list of migrations.
SELECT 1;
