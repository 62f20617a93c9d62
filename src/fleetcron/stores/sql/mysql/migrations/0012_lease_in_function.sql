-- Nothing changes in this dialect. Version 12 made PostgreSQL's lease acquire and release
-- functions, so the statements sent per lock cycle are plain calls. Every dialect keeps
-- one version sequence.
SELECT 1;
