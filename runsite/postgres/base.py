"""Django's PostgreSQL backend, its pool a `LifoConnectionPool` (runsite/dbpool.py) of
`LazyBeginConnection`s (runsite/postgres/lazy_begin.py: a transaction's BEGIN goes with its
first statement), each with psycopg's prepared-statement cache checked after a failed pipeline
(runsite/postgres/prepared.py).

Django builds its pool from `psycopg_pool.ConnectionPool` with no way to name another class; this
backend builds the same pool (the same connection parameters, `configure` hook and options) from
the subclass, then leaves everything else to Django but how a pooled connection opens a
transaction.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.utils.asyncio import async_unsafe
from psycopg.pq import Format, TransactionStatus
from psycopg_pool import ConnectionPool

from runsite.dbpool import LifoConnectionPool
from runsite.postgres.lazy_begin import LazyBeginConnection, ServerBindingCursor
from runsite.postgres.prepared import check_prepared_statements


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
                connection_class=LazyBeginConnection,
                open=False,  # opened on first use, as Django's
                configure=self._configure_connection,  # type: ignore[attr-defined]
                **options,
            )
            # Threads racing here each build one; the first stored wins (none is open yet).
            pools.setdefault(self.alias, pool)
        return pools[self.alias]

    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        if params.get("cursor_factory") is base.ServerBindingCursor:
            params["cursor_factory"] = ServerBindingCursor
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        conn = super().get_new_connection(conn_params)
        check_prepared_statements(conn)  # (runsite/postgres/prepared.py)
        if isinstance(conn, LazyBeginConnection):
            conn.committed_early = False  # (a pooled connection lent again)
        return conn

    def _commit(self) -> None:
        # A transaction committed with its last statement (LazyBeginConnection.queue_commit):
        # psycopg's commit finds the connection idle and sends nothing.
        self._transaction_ended()
        super()._commit()  # type: ignore[misc]

    def _rollback(self) -> None:
        self._transaction_ended()
        super()._rollback()  # type: ignore[misc]

    def _savepoint_rollback(self, sid: str) -> None:
        super()._savepoint_rollback(sid)  # type: ignore[misc]
        conn = self.connection
        if isinstance(conn, LazyBeginConnection):
            conn.generic_plans = None  # a plan mode sent since the savepoint is undone

    def _transaction_ended(self) -> None:
        conn = self.connection
        if isinstance(conn, LazyBeginConnection):
            conn.committed_early = False

    def _set_autocommit(self, autocommit: bool) -> None:
        conn = self.connection
        if not isinstance(conn, LazyBeginConnection):
            super()._set_autocommit(autocommit)  # type: ignore[misc]
            return
        # psycopg stays in autocommit mode; a transaction is begun by its first statement.
        # Refused inside an open transaction, as psycopg refuses to switch there.
        status = TransactionStatus(conn.pgconn.transaction_status)
        if status != TransactionStatus.IDLE:
            with self.wrap_database_errors:
                raise psycopg.ProgrammingError(
                    f"can't change 'autocommit' now: connection in transaction status {status.name}"
                )
        conn.begin_pending = not autocommit

    @async_unsafe
    def create_cursor(self, name: str | None = None) -> Any:
        if name and isinstance(self.connection, LazyBeginConnection):
            # Django makes a named cursor holdable when psycopg's autocommit is on, which
            # here it always is: hold it only outside a transaction, as Django means to.
            return self._named_cursor(name)
        return super().create_cursor(name)

    def _named_cursor(self, name: str) -> Any:
        withhold = self.get_autocommit()
        if self.settings_dict["OPTIONS"].get("server_side_binding") is not True:
            cursor = base.ServerSideCursor(  # type: ignore[call-arg]
                self.connection, name=name, scrollable=False, withhold=withhold
            )
        else:
            cursor = self.connection.cursor(name, scrollable=False, withhold=withhold)
        tzloader = self.connection.adapters.get_loader(base.TIMESTAMPTZ_OID, Format.TEXT)
        if self.timezone != tzloader.timezone:
            register_tzloader(self.timezone, cursor)
        return cursor
