"""Run webhooks and notification rules: the outbox written with each suspend/end, sent to a real
HTTP receiver on loopback with retries, signatures and ids; e-mail through Django's locmem
backend; the refusals (422 naming `webhook`) and the run page's deliveries."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core import mail
from django.test import Client
from django.utils import timezone

from runs import services
from runs.engine.delivery import deliver_due
from runs.engine.worker import Worker
from runs.models import Delivery, NotificationRule, Run, RunStatus, Thread
from runs.selectors.notifications import stuck_runs_to_announce
from tests.test_graphs import graphs  # noqa: F401 - the `graphs` fixture


class Receiver:
    """An HTTP server on 127.0.0.1 that answers each POST with the next scripted reply:
    a status code, or "hang" (sleep past the sender's timeout, then 200)."""

    def __init__(self, replies: list[int | str] | None = None, hang_seconds: float = 2.0):
        self.replies = list(replies or [])
        self.requests: list[dict[str, Any]] = []
        self.hang_seconds = hang_seconds
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append(
                    {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                )
                reply = receiver.replies.pop(0) if receiver.replies else 200
                if reply == "hang":
                    time.sleep(receiver.hang_seconds)
                    reply = 200
                self.send_response(int(reply))
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def json(self, i: int) -> Any:
        return json.loads(self.requests[i]["body"])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    settings.RUNS_API_AUTH = False
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on loopback
    settings.RUNS_WEBHOOK_SECRET = "s3cret"
    settings.RUNS_WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.RUNS_WEBHOOK_BACKOFF_SECONDS = 0.01
    settings.RUNS_WEBHOOK_BACKOFF_MAX_SECONDS = 0.05


def post(path: str, body: Any) -> Any:
    return Client().post(f"/api{path}", json.dumps(body), content_type="application/json")


def new_thread() -> str:
    r = post("/threads", {})
    assert r.status_code == 200
    return r.json()["thread_id"]


def deliver_until_done(timeout: float = 10.0) -> None:
    """Send what is due until nothing is left pending or retrying (backoff is tiny here)."""
    end = time.monotonic() + timeout
    while Delivery.objects.filter(status__in=("pending", "retrying")).exists():
        assert time.monotonic() < end, list(Delivery.objects.values("status", "last_error"))
        deliver_due()
        time.sleep(0.02)


def refund_input() -> dict[str, Any]:
    return {"order_id": "A-1", "amount": 5}


# --- the run's own webhook ------------------------------------------------------------------


@pytest.mark.django_db
def test_it_posts_the_run_when_it_suspends_and_again_when_it_ends(
    receiver: Receiver, drain: Any
) -> None:
    tid = new_thread()
    r = post(
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": refund_input(), "webhook": receiver.url},
    )
    assert r.status_code == 200, r.content
    run_id = r.json()["run_id"]
    assert Run.objects.get(id=run_id).webhook == receiver.url
    drain()
    deliver_until_done()
    assert len(receiver.requests) == 1
    suspended = receiver.json(0)
    assert suspended["run_id"] == run_id
    assert suspended["thread_id"] == tid
    assert suspended["status"] == "suspended"
    assert suspended["event"] == "suspended"
    assert suspended["values"] == Thread.objects.get(id=tid).values
    assert receiver.requests[0]["headers"]["x-runsite-event"] == "suspended"

    r = post(
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "command": {"resume": {"approved": True}}},
    )
    assert r.status_code == 200, r.content
    drain()
    deliver_until_done()
    assert len(receiver.requests) == 2
    ended = receiver.json(1)
    assert ended["run_id"] == run_id
    assert ended["status"] == "success"
    assert ended["values"] == Thread.objects.get(id=tid).values
    ids = {rq["headers"]["x-runsite-delivery"] for rq in receiver.requests}
    assert len(ids) == 2  # one id per delivery


@pytest.mark.django_db
def test_it_posts_a_stateless_runs_end_from_runs_wait(receiver: Receiver) -> None:
    r = post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    assert r.status_code == 200, r.content
    from runs.engine.worker import drain as _drain

    _drain()
    deliver_until_done()
    assert receiver.json(0)["status"] == "success"
    assert receiver.json(0)["run_id"] == r.json()["run_id"]


@pytest.mark.django_db
def test_it_retries_a_failing_receiver_until_it_answers_200(receiver: Receiver, drain: Any) -> None:
    receiver.replies = [500, "hang", 200]
    receiver.hang_seconds = 1.5  # past the 0.5 s timeout
    r = post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    assert r.status_code == 200
    drain()
    deliver_until_done()
    d = Delivery.objects.get()
    assert d.status == "sent"
    assert d.attempts == 3
    assert [e["status_code"] for e in d.log] == [500, None, 200]
    assert d.log[1]["error"].startswith("timeout")
    assert len(receiver.requests) == 3
    # The same delivery each time: a receiver dedupes on the id.
    assert {rq["headers"]["x-runsite-delivery"] for rq in receiver.requests} == {str(d.id)}
    assert len({rq["body"] for rq in receiver.requests}) == 1


@pytest.mark.django_db
def test_it_signs_the_timestamp_and_body_with_the_secret(receiver: Receiver, drain: Any) -> None:
    post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    drain()
    deliver_until_done()
    request = receiver.requests[0]
    timestamp = request["headers"]["x-runsite-timestamp"]
    expected = hmac.new(
        b"s3cret", timestamp.encode() + b"." + request["body"], hashlib.sha256
    ).hexdigest()
    assert request["headers"]["x-runsite-signature"] == f"sha256={expected}"
    assert abs(int(timestamp) - time.time()) < 300
    forged = hmac.new(b"other", timestamp.encode() + b"." + request["body"], hashlib.sha256)
    assert request["headers"]["x-runsite-signature"] != f"sha256={forged.hexdigest()}"


@pytest.mark.django_db
def test_it_gives_up_after_the_configured_attempts(
    receiver: Receiver, drain: Any, settings: Any
) -> None:
    settings.RUNS_WEBHOOK_MAX_ATTEMPTS = 3
    receiver.replies = [503] * 10
    post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    drain()
    deliver_until_done()
    d = Delivery.objects.get()
    assert d.status == "failed"
    assert d.attempts == 3
    assert d.last_error == "HTTP 503"
    assert len(receiver.requests) == 3
    assert d.finished_at is not None


@pytest.mark.django_db
def test_it_reclaims_a_delivery_whose_worker_lease_expired(receiver: Receiver, drain: Any) -> None:
    post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    drain()
    [lost] = services.deliveries_claim(owner="dead-worker", limit=5)
    assert services.deliveries_claim(owner="other", limit=5) == []  # leased
    Delivery.objects.filter(id=lost.id).update(locked_until=timezone.now() - timedelta(seconds=1))
    deliver_until_done()
    d = Delivery.objects.get()
    assert d.status == "sent" and d.attempts == 2
    # The dead worker's late report is fenced off.
    assert (
        services.delivery_record(
            delivery_id=d.id, owner="dead-worker", attempt=1, status_code=500, error="late"
        )
        is None
    )
    assert Delivery.objects.get().status == "sent"


@pytest.mark.django_db
def test_it_posts_the_cancelled_run(receiver: Receiver, drain: Any, support: User) -> None:
    tid = new_thread()
    r = post(
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": refund_input(), "webhook": receiver.url},
    )
    drain()
    run = Run.objects.get(id=r.json()["run_id"])
    services.run_cancel(run=run, action="interrupt", actor=support)
    deliver_until_done()
    assert [receiver.json(i)["status"] for i in range(2)] == ["suspended", "interrupted"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("graphs")
def test_it_posts_a_langgraph_graphs_run(receiver: Receiver, drain: Any) -> None:
    tid = new_thread()
    r = post(
        f"/threads/{tid}/runs",
        {"assistant_id": "approval", "input": {"order_id": "b-1"}, "webhook": receiver.url},
    )
    assert r.status_code == 200, r.content
    drain()
    deliver_until_done()
    assert receiver.json(0)["status"] == "suspended"
    r = post(
        f"/threads/{tid}/runs",
        {
            "assistant_id": "approval",
            "command": {"resume": {"approved": True}},
            "webhook": receiver.url + "?resumed=1",
        },
    )
    assert r.status_code == 200, r.content
    drain()
    deliver_until_done()
    assert receiver.json(1)["status"] == "success"
    assert receiver.json(1)["values"] == Thread.objects.get(id=tid).values
    assert Delivery.objects.filter(target=receiver.url + "?resumed=1").count() == 1


# --- refusals ---------------------------------------------------------------------------------

REFUSED = [
    "ftp://example.com/hook",
    "not a url",
    "http://127.0.0.1:9/hook",
    "http://localhost/hook",
    "http://10.1.2.3/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://[::1]/hook",
    "http://user:pw@example.com/hook",
]


@pytest.mark.django_db
@pytest.mark.parametrize("url", REFUSED)
@pytest.mark.parametrize("endpoint", ["/runs", "/runs/wait", "/runs/stream", "thread"])
def test_it_refuses_a_webhook_it_may_not_call(settings: Any, url: str, endpoint: str) -> None:
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = False
    path = f"/threads/{new_thread()}/runs" if endpoint == "thread" else endpoint
    r = post(path, {"assistant_id": "echo", "input": "hi", "webhook": url})
    assert r.status_code == 422, r.content
    assert r.json()["errors"][0]["field"] == "webhook"
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_it_refuses_a_batch_with_one_bad_webhook_whole(settings: Any) -> None:
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = False
    good = {"assistant_id": "echo", "input": 1}
    r = post("/runs/batch", [good, {**good, "webhook": "http://127.0.0.1/x"}])
    assert r.status_code == 422
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("graphs")
def test_it_refuses_a_graph_runs_private_webhook(settings: Any) -> None:
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = False
    tid = new_thread()
    r = post(
        f"/threads/{tid}/runs",
        {"assistant_id": "approval", "input": {}, "webhook": "http://10.0.0.1/"},
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "webhook"
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_it_checks_the_target_again_when_it_delivers(
    receiver: Receiver, drain: Any, settings: Any
) -> None:
    post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    drain()
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = False  # turned off since (or DNS moved)
    deliver_until_done()
    d = Delivery.objects.get()
    assert d.status == "failed"
    assert "loopback" in d.last_error or "private" in d.last_error
    assert receiver.requests == []


# --- notification rules -----------------------------------------------------------------------


@pytest.fixture
def on_call(db: Any) -> Group:
    group = Group.objects.create(name="On call")
    for name, email in [("ann", "ann@example.com"), ("ben", ""), ("cat", "cat@example.com")]:
        User.objects.create_user(username=name, email=email).groups.add(group)
    return group


@pytest.mark.django_db
def test_a_rule_notifies_slack_and_emails_its_group_when_a_run_suspends(
    receiver: Receiver, drain: Any, on_call: Group
) -> None:
    NotificationRule.objects.create(
        name="refunds",
        agent_id="refund",
        events=["suspended"],
        webhook_url=receiver.url,
        webhook_format="slack",
        email_group=on_call,
    )
    r = post("/runs", {"assistant_id": "refund", "input": refund_input()})
    run_id = r.json()["run_id"]
    drain()
    deliver_until_done()
    body = receiver.json(0)
    assert set(body) == {"text"}
    assert f"/runs/{run_id}/" in body["text"] and "issue_refund" in body["text"]
    [message] = mail.outbox
    assert sorted(message.to) == ["ann@example.com", "cat@example.com"]
    assert f"/runs/{run_id}/" in message.body
    assert "waiting for a human" in message.subject
    assert {d.status for d in Delivery.objects.all()} == {"sent"}


@pytest.mark.django_db
def test_a_rule_for_one_resource_ignores_the_others(receiver: Receiver, drain: Any) -> None:
    NotificationRule.objects.create(
        name="tenant a",
        agent_id="refund",
        resource_id="tenant-a",
        events=["suspended", "error"],
        webhook_url=receiver.url,
    )
    for resource in ("tenant-a", "tenant-b"):
        thread = services.thread_create(metadata={}, pinned_resource_id=resource)
        services.run_create(
            agent_id="refund", actor=None, thread_id=thread.id, input=refund_input()
        )
    drain()
    deliver_until_done()
    assert len(receiver.requests) == 1
    generic = receiver.json(0)
    assert generic["event"] == "suspended"
    assert generic["run"]["resource_id"] == "tenant-a"
    assert generic["url"].endswith(f"/runs/{generic['run']['id']}/")


@pytest.mark.django_db
def test_a_rule_hears_errors_and_timeouts_but_not_what_it_did_not_pick(
    receiver: Receiver, drain: Any, settings: Any
) -> None:
    settings.RUNS_MAX_ATTEMPTS = 1
    NotificationRule.objects.create(
        name="flaky", agent_id="flaky", events=["error", "timeout"], webhook_url=receiver.url
    )
    NotificationRule.objects.create(
        name="echo", agent_id="echo", events=["error"], webhook_url=receiver.url
    )
    post("/runs", {"assistant_id": "flaky", "input": {}})
    post("/runs", {"assistant_id": "echo", "input": "fine"})
    drain()
    deliver_until_done()
    assert [receiver.json(i)["event"] for i in range(len(receiver.requests))] == ["error"]
    assert "failed" in receiver.json(0)["text"]


@pytest.mark.django_db
def test_a_stuck_run_is_announced_once(receiver: Receiver, settings: Any) -> None:
    NotificationRule.objects.create(
        name="stuck", agent_id="echo", events=["stuck"], webhook_url=receiver.url
    )
    r = post("/runs", {"assistant_id": "echo", "input": "never claimed"})
    run_id = r.json()["run_id"]
    assert stuck_runs_to_announce() == []
    Run.objects.filter(id=run_id).update(created_at=timezone.now() - timedelta(minutes=30))
    worker = Worker(owner="scanner", listen=False)
    worker._announce_stuck()
    worker._announce_stuck()  # a second scan (or another worker) adds nothing
    services.runs_announce_stuck(run_ids=[run_id])  # nor does a racing one
    assert Delivery.objects.filter(event="stuck").count() == 1
    deliver_until_done()
    assert receiver.json(0)["event"] == "stuck"
    assert receiver.json(0)["run"]["status"] == RunStatus.PENDING


# --- pages ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_shows_its_deliveries(
    receiver: Receiver, drain: Any, reviewer: User, settings: Any
) -> None:
    settings.RUNS_WEBHOOK_MAX_ATTEMPTS = 1
    receiver.replies = [500]
    r = post("/runs", {"assistant_id": "echo", "input": "hi", "webhook": receiver.url})
    run_id = r.json()["run_id"]
    drain()
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/runs/{run_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Deliveries" in html and 'hx-get="/runs/' in html  # pending: refreshes itself
    deliver_until_done()
    fragment = client.get(f"/runs/{run_id}/deliveries/", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    html = fragment.content.decode()
    assert "s-failed" in html and "HTTP 500" in html and "hx-get" not in html
    assert client.get(f"/runs/{Thread.objects.get().id}/deliveries/").status_code == 404


@pytest.mark.django_db
def test_the_deliveries_region_needs_a_login(drain: Any) -> None:
    r = post("/runs", {"assistant_id": "echo", "input": "hi"})
    page = Client().get(f"/runs/{r.json()['run_id']}/deliveries/")
    assert page.status_code == 302


@pytest.mark.django_db
def test_staff_manage_rules_in_the_admin_and_a_private_url_is_refused(
    staff: User, settings: Any
) -> None:
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = False
    client = Client()
    client.force_login(staff)
    form = {
        "name": "ops",
        "agent_id": "refund",
        "resource_id": "",
        "events": ["suspended", "stuck"],
        "webhook_url": "http://127.0.0.1/hook",
        "webhook_format": "generic",
        "active": "on",
    }
    r = client.post("/admin/runs/notificationrule/add/", form)
    assert r.status_code == 200
    assert "loopback" in r.content.decode()
    assert not NotificationRule.objects.exists()
    r = client.post("/admin/runs/notificationrule/add/", {**form, "webhook_url": ""})
    assert r.status_code == 200  # neither a URL nor a group
    assert not NotificationRule.objects.exists()
    group = Group.objects.create(name="ops")
    r = client.post(
        "/admin/runs/notificationrule/add/", {**form, "webhook_url": "", "email_group": group.id}
    )
    assert r.status_code == 302
    rule = NotificationRule.objects.get()
    assert rule.events == ["suspended", "stuck"] and rule.email_group == group
    assert client.get("/admin/runs/delivery/").status_code == 200


@pytest.mark.django_db
def test_a_rule_hears_the_reapers_timeout_and_the_run_webhook_too(receiver: Receiver) -> None:
    NotificationRule.objects.create(
        name="timeouts", agent_id="slow", events=["timeout"], webhook_url=receiver.url + "?rule"
    )
    r = post("/runs", {"assistant_id": "slow", "input": {}, "webhook": receiver.url})
    [claimed] = services.run_claim(owner="frozen-worker")  # then the worker hangs in a tool
    Run.objects.filter(id=claimed.run.id).update(deadline_at=timezone.now() - timedelta(seconds=1))
    services.runs_reap()
    assert Run.objects.get(id=r.json()["run_id"]).status == RunStatus.TIMEOUT
    deliver_until_done()
    bodies = sorted((rq["body"] for rq in receiver.requests), key=len)
    assert {json.loads(b)["event"] for b in bodies} == {"timeout"}
    assert len(bodies) == 2  # the rule's and the run's own
    assert Delivery.objects.filter(status="sent").count() == 2


@pytest.mark.django_db
def test_the_outbox_row_commits_or_rolls_back_with_the_state_change(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = post("/runs", {"assistant_id": "flaky", "input": {}, "webhook": receiver.url})
    [claimed] = services.run_claim(owner="w")

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("database went away after the outbox insert")

    monkeypatch.setattr("runs.services.finish._publish_fenced", crash)
    with pytest.raises(RuntimeError):
        services.run_finish(lease=claimed.lease, status="error", error={"error": "X"})
    assert Run.objects.get(id=r.json()["run_id"]).status == RunStatus.RUNNING
    assert not Delivery.objects.exists()
    monkeypatch.undo()
    services.run_finish(lease=claimed.lease, status="error", error={"error": "X"})
    assert Delivery.objects.get().event == "error"
