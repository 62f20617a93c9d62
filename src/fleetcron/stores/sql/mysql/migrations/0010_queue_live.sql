-- Nothing changes in this dialect. Version 10 gave PostgreSQL's queue plans that do not
-- depend on its statistics (a `live` column leading the claim index, a dedupe index of
-- keyed items only) and its hot queue operations as functions; here the claim names its
-- index already. Every dialect keeps one version sequence.
SELECT 1;
