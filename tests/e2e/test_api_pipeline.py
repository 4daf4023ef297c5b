"""The JSON API's own middleware chain (settings.API_MIDDLEWARE, runsite/asgi.py) over a real
server (each supported one): what the API keeps (CORS, security headers, NUL refusal, API keys) and what it sheds
(sessions, CSRF, frame options), while the dashboard keeps the full chain."""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.every_server]

ORIGIN = "http://localhost:3000"


@pytest.fixture
def site(site_factory):
    return site_factory(RUNS_CORS_ALLOWED_ORIGINS=ORIGIN, RUNS_API_AUTH="on")


def test_it_answers_a_cors_preflight_from_an_allowed_origin(site):
    response = httpx.options(
        f"{site.url}/api/threads/search",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-api-key",
        },
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "x-api-key" in response.headers["access-control-allow-headers"].lower()


def test_it_refuses_other_origins_and_still_needs_a_key(site):
    response = httpx.post(
        f"{site.url}/api/threads/search", json={}, headers={"Origin": "http://evil.example"}
    )
    assert response.status_code == 401
    assert "access-control-allow-origin" not in response.headers


def test_it_refuses_nul_characters_before_the_database(site):
    response = httpx.get(f"{site.url}/api/ok?x=%00")
    assert response.status_code == 400
    assert "NUL" in response.json()["detail"]


def test_it_sheds_the_page_middleware_on_the_api_but_not_on_pages(site):
    api = httpx.get(f"{site.url}/api/ok")
    assert api.status_code == 200
    assert api.headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware kept
    assert "x-frame-options" not in api.headers  # clickjacking middleware shed
    assert "set-cookie" not in api.headers

    page = httpx.get(f"{site.url}/accounts/login/")
    assert page.status_code == 200
    assert page.headers["x-frame-options"] == "DENY"
    assert "csrftoken" in page.headers.get("set-cookie", "")
