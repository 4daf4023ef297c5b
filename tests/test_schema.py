"""The database the migrations build has every index and constraint the models declare.

Django's migration state can say a constraint exists while the database lacks it: an AlterField
that turns a column's own index off drops every index on that column alone that is not one of
Meta.indexes (0014 dropped `one_running_run_per_thread` on PostgreSQL that way; 0016 restores
it). `makemigrations --check` cannot see that; reading the database can.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction

from runs.models import Run, RunStatus, Thread

pytestmark = pytest.mark.django_db


def test_every_declared_index_and_constraint_is_in_the_database():
    missing = []
    with connection.cursor() as cursor:
        for model in apps.get_models():
            meta = model._meta
            if not meta.managed or meta.proxy:
                continue
            present = connection.introspection.get_constraints(cursor, meta.db_table)
            missing += [
                f"{meta.label}.{declared.name}"
                for declared in [*meta.indexes, *meta.constraints]
                if declared.name not in present
            ]
    assert missing == []


def test_a_thread_refuses_a_second_running_run():
    thread = Thread.objects.create()
    Run.objects.create(thread=thread, agent_id="echo", status=RunStatus.RUNNING)
    second = Run.objects.create(thread=thread, agent_id="echo", status=RunStatus.PENDING)
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.filter(id=second.id).update(status=RunStatus.RUNNING)
    # Another thread, or the same thread once its run ended, may run one.
    other = Run.objects.create(thread=Thread.objects.create(), agent_id="echo")
    Run.objects.filter(id=other.id).update(status=RunStatus.RUNNING)
    Run.objects.filter(thread=thread, status=RunStatus.RUNNING).update(status=RunStatus.SUCCESS)
    Run.objects.filter(id=second.id).update(status=RunStatus.RUNNING)
    assert Run.objects.filter(status=RunStatus.RUNNING).count() == 2
