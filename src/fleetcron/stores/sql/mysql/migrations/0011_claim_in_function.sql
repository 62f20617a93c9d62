-- Nothing changes in this dialect. Version 11 moved PostgreSQL's check of a claim's job
-- definition into its claim function, so the statement sent per claim is a plain call.
-- Every dialect keeps one version sequence.
SELECT 1;
