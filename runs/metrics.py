"""Prometheus metrics. Counters count what this process did (sum them across instances);
gauges of run state are read from the database at scrape time, so every instance agrees."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

CLAIMS = Counter("runsite_claims", "Runs claimed by workers of this process")
FINISHES = Counter("runsite_finishes", "Runs ended by workers of this process", ["status"])
SUSPENSIONS = Counter("runsite_suspensions", "Runs suspended for a human")
CANCELS = Counter("runsite_cancels", "Cancellations requested or applied", ["action"])
DECISIONS = Counter("runsite_decisions", "Human decisions on tool calls", ["decision"])
DECISION_LATENCY = Histogram(
    "runsite_decision_latency_seconds",
    "Time from a tool call's suspension to the human decision",
    buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600),
)
LEASE_LOSSES = Counter(
    "runsite_worker_lease_losses", "Runs a worker of this process lost its lease on"
)
REAPED = Counter("runsite_reaped", "Runs the reaper returned to the queue or failed", ["outcome"])
REVIEW_DEADLINES = Counter(
    "runsite_review_deadlines",
    "Waiting tool calls whose review deadline passed, by what the reaper did",
    ["outcome"],
)
WEBSOCKETS = Gauge("runsite_websocket_connections", "Open dashboard websocket connections")


class RunStateCollector(Collector):
    """Runs by status and the oldest suspension, from the database at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from django.db.models import Count, Min
        from django.utils import timezone

        from runs.models import PENDING_DECISION_STATUSES, Run, RunStatus, ToolCall

        by_status = GaugeMetricFamily(
            "runsite_runs", "Runs by status (top-level runs)", labels=["status"]
        )
        counts = {s: 0 for s in RunStatus.values}
        try:
            for row in (
                Run.objects.filter(parent_run__isnull=True).values("status").annotate(n=Count("id"))
            ):
                counts[row["status"]] = row["n"]
            oldest = Run.objects.filter(status=RunStatus.SUSPENDED).aggregate(
                m=Min("suspended_at")
            )["m"]
            now = timezone.now()
            waiting = ToolCall.objects.filter(
                status__in=PENDING_DECISION_STATUSES, run__status=RunStatus.SUSPENDED
            )
            overdue = waiting.filter(review_deadline_at__lte=now).count()
            claimed = waiting.filter(claimed_until__gt=now).exclude(claimed_by="").count()
        except Exception:
            return  # database down: /readyz reports it; metrics just omit run state
        for status, n in counts.items():
            by_status.add_metric([status], n)
        yield by_status
        age = GaugeMetricFamily(
            "runsite_oldest_suspension_age_seconds",
            "How long the longest-waiting suspended run has waited",
        )
        age.add_metric([], (timezone.now() - oldest).total_seconds() if oldest else 0.0)
        yield age
        reviews = GaugeMetricFamily(
            "runsite_reviews_overdue", "Tool calls waiting for a human past their review deadline"
        )
        reviews.add_metric([], overdue)
        yield reviews
        held = GaugeMetricFamily(
            "runsite_reviews_claimed", "Tool calls waiting for a human that a reviewer has claimed"
        )
        held.add_metric([], claimed)
        yield held


_registered = False


def register_run_state_collector() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(RunStateCollector())
        _registered = True
