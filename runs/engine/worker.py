"""The worker: claims runs, executes them in threads, holds leases, reaps, cancels fast.

One process = one Worker: a main loop (claim, heartbeat, reaper, deadlines), a LISTEN thread
on PostgreSQL (wake-ups and cancel requests arrive as NOTIFY), and a pool of executor threads
that each run one step loop. `python manage.py runagents` starts it; the embedded mode (SQLite
default) starts the same Worker inside the server process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from runs import live, metrics, services
from runs.engine import wakeup
from runs.engine.context import NonRetryableError, RunControl, RunStopped
from runs.engine.delivery import Deliverer
from runs.engine.loop import Finished, StepLoop, Suspended, error_of
from runs.engine.registry import get_agent
from runs.exceptions import LeaseLost, NotFound, RunCancelled
from runs.graphs.loader import is_graph_agent
from runs.models import CancelAction, RunStatus
from runs.selectors.notifications import stuck_runs_to_announce

logger = logging.getLogger("runs.worker")


STUCK_SCAN_SECONDS = 30.0
# The outbox is polled at most this often (a claim query is 3 round trips). The loop turns once
# per claim under load; polling on every turn cost the engine a third of its echo throughput.
DELIVERY_TICK_SECONDS = 0.25


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass
class _Active:
    lease: services.Lease
    control: RunControl
    future: Future | None = None


def execute_claimed(claimed: services.ClaimedRun, control: RunControl) -> str:
    """Run one claimed run until it finishes, suspends, is cancelled or loses its lease.

    Returns the outcome (a RunStatus value, "released", "lost" or "deleted").
    """
    run, lease = claimed.run, claimed.lease
    started = time.monotonic()
    outcome_status = "lost"
    failed = False
    try:
        try:
            agent = get_agent(run.agent_id)
        except NotFound as exc:
            raise NonRetryableError(exc.detail) from None
        limit = agent.time_limit or settings.RUNS_DEFAULT_TIME_LIMIT
        control.deadline = time.monotonic() + limit
        if agent.time_limit:
            # The row's deadline (with grace) lets the reaper time out a run whose tool ignores
            # cancellation while the worker keeps heartbeating; the claim set the default one.
            services.run_set_deadline(
                lease=lease, deadline=timezone.now() + timedelta(seconds=limit + 5)
            )
        logger.info("claim run=%s agent=%s attempt=%s", run.id, run.agent_id, lease.attempt)
        outcome: Finished | Suspended | str
        if is_graph_agent(agent):  # a LangGraph graph (runs/graphs)
            from runs.graphs.executor import GraphLoop

            outcome = GraphLoop(run=run, lease=lease, control=control, agent=agent).run_until_stop()
        else:
            outcome = StepLoop(run=run, lease=lease, control=control, agent=agent).run_until_stop()
        if isinstance(outcome, str):  # a graph run that suspended itself
            outcome_status = outcome
        elif isinstance(outcome, Finished):
            services.run_finish(
                lease=lease,
                status=RunStatus.SUCCESS,
                output=outcome.output,
                values=outcome.values,
                steps=outcome.steps,
                events=outcome.events,
                held=outcome.held,
                source=outcome.source,
            )
            outcome_status = RunStatus.SUCCESS
        else:
            outcome_status = services.run_suspend(plans=outcome.plans, values=outcome.values)
    except RunStopped as stop:
        outcome_status = _stopped(lease, stop.reason, control)
    except RunCancelled as done:
        # Cancelled while it ran: the cancel request ended the run; this worker only stops.
        outcome_status = "deleted" if done.deleted else RunStatus.INTERRUPTED
        logger.info("cancelled run=%s attempt=%s; stopped", run.id, lease.attempt)
    except LeaseLost:
        metrics.LEASE_LOSSES.inc()
        logger.warning(
            "lease lost run=%s attempt=%s; stopping without writing", run.id, lease.attempt
        )
    except NonRetryableError as exc:
        error = error_of(exc)
        outcome_status = _safely(lambda: _finish(lease, RunStatus.ERROR, error))
    except Exception as exc:
        logger.warning(
            "run=%s attempt=%s raised %s: %s", run.id, lease.attempt, type(exc).__name__, exc
        )
        error = error_of(exc)
        failed = True
        if isinstance(exc, DatabaseError):
            # A dropped connection: get a fresh one so the failure can be recorded (and the
            # run retried) now, instead of waiting for the lease to expire.
            close_old_connections()
        outcome_status = _safely(lambda: services.run_fail_attempt(lease=lease, error=error).status)
    if outcome_status in (RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.TIMEOUT):
        metrics.FINISHES.labels(outcome_status).inc()
    if outcome_status in (RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.TIMEOUT) and not failed:
        # (a failure ending the run was logged by the service that recorded it)
        logger.info(
            "finish run=%s agent=%s attempt=%s status=%s duration=%.3fs",
            run.id,
            run.agent_id,
            lease.attempt,
            outcome_status,
            time.monotonic() - started,
        )
    return outcome_status


def _finish(lease: services.Lease, status: str, error: dict[str, str]) -> str:
    services.run_finish(lease=lease, status=status, error=error)
    return status


def _safely(fn: Any) -> str:
    """Record an outcome; a lost lease or a dead connection means another worker owns it now."""
    try:
        return fn()
    except RunCancelled as done:
        return "deleted" if done.deleted else RunStatus.INTERRUPTED
    except LeaseLost:
        logger.warning("lease lost while recording an outcome; another worker owns the run")
        return "lost"
    except Exception as exc:
        logger.warning(
            "could not record the outcome (%s: %s); the reaper will retry the run",
            type(exc).__name__,
            exc,
        )
        return "lost"


def _stopped(lease: services.Lease, reason: str, control: RunControl) -> str:
    if reason == "lost":
        # The heartbeat found the run held by another attempt (or gone): logged as a fenced
        # write that found it out is (a worker that was paused past its lease says so).
        metrics.LEASE_LOSSES.inc()
        logger.warning(
            "lease lost run=%s attempt=%s; stopping without writing", lease.run_id, lease.attempt
        )
        return "lost"
    if reason == "release":
        return "released" if _safely(lambda: services.run_release(lease=lease)) else "lost"
    if reason == "timeout":
        error = {"error": "TimeoutError", "message": "run exceeded its time limit"}
        return _safely(lambda: _finish(lease, RunStatus.TIMEOUT, error))

    # cancel: the request that cancelled the run ended it (or deleted it) in its own
    # transaction and said so in its notice: nothing to write, nothing to ask.
    if control.cancel_applied is not None:
        logger.info("cancelled run=%s attempt=%s; stopped", lease.run_id, lease.attempt)
        return (
            "deleted" if control.cancel_applied == CancelAction.ROLLBACK else RunStatus.INTERRUPTED
        )

    # A cancel the notice did not say was applied (an older version's; a heartbeat's finding):
    # applied here if it still needs to be.
    def ack() -> str:
        run = services.run_acknowledge_cancel(lease=lease)
        return run.status if run is not None else "deleted"

    outcome = _safely(ack)
    if outcome != "lost":  # (a lost lease was logged by _safely)
        logger.info("cancelled run=%s attempt=%s; stopped", lease.run_id, lease.attempt)
    return outcome


class _DaemonPool:
    """Runs on daemon threads; the claim only takes free slots, so at most `concurrency` at once.
    Daemon threads, unlike ThreadPoolExecutor's, cannot keep the process alive: a tool still
    busy after the shutdown grace is abandoned (the run was released, so the fence rejects
    anything it writes later) instead of blocking exit for minutes. A thread that finished a
    run waits `IDLE_SECONDS` for the next before it ends (starting a thread per run was ~4 % of
    a busy worker's CPU)."""

    IDLE_SECONDS = 30.0

    def __init__(self, name: str):
        self.name = name
        self._work: queue.SimpleQueue[tuple[Future, Callable[..., str], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, fn: Callable[..., str], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # that thread takes this run
        self._work.put((future, fn, args))
        if start:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()
        return future

    def _serve(self) -> None:
        # A run's suspension and end reach their waiters from here, not through the
        # publisher's thread (runs/live.py).
        with live.sending_thread():
            self._serve_runs()

    def _serve_runs(self) -> None:
        while True:
            try:
                future, fn, args = self._work.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0 and self._work.empty():
                        self._idle -= 1
                        return
                continue  # a run was handed to this thread as it timed out: take it
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1


# The first responder (PostgreSQL). A queued run's NOTIFY reaches every worker listening for
# it, and each one wakes two threads and looks at the queue on the cores the run needs (two
# workers on two cores: a human-in-the-loop run suspended 1.4 ms later than with one). Only
# the worker whose LISTEN connection holds this session advisory lock ("RUNSRESP") listens for
# queued runs; it hands them to the others (HANDOFF_CHANNEL, which they listen for) when it
# claimed as many as it had room for and more may wait, when it had no room, or when its loop
# was busy in a tick of its own (a reaper or prune pass) as the NOTIFY came. A responder that
# dies releases the lock with its connection; another worker takes it within a second, and
# every worker still polls the queue (RUNS_POLL_SECONDS).
RESPONDER_LOCK = 0x52554E5352455350
HANDOFF_CHANNEL = "runsite_queue_handoff"
_HAND_ON_SQL = f"SELECT pg_notify('{HANDOFF_CHANNEL}', '')"


def listen_conninfo() -> dict[str, Any]:
    """The parameters of Django's own connections (host, TLS, `connect_timeout`, keepalives,
    session options, application name: runsite/settings.py), for a LISTEN connection of the
    worker's own; not Django's Python-side ones (cursor class, adapters, prepared statements)."""
    params = connection.get_connection_params()
    for python_side in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(python_side, None)
    return params


class Worker:
    def __init__(
        self,
        *,
        concurrency: int | None = None,
        owner: str | None = None,
        poll_seconds: float | None = None,
        heartbeat_seconds: float | None = None,
        reaper_seconds: float | None = None,
        listen: bool | None = None,
        shutdown_grace: float | None = None,
    ):
        self.concurrency = concurrency or settings.RUNS_WORKER_CONCURRENCY
        self.owner = owner or new_owner_id()
        self.poll_seconds = poll_seconds or settings.RUNS_POLL_SECONDS
        self.heartbeat_seconds = heartbeat_seconds or settings.RUNS_HEARTBEAT_SECONDS
        self.reaper_seconds = reaper_seconds or settings.RUNS_REAPER_SECONDS
        self.listen = settings.RUNS_NOTIFY if listen is None else listen
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._active: dict[UUID, _Active] = {}
        self._lock = threading.Lock()
        self.shutdown_grace = (
            settings.RUNS_SHUTDOWN_GRACE_SECONDS if shutdown_grace is None else shutdown_grace
        )
        self._pool = _DaemonPool("runsite-run")
        self._listener: threading.Thread | None = None
        # The first responder's state (RESPONDER_LOCK): whether this worker holds the lock,
        # whether a queued run's NOTIFY came since the main loop last looked, and whether the
        # main loop is waiting (not in a tick of its own).
        self.responder = threading.Event()
        self._queue_noticed = False
        self._waiting = False
        # The last claim filled every free slot: more runs are likely queued, so the next claim
        # reads the queue by claiming, without the look first (services.run_claim's `told`).
        self._backlog = False
        self.claimed_total = 0
        self._deliverer = Deliverer(owner=self.owner, wake=self._wake)

    # -- signals from outside -----------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def cancel_requested(self, notices: list[str]) -> None:
        """Stop the runs named (`services.cancel_notice`: `<run id>=<applied action>`, or a bare
        run id whose cancel is left to this worker to apply)."""
        with self._lock:
            for notice in notices:
                rid, _, applied = notice.partition("=")
                try:
                    active = self._active.get(UUID(rid))
                except ValueError:
                    continue
                if active is not None:
                    active.control.request_cancel(applied=applied or None)

    def stop(self) -> None:
        """Stop claiming; in-flight runs stop at their next boundary and are released."""
        self._stopping.set()
        self._wake.set()

    # -- main loop ----------------------------------------------------------------------------

    def run_forever(self) -> None:
        wakeup.register(self)
        if self.listen and connection.vendor == "postgresql":
            self._listener = threading.Thread(
                target=self._listen_loop, name="runsite-listen", daemon=True
            )
            self._listener.start()
        logger.info("worker %s started (concurrency %d)", self.owner, self.concurrency)
        next_heartbeat = time.monotonic() + self.heartbeat_seconds
        next_reap = time.monotonic()
        next_stuck_scan = time.monotonic()
        next_prune = time.monotonic()
        next_delivery = time.monotonic()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                now = time.monotonic()
                try:
                    if now >= next_reap:
                        services.runs_reap()
                        services.reviews_expire()
                        next_reap = now + self.reaper_seconds
                    if now >= next_stuck_scan:
                        self._announce_stuck()
                        next_stuck_scan = now + STUCK_SCAN_SECONDS
                    if now >= next_prune:
                        # Bounded in time: a big backlog is pruned over many ticks, with claims
                        # in between (services.runs_prune skips rows the engine holds).
                        next_prune = now + settings.RUNS_PRUNE_INTERVAL_SECONDS
                        services.retention_apply(time_budget=settings.RUNS_PRUNE_BUDGET_SECONDS)
                    if now >= next_heartbeat:
                        self._heartbeat()
                        next_heartbeat = now + self.heartbeat_seconds
                    self._watch_deadlines()
                    if now >= next_delivery:
                        self._deliverer.tick()  # the outbox: sent on its own threads
                        next_delivery = now + DELIVERY_TICK_SECONDS
                    with self._lock:
                        noticed, self._queue_noticed = self._queue_noticed, False
                    full = self._free_slots() <= 0
                    got = self._claim(told=noticed)
                    if noticed and (got or full) and self.responder.is_set():
                        self._pass_on()
                except Exception:
                    logger.exception("worker loop error; retrying shortly")
                    close_old_connections()
                    got = False
                    self._stopping.wait(1.0)
                if got:
                    # Every free slot filled: more may be queued, so claim again before sleeping.
                    # A claim that filled fewer saw every claimable run; what is queued later
                    # notifies (and a run's end sets the wake-up), so it would claim nothing.
                    continue
                timeout = min(self.poll_seconds, max(0.0, next_heartbeat - time.monotonic()))
                with self._lock:
                    self._waiting = True
                self._wake.wait(timeout)
                with self._lock:
                    self._waiting = False
        finally:
            self._shutdown()

    def _pass_on(self) -> None:
        """Wake the other workers at once (the responder could not take everything queued)."""
        with connection.cursor() as cursor:
            cursor.execute(_HAND_ON_SQL)

    def _queued(self) -> bool:
        """A run was queued (its NOTIFY, on the responder's listener thread); True when the
        listener must hand it on (the loop is busy in a tick of its own)."""
        with self._lock:
            self._queue_noticed = True
            busy = not self._waiting
        self._wake.set()
        return busy

    def _take_responder_lock(self, conn: Any) -> None:
        """Become the first responder if no worker is: listen for queued runs, not for runs
        handed on. Every worker listens for handed-on runs until then."""
        if self.responder.is_set():
            return
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", [RESPONDER_LOCK]).fetchone()
        if row[0]:
            conn.execute(f"LISTEN {services.QUEUE_CHANNEL}")
            conn.execute(f"UNLISTEN {HANDOFF_CHANNEL}")
            self.responder.set()
            self._wake.set()  # anything queued before it listened

    def _announce_stuck(self) -> None:
        # Every worker scans; the outbox's unique constraint keeps one message per run and rule.
        run_ids = stuck_runs_to_announce()
        if run_ids:
            services.runs_announce_stuck(run_ids=run_ids)

    def _free_slots(self) -> int:
        with self._lock:
            return self.concurrency - len(self._active)

    def _claim(self, *, told: bool = False) -> bool:
        """Claim up to the free slots; True when it filled them all (more may be waiting).
        `told`: a queued run's NOTIFY came since the last claim (`services.run_claim`). A claim
        after one that filled every slot counts as told too: with a backlog, a look at the queue
        before each claim would almost always answer "yes" (one round trip a run); the first
        claim to find the queue drained costs one empty claim instead."""
        free = self._free_slots()
        if free <= 0:
            return False
        # Each claimed run's change (now `running`) goes out from the run's own thread, which
        # publishes its end too (`live.sending_thread`): the two leave in order, each in one
        # Redis PUBLISH from the thread that committed it, and this thread, which claims and
        # hands runs out, neither sends nor hands every claim to the publisher's thread (whose
        # event loop send cost a busy worker ~10 % of its CPU, docs/benchmarks.md).
        with live.publishes_held() as held:
            claimed = services.run_claim(owner=self.owner, limit=free, told=told or self._backlog)
        changes = {change.run_id: change for change in held}
        self._backlog = len(claimed) == free
        for c in claimed:
            control = RunControl()
            active = _Active(lease=c.lease, control=control)
            with self._lock:
                self._active[c.lease.run_id] = active
            change = changes.pop(str(c.lease.run_id), None)
            active.future = self._pool.submit(self._execute, c, control, change)
        live.publish_all(list(changes.values()))  # (none: every claim publishes its run's)
        self.claimed_total += len(claimed)
        return len(claimed) == free

    def _execute(
        self, claimed: services.ClaimedRun, control: RunControl, change: live.RunChange | None
    ) -> str:
        try:
            if change is not None:
                live.publish(change)
            return execute_claimed(claimed, control)
        finally:
            # Executor threads are long-lived: hand the connection back (to the pool on
            # PostgreSQL) so an idle worker holds none.
            close_old_connections()
            with self._lock:
                self._active.pop(claimed.lease.run_id, None)
            self._wake.set()  # a slot is free

    def _heartbeat(self) -> None:
        with self._lock:
            held = {rid: a for rid, a in self._active.items()}
        if not held:
            return
        alive = services.run_heartbeat(owner=self.owner, run_ids=list(held))
        for rid, active in held.items():
            if rid not in alive:
                # Reaped, rolled back or deleted while we ran it: stop without writing.
                active.control.mark_lost()
            elif alive[rid] is not None:
                active.control.request_cancel()  # the NOTIFY was lost; the heartbeat saw it

    def _watch_deadlines(self) -> None:
        with self._lock:
            actives = list(self._active.values())
        for a in actives:
            if a.control.timed_out():
                a.control.wake.set()

    def _listen_loop(self) -> None:
        import psycopg

        conninfo = listen_conninfo()
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                with psycopg.connect(autocommit=True, **conninfo) as conn:
                    # Cancels of this worker's runs, and any whose worker was not known.
                    conn.execute(f"LISTEN {services.cancel_channel(self.owner)}")
                    conn.execute(f"LISTEN {services.CANCEL_CHANNEL}")
                    conn.execute(f"LISTEN {HANDOFF_CHANNEL}")
                    backoff = 0.1
                    self._take_responder_lock(conn)
                    retry_lock_at = time.monotonic() + 1.0
                    self._wake.set()  # anything queued while we were not listening
                    while not self._stopping.is_set():
                        # Back from notifies() with the first batch: the connection is the
                        # generator's until it ends, and a busy responder hands runs on.
                        pass_on = False
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            if services.is_cancel_channel(note.channel):
                                self.cancel_requested(note.payload.split(","))
                            elif note.channel == services.QUEUE_CHANNEL:
                                pass_on = self._queued() or pass_on
                            else:
                                self._wake.set()  # handed on by the responder
                        if pass_on:
                            conn.execute(_HAND_ON_SQL)
                        if time.monotonic() >= retry_lock_at:
                            self._take_responder_lock(conn)  # another's may have died
                            retry_lock_at = time.monotonic() + 1.0
            except Exception as exc:
                self.responder.clear()  # the lock went with the connection
                if self._stopping.is_set():
                    break
                logger.warning("LISTEN connection lost (%s); reconnecting", exc)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _shutdown(self) -> None:
        wakeup.unregister(self)
        # Deliveries in flight finish or are left to their lease (then re-sent: at least once).
        self._deliverer.shutdown(wait=False)
        with self._lock:
            actives = list(self._active.values())
        for a in actives:
            a.control.request_release()
        deadline = time.monotonic() + self.shutdown_grace
        for a in actives:
            if a.future is not None:
                # A timeout falls through to the forced release below.
                with contextlib.suppress(Exception):
                    a.future.result(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            leftovers = list(self._active.values())
        for a in leftovers:
            # Still inside a tool past the grace period: give the run back anyway; the fence
            # rejects whatever that thread tries to write later.
            try:
                services.run_release(lease=a.lease)
            except Exception:
                logger.warning("could not release run %s", a.lease.run_id, exc_info=True)
        close_old_connections()
        logger.info("worker %s stopped", self.owner)
        self._stopped.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def drain(*, owner: str | None = None, max_runs: int = 10_000, timeout: float = 60.0) -> int:
    """Execute queued runs in this thread until none is runnable (tests, seed_demo)."""
    owner = owner or new_owner_id()
    done = 0
    end = time.monotonic() + timeout
    while done < max_runs and time.monotonic() < end:
        claimed = services.run_claim(owner=owner, limit=1)
        if not claimed:
            break
        execute_claimed(claimed[0], RunControl())
        done += 1
    return done


EMBEDDED_SHUTDOWN_GRACE = 2.0


def start_embedded_worker(**kwargs: Any) -> Worker:
    """Start a Worker on a daemon thread inside this process (server embedded mode).

    When the server exits (Ctrl-C or SIGTERM stop Daphne's reactor, then the interpreter runs its
    exit hooks; uvicorn announces its shutdown first) the worker stops claiming and gives its
    runs back to the queue, as a standalone worker does on SIGTERM; a short grace keeps the whole
    exit within a few seconds.
    """
    kwargs.setdefault(
        "shutdown_grace", min(EMBEDDED_SHUTDOWN_GRACE, settings.RUNS_SHUTDOWN_GRACE_SECONDS)
    )
    worker = Worker(**kwargs)
    thread = threading.Thread(
        target=worker.run_forever, name="runsite-embedded-worker", daemon=True
    )
    thread.start()
    atexit.register(stop_embedded_worker, worker)
    return worker


def stop_embedded_worker(worker: Worker) -> None:
    """Stop claiming and give the runs in flight back to the queue, within the short grace.

    Called at exit, and by servers that announce their shutdown (ASGI lifespan, runsite/asgi.py):
    uvicorn ends a SIGTERM by raising the signal again with its default action, which skips
    the interpreter's exit hooks. Calling it twice is harmless."""
    worker.stop()
    worker.wait_stopped(timeout=worker.shutdown_grace + 2.0)
