"""The production topology for real: two Daphne instances and two workers on PostgreSQL + Redis.

Faults are injected into real processes (SIGKILL, restarts, pg_terminate_backend, Redis
client kills). Each test records what it saw in the reliability report (tests/reliability.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
from django.db import connection

from runs import services
from runs.models import Checkpoint, Run, RunEvent, RunStatus
from tests import reliability
from tests.e2e.conftest import LiveRunsite
from tests.helpers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]

FAST = {
    "RUNS_LEASE_SECONDS": "3",
    "RUNS_HEARTBEAT_SECONDS": "1",
    "RUNS_REAPER_SECONDS": "0.5",
    "RUNS_POLL_SECONDS": "0.25",
    "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS": "3000",
}


@dataclass
class Cluster:
    webs: list[LiveRunsite]
    workers: list[WorkerProcess]
    key: str
    start_web: object = None
    start_worker: object = None
    extra: dict = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.key}

    def api(self, i: int) -> httpx.Client:
        return httpx.Client(base_url=f"{self.webs[i].url}/api", headers=self.headers, timeout=30)


@pytest.fixture
def cluster(site_factory, start_worker) -> Cluster:
    if not os.environ.get("REDIS_URL"):
        if os.environ.get("CI"):
            pytest.fail("the cluster tests need REDIS_URL (CI is set)")
        pytest.skip("the cluster tests need REDIS_URL")
    _, raw = services.api_key_create(name="cluster")

    def web() -> LiveRunsite:
        return site_factory(embedded_worker=False, RUNS_API_AUTH="on", **FAST)

    def worker() -> WorkerProcess:
        return start_worker(concurrency=4, **FAST)

    return Cluster(
        webs=[web(), web()],
        workers=[worker(), worker()],
        key=raw,
        start_web=web,
        start_worker=worker,
    )


def create_runs(client: httpx.Client, agent: str, input: dict, n: int) -> list[str]:
    # Stateless runs whose temporary threads are kept: the checks read them after they end.
    ids = []
    for _ in range(n):
        response = client.post(
            "/runs", json={"on_completion": "keep", "assistant_id": agent, "input": input}
        )
        assert response.status_code == 200, response.text
        ids.append(response.json()["run_id"])
    return ids


def finished_counts(ids: list[str]) -> Counter:
    return Counter(
        str(r)
        for r in RunEvent.objects.filter(run_id__in=ids, kind="finished").values_list(
            "run_id", flat=True
        )
    )


def assert_steps_unique(ids: list[str]) -> None:
    for rid in ids:
        steps = list(Checkpoint.objects.filter(run_id=rid).values_list("step", flat=True))
        assert sorted(steps) == list(range(len(steps))), f"run {rid}: steps {sorted(steps)}"


def test_sigkill_of_a_worker_during_20_slow_runs(cluster: Cluster) -> None:
    with cluster.api(1) as b:
        ids = create_runs(b, "slow", {"steps": 10, "delay_ms": 100}, 20)
    victim = cluster.workers[0]
    wait_for(
        lambda: (
            Run.objects.filter(lease_owner__contains=f":{victim.pid}:", status="running").count()
            >= 2
        ),
        timeout=20,
    )
    held = list(
        Run.objects.filter(lease_owner__contains=f":{victim.pid}:").values_list("id", flat=True)
    )
    victim.signal(signal.SIGKILL)
    wait_for(
        lambda: Run.objects.filter(id__in=ids, status=RunStatus.SUCCESS).count() == 20, timeout=60
    )
    finished = finished_counts(ids)
    duplicated = sum(1 for n in finished.values() if n > 1)
    lost = 20 - Run.objects.filter(id__in=ids, status=RunStatus.SUCCESS).count()
    assert_steps_unique(ids)
    assert (lost, duplicated) == (0, 0)
    reliability.record(
        "SIGKILL of one of two workers mid-run",
        runs=20,
        observed=f"{len(held)} runs held by the killed worker were re-claimed after the lease (3 s) and finished; every step checkpointed once",
        lost=lost,
        duplicated=duplicated,
    )


def test_restart_of_every_process_with_50_suspended_and_10_running(cluster: Cluster) -> None:
    with cluster.api(0) as a, cluster.api(1) as b:
        refunds = [
            a.post(
                "/runs",
                json={
                    "on_completion": "keep",
                    "assistant_id": "refund",
                    "input": {"order_id": f"R-{i}", "amount": 10 + i},
                },
            ).json()["run_id"]
            for i in range(50)
        ]
        slows = create_runs(b, "slow", {"steps": 60, "delay_ms": 100}, 10)
    wait_for(
        lambda: Run.objects.filter(id__in=refunds, status=RunStatus.SUSPENDED).count() == 50,
        timeout=60,
    )
    wait_for(
        lambda: Run.objects.filter(id__in=slows, status=RunStatus.RUNNING).count() >= 8, timeout=30
    )
    running_before = Run.objects.filter(id__in=slows, status=RunStatus.RUNNING).count()
    for web in cluster.webs:
        web.stop()
    for w in cluster.workers:
        w.stop()
    released = Run.objects.filter(id__in=slows, status=RunStatus.PENDING).count()
    cluster.webs = [cluster.start_web(), cluster.start_web()]
    cluster.workers = [cluster.start_worker(), cluster.start_worker()]
    with cluster.api(0) as a2:
        listed = a2.get("/agents/refund/suspended-runs", params={"per_page": 100, "page": 0}).json()
    assert listed["total"] == 50
    assert {r["run_id"] for r in listed["runs"]} == set(refunds)
    wait_for(
        lambda: Run.objects.filter(id__in=slows, status=RunStatus.SUCCESS).count() == 10, timeout=90
    )
    # the suspended runs still resume after the restart
    with cluster.api(1) as b2:
        for rid in refunds[:5]:
            assert (
                b2.post("/agents/refund/approve-tool-call", json={"run_id": rid}).status_code == 202
            )
    wait_for(
        lambda: Run.objects.filter(id__in=refunds[:5], status=RunStatus.SUCCESS).count() == 5,
        timeout=30,
    )
    lost = 60 - Run.objects.filter(id__in=refunds + slows).count()
    finished = finished_counts(slows + refunds[:5])
    duplicated = sum(1 for n in finished.values() if n > 1)
    assert_steps_unique(slows)
    assert (lost, duplicated) == (0, 0)
    reliability.record(
        "restart of both web instances and both workers (SIGTERM)",
        runs=60,
        observed=(
            f"50 suspended runs listed again after restart; {running_before} running runs "
            f"released to pending on SIGTERM ({released} seen pending) and finished on the new workers"
        ),
        lost=lost,
        duplicated=duplicated,
    )


def test_postgres_connections_killed_under_load(cluster: Cluster) -> None:
    statuses: Counter = Counter()
    created: list[str] = []
    stop = threading.Event()

    def load(i: int) -> None:
        with cluster.api(i) as client:
            while not stop.is_set():
                try:
                    r = client.post(
                        "/runs",
                        json={
                            "on_completion": "keep",
                            "assistant_id": "echo",
                            "input": {"n": len(created)},
                        },
                    )
                    statuses[r.status_code] += 1
                    if r.status_code == 200:
                        created.append(r.json()["run_id"])
                    r = client.get(
                        "/agents/refund/suspended-runs", params={"per_page": 10, "page": 0}
                    )
                    statuses[r.status_code] += 1
                    r = client.post("/threads/search", json={"limit": 5})
                    statuses[r.status_code] += 1
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1

    loaders = [threading.Thread(target=load, args=(i,)) for i in (0, 1)]
    for t in loaders:
        t.start()
    killed = 0
    try:
        time.sleep(1.5)
        for _ in range(3):
            with connection.cursor() as c:
                c.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                killed += c.fetchone()[0]
            time.sleep(1.5)
    finally:
        stop.set()
        for t in loaders:
            t.join(30)
    server_errors = {
        k: v for k, v in statuses.items() if isinstance(k, int) and k >= 500 and k != 503
    }
    assert not server_errors, statuses
    assert statuses[200] > 0
    # workers reconnect and continue: everything accepted finishes, and new work still runs
    with cluster.api(0) as a:
        after = create_runs(a, "echo", {"after": True}, 10)
    wait_for(
        lambda: (
            Run.objects.filter(id__in=created + after, status=RunStatus.SUCCESS).count()
            == len(created) + 10
        ),
        timeout=90,
    )
    # nothing half-written: every run has its created event and exactly one end
    runs = Run.objects.filter(id__in=created + after)
    assert runs.count() == len(created) + 10
    assert RunEvent.objects.filter(run__in=runs, kind="created").count() == runs.count()
    finished = finished_counts(created + after)
    duplicated = sum(1 for n in finished.values() if n > 1)
    assert duplicated == 0
    assert not Run.objects.filter(status__in=[RunStatus.PENDING, RunStatus.RUNNING]).exists()
    reliability.record(
        "pg_terminate_backend of every connection, 3 times under API load",
        runs=len(created) + 10,
        observed=(
            f"{killed} connections killed; responses {dict((str(k), v) for k, v in statuses.items())} "
            "(failures are 503s or dropped connections, no other 5xx); workers reconnected and "
            "finished every accepted run"
        ),
        lost=0,
        duplicated=duplicated,
    )


# --- live updates across instances -------------------------------------------------------------

ROW_STATUS = r'id="{prefix}-{rid}"[^>]*>.*?badge s-(\w+)'


def statuses_seen(recorder, prefix: str, rid: str) -> list[tuple[float, str]]:
    import re

    pattern = re.compile(ROW_STATUS.format(prefix=prefix, rid=rid), re.S)
    seen = []
    for t, frame in recorder.frames:
        for row in frame.split("</tr>"):
            m = pattern.search(row)
            if m and (not seen or seen[-1][1] != m.group(1)):
                seen.append((t, m.group(1)))
    return seen


@pytest.fixture
def watcher(cluster: Cluster, support):
    from tests.helpers import WsRecorder, session_cookie_for

    cookie = session_cookie_for(support)
    recorders = []

    def watch(i: int, path: str) -> WsRecorder:
        site = cluster.webs[i]
        r = WsRecorder(site.url.replace("http://", "ws://") + path, cookie=cookie, origin=site.url)
        assert r.connected.wait(15), r.error
        recorders.append(r)
        return r

    yield watch
    for r in recorders:
        r.stop()


def test_a_client_on_one_instance_sees_a_run_made_on_the_other_through_every_status(
    cluster: Cluster, watcher
) -> None:
    a = watcher(0, "/ws/runs/?view=runs")
    time.sleep(0.5)
    with cluster.api(1) as b:
        body = b.post(
            "/runs",
            json={
                "on_completion": "keep",
                "assistant_id": "slow",
                "input": {"steps": 10, "delay_ms": 100},
                "after_seconds": 1,
            },
        ).json()
    rid = body["run_id"]
    wait_for(lambda: Run.objects.get(id=rid).status == RunStatus.SUCCESS, timeout=30)
    time.sleep(1.2)
    run = Run.objects.get(id=rid)
    seen = statuses_seen(a, "run-row", rid)
    statuses = [s for _, s in seen]
    assert statuses == ["pending", "running", "success"], statuses
    at = dict((s, t) for t, s in seen)
    delays = {
        "pending": at["pending"] - run.created_at.timestamp(),
        "running": at["running"] - run.started_at.timestamp(),
        "success": at["success"] - run.finished_at.timestamp(),
    }
    assert max(delays.values()) < 1.0, delays
    reliability.record(
        "live update across instances (API on B, worker, websocket on A)",
        runs=1,
        observed="statuses seen on A: "
        + " → ".join(statuses)
        + "; commit→frame "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in delays.items()),
    )


def test_approving_on_one_instance_drops_the_run_from_the_inbox_on_the_other(
    cluster: Cluster, watcher
) -> None:
    inbox = watcher(0, "/ws/runs/?view=inbox")
    time.sleep(0.5)
    with cluster.api(1) as b:
        rid = b.post(
            "/runs",
            json={
                "on_completion": "keep",
                "assistant_id": "refund",
                "input": {"order_id": "I-1", "amount": 7},
            },
        ).json()["run_id"]
        # The row itself (a deletion frame for the still-pending run names it too).
        wait_for(lambda: inbox.first(f'<tr id="inbox-row-{rid}"') is not None, timeout=15)
        approved_at = time.time()
        assert b.post("/agents/refund/approve-tool-call", json={"run_id": rid}).status_code == 202
    deletion = f'id="inbox-row-{rid}" hx-swap-oob="delete"'

    def dropped_at() -> float | None:
        # the first removal after the approval (a pending run is removed before it suspends)
        return next((t for t, f in inbox.frames if t >= approved_at and deletion in f), None)

    wait_for(lambda: dropped_at() is not None, timeout=5)
    dropped = dropped_at() - approved_at
    wait_for(lambda: Run.objects.get(id=rid).status == RunStatus.SUCCESS, timeout=15)
    assert dropped < 1.0
    reliability.record(
        "approve on instance B, inbox on instance A",
        runs=1,
        observed=f"row removed from A's inbox {dropped * 1000:.0f} ms after the approval; the worker finished the run",
    )


def test_killing_redis_connections_loses_no_run_state_and_clients_resync(
    cluster: Cluster, watcher
) -> None:
    import redis

    a = watcher(0, "/ws/runs/?view=runs")
    time.sleep(0.5)
    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    statuses: Counter = Counter()
    with cluster.api(1) as b:
        before = create_runs(b, "echo", {"before": True}, 5)
        killed = r.client_kill_filter(_type="pubsub") + r.client_kill_filter(
            _type="normal", skipme=True
        )
        killed_at = time.time()
        after = []
        for _ in range(10):
            resp = b.post(
                "/runs",
                json={"on_completion": "keep", "assistant_id": "echo", "input": {"after": True}},
            )
            statuses[resp.status_code] += 1
            if resp.status_code == 200:
                after.append(resp.json()["run_id"])
            time.sleep(0.1)
        listing = b.get("/agents/echo/runs", params={"status": "success"})
        statuses[listing.status_code] += 1
        ids = before + after
        wait_for(
            lambda: Run.objects.filter(id__in=ids, status=RunStatus.SUCCESS).count() == len(ids),
            timeout=30,
        )

    # The page's socket misses nothing for good: channels_redis re-subscribes A a second or so
    # after the kill and what was published meanwhile never reaches it, but A's hub hears its
    # beat again and the page resyncs from the database (runs/hub.py), and what B and the
    # workers could not publish is sent again (runs/live.py). Every run made after the kill
    # shows on A as it ended, without another change to carry it.
    def final_statuses() -> dict[str, str | None]:
        return {rid: (statuses_seen(a, "run-row", rid) or [(0, None)])[-1][1] for rid in after}

    wait_for(lambda: set(final_statuses().values()) == {"success"}, timeout=15)
    regained = min(a.first(f"run-row-{rid}") for rid in after)
    assert all(code < 500 for code in statuses if isinstance(code, int)), statuses
    assert len(after) == 10
    reliability.record(
        "Redis client connections killed (CLIENT KILL pubsub + normal) with clients connected",
        runs=len(ids),
        observed=f"{killed} Redis connections killed; API answers {dict(statuses)}; every run finished; "
        f"the websocket on A showed every run made after the kill, ended (the first {regained - killed_at:.1f} s after it)",
        lost=0,
        duplicated=sum(1 for n in finished_counts(ids).values() if n > 1),
    )
