"""The rooms of the scheduler; :mod:`fleetcron.scheduler` holds the loop that ties them.

- :mod:`~fleetcron.scheduling.planning` — which slots to claim: each job's next fire time
  in a heap, the catch-up decisions for late slots, the claims and their deadlines.
- :mod:`~fleetcron.scheduling.recovery` — what the ledger says must be claimed again:
  queued runs (trigger, backfill), attempts whose holder vanished, retries that have come.
- :mod:`~fleetcron.scheduling.supervision` — running a claimed attempt: its slot lease and
  keepalive, the executor and its stop sequence, the outcome, abandoned threads.
- :mod:`~fleetcron.scheduling.leadership` — leader mode: the elector that holds the
  namespace's leader lease, with test signals.
- :mod:`~fleetcron.scheduling.definitions` — which definition of a job governs when
  replicas disagree (the stored one), and the conflicts this replica knows of.
"""
