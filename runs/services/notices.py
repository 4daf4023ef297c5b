"""Cancel notices: the NOTIFYs that tell a worker a run it holds was cancelled, and the ones a
request keeps until its answer has gone.

A cancel of a running run tells the worker that holds it on that worker's channel
(`cancel_channel`), in the cancel's own statement, so that PostgreSQL delivers it at the
COMMIT. The notice only wakes the worker sooner: the cancel is committed with the run's lease
cleared (or the run deleted), so a worker that never hears it is fenced out at its next write
or heartbeat (`LeaseLost`, `RunCancelled`, `run_heartbeat`) and stops the run there.

At that COMMIT PostgreSQL signals the worker's listening backend, which wakes the worker's
listener thread, on the cores the request's answer still needs. Within `cancel_notices_held()`,
a thread's cancel notices are kept instead, from the commit of the transaction that wrote them,
for the server to `send_cancel_notices` once its answer has left (runsite/handlers.py): the
harness's cancel answers ~0.3-0.5 ms sooner on two cores, and its worker hears it ~3 ms later
(docs/benchmarks.md).

Only the NOTIFYs to workers are held. Queue wake-ups go out at commit (a worker should claim a
new run at once), and a worker in the web process itself is poked at commit
(`core._notify_in_process`): it needs no database round trip.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from uuid import UUID

from django.db import connection, transaction

from runs.holds import Hold

logger = logging.getLogger("runs")

Notice = tuple[str, str]  # (channel, payload)

CANCEL_CHANNEL = "runsite_cancel"
# A cancel notice goes to the channel of the worker that holds the run (`cancel_channel`), so
# that a cancel wakes that worker alone; every worker listens on its own and on CANCEL_CHANNEL
# (where a notice whose worker is not known goes). PostgreSQL's identifiers are 63 bytes at most.
_OWNER_DIGITS = 16


def cancel_channel(owner: str | None) -> str:
    """The channel a cancel notice for a run held by the worker `owner` (its lease owner) goes
    to: `runsite_cancel_<first 16 hex digits of the owner's MD5>` (a name, not a secret; the
    statement that writes the notice computes the same in SQL, `cancel_channel_sql`), or
    CANCEL_CHANNEL when no worker holds it."""
    if not owner:
        return CANCEL_CHANNEL
    digest = hashlib.md5(owner.encode(), usedforsecurity=False).hexdigest()
    return f"{CANCEL_CHANNEL}_{digest[:_OWNER_DIGITS]}"


def is_cancel_channel(channel: str) -> bool:
    """Whether a notice on `channel` is a cancel notice (the shared channel or a worker's)."""
    return channel == CANCEL_CHANNEL or channel.startswith(f"{CANCEL_CHANNEL}_")


def cancel_channel_sql(owner_column: str) -> str:
    """`cancel_channel` of a lease owner column, as a SQL expression (PostgreSQL)."""
    return (
        f"CASE WHEN {owner_column} IS NULL OR {owner_column} = '' THEN '{CANCEL_CHANNEL}'"
        f" ELSE '{CANCEL_CHANNEL}_' || left(md5({owner_column}), {_OWNER_DIGITS}) END"
    )


def cancel_notice(run_id: UUID, action: str) -> str:
    """What the cancel channel says of a run whose cancel this transaction applies (ended or
    deleted it): `<run id>=<action>`. The worker running it then stops without asking the
    database (`engine/worker.py`); a bare run id (an older version's) asks it to apply one."""
    return f"{run_id}={action}"


# Any number of notices in one statement whose text does not change with their number.
SEND_SQL = "SELECT count(pg_notify(c, p)) FROM unnest(%s::text[], %s::text[]) AS n(c, p)"


def cancel_notices_held() -> AbstractContextManager[list[Notice]]:
    """Within the block, the cancel notices this thread's committed transactions would send
    are kept in the list yielded instead (see the module's docstring), for the caller to
    `send_cancel_notices` after its answer. Raising out of the block sends them at once."""
    return _held.held()


def holding() -> bool:
    """Whether this thread keeps its cancel notices (`cancel_notices_held`)."""
    return _held.kept() is not None


def keep(notices: Sequence[Notice]) -> None:
    """Keep cancel notices this thread holds (`holding()`) from the current transaction's
    commit on, instead of sending them with it (dropped if it rolls back)."""
    kept = _held.kept()
    assert kept is not None, "keep() outside cancel_notices_held()"
    if notices:
        transaction.on_commit(lambda: kept.extend(notices))


def sent_now(notices: Sequence[Notice]) -> list[Notice]:
    """Of `notices`, to go out with the current transaction's commit, those its statement must
    send: all of them unless this thread holds its cancel notices; then all but those, which
    are kept (`keep`)."""
    if not holding():
        return list(notices)
    keep([n for n in notices if is_cancel_channel(n[0])])
    return [n for n in notices if not is_cancel_channel(n[0])]


def send_cancel_notices(notices: Sequence[Notice]) -> None:
    """Send kept notices in one statement of their own. A failure is logged, not raised: the
    cancels are committed, and their workers find them at their next write or heartbeat."""
    if not notices:
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(SEND_SQL, [[c for c, _ in notices], [p for _, p in notices]])
    except Exception:
        logger.warning(
            "%d cancel notice(s) to workers not sent; the workers find the cancels at their"
            " next write or heartbeat",
            len(notices),
            exc_info=True,
        )


_held = Hold(send_cancel_notices)
