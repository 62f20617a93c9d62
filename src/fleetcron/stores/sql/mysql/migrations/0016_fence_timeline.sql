-- Nothing changes in this dialect. Version 16 folded PostgreSQL's WAL timeline into its
-- fences, so that a promoted standby never issues a fence at or below one the old primary
-- issued. Every dialect keeps one version sequence.
SELECT 1;
