"""The PostgreSQL stores' session advisory locks, as a capability of the store object
(:mod:`fleetcron.stores.advisory_api`); the driving code is imported when first asked for
(:mod:`fleetcron.stores.sql.advisory` imports the PostgreSQL store module)."""

from __future__ import annotations

from fleetcron.stores.advisory_api import AdvisoryLocks

__all__ = ["AdvisoryCapable"]


class AdvisoryCapable:
    """Mixed into the PostgreSQL stores: they offer session advisory locks."""

    def advisory_locks(self) -> AdvisoryLocks:
        """This server's session advisory locks (lock mode ``advisory``)."""
        from fleetcron.stores.sql.advisory import PostgresAdvisoryLocks

        return PostgresAdvisoryLocks(getattr(self, "store_url"))  # noqa: B009 - the store's
