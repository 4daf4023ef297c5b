"""The real server answers, runs execute through its embedded worker."""

from __future__ import annotations

import pytest

from runs import services
from runs.models import Run, RunStatus
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.every_server]


def test_it_serves_health_and_runs_an_agent(live_runsite) -> None:
    import httpx

    assert httpx.get(f"{live_runsite.url}/readyz").json()["checks"]["database"] == "ok"
    run = services.run_create(agent_id="echo", thread_id=None, input={"hi": 1}, actor="test")
    wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.SUCCESS, timeout=15)
    assert Run.objects.get(id=run.id).output == {"echo": {"hi": 1}}
