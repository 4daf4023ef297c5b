"""Schema fuzzing of the whole API with schemathesis against /api/openapi.json: no 5xx, and every
response matches the status codes, content types and schemas the document declares.

Bounded (a few examples per operation) so it runs in CI. The streaming endpoints (stream, wait,
join, cancel with wait) follow a run until it ends, so they are left to the end-to-end suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from runs import services

# CI runs a bounded budget; `make fuzz` (SCHEMATHESIS_EXAMPLES=200) runs a larger one.
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "12"))

schema = (
    schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())
    .exclude(path_regex=r"/(stream|wait|join|resume-stream)$")
    .exclude(path_regex=r"/runs/\{run_id\}/cancel$")
)


@pytest.fixture(autouse=True)
def _api(settings: Any, db: Any) -> Iterator[None]:
    settings.RUNS_API_AUTH = False
    # Some data for the generated requests to find (most ids will still be random: 404s).
    thread = services.thread_create(metadata={"resource_id": "acme"})
    services.run_create(agent_id="echo", thread_id=thread.id, input={"x": 1}, actor="schema")
    # The WSGI app runs in this thread: keep the test transaction's connection open.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_api_honours_its_openapi_document(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, response.text[:500]
    case.validate_response(
        response,
        checks=[status_code_conformance, content_type_conformance, response_schema_conformance],
    )
