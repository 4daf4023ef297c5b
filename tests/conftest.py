"""Shared fixtures: the cast of users, Postgres-only marking, engine helpers, worker processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection

from tests.helpers import WorkerProcess


@pytest.fixture(autouse=True)
def _postgres_only(request: pytest.FixtureRequest) -> None:
    """`@pytest.mark.postgres` tests fail (not skip) under CI when PostgreSQL is missing."""
    if request.node.get_closest_marker("postgres") and connection.vendor != "postgresql":
        if os.environ.get("CI"):
            pytest.fail("this test needs PostgreSQL: set DATABASE_URL=postgres://… (CI is set)")
        pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://…)")


def _user(username: str, *groups: str, staff: bool = False) -> User:
    from runs.services import groups_ensure

    groups_ensure()  # transactional tests flush the groups the data migration made
    user = User.objects.create_user(username=username, password=username)
    if staff:
        user.is_staff = user.is_superuser = True
        user.save()
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


@pytest.fixture
def reviewer(db: Any) -> User:
    return _user("rita", "Reviewers")


@pytest.fixture
def reviewer2(db: Any) -> User:
    return _user("rob", "Reviewers")


@pytest.fixture
def support(db: Any) -> User:
    return _user("sam", "Support")


@pytest.fixture
def staff(db: Any) -> User:
    return _user("stella", staff=True)


@pytest.fixture
def nobody(db: Any) -> User:
    return _user("nora")


@pytest.fixture
def drain() -> Callable[..., int]:
    """Execute queued runs in-process until none is runnable."""
    from runs.engine.worker import drain as _drain

    return _drain


@pytest.fixture
def register_agent() -> Iterator[Callable[[Any], Any]]:
    from runs.engine import registry

    added: list[str] = []

    def add(agent: Any) -> Any:
        registry.register(agent)
        added.append(agent.id)
        return agent

    yield add
    for agent_id in added:
        registry.unregister(agent_id)


@pytest.fixture
def start_worker(transactional_db: Any, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `manage.py runagents` processes on this test's database (transaction=True tests)."""
    started: list[WorkerProcess] = []

    def start(concurrency: int = 4, **env: str) -> WorkerProcess:
        w = WorkerProcess(
            concurrency=concurrency, log=tmp_path / f"worker{len(started)}.log", **env
        )
        started.append(w)
        w.wait_started()
        return w

    yield start
    for w in started:
        w.signal(signal.SIGCONT)
        w.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests import reliability

    if reliability.ROWS:
        vendor = connection.vendor
        database = (
            "PostgreSQL + Redis"
            if vendor == "postgresql" and os.environ.get("REDIS_URL")
            else vendor
        )
        reliability.write(database)
