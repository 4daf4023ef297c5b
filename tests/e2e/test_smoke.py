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


def test_an_api_answer_goes_with_its_length_not_in_chunks(live_runsite) -> None:
    import httpx

    api = f"{live_runsite.url}/api"
    thread_id = httpx.post(f"{api}/threads", json={}).json()["thread_id"]
    got = httpx.get(f"{api}/threads/{thread_id}")  # a synchronous view's answer
    # An asynchronous view's answer known at once (a join of a run that does not exist).
    unknown = httpx.get(f"{api}/threads/{thread_id}/runs/{thread_id}/join")
    assert (got.status_code, unknown.status_code) == (200, 404)
    for answer in (got, unknown):
        assert "transfer-encoding" not in answer.headers
        assert answer.headers["content-length"] == str(len(answer.content))
    # A wait's answer is not known before the run ends: it is streamed, in chunks.
    waited = httpx.post(
        f"{api}/threads/{thread_id}/runs/wait",
        json={"assistant_id": "echo", "input": {"hi": 1}},
        timeout=30,
    )
    assert "content-length" not in waited.headers
    assert waited.json()["output"] == {"echo": {"hi": 1}}
