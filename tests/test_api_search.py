"""GET /api/runs/search: the runs list's search, filters and sort for programs (API keys)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs import services
from runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _auth_on(settings: Any) -> None:
    settings.RUNS_API_AUTH = True


def api_key(resource: str | None = None) -> str:
    _key, raw = services.api_key_create(name=f"k-{resource}", resource_id=resource)
    return raw


def search(query: str, key: str) -> Any:
    return Client().get(f"/api/runs/search?{query}", headers={"x-api-key": key})


def echo(input: Any, resource: str | None = None) -> Run:
    thread = services.thread_create(metadata={}, pinned_resource_id=resource)
    return services.run_create(agent_id="echo", thread_id=thread.id, input=input, actor="t")


def test_it_finds_runs_by_what_they_did_with_the_matching_passage(drain: Any) -> None:
    wanted = echo({"note": "refund the blue kettle"})
    echo({"note": "ship the red teapot"})
    drain()

    response = search("q=kettle", api_key())

    assert response.status_code == 200
    body = response.json()
    assert [r["run_id"] for r in body["runs"]] == [str(wanted.id)]
    assert body["total"] == 1 and body["total_capped"] is False
    [run] = body["runs"]
    assert run["status"] == "success"
    assert ["kettle", True] in run["match"]


def test_it_filters_sorts_and_pages_like_the_runs_list(drain: Any) -> None:
    runs = [echo({"n": i, "word": "alpha"}) for i in range(5)]
    drain()
    key = api_key()

    first = search("q=alpha&status=success&sort=created&limit=2", key).json()
    second = search("q=alpha&status=success&sort=created&limit=2&offset=2", key).json()

    assert first["total"] == second["total"] == 5
    ids = [r["run_id"] for r in first["runs"] + second["runs"]]
    assert ids == [str(r.id) for r in runs[:4]]  # oldest first, no overlap between pages
    assert search("q=alpha&status=pending", key).json()["total"] == 0
    assert search("q=alpha&status=pending,success", key).json()["total"] == 5


def test_a_pinned_key_searches_only_its_resource(drain: Any) -> None:
    acme = echo({"word": "gamma"}, resource="acme")
    echo({"word": "gamma"}, resource="globex")
    drain()

    body = search("q=gamma", api_key("acme")).json()

    assert [r["run_id"] for r in body["runs"]] == [str(acme.id)]
    assert body["total"] == 1
    assert search("q=gamma", api_key()).json()["total"] == 2


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("bogus=1", "bogus"),
        ("status=flying", "status"),
        ("sort=sideways", "sort"),
        ("limit=0", "limit"),
        ("limit=many", "limit"),
        ("offset=-1", "offset"),
        ("thread=not-a-uuid", "thread"),
        ("q=" + "x" * 600, "q"),
    ],
)
def test_it_refuses_a_bad_parameter_naming_it(query: str, field: str) -> None:
    response = search(query, api_key())
    assert response.status_code == 422, response.content[:300]
    assert field in response.content.decode()


def test_it_needs_an_api_key() -> None:
    assert Client().get("/api/runs/search?q=x").status_code == 401
