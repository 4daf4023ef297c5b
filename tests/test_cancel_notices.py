"""A cancel notice reaches the worker that holds the run, not every worker.

Every worker LISTENs on its own channel (`services.cancel_channel(owner)`) and on the shared
one. A cancel of a running run tells the run's lease owner on its channel, so one worker wakes
where all of them did (two workers on two cores: a harness cancel 0.2-0.5 ms sooner; a cluster
of many workers no longer wakes each one per cancel). These listen on PostgreSQL as the
workers do, with their own connections, and cancel through every path that tells a worker.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from runs import services
from runs.models import Run, RunStatus
from runs.services.core import cancel_channel_sql

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Listener:
    """A LISTEN connection of its own, as a worker's listener thread has."""

    def __init__(self, channel: str):
        self.conn = psycopg.connect(autocommit=True, **connection.get_connection_params())
        self.conn.execute(f"LISTEN {channel}")

    def heard(self) -> list[tuple[str, str]]:
        self.conn.execute("SELECT 1")  # notifications that came are read with any answer
        return [(n.channel, n.payload) for n in self.conn.notifies(timeout=0.2)]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listeners():
    opened: list[Listener] = []

    def listen(channel: str) -> Listener:
        opened.append(Listener(channel))
        return opened[-1]

    yield listen
    for listener in opened:
        listener.close()


def running(owner: str, n: int = 1, *, on_threads: bool = True) -> list[Run]:
    """n `slow` runs claimed by the worker `owner`, each on a thread of its own."""
    for _ in range(n):
        thread_id = services.thread_create(metadata={}).id if on_threads else None
        kwargs = None if on_threads else {"on_completion": "keep"}
        services.run_create(
            agent_id="slow", thread_id=thread_id, input={"steps": 5}, actor="t", kwargs=kwargs
        )
    claimed = services.run_claim(owner=owner, limit=n)
    assert len(claimed) == n
    return [Run.objects.get(id=c.run.id) for c in claimed]


def test_the_channel_is_computed_alike_in_python_and_in_the_statement() -> None:
    owners = ["w1", "host-a:4242:9f3c01ab", "hôte:1:ü", "x" * 300]
    with connection.cursor() as cursor:
        for owner in [*owners, None, ""]:
            cursor.execute(
                f"SELECT {cancel_channel_sql('o')} FROM (SELECT %s::text AS o) x", [owner]
            )
            assert cursor.fetchone()[0] == services.cancel_channel(owner)
    assert services.cancel_channel(None) == services.CANCEL_CHANNEL
    names = {services.cancel_channel(o) for o in owners}
    assert len(names) == len(owners)  # one channel per worker
    assert all(len(name) <= 63 and name.isidentifier() for name in names)
    # The worker's listener stops runs on these, and only these.
    assert all(services.is_cancel_channel(name) for name in [*names, services.CANCEL_CHANNEL])
    assert not services.is_cancel_channel(services.QUEUE_CHANNEL)
    assert not services.is_cancel_channel("runsite_queue_handoff")


def test_a_cancel_on_a_thread_tells_the_runs_worker_alone(listeners, support) -> None:
    mine, other, shared = (
        listeners(services.cancel_channel("w1")),
        listeners(services.cancel_channel("w2")),
        listeners(services.CANCEL_CHANNEL),
    )
    interrupted, rolled_back = running("w1", 2)
    for run, action in ((interrupted, "interrupt"), (rolled_back, "rollback")):
        services.run_cancel_on_thread(
            thread_id=run.thread_id, run_id=run.id, action=action, actor=support
        )
    assert mine.heard() == [
        (services.cancel_channel("w1"), f"{interrupted.id}=interrupt"),
        (services.cancel_channel("w1"), f"{rolled_back.id}=rollback"),
    ]
    assert other.heard() == [] and shared.heard() == []


def test_a_cancel_by_run_and_a_bulk_cancel_tell_each_runs_worker(listeners, support) -> None:
    w1, w2, shared = (
        listeners(services.cancel_channel("w1")),
        listeners(services.cancel_channel("w2")),
        listeners(services.CANCEL_CHANNEL),
    )
    (single,) = running("w1", 1, on_threads=False)
    services.run_cancel(run=single, action="interrupt", actor=support)
    assert w1.heard() == [(services.cancel_channel("w1"), f"{single.id}=interrupt")]
    assert w2.heard() == []

    first, second = running("w1", 2), running("w2", 1)
    pending = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    result = services.runs_cancel_many(action="interrupt", actor=support, status="all")
    assert set(result.interrupted) == {r.id for r in [*first, *second]} | {pending.id}
    ((channel, payload),) = w1.heard()
    assert channel == services.cancel_channel("w1")
    assert sorted(payload.split(",")) == sorted(f"{r.id}=interrupt" for r in first)
    assert w2.heard() == [(services.cancel_channel("w2"), f"{second[0].id}=interrupt")]
    assert shared.heard() == []  # the pending run has no worker to tell


def test_deleting_a_thread_tells_the_worker_of_its_running_run(listeners, support) -> None:
    w1, w2 = listeners(services.cancel_channel("w1")), listeners(services.cancel_channel("w2"))
    (run,) = running("w1")
    services.thread_delete(thread=run.thread, actor=support)
    assert w1.heard() == [(services.cancel_channel("w1"), f"{run.id}=rollback")]
    assert w2.heard() == []
    assert not Run.objects.filter(id=run.id).exists()


def test_a_run_no_worker_holds_is_told_on_the_shared_channel(listeners, support) -> None:
    shared = listeners(services.CANCEL_CHANNEL)
    (run,) = running("w1")
    # A running row without an owner (as an older version could leave): every worker hears it.
    Run.objects.filter(id=run.id).update(lease_owner=None)
    services.run_cancel(run=Run.objects.get(id=run.id), action="interrupt", actor=support)
    assert shared.heard() == [(services.CANCEL_CHANNEL, f"{run.id}=interrupt")]
    assert Run.objects.get(id=run.id).status == RunStatus.INTERRUPTED
