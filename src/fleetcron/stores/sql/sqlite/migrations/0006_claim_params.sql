-- Nothing changes in this dialect's schema: version 6 passes the claim's progress and
-- pause rules as parameters, which here are bound into the claim's query text.
SELECT 1;
