"""python manage.py seed_demo: users, groups and runs in every status, executed by the real engine."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandParser
from django.test import override_settings

from runs import services
from runs.engine.registry import all_agents
from runs.engine.worker import drain
from runs.models import Run, RunStatus

USERS = [
    # (username, staff/superuser, groups, resources it is bound to: none = sees every run)
    ("admin", True, (), ()),
    ("reviewer", False, ("Reviewers",), ()),
    ("support", False, ("Support",), ()),
    # Tenant-scoped staff: sees and acts on the "acme" threads and runs only.
    ("acme-support", False, ("Reviewers", "Support"), ("acme",)),
]

DEMO_EMAIL = {
    "sender": "ada@acme.example",
    "subject": "Charged twice for order A-1001",
    "body": "Hi, my card was charged twice for the same order. Can you fix it?",
}


class Command(BaseCommand):
    help = "Create demo users (password = username) and threads/runs in every status."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--force", action="store_true", help="add demo runs even if runs exist")

    def handle(self, *args: Any, force: bool, **options: Any) -> None:
        services.groups_ensure()
        for username, staff, groups, resources in USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(username)
                user.is_staff = staff
                user.is_superuser = staff
                user.save()
            user.groups.add(*Group.objects.filter(name__in=groups))
            if resources:
                services.staff_scope_set(user=user, resource_ids=resources)
        if Run.objects.exists() and not force:
            self.stdout.write("demo runs already present; users and groups ensured")
            return
        self._seed_runs()
        counts = {s: Run.objects.filter(status=s).count() for s in RunStatus.values}
        self.stdout.write("seeded demo runs: " + ", ".join(f"{k} {v}" for k, v in counts.items()))

    def _seed_runs(self) -> None:
        actor = "seed_demo"

        def thread(resource: str, customer: str) -> Any:
            return services.thread_create(metadata={"resource_id": resource, "customer": customer})

        acme, globex, initech = (
            thread("acme", "Ada"),
            thread("globex", "Grace"),
            thread("initech", "Linus"),
        )
        # success
        for i, t in enumerate([acme, globex, initech]):
            services.run_create(
                agent_id="echo", thread_id=t.id, input={"message": f"hello #{i}"}, actor=actor
            )
        services.run_create(
            agent_id="weather", thread_id=globex.id, input={"city": "Lisbon"}, actor=actor
        )
        services.run_create(agent_id="flaky", thread_id=initech.id, input={}, actor=actor)
        drain()
        # suspended: approvals, a question for the user, and a supervisor waiting on its sub-agent
        for t, order, amount in [
            (acme, "A-1001", 25.0),
            (globex, "G-2002", 480.0),
            (initech, "I-3003", 12.5),
        ]:
            services.run_create(
                agent_id="refund",
                thread_id=t.id,
                input={"order_id": order, "amount": amount},
                actor=actor,
            )
        services.run_create(agent_id="weather", thread_id=None, input={}, actor=actor)
        if "email_triage" in all_agents():  # the LangGraph demo graph (make run registers it)
            services.run_create(
                agent_id="email_triage",
                thread_id=thread("acme", "Ada").id,
                input=DEMO_EMAIL,
                actor=actor,
            )
        services.run_create(
            agent_id="support",
            thread_id=thread("acme", "Alan").id,
            input={"message": "I was charged twice", "order_id": "A-1002", "amount": 40.0},
            actor=actor,
        )
        drain()
        # error (a failure with no retry left) and timeout (over its time limit)
        with override_settings(RUNS_MAX_ATTEMPTS=1):
            services.run_create(agent_id="flaky", thread_id=None, input={}, actor=actor)
            drain()
        with override_settings(RUNS_DEFAULT_TIME_LIMIT=0.3):
            services.run_create(
                agent_id="slow", thread_id=None, input={"steps": 10, "delay_ms": 100}, actor=actor
            )
            drain()
        # interrupted (cancelled while pending)
        doomed = services.run_create(
            agent_id="slow", thread_id=None, input={"steps": 5}, actor=actor
        )
        services.run_cancel(
            run=doomed, action="interrupt", actor="support", reason="demo: not needed"
        )
        # pending (scheduled an hour ahead) and one long run the server's worker picks up (running)
        services.run_create(
            agent_id="echo", thread_id=None, input={"later": True}, after_seconds=3600, actor=actor
        )
        services.run_create(
            agent_id="slow", thread_id=None, input={"steps": 600, "delay_ms": 1000}, actor=actor
        )
