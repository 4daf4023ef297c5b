"""The queue: claim, heartbeat, reap, release (used by runs/engine/worker.py)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Q

from runs import metrics
from runs.contracts import ClaimedRun, Lease
from runs.models import (
    ACTIVE_STATUSES,
    CancelAction,
    Checkpoint,
    Run,
    RunEvent,
    RunStatus,
    Thread,
    ToolCall,
    ToolCallStatus,
)
from runs.rows import compact, execute_planned, instances, instances_from_json
from runs.services.cancel import _apply_cancel
from runs.services.core import (
    LEASE_CLEARED,
    QUEUE_CHANNEL,
    _insert_events,
    _is_postgres,
    _lock_run_if,
    _lock_thread,
    _lock_timeout,
    _notify,
    _now,
    _publish,
    _update_returning,
    logger,
)
from runs.services.finish import _finish_locked

_CLAIM_SQL_POSTGRES = """
WITH RECURSIVE queue AS (
    -- The pending runs in the queue's order, walked one step of run_queue_idx at a time and
    -- only as far as the candidates below need (the claim's LIMIT stops the walk). A plain
    -- scan let the planner read every pending run, check each and sort them: with statistics
    -- from before a burst it thinks the queue holds a few rows, and with 4,000 queued runs each
    -- claim took 20-580 ms, growing with the table's history (bench/engine.py --history).
    (SELECT r.created_at, r.id, r.ctid AS at FROM runs_run r
      WHERE r.status = 'pending' ORDER BY r.created_at, r.id LIMIT 1)
    UNION ALL
    SELECT step.created_at, step.id, step.at
      FROM queue q
     CROSS JOIN LATERAL (
           SELECT r.created_at, r.id, r.ctid AS at FROM runs_run r
            WHERE r.status = 'pending' AND (r.created_at, r.id) > (q.created_at, q.id)
            ORDER BY r.created_at, r.id LIMIT 1) step
), candidate AS (
    SELECT head.id, head.fresh
      FROM queue q
     CROSS JOIN LATERAL (
           -- Each run the walk reaches, at the row version it read (a TID scan, whatever the
           -- statistics say) and locked by itself: a join the planner could hash (with stale
           -- statistics it hashed every pending run), a subquery with its own lock it cannot.
           -- Only the row's own checks are in here: a row changed by a commit since the
           -- statement began is checked again after its lock (EvalPlanQual), and that recheck
           -- starts this subquery's plan afresh for each run walked.
           SELECT r.id, r.thread_id, r.started_at IS NULL AS fresh
             FROM runs_run r
            WHERE r.ctid = q.at AND r.id = q.id AND r.status = 'pending'
              AND r.parent_run_id IS NULL
              AND (r.not_before IS NULL OR r.not_before <= %(now)s)
           OFFSET 0
              FOR UPDATE OF r SKIP LOCKED) head
       -- The run is the head of its thread's queue, and its thread runs nothing. Written as
       -- scalar subqueries over small partial indexes so the plan stays per-row index lookups
       -- even when statistics are stale (a burst on a fresh table turned NOT EXISTS anti-joins
       -- into O(n^2) plans: 7 s per claim with 6,000 queued runs).
     WHERE head.id = (SELECT o.id FROM runs_run o
                       WHERE o.thread_id = head.thread_id AND o.status = 'pending'
                         AND o.parent_run_id IS NULL
                       ORDER BY o.created_at, o.id LIMIT 1)
       -- one_running_run_per_thread
       AND (SELECT o.id FROM runs_run o
             WHERE o.thread_id = head.thread_id AND o.status = 'running' LIMIT 1) IS NULL
       -- A run waiting for a human holds its thread too: it continues before anything queued
       -- behind it (run_thread_suspended_idx).
       AND (SELECT o.id FROM runs_run o
             WHERE o.thread_id = head.thread_id AND o.status = 'suspended'
               AND o.parent_run_id IS NULL LIMIT 1) IS NULL
     LIMIT {limit}
), claimed AS (
    UPDATE runs_run SET status = 'running', lease_owner = %(owner)s,
           attempt = runs_run.attempt + 1, lease_expires_at = %(expires)s,
           deadline_at = %(deadline)s, started_at = COALESCE(runs_run.started_at, %(now)s),
           updated_at = %(now)s, last_seq = runs_run.last_seq + 1
      FROM candidate WHERE runs_run.id = candidate.id
    RETURNING runs_run.*, candidate.fresh
), started AS (
    INSERT INTO runs_runevent (run_id, seq, kind, data, actor, created_at)
    SELECT id, last_seq, 'started',
           jsonb_build_object('attempt', attempt, 'worker', %(owner)s::text), '', %(now)s
      FROM claimed
), marked AS (
    -- A resumed run's next call, decided (approved, or answered with resume data), is the
    -- first thing its worker does: its tool runs right after the claim. Its `running` mark
    -- goes with the claim instead of a round trip of its own before the tool (the step loop
    -- takes it as marked, and puts it back to what it was if the run stops before the tool
    -- starts). The next call is the first of its checkpoint's pending calls not resolved.
    -- A LangGraph graph's run marks nothing here: its checkpoints' projections have no pending
    -- calls (runs/services/graphs.py), and its executor reads its interrupts decided
    -- (tests/test_graphs_hitl.py resumes them on PostgreSQL).
    UPDATE runs_toolcall SET status = 'running', started_at = %(now)s
      FROM (SELECT nxt.id, nxt.status AS was
              FROM claimed c
             CROSS JOIN LATERAL (
                   SELECT ck.pending FROM runs_checkpoint ck
                    WHERE ck.run_id = c.id ORDER BY ck.step DESC LIMIT 1) ck
             CROSS JOIN LATERAL (
                   SELECT t.id, t.status
                     FROM jsonb_array_elements_text(ck.pending) WITH ORDINALITY p(call, n)
                     JOIN runs_toolcall t ON t.run_id = c.id AND t.tool_call_id = p.call
                    WHERE t.status NOT IN ('succeeded', 'failed', 'declined')
                    ORDER BY p.n LIMIT 1) nxt
             WHERE NOT c.fresh AND nxt.status IN ('approved', 'answered')) next_call
     WHERE runs_toolcall.id = next_call.id
    RETURNING runs_toolcall.run_id, runs_toolcall.tool_call_id, next_call.was
)
SELECT claimed.*, base.id AS base_checkpoint_id, base.values AS base_values,
       own.checkpoint AS own_checkpoint, own_calls.calls AS own_calls,
       (SELECT jsonb_object_agg(m.tool_call_id, m.was) FROM marked m
         WHERE m.run_id = claimed.id) AS marked_calls,
       -- What the run's search document takes from its thread, for its end to write the
       -- document without reading it first (services/finish.py, `_end_at_once`).
       (SELECT t.metadata FROM runs_thread t WHERE t.id = claimed.thread_id) AS thread_metadata,
       -- ...and whether its end has deliveries to write (its webhook, a rule for its agent).
       claimed.webhook <> '' OR EXISTS (
           SELECT 1 FROM runs_notificationrule n
            WHERE n.agent_id = claimed.agent_id AND n.active) AS ends_announced,
       -- A claim lost in a database crash leaves the run pending (safe), and the worker's
       -- next synchronous commit flushes it anyway: no need to wait for the WAL flush. A
       -- claim that marks a call waits for it: the call's tool (with effects) runs next, and
       -- its record must say it may have run, whatever happens to the database.
       set_config('synchronous_commit',
                  CASE WHEN EXISTS (SELECT 1 FROM marked) THEN 'on' ELSE 'off' END,
                  true) AS commit_mode
  FROM claimed
  LEFT JOIN LATERAL (
        SELECT c.id, c.values FROM runs_checkpoint c
         WHERE c.thread_id = claimed.thread_id
         ORDER BY c.created_at DESC, c.id DESC LIMIT 1) base ON claimed.fresh
  LEFT JOIN LATERAL (
        SELECT to_jsonb(c) AS checkpoint FROM runs_checkpoint c
         WHERE c.run_id = claimed.id
         ORDER BY c.step DESC LIMIT 1) own ON NOT claimed.fresh
  LEFT JOIN LATERAL (
        SELECT COALESCE(jsonb_agg(to_jsonb(tc)), '[]') AS calls FROM runs_toolcall tc
         WHERE tc.run_id = claimed.id) own_calls ON NOT claimed.fresh
"""
# Twin: _claim_sqlite below (the same rules; SQLite has no SKIP LOCKED). One statement, one
# round trip: pick (the CTE is an optimisation fence: with `WHERE id IN (subquery … LIMIT)` the
# planner may re-run the subquery per row and lock more rows than LIMIT, as Oban's engine
# notes), claim, write the `started` events, and fetch what the run continues from: the
# thread's state for a fresh run; for one started before (a resume, a retry) its own latest
# checkpoint and its tool calls, which its worker read in two more round trips otherwise.

# Whether the claim above can find anything: a read of the queue's partial index. An empty claim
# still costs PostgreSQL ~1.1 ms (the UPDATE's executor opens all of runs_run's and runs_runevent's
# indexes and triggers before it finds no candidate; planning is ~0.8 ms of it and a prepared
# plan did not save it), this ~0.2 ms (bench/db_calls.py). Every wake-up NOTIFY reaches every worker, and a worker
# claims again when a run ends, so most claims on a lightly queued system find nothing.
# A claim made because the first responder was just told of a queued run skips it (`told`):
# there the answer is almost always "yes" and the read is ~0.2 ms on the way to the claim.
_CLAIMABLE_SQL_POSTGRES = """
SELECT 1 FROM runs_run
 WHERE status = 'pending' AND parent_run_id IS NULL
   AND (not_before IS NULL OR not_before <= %(now)s)
 LIMIT 1
"""


_CLAIM_SENT = compact(_CLAIM_SQL_POSTGRES)  # converted once by psycopg, not at every claim


@functools.cache
def _claim_sql_postgres(limit: int) -> str:
    """The claim for up to `limit` runs, the limit written in (a worker uses a few: one prepared
    statement each). As a parameter, PostgreSQL's generic plan cannot know how far the walk
    goes and costs it far above the custom plans, so it planned every claim again (~0.8 ms)."""
    if type(limit) is not int or limit < 1:
        raise ValueError(f"a claim's limit is a positive int, not {limit!r}")
    return _CLAIM_SENT.replace("{limit}", str(limit))


def run_claim(*, owner: str, limit: int = 1, told: bool = False) -> list[ClaimedRun]:
    """Claim up to `limit` runnable runs: oldest pending whose thread has no running run.

    `told`: the caller was just told a run was queued (the first responder's NOTIFY) or its
    last claim filled every slot it asked for (a backlog), so the queue is read by the claim
    itself, not first by `_claimable` (a round trip that would almost always answer "yes").

    Each claimed Run carries `fresh` (never started before: no checkpoint of its own) and, on
    PostgreSQL, `thread_metadata` (its thread's, as the claim read it: what the run's search
    document takes from it) and `ends_announced` (its end has deliveries to write, as far as
    the claim saw), `base_checkpoint_id`/`base_values` (the thread state a fresh run
    starts from) or `resumed_from` (what one started before continues from: its latest
    checkpoint, None without one, and its tool calls) and `marked_calls`: its next call,
    decided, marked `running` by the claim (tool_call_id -> the status it had; the step loop
    runs its tool without marking it again).
    """
    now = _now()
    expires = now + timedelta(seconds=settings.RUNS_LEASE_SECONDS)
    # Default deadline (+ grace) so the reaper can time out a run stuck in a tool; agents with
    # their own time limit move it when they start.
    deadline = now + timedelta(seconds=settings.RUNS_DEFAULT_TIME_LIMIT + 5)
    params = {"now": now, "owner": owner, "expires": expires, "deadline": deadline}
    for _ in range(5):
        try:
            if _is_postgres():
                # A run queued after this read notifies the workers after its commit, so the
                # worker's next turn claims it: answering "nothing" here loses no wake-up.
                if not told and not _claimable(now):
                    return []
                runs = instances(Run, _claim_sql_postgres(limit), params, planned=True)
                for run in runs:
                    _decode_claimed(run)
            else:
                with transaction.atomic():
                    runs = _claim_sqlite(
                        owner=owner, limit=limit, now=now, expires=expires, deadline=deadline
                    )
                    RunEvent.objects.bulk_create(
                        RunEvent(
                            run_id=r.id,
                            seq=r.last_seq,
                            kind="started",
                            data={"attempt": r.attempt, "worker": owner},
                        )
                        for r in runs
                    )
        except IntegrityError:
            # Another worker claimed a run on the same thread between our NOT EXISTS check and
            # our UPDATE (one_running_run_per_thread). Try again: the next pick skips it.
            continue
        if not runs:
            return []
        runs.sort(key=lambda r: (r.created_at, r.id))
        claimed = []
        for run in runs:
            _publish(run)
            lease = Lease(
                run.id,
                owner,
                run.attempt,
                run.thread_id,
                run.agent_id,
                run.parent_run_id,
                run.resource_id,
            )
            claimed.append(ClaimedRun(run=run, lease=lease))
        metrics.CLAIMS.inc(len(claimed))
        return claimed
    return []


def _decode_claimed(run: Run) -> None:
    """The claim's extra columns (JSON, as psycopg hands it over) as `Run` declares them."""
    if isinstance(run.base_values, str):
        run.base_values = json.loads(run.base_values)
    if isinstance(run.thread_metadata, str):
        run.thread_metadata = json.loads(run.thread_metadata)
    own: Any = run.__dict__.pop("own_checkpoint", None)
    calls: Any = run.__dict__.pop("own_calls", None)
    marked: Any = run.__dict__.pop("marked_calls", None)
    run.__dict__.pop("commit_mode", None)
    if run.fresh:
        return
    if isinstance(own, str):
        own = json.loads(own)
    if isinstance(calls, str):
        calls = json.loads(calls)
    if isinstance(marked, str):
        marked = json.loads(marked)
    found = instances_from_json(Checkpoint, [own] if own is not None else [])
    tool_calls = instances_from_json(ToolCall, calls)
    # The calls were read as the statement began: the ones it marked are `running` now.
    run.marked_calls = marked or {}
    for tc in tool_calls:
        if tc.tool_call_id in run.marked_calls:
            tc.status, tc.started_at = ToolCallStatus.RUNNING, run.updated_at
    run.resumed_from = (found[0] if found else None, tool_calls)


def _claimable(now: datetime) -> bool:
    with connection.cursor() as cursor:
        execute_planned(cursor, _CLAIMABLE_SQL_POSTGRES, {"now": now})
        return cursor.fetchone() is not None


def _claim_sqlite(
    *, owner: str, limit: int, now: datetime, expires: datetime, deadline: datetime
) -> list[Run]:
    # Twin of _CLAIM_SQL_POSTGRES. SQLite serialises writers (IMMEDIATE transactions), so a
    # read-then-conditional-update in one transaction cannot race; there is no SKIP LOCKED to
    # need. A thread is held by its running run or by a run waiting for a human.
    busy_threads = set(
        Run.objects.filter(
            Q(status=RunStatus.RUNNING) | Q(status=RunStatus.SUSPENDED, parent_run__isnull=True),
            thread__isnull=False,
        ).values_list("thread_id", flat=True)
    )
    seen: set[UUID] = set()
    chosen: list[UUID] = []
    candidates = (
        Run.objects.filter(status=RunStatus.PENDING, parent_run__isnull=True)
        .order_by("created_at", "id")
        .values_list("id", "thread_id", "not_before")
    )
    for rid, tid, not_before in candidates.iterator():
        if tid in busy_threads or tid in seen:
            seen.add(tid)
            continue
        seen.add(tid)  # later runs on this thread wait for this one (FIFO per thread)
        if not_before is not None and not_before > now:
            continue
        chosen.append(rid)
        if len(chosen) >= limit:
            break
    if not chosen:
        return []
    fresh = set(
        Run.objects.filter(id__in=chosen, started_at__isnull=True).values_list("id", flat=True)
    )
    Run.objects.filter(id__in=chosen, status=RunStatus.PENDING).update(
        status=RunStatus.RUNNING,
        lease_owner=owner,
        attempt=F("attempt") + 1,
        lease_expires_at=expires,
        deadline_at=deadline,
        updated_at=now,
        last_seq=F("last_seq") + 1,
    )
    Run.objects.filter(id__in=chosen, started_at__isnull=True).update(started_at=now)
    runs = list(Run.objects.filter(id__in=chosen, lease_owner=owner, status=RunStatus.RUNNING))
    for run in runs:
        run.fresh = run.id in fresh
    return runs


def run_heartbeat(*, owner: str, run_ids: Sequence[UUID]) -> dict[UUID, str | None]:
    """Renew the leases of the runs this worker holds; also reads their cancel requests.

    Returns {run_id: cancel_action or None} for the runs still held. A run missing from the
    answer was lost (reaped, cancelled with rollback, deleted): its executor must stop.
    """
    if not run_ids:
        return {}
    now = _now()
    rows = _update_returning(
        Run.objects.filter(id__in=list(run_ids), lease_owner=owner, status=RunStatus.RUNNING),
        ["id", "cancel_action"],
        lease_expires_at=now + timedelta(seconds=settings.RUNS_LEASE_SECONDS),
    )
    return {rid: action for rid, action in rows}


def run_set_deadline(*, lease: Lease, deadline: datetime) -> None:
    Run.objects.filter(
        id=lease.run_id, lease_owner=lease.owner, attempt=lease.attempt, status=RunStatus.RUNNING
    ).update(deadline_at=deadline)


def runs_reap(*, max_attempts: int | None = None) -> dict[str, int]:
    """Return runs whose worker vanished to the queue (or fail them after too many attempts).

    Safe on every worker at once: the statements only touch rows whose lease already expired,
    and a run claimed again in between no longer matches.
    """
    max_attempts = max_attempts or settings.RUNS_MAX_ATTEMPTS
    try:
        return _reap(max_attempts)
    except OperationalError as exc:
        # A lock held by a frozen process: try again on the next round rather than hang.
        logger.warning("reaper: skipped a round (%s)", exc)
        return {"requeued": 0, "failed": 0, "cancelled": 0, "timed_out": 0, "threads_deleted": 0}


def _reap(max_attempts: int) -> dict[str, int]:
    now = _now()
    counts = {"requeued": 0, "failed": 0, "cancelled": 0, "timed_out": 0, "threads_deleted": 0}
    expired = Q(status=RunStatus.RUNNING, lease_expires_at__lt=now, parent_run__isnull=True)

    # A pending cancel request wins over a retry: the user asked for the run to stop.
    for run_id in Run.objects.filter(expired, cancel_requested_at__isnull=False).values_list(
        "id", flat=True
    ):
        with transaction.atomic():
            _lock_timeout()
            run = _lock_run_if(run_id, expired)
            if run is not None:
                _apply_cancel(run, action=run.cancel_action or CancelAction.INTERRUPT, actor=None)
                counts["cancelled"] += 1
                metrics.REAPED.labels("cancelled").inc()

    with transaction.atomic():
        _lock_timeout()
        rows = _update_returning(
            Run.objects.filter(expired, cancel_requested_at__isnull=True, attempt__lt=max_attempts),
            ["id", "thread_id", "last_seq", "attempt"],
            status=RunStatus.PENDING,
            **LEASE_CLEARED,
            updated_at=now,
            last_seq=F("last_seq") + 1,
        )
        if rows:
            RunEvent.objects.bulk_create(
                RunEvent(
                    run_id=rid,
                    seq=seq,
                    kind="lease_expired",
                    data={"attempt": attempt, "requeued": True},
                )
                for rid, _tid, seq, attempt in rows
            )
            _notify(QUEUE_CHANNEL)
            for run in Run.objects.filter(id__in=[r[0] for r in rows]):
                _publish(run)
            counts["requeued"] = len(rows)
            logger.info("reaper: requeued %d run(s) whose lease expired", len(rows))
            metrics.REAPED.labels("requeued").inc(len(rows))

    for run_id in Run.objects.filter(
        expired, cancel_requested_at__isnull=True, attempt__gte=max_attempts
    ).values_list("id", flat=True):
        with transaction.atomic():
            _lock_timeout()
            run = _lock_run_if(run_id, expired)
            if run is not None:
                error = {
                    "error": "LeaseExpired",
                    "message": f"the worker running it stopped responding {run.attempt} time(s)",
                }
                _finish_locked(run, status=RunStatus.ERROR, error=error, kind="lease_expired")
                counts["failed"] += 1
                metrics.REAPED.labels("failed").inc()

    for run_id in Run.objects.filter(
        status=RunStatus.RUNNING, parent_run__isnull=True, deadline_at__lt=now
    ).values_list("id", flat=True):
        with transaction.atomic():
            _lock_timeout()
            run = _lock_run_if(run_id, Q(status=RunStatus.RUNNING, deadline_at__lt=now))
            if run is not None:
                error = {"error": "TimeoutError", "message": "run exceeded its time limit"}
                _finish_locked(run, status=RunStatus.TIMEOUT, error=error, kind="finished")
                counts["timed_out"] += 1
                metrics.REAPED.labels("timed_out").inc()

    counts["threads_deleted"] = _delete_expired_threads(now)
    return counts


def _delete_expired_threads(now: datetime, batch: int = 100) -> int:
    """Delete stateless runs' temporary threads whose grace period is over, and threads whose
    LangGraph `ttl` ran out while idle (with their runs, checkpoints, events and tool calls;
    the audit log stays)."""
    deleted = 0
    for thread_id in Thread.objects.filter(expires_at__lt=now).values_list("id", flat=True)[:batch]:
        with transaction.atomic():
            _lock_timeout()
            _lock_thread(thread_id)
            runs = Run.objects.filter(thread_id=thread_id)
            ttl = Thread.objects.filter(id=thread_id).values("ttl_minutes", "updated_at").first()
            if ttl is None:
                continue
            if ttl["ttl_minutes"] is not None:
                # A thread with a LangGraph `ttl` lives ttl minutes past its last activity.
                alive_until = ttl["updated_at"] + timedelta(minutes=ttl["ttl_minutes"])
                if runs.filter(status__in=ACTIVE_STATUSES).exists():
                    alive_until = max(alive_until, now + timedelta(minutes=ttl["ttl_minutes"]))
                if alive_until > now:
                    Thread.objects.filter(id=thread_id).update(expires_at=alive_until)
                    continue
            # A run created on the thread meanwhile keeps it (expiry is re-armed when it ends).
            elif runs.filter(status__in=ACTIVE_STATUSES).exists():
                Thread.objects.filter(id=thread_id).update(expires_at=None)
                continue
            for run in runs.filter(parent_run__isnull=True):
                _publish(run, status="deleted", seq=run.last_seq + 1)
            Thread.objects.filter(id=thread_id).delete()
            deleted += 1
    if deleted:
        logger.info("reaper: deleted %d expired stateless thread(s)", deleted)
    return deleted


def run_release(*, lease: Lease) -> bool:
    """Give a claimed run back to the queue (graceful shutdown). It does not count as an attempt."""
    with transaction.atomic():
        rows = _update_returning(
            Run.objects.filter(
                id=lease.run_id,
                lease_owner=lease.owner,
                attempt=lease.attempt,
                status=RunStatus.RUNNING,
            ),
            ["last_seq"],
            status=RunStatus.PENDING,
            **LEASE_CLEARED,
            attempt=F("attempt") - 1,
            last_seq=F("last_seq") + 1,
            updated_at=_now(),
        )
        if not rows:
            return False
        _insert_events(
            lease.run_id, rows[0][0], [("released", {"attempt": lease.attempt}, "system")]
        )
        _notify(QUEUE_CHANNEL)
        _publish(Run.objects.get(id=lease.run_id))
    return True
