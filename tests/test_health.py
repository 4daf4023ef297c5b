"""Health endpoints and Prometheus metrics."""

from __future__ import annotations

import pytest
from django.test import override_settings

from runs import services

pytestmark = pytest.mark.django_db


def test_liveness_answers_without_the_database(client, django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readiness_checks_the_database(client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["database"] == "ok"


@override_settings(REDIS_URL="redis://127.0.0.1:1/0")
def test_readiness_fails_when_redis_is_unreachable(client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["checks"]["database"] == "ok"
    assert body["checks"]["redis"] != "ok"


def test_metrics_report_runs_by_status_and_counters(client, drain, reviewer) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "M", "amount": 2}, actor="t"
    )
    services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    drain()
    services.tool_call_approve(run=run, actor=reviewer)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'runsite_runs{status="success"} 1.0' in text
    assert 'runsite_runs{status="pending"} 1.0' in text  # the approved refund, queued again
    assert "runsite_claims_total" in text
    assert "runsite_decision_latency_seconds_bucket" in text
    assert "runsite_worker_lease_losses_total" in text


@override_settings(RUNS_METRICS_TOKEN="s3cret")
def test_metrics_can_require_a_token(client) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200


@override_settings(RUNS_API_AUTH=False)
def test_a_lost_database_connection_is_a_503_not_a_500(client, monkeypatch) -> None:
    from django.db import OperationalError

    from runs import selectors

    def broken(*args, **kwargs):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(selectors, "threads_search", broken)
    monkeypatch.setattr(selectors, "thread_get", broken)
    response = client.post("/api/threads/search", data={}, content_type="application/json")
    assert response.status_code == 503
    assert response.json()["code"] == "database_unavailable"
    assert response["Retry-After"] == "2"
