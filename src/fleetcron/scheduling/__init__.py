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
- :mod:`~fleetcron.scheduling.registration` — writing the replica's definitions at start.
- :mod:`~fleetcron.scheduling.handover` — the slots other replicas own, adopted once their
  owner had its chance; the ring's members (:mod:`~fleetcron.scheduling.ownership`).
- :mod:`~fleetcron.scheduling.overlap` — what a refused claim becomes: the ``overlap``
  policy (skip, buffer, cancel the running attempt), not-due and paused slots.
- :mod:`~fleetcron.scheduling.store_clock` — the store's clock, read and estimated.
- :mod:`~fleetcron.scheduling.outage` — the store down and back: the loop's back-off.
- :mod:`~fleetcron.scheduling.finishing` — outcomes of runs ending together, one round trip.
- :mod:`~fleetcron.scheduling.replacement` — a store replaced under the replica.
- :mod:`~fleetcron.scheduling.heartbeat`, :mod:`~fleetcron.scheduling.monitor`,
  :mod:`~fleetcron.scheduling.retention`, :mod:`~fleetcron.scheduling.queues` — beside the
  loop: the replica's row, the health watch and its alerts, retention, queue workers.
- :mod:`~fleetcron.scheduling.options` — :class:`SchedulerOptions`.
"""
