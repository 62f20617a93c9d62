-- Nothing changes in this dialect. Version 14 gave PostgreSQL functions that decide a
-- batch of claims or of outcomes in one call. Every dialect keeps one version sequence.
SELECT 1;
