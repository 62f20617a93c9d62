"""The SQL stores: PostgreSQL, MySQL/MariaDB and SQLite.

- :mod:`~fleetcron.stores.sql.runner` — the runner, sync and async: one connection,
  named queries, error translation, the schema check and migrations;
- :mod:`~fleetcron.stores.sql.operations` — the operations, shared by the dialects;
- :mod:`~fleetcron.stores.sql.files` — the dialects' files beside this module:
  ``<dialect>/queries.sql``, ``<dialect>/migrations/`` and ``<dialect>/schema.sql``;
- one module per dialect (``postgres``, ``mysql`` and ``mysql_async``, ``sqlite`` and
  ``sqlite_operations``): how to connect, execute and translate its driver's errors.
"""
