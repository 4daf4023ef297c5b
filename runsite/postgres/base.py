"""Django's PostgreSQL backend, its pool a `LifoConnectionPool` (runsite/dbpool.py).

Django builds its pool from `psycopg_pool.ConnectionPool` with no way to name another class; this
backend builds the same pool (the same connection parameters, `configure` hook and options) from
the subclass, then leaves everything else to Django.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

from runsite.dbpool import LifoConnectionPool


class DatabaseWrapper(base.DatabaseWrapper):
    # The class each alias's pool is built from (bench/pool_order.py compares it with
    # psycopg's own; set it before the pool is first built, or call close_pool()).
    pool_class: type[ConnectionPool] = LifoConnectionPool

    @property
    def pool(self) -> Any:
        options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not options:
            return None
        # Django's own (class-wide, one per alias) and its connection set-up: not in its stubs.
        pools: dict[str, Any] = self._connection_pools  # type: ignore[attr-defined]
        if self.alias not in pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            options = {} if options is True else {**options}
            if self.settings_dict["CONN_HEALTH_CHECKS"]:
                options.setdefault("check", ConnectionPool.check_connection)
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets autocommit itself later
            pool = self.pool_class(
                kwargs=connect_kwargs,
                open=False,  # opened on first use, as Django's
                configure=self._configure_connection,  # type: ignore[attr-defined]
                **options,
            )
            # Threads racing here each build one; the first stored wins (none is open yet).
            pools.setdefault(self.alias, pool)
        return pools[self.alias]
