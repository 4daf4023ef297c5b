"""Creating runs: the multitask strategies, stateless runs, sub-agent runs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import DateTimeField

from runs.contracts import Actor, JSONObject, JSONValue, Lease, actor_name, assistant_uuid
from runs.engine.registry import get_agent
from runs.exceptions import Conflict, NotFound, Unsupported, ValidationFailed
from runs.ids import uuid7
from runs.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    MultitaskStrategy,
    Run,
    RunEvent,
    RunStatus,
    Thread,
    ThreadStatus,
    ToolCall,
)
from runs.rows import (
    fetch_long,
    insert,
    insert_from_statement,
    insert_statements,
    write_together,
)
from runs.services import thread_hints
from runs.services.cancel import _cancel_locked
from runs.services.core import (
    QUEUE_CHANNEL,
    REJECT_MESSAGE,
    _append_events,
    _check_json_size,
    _fence,
    _is_postgres,
    _lock_thread,
    _lock_thread_row,
    _notifies_in_sql,
    _notify,
    _notify_in_process,
    _now,
    _publish,
    _refresh_thread,
    _thread_has_run_in,
    _uuid_param,
    _validate_choice,
)
from runs.services.decisions import thread_resume
from runs.services.search import new_run_document, search_refresh, search_refresh_thread
from runs.services.threads import thread_create
from runs.webhooks import validate_url


def run_create(
    *,
    agent_id: str,
    actor: Actor,
    thread_id: UUID | None = None,
    input: JSONValue = None,
    command: JSONObject | None = None,
    metadata: JSONObject | None = None,
    kwargs: JSONObject | None = None,
    multitask_strategy: str = MultitaskStrategy.ENQUEUE,
    if_not_exists: str = "reject",
    after_seconds: float | None = None,
    pinned_resource_id: str | None = None,
    webhook: str = "",
    run_id: UUID | None = None,
) -> Run:
    """Create a run (or, with `command.resume`, resume the thread's suspended run).

    `run_id`: the id the new run gets (default: a fresh one), so a caller can watch for its
    changes before it exists; a resumed run keeps its own id.

    `webhook` (LangGraph's): a URL POSTed the run when it suspends or ends (notifications);
    a URL that may not be called is refused (422 naming `webhook`). On resume it replaces the
    suspended run's webhook.

    Without a thread the run is stateless: it gets a temporary thread, deleted (with its runs,
    checkpoints and events) RUNS_STATELESS_KEEP_SECONDS after the run ends, unless
    `kwargs["on_completion"]` is "keep". A run in flight on the thread (pending, running, or
    suspended: a run waiting for a human holds its thread) is handled by `multitask_strategy`.
    """
    agent = get_agent(agent_id)
    if webhook:
        validate_url(webhook, field="webhook")
    _validate_choice(multitask_strategy, MultitaskStrategy.values, "multitask_strategy")
    _validate_choice(if_not_exists, ("reject", "create"), "if_not_exists")
    if after_seconds is not None and (after_seconds < 0 or after_seconds > 86400 * 365):
        raise ValidationFailed.field(
            "after_seconds",
            "out of range",
            detail="after_seconds must be between 0 and one year",
        )
    kwargs = dict(kwargs or {})
    on_completion = kwargs.get("on_completion")
    if on_completion is not None:
        if thread_id is not None:
            raise Unsupported(
                "on_completion", "on_completion applies only to stateless runs (without a thread)"
            )
        _validate_choice(on_completion, ("delete", "keep"), "on_completion")
    if command:
        for name in ("update", "goto"):
            if command.get(name) is not None:
                raise Unsupported(
                    f"command.{name}",
                    f"command.{name} is not supported for Runsite agents (only command.resume)",
                )
        if command.get("resume") is None:
            raise ValidationFailed.field("command", "command needs 'resume'")
        if thread_id is None:
            raise ValidationFailed.field(
                "thread_id",
                "required with command.resume",
                detail="You must provide a thread_id when resuming.",
            )
        resume = partial(
            thread_resume,
            thread_id=thread_id,
            resume=command["resume"],
            actor=actor,
            pinned_resource_id=pinned_resource_id,
        )
        if not webhook:
            return resume()  # its own transaction: no savepoint inside one of ours
        with transaction.atomic():
            resumed = resume()
            # Still uncommitted, so no worker can have finished it without the webhook.
            Run.objects.filter(id=resumed.id).update(webhook=webhook)
            resumed.webhook = webhook
        return resumed

    errors = agent.input_errors(input)
    if errors:
        raise ValidationFailed(
            f"input does not match agent {agent_id}'s input schema",
            errors=[
                {**e, "field": f"input.{e['field']}" if e["field"] != "(root)" else "input"}
                for e in errors
            ],
        )
    _check_json_size(input, "input")
    _check_json_size(metadata or {}, "metadata")

    new_run = partial(
        _new_run,
        agent_id=agent_id,
        actor=actor,
        input=input,
        metadata=metadata,
        kwargs=kwargs,
        multitask_strategy=multitask_strategy,
        after_seconds=after_seconds,
        webhook=webhook,
        run_id=run_id,
    )
    if thread_id is not None:
        at_once = _create_at_once(
            new_run,
            thread_id=thread_id,
            agent_id=agent_id,
            multitask_strategy=multitask_strategy,
            pinned_resource_id=pinned_resource_id,
        )
        if at_once is not None:
            return at_once
    with transaction.atomic():
        if thread_id is None:
            kwargs.setdefault("on_completion", "delete")
            thread = Thread(
                metadata={"stateless": True, **_graph_metadata(agent_id)},
                resource_id=pinned_resource_id,
                delete_when_done=kwargs["on_completion"] == "delete",
            )
            if multitask_strategy in (MultitaskStrategy.ENQUEUE, MultitaskStrategy.REJECT):
                # Nothing can be in flight on a thread made for the run.
                return _create_stateless(thread, *new_run(thread_id=thread.id))
            insert([thread])
        else:
            # Read and locked in one statement: what the thread holds now (its metadata),
            # and no other run can be created or end on it until this one is committed.
            found = _lock_thread_row(thread_id)
            if found is None or (
                pinned_resource_id is not None and found.resource_id != pinned_resource_id
            ):
                if if_not_exists != "create" or found is not None:
                    raise NotFound(f"Thread {thread_id} not found", code="thread_not_found")
                found = thread_create(
                    thread_id=thread_id,
                    metadata=_graph_metadata(agent_id),
                    pinned_resource_id=pinned_resource_id,
                )
                _lock_thread(found.id)
            thread = found
        run, created = new_run(thread_id=thread.id)
        run.thread = thread
        run.resource_id = thread.resource_id
        if multitask_strategy in (MultitaskStrategy.INTERRUPT, MultitaskStrategy.ROLLBACK):
            _create_replacing(run, created, thread, agent_id, actor)
        else:
            _create_queued(run, created, thread, agent_id)
        thread_hints.remember(thread.id, thread.metadata)
        _publish(run)
    return run


def _create_stateless(thread: Thread, run: Run, created: RunEvent) -> Run:
    """A stateless run queued with its new thread: the thread (busy), the run, its first event,
    its search document and the workers' wake-up in one statement (`rows.write_together`),
    with its COMMIT where the caller's transaction allows (the thread's INSERT and the run's
    write were two round trips). Inside `run_create`'s transaction."""
    thread.status = ThreadStatus.BUSY
    run.thread, run.resource_id = thread, thread.resource_id
    document = new_run_document(run_id=run.id, input=run.input, thread_metadata=thread.metadata)
    notify = _notifies_in_sql()
    write_together(
        [
            *insert_statements([thread]),
            *insert_statements([run]),
            *insert_statements([created]),
            *insert_statements([document]),
        ],
        "SELECT pg_notify(%s, '')" if notify else "SELECT 1",
        [QUEUE_CHANNEL] if notify else [],
        connection.alias,
        commit=True,
    )
    _notify_in_process(QUEUE_CHANNEL)
    _publish(run)
    return run


def _new_run(
    *,
    agent_id: str,
    actor: Actor,
    thread_id: UUID,
    input: JSONValue,
    metadata: JSONObject | None,
    kwargs: JSONObject,
    multitask_strategy: str,
    after_seconds: float | None,
    webhook: str,
    run_id: UUID | None,
) -> tuple[Run, RunEvent]:
    """A new run (pending) and its first event, not yet written; its resource is its thread's."""
    now = _now()
    run = Run(
        id=run_id or uuid7(),
        thread_id=thread_id,
        agent_id=agent_id,
        status=RunStatus.PENDING,
        input=input,
        metadata=metadata or {},
        kwargs=kwargs,
        multitask_strategy=multitask_strategy,
        not_before=now + timedelta(seconds=after_seconds) if after_seconds else None,
        webhook=webhook,
        last_seq=1,  # its first event, written with it: no other writer knows the run yet
    )
    created = RunEvent(
        run_id=run.id,
        seq=1,
        kind="created",
        data={"input": input, "multitask_strategy": multitask_strategy},
        actor=actor_name(actor),
    )
    return run, created


# The statement of `_create_at_once`, up to its writes: the thread locked (in the caller's
# scope), and `ok`, the thread if this statement may queue the run on it. A statement's snapshot
# is taken before it waits for a lock: a transaction that committed a change to the thread
# meanwhile (a run queued or ended on it, new metadata) is seen in the locked row but not by the
# statement's reads (whether a run is in flight, whether the thread had runs). The row's
# version (`xmin`) as locked is compared with the one the snapshot sees, and its metadata with
# the hint the run's document and the thread's new metadata were built from: unequal, nothing
# is written, and the creation takes the full path, whose reads follow its lock.
_CREATE_AT_ONCE_HEAD = (
    "WITH t AS MATERIALIZED (SELECT id, resource_id, xmin AS row_version, metadata = %s AS hinted"
    " FROM runs_thread WHERE id = %s{scope} FOR NO KEY UPDATE),"
    " ok AS MATERIALIZED (SELECT t.id, t.resource_id FROM t WHERE t.hinted"
    " AND t.row_version = (SELECT s.xmin FROM runs_thread s WHERE s.id = t.id){busy}{first})"
)


def _create_at_once(
    new_run: Callable[..., tuple[Run, RunEvent]],
    *,
    thread_id: UUID,
    agent_id: str,
    multitask_strategy: str,
    pinned_resource_id: str | None,
) -> Run | None:
    """`run_create` of a run queued on an existing thread (enqueue, or reject with nothing in
    flight) as one statement on PostgreSQL, when this process knows what the thread holds
    (`thread_hints`): the thread's lock, the run, its first event, its search document, the
    thread's status and metadata and the workers' wake-up in one round trip that commits alone
    (the lock and the write were two).

    Returns the run, or None when the full path must create it: no hint, another strategy,
    a thread not found or out of scope, a run in flight under reject, a thread whose metadata
    changes while it has runs (their documents are rewritten), or a thread that held something
    other than the hint or was changed while the statement waited for its lock (see
    `_CREATE_AT_ONCE_HEAD`). Nothing was written then, and no lock is kept outside a
    transaction."""
    if not _is_postgres() or multitask_strategy not in (
        MultitaskStrategy.ENQUEUE,
        MultitaskStrategy.REJECT,
    ):
        return None
    hint = thread_hints.recall(thread_id)
    if hint is None:
        return None
    run, created = new_run(thread_id=thread_id)
    stamped = _stamped(hint, agent_id)
    document = new_run_document(run_id=run.id, input=run.input, thread_metadata=stamped)
    metadata_field = Thread._meta.get_field("metadata")
    params: list[Any] = [metadata_field.get_db_prep_save(hint, connection), _uuid_param(thread_id)]
    if pinned_resource_id is not None:
        params.append(pinned_resource_id)
    head = _CREATE_AT_ONCE_HEAD.format(
        scope=" AND resource_id = %s" if pinned_resource_id is not None else "",
        busy=(
            f" AND NOT {_thread_has_run_in('t.id', ACTIVE_STATUSES)}"
            if multitask_strategy == MultitaskStrategy.REJECT
            else ""
        ),
        # Its earlier runs' documents hold the old metadata: the full path rewrites them.
        first=(
            " AND NOT EXISTS (SELECT 1 FROM runs_run o WHERE o.thread_id = t.id)"
            if stamped is not hint
            else ""
        ),
    )
    db_time = DateTimeField().get_db_prep_value(_now(), connection)
    thread_sets, thread_params = "status = %s, updated_at = %s", [ThreadStatus.BUSY.value, db_time]
    if stamped is not hint:
        thread_sets += ", metadata = %s"
        thread_params.append(metadata_field.get_db_prep_save(stamped, connection))
    writes = [
        insert_from_statement(run, "ok", {"resource_id": "ok.resource_id"}),
        insert_from_statement(created, "ok", {}),
        insert_from_statement(document, "ok", {}),
        (
            f"UPDATE runs_thread SET {thread_sets} FROM ok WHERE runs_thread.id = ok.id",
            thread_params,
        ),
    ]
    select = ["t.resource_id", "ok.id IS NOT NULL AS created"]
    if _notifies_in_sql():
        select.append("CASE WHEN ok.id IS NOT NULL THEN pg_notify(%s, '') END")
        params_after = [QUEUE_CHANNEL]
    else:
        params_after = []
    parts = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(writes))
    statement = f"{head}, {parts} SELECT {', '.join(select)} FROM t LEFT JOIN ok ON true"
    params += [p for _, write_params in writes for p in write_params] + params_after
    row = fetch_long(statement, params, connection.alias)
    if row is None or not row[1]:
        return None
    run.resource_id = row[0]
    _notify_in_process(QUEUE_CHANNEL)
    thread_hints.remember(thread_id, stamped)
    _publish(run)
    return run


# The thread's runs in flight besides the one being created (left out by id: in one statement
# on PostgreSQL the new row is not visible yet, one statement after another on SQLite it is),
# and whether it had runs before it.
_QUEUED_SQL = (
    f"SELECT {_thread_has_run_in('%s', ACTIVE_STATUSES, besides=' AND o.id <> %s')},"
    " EXISTS (SELECT 1 FROM runs_run o WHERE o.thread_id = %s AND o.id <> %s)"
)
_QUEUED_PAIRS = len(ACTIVE_STATUSES) + 1  # (thread, run) parameters, one pair per EXISTS


def _create_queued(run: Run, created: RunEvent, thread: Thread, agent_id: str) -> None:
    """Queue a new run behind whatever runs on its thread (enqueue; reject refuses if any):
    the run, its first event, its search document, the thread's new status and metadata and
    the workers' wake-up in one statement (`rows.write_together`). Caller holds the thread lock.

    The thread is busy now whatever ran before (the new run is pending), and its expiry stays
    as it was (an active run never sets it)."""
    metadata = _stamped_graph_metadata(thread, agent_id)
    document = new_run_document(run_id=run.id, input=run.input, thread_metadata=metadata)
    db_time = DateTimeField().get_db_prep_value(_now(), connection)
    thread_id = _uuid_param(thread.id)
    run_id = _uuid_param(run.id)
    thread_update: tuple[str, list[Any]]
    if metadata is thread.metadata:
        thread_update = ("UPDATE runs_thread SET status = %s, updated_at = %s WHERE id = %s", [])
    else:
        field = Thread._meta.get_field("metadata")
        thread_update = (
            "UPDATE runs_thread SET status = %s, updated_at = %s, metadata = %s WHERE id = %s",
            [field.get_db_prep_save(metadata, connection)],
        )
    thread_sql, extra = thread_update
    thread_params = [ThreadStatus.BUSY.value, db_time, *extra, thread_id]
    notify = _notifies_in_sql()
    # The transaction's last statement (its COMMIT with it) unless something may follow it: a
    # refusal of a busy thread, or the thread's earlier runs' documents with its new metadata
    # (`had_runs`, read under the thread's lock; unknown for a thread made in this transaction).
    last = run.multitask_strategy != MultitaskStrategy.REJECT and (
        metadata is thread.metadata or not getattr(thread, "had_runs", True)
    )
    row = write_together(
        [
            *insert_statements([run]),
            *insert_statements([created]),
            *insert_statements([document]),
            (thread_sql, thread_params),
        ],
        _QUEUED_SQL + (", pg_notify(%s, %s)" if notify else ""),
        [thread_id, run_id] * _QUEUED_PAIRS + ([QUEUE_CHANNEL, ""] if notify else []),
        connection.alias,
        commit=last,
    )
    assert row is not None  # a SELECT without FROM answers one row
    busy, had_runs = row[0], row[1]
    if busy and run.multitask_strategy == MultitaskStrategy.REJECT:
        raise Conflict(REJECT_MESSAGE, code="thread_busy")  # and nothing above is committed
    if metadata is not thread.metadata:
        thread.metadata = metadata
        if had_runs:  # their documents hold the old metadata
            search_refresh_thread(thread_id=thread.id)
    _notify_in_process(QUEUE_CHANNEL)


def _create_replacing(
    run: Run, created: RunEvent, thread: Thread, agent_id: str, actor: Actor
) -> None:
    """A new run that cancels the runs in flight on its thread (interrupt or rollback)."""
    _stamp_graph_metadata(thread, agent_id)
    inflight = list(
        Run.objects.select_for_update(no_key=True)
        .filter(thread_id=thread.id, parent_run__isnull=True, status__in=ACTIVE_STATUSES)
        .order_by("id")
    )
    insert([run])
    insert([created])
    insert([new_run_document(run_id=run.id, input=run.input, thread_metadata=thread.metadata)])
    for old in inflight:
        _cancel_locked(
            old,
            action=run.multitask_strategy,
            actor=actor,
            reason=f"replaced by run {run.id} (multitask_strategy={run.multitask_strategy})",
        )
    _refresh_thread(thread.id, one_in_flight=True)  # the new run is queued: busy
    _notify(QUEUE_CHANNEL)


def _graph_metadata(agent_id: str) -> dict[str, str]:
    return {"graph_id": agent_id, "assistant_id": assistant_uuid(agent_id)}


def _stamped_graph_metadata(thread: Thread, agent_id: str) -> JSONObject:
    """The thread's metadata with `graph_id` and `assistant_id` stamped in, as the LangGraph
    server stamps them (so `threads.search(metadata={"graph_id": …})` finds a graph's threads);
    keys the caller set are kept. The thread's own dict when nothing is missing."""
    return _stamped(thread.metadata, agent_id)


def _stamped(metadata: JSONObject, agent_id: str) -> JSONObject:
    wanted = _graph_metadata(agent_id)
    current = metadata or {}
    missing = {k: v for k, v in wanted.items() if k not in current}
    return {**current, **missing} if missing else metadata


def _stamp_graph_metadata(thread: Thread, agent_id: str) -> None:
    """Write `_stamped_graph_metadata` to the thread. Caller holds the thread lock and read
    `thread` under it."""
    metadata = _stamped_graph_metadata(thread, agent_id)
    if metadata is not thread.metadata:
        thread.metadata = metadata
        # One statement: the new metadata, and whether runs of the thread have documents that
        # hold the old (a thread's first run, the common case, has none to rewrite).
        field = Thread._meta.get_field("metadata")
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE runs_thread SET metadata = %s WHERE id = %s RETURNING"
                " EXISTS (SELECT 1 FROM runs_run r WHERE r.thread_id = runs_thread.id)",
                [
                    field.get_db_prep_save(thread.metadata, connection),
                    Thread._meta.get_field("id").get_db_prep_value(thread.id, connection),
                ],
            )
            row = cursor.fetchone()
        if row is not None and row[0]:
            search_refresh_thread(thread_id=thread.id)


def run_create_child(
    *, lease: Lease, tool_call: ToolCall, agent_id: str, input: JSONValue
) -> Lease:
    """Start (or take over) the sub-agent run of a delegation tool call, owned like its parent.

    The child never enters the queue: the parent's worker executes it inline, so it inherits the
    parent's lease owner. Re-executing after a crash takes the child over from the dead worker.
    """
    get_agent(agent_id)
    with transaction.atomic():
        _fence(lease)
        parent = Run.objects.get(id=lease.run_id)
        child_id = ToolCall.objects.filter(id=tool_call.id).values_list("child_run", flat=True)[0]
        now = _now()
        if child_id is None:
            child = Run.objects.create(
                thread=None,
                agent_id=agent_id,
                parent_run=parent,
                resource_id=parent.resource_id,
                status=RunStatus.RUNNING,
                input=input,
                metadata={"parent_tool_call_id": tool_call.tool_call_id},
                attempt=1,
                lease_owner=lease.owner,
                lease_expires_at=parent.lease_expires_at,
                started_at=now,
            )
            ToolCall.objects.filter(id=tool_call.id).update(child_run=child)
            seq = _append_events(
                child.id,
                [("created", {"input": input, "parent_run_id": str(parent.id)}, "system")],
            )
            seq = _append_events(child.id, [("started", {"attempt": 1}, "system")])
            child.last_seq = seq
            search_refresh(run_ids=[child.id])
        else:
            child = Run.objects.select_for_update(no_key=True).get(id=child_id)
            if child.status in TERMINAL_STATUSES:
                return Lease(
                    child.id,
                    child.lease_owner or "",
                    child.attempt,
                    None,
                    agent_id,
                    parent.id,
                    parent.resource_id,
                )
            child.status = RunStatus.RUNNING
            child.attempt += 1
            child.lease_owner = lease.owner
            child.lease_expires_at = parent.lease_expires_at
            child.save(
                update_fields=["status", "attempt", "lease_owner", "lease_expires_at", "updated_at"]
            )
            child.last_seq = _append_events(
                child.id, [("started", {"attempt": child.attempt}, "system")]
            )
        _publish(child)
    return Lease(
        child.id, lease.owner, child.attempt, None, agent_id, lease.run_id, lease.resource_id
    )
