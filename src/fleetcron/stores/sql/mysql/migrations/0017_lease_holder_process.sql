-- Nothing changes in this dialect. Version 17 gave SQLite's lease rows their holder's
-- process (pid, start time, boot), so that a holder gone on the one host the store serves
-- is taken over at once. Every dialect keeps one version sequence.
SELECT 1;
