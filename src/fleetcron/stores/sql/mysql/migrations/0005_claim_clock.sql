-- Nothing changes in this dialect. Version 5 moved PostgreSQL's claim to a function of
-- a new name that reads no session setting; every dialect keeps one version sequence.
SELECT 1;
