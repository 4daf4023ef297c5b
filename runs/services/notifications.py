"""The delivery outbox: run webhooks and notification rules.

A run that suspends or ends writes its deliveries (`_announce`) in the transaction that changed
it, so a committed state change always has its messages and a rolled-back one has none. Workers
claim due rows (`deliveries_claim`: a lease, so a worker killed mid-POST leaves a row that is
due again when the lease expires), send them, and record each attempt (`delivery_record`,
fenced by owner and attempt). Delivery is at least once: receivers dedupe on the delivery id.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.urls import reverse

from runs.contracts import JSONObject, assistant_uuid
from runs.models import (
    DUE_DELIVERY_STATUSES,
    Delivery,
    DeliveryChannel,
    DeliveryStatus,
    NotificationEvent,
    NotificationRule,
    Run,
    Thread,
    ToolCall,
    WebhookFormat,
)
from runs.services.core import QUEUE_CHANNEL, _is_postgres, _notify, _now, logger
from runs.webhooks import backoff_seconds

# The events a run's own `webhook` hears (LangGraph: when the run ends; Runsite: suspends too).
RUN_WEBHOOK_EVENTS = (
    NotificationEvent.SUSPENDED,
    NotificationEvent.SUCCESS,
    NotificationEvent.ERROR,
    NotificationEvent.TIMEOUT,
    NotificationEvent.INTERRUPTED,
)


def run_url(run_id: UUID | str) -> str:
    return settings.RUNS_PUBLIC_URL + reverse("runs:run_detail", args=[run_id])


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _langgraph_body(run: Run, event: str, values: JSONObject | None) -> JSONObject:
    """LangGraph's webhook body: the run object, its thread's values, and the error if any."""
    body: JSONObject = {
        "run_id": str(run.id),
        "thread_id": str(run.thread_id) if run.thread_id else None,
        "assistant_id": assistant_uuid(run.agent_id),
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
        "status": run.status,
        "metadata": {
            **(run.metadata or {}),
            "graph_id": run.agent_id,
            "assistant_id": assistant_uuid(run.agent_id),
        },
        "kwargs": run.kwargs or {},
        "multitask_strategy": run.multitask_strategy,
        "values": values,
        "event": event,
    }
    if run.error is not None:
        body["error"] = run.error
    if run.output is not None:
        body["output"] = run.output
    return body


def _summary(run: Run, event: str) -> str:
    head = f"Run {str(run.id)[:8]} of agent {run.agent_id}"
    if run.resource_id:
        head += f" (resource {run.resource_id})"
    if event == NotificationEvent.SUSPENDED:
        tools = sorted(
            set(
                ToolCall.objects.filter(
                    run_id=run.id, status__in=("awaiting_approval", "awaiting_input")
                ).values_list("tool_name", flat=True)
            )
        )
        return f"{head} is waiting for a human ({', '.join(tools) or 'review'})"
    if event == NotificationEvent.ERROR:
        message = (run.error or {}).get("message") or (run.error or {}).get("error") or ""
        return f"{head} failed: {message}"[:500]
    if event == NotificationEvent.TIMEOUT:
        return f"{head} timed out"
    if event == NotificationEvent.STUCK:
        return f"{head} looks stuck ({run.status}, no progress for a while)"
    if event == NotificationEvent.INTERRUPTED:
        return f"{head} was cancelled"
    if event == NotificationEvent.REVIEW_OVERDUE:
        return f"{head}: a review is overdue (past its deadline)"
    return f"{head} ended {run.status}"


def _rule_deliveries(run: Run, event: str, now: Any) -> list[Delivery]:
    if getattr(run, "has_rules", True) is False:
        return []  # known from the query that loaded the run
    rules = [
        r
        for r in NotificationRule.objects.filter(active=True, agent_id=run.agent_id)
        if event in (r.events or []) and (not r.resource_id or r.resource_id == run.resource_id)
    ]
    if not rules:
        return []
    url = run_url(run.id)
    text = _summary(run, event)
    out = []
    common = {"run_id": run.id, "agent_id": run.agent_id, "event": event, "next_attempt_at": now}
    for rule in rules:
        if rule.webhook_url:
            if rule.webhook_format == WebhookFormat.SLACK:
                payload: JSONObject = {"text": f"{text}: <{url}|open the run>"}
            else:
                payload = {
                    "event": event,
                    "text": text,
                    "url": url,
                    "rule": rule.name,
                    "run": {
                        "id": str(run.id),
                        "agent_id": run.agent_id,
                        "resource_id": run.resource_id,
                        "thread_id": str(run.thread_id) if run.thread_id else None,
                        "status": run.status,
                        "error": run.error,
                        "created_at": _iso(run.created_at),
                        "suspended_at": _iso(run.suspended_at),
                        "finished_at": _iso(run.finished_at),
                    },
                }
            out.append(
                Delivery(
                    **common,
                    rule=rule,
                    channel=DeliveryChannel.WEBHOOK,
                    target=rule.webhook_url,
                    format=rule.webhook_format,
                    payload=payload,
                )
            )
        if rule.email_group_id is not None:
            out.append(
                Delivery(
                    **common,
                    rule=rule,
                    channel=DeliveryChannel.EMAIL,
                    target=rule.email_group.name if rule.email_group else "",
                    format="email",
                    payload={
                        "subject": f"[Runsite] {text}"[:200],
                        "body": f"{text}\n\nOpen the run: {url}\n\n(rule: {rule.name})\n",
                        "group_id": rule.email_group_id,
                    },
                )
            )
    return out


_rules_of_run = NotificationRule.objects.filter(active=True, agent_id=OuterRef("agent_id"))


def _announce(run: Run | UUID, event: str) -> int:
    """Write the outbox rows for `event` of a run: its own webhook and the matching rules.

    Call it inside the transaction of the state change, after the thread's values are
    written (the webhook body carries them). Returns the number of rows written."""
    if not isinstance(run, Run):
        found = Run.objects.annotate(has_rules=Exists(_rules_of_run)).filter(id=run).first()
        if found is None:
            return 0
        run = found
    now = _now()
    rows = _rule_deliveries(run, event, now)
    if run.webhook and event in RUN_WEBHOOK_EVENTS:
        values = (
            Thread.objects.filter(id=run.thread_id).values_list("values", flat=True).first()
            if run.thread_id
            else None
        )
        rows.append(
            Delivery(
                run_id=run.id,
                agent_id=run.agent_id,
                event=event,
                channel=DeliveryChannel.WEBHOOK,
                target=run.webhook,
                format="langgraph",
                payload=_langgraph_body(run, event, values),
                next_attempt_at=now,
            )
        )
    if not rows:
        return 0
    # A stuck run is announced once per rule and channel (unique constraint): a second worker
    # scanning the same run inserts nothing.
    Delivery.objects.bulk_create(rows, ignore_conflicts=event == NotificationEvent.STUCK)
    _notify(QUEUE_CHANNEL)  # workers send the outbox too
    logger.info("announce run=%s event=%s deliveries=%d", run.id, event, len(rows))
    return len(rows)


def runs_announce_stuck(*, run_ids: Sequence[UUID]) -> int:
    """Announce runs the stuck scan found (selectors.notifications.stuck_runs_to_announce)."""
    written = 0
    for run in Run.objects.filter(id__in=list(run_ids)):
        with transaction.atomic():
            written += _announce(run, NotificationEvent.STUCK)
    return written


# --- sending ---------------------------------------------------------------------------------

_CLAIM_SQL_POSTGRES = """
UPDATE runs_delivery
   SET locked_by = %(owner)s, locked_until = %(until)s, attempts = attempts + 1,
       updated_at = %(now)s
 WHERE id IN (
    SELECT id FROM runs_delivery
     WHERE status IN ('pending', 'retrying') AND next_attempt_at <= %(now)s
       AND (locked_until IS NULL OR locked_until < %(now)s)
     ORDER BY next_attempt_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED)
RETURNING id
"""


def delivery_lease_seconds() -> float:
    # Longer than one attempt can take (connect + read timeouts), so a live worker keeps it.
    return settings.RUNS_WEBHOOK_TIMEOUT_SECONDS * 2 + 5


def deliveries_claim(*, owner: str, limit: int) -> list[Delivery]:
    """Lease up to `limit` due deliveries to `owner` (one attempt each; `attempts` counts it)."""
    now = _now()
    until = now + timedelta(seconds=delivery_lease_seconds())
    if _is_postgres():
        # One statement, atomic on its own: every worker runs it four times a second, so an
        # idle outbox costs one round trip, not a transaction's three.
        with connection.cursor() as cursor:
            cursor.execute(
                _CLAIM_SQL_POSTGRES, {"owner": owner, "until": until, "now": now, "limit": limit}
            )
            ids = [row[0] for row in cursor.fetchall()]
    else:
        # Twin of _CLAIM_SQL_POSTGRES. SQLite has one writer at a time: the conditional UPDATE
        # of each row is the lock (a row another process took in between matches nothing).
        due = Q(status__in=DUE_DELIVERY_STATUSES, next_attempt_at__lte=now) & (
            Q(locked_until__isnull=True) | Q(locked_until__lt=now)
        )
        candidates = Delivery.objects.filter(due).order_by("next_attempt_at")[:limit]
        ids = [
            row_id
            for row_id in list(candidates.values_list("id", flat=True))
            if Delivery.objects.filter(due, id=row_id).update(
                locked_by=owner, locked_until=until, attempts=F("attempts") + 1, updated_at=now
            )
            == 1
        ]
    if not ids:
        return []
    claimed = list(Delivery.objects.filter(id__in=ids).order_by("next_attempt_at"))
    handed = []
    for d in claimed:
        if d.attempts > settings.RUNS_WEBHOOK_MAX_ATTEMPTS:
            # The last allowed attempt's worker died mid-delivery: give up instead.
            delivery_record(
                delivery_id=d.id,
                owner=owner,
                attempt=d.attempts,
                status_code=None,
                error="gave up: the worker of the last attempt was lost",
                give_up=True,
                count=False,
            )
            continue
        handed.append(d)
    return handed


def delivery_record(
    *,
    delivery_id: UUID,
    owner: str,
    attempt: int,
    status_code: int | None,
    error: str = "",
    give_up: bool = False,
    count: bool = True,
) -> str | None:
    """Record one attempt: sent (2xx, no error), retrying later (backoff), or failed (after
    RUNS_WEBHOOK_MAX_ATTEMPTS attempts, or `give_up`). Fenced by owner and attempt: a worker
    whose lease expired and was re-claimed records nothing. Returns the new status or None."""
    now = _now()
    with transaction.atomic():
        d = (
            Delivery.objects.select_for_update()
            .filter(
                id=delivery_id,
                locked_by=owner,
                attempts=attempt,
                status__in=DUE_DELIVERY_STATUSES,
            )
            .first()
        )
        if d is None:
            return None
        ok = not error and status_code is not None and 200 <= status_code < 300
        entry: JSONObject = {"at": now.isoformat(), "status_code": status_code, "error": error}
        if count:
            entry["attempt"] = attempt
        d.log = [*(d.log or []), entry][-50:]
        d.last_status_code = status_code
        d.last_error = "" if ok else (error or f"HTTP {status_code}")[:2000]
        d.locked_by = ""
        d.locked_until = None
        if ok:
            d.status = DeliveryStatus.SENT
            d.finished_at = now
        elif give_up or attempt >= settings.RUNS_WEBHOOK_MAX_ATTEMPTS:
            d.status = DeliveryStatus.FAILED
            d.finished_at = now
        else:
            d.status = DeliveryStatus.RETRYING
            d.next_attempt_at = now + timedelta(seconds=backoff_seconds(attempt))
        d.save()
    logger.info(
        "delivery=%s run=%s event=%s attempt=%d status=%s code=%s error=%s",
        d.id,
        d.run_id,
        d.event,
        attempt,
        d.status,
        status_code,
        error[:200],
    )
    return d.status
