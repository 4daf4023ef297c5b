"""psycopg's prepared-statement cache, kept true to the server after a failed pipeline.

psycopg names a statement as prepared when it queues the statement's Parse, and checks the
outcome only for a statement it had never seen before. A statement it had already run without
preparing (counted towards `prepare_threshold`) and prepares now, in a pipeline that fails
before its Parse (an earlier statement raised, so the server skipped the rest), stays named in
the cache although the server never prepared it: every later execution on that connection
fails with `prepared statement "_pg3_…" does not exist` (psycopg 3.3.9).

Runsite's hot writes run in pipelines (`runs/rows.py`: statements sent together, the plan mode
and sometimes the `COMMIT` with them), so a hot write that failed at the moment a statement
behind it reached the threshold broke every call of that statement after it on that connection
(tests/test_prepared.py; the plan mode and the `COMMIT` were such statements until they became
the connection's own commands, which psycopg does not prepare). Here such a statement's outcome is checked as a new one's is: when it
failed or was skipped, psycopg forgets the name and prepares the statement again next time.
"""

from __future__ import annotations

from typing import Any

from psycopg._preparing import Key, Prepare, PrepareManager
from psycopg._queries import PostgresQuery


class CheckedPrepareManager(PrepareManager):
    """psycopg's cache, with every statement prepared now checked against its outcome."""

    def maybe_add_to_cache(self, query: PostgresQuery, prep: Prepare, name: bytes) -> Key | None:
        key = self.key(query)
        counted = prep is Prepare.SHOULD and self.prepare_threshold is not None
        counted = counted and key in self._counts
        added = super().maybe_add_to_cache(query, prep, name)
        # psycopg returns a key (to check the statement's results against) only for a statement
        # it had not counted: return it too for one it has just moved from counted to named.
        return key if counted else added


def check_prepared_statements(conn: Any) -> None:
    """Give the psycopg connection `conn` the checked cache, with what its own holds (settings,
    counts, names); a connection that has it already keeps it as it is."""
    if not isinstance(conn._prepared, CheckedPrepareManager):
        checked = CheckedPrepareManager()
        checked.__dict__.update(vars(conn._prepared))
        conn._prepared = checked
