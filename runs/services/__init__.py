"""Every state change of Runsite, one module per family of operations.

Views, API handlers, consumers, commands and the engine call these functions; none of them
decides state itself. Each function is atomic and announces its change only after commit
(`live.run_changed_on_commit`), and wakes workers with `pg_notify` inside the transaction so a
notification never arrives before the row it talks about. Lock order and fencing: see `core`.

`from runs import services; services.run_cancel(...)` is the way in; the modules are:
threads, runs (create), queue (claim/heartbeat/reap/release), steps, finish, cancel,
decisions, retry, retention (pruning), agent_inbox (a graph's Agent Inbox choices), claims
(who reviews a waiting call), review_deadlines (the reaper's half of review deadlines), access,
notifications (the webhook and e-mail outbox, written with each suspend/end), search (the runs'
search documents), saved_views, tenants (staff bound to resources), and core (locks, events,
audit, publishing).
"""

from __future__ import annotations

from runs.contracts import (
    Actor,
    BulkCancelResult,
    ClaimedRun,
    FenceResult,
    HeldWrites,
    Lease,
    StepWrite,
    SuspendPlan,
    ToolOutcome,
    actor_name,
    step_event,
)
from runs.services.access import (
    GROUP_PERMISSIONS,
    api_key_create,
    api_key_revoke,
    api_key_touch,
    api_key_touch_due,
    groups_ensure,
)
from runs.services.agent_inbox import tool_call_inbox_decide
from runs.services.cancel import (
    CancelAnswer,
    bulk_cancel_planned,
    run_cancel,
    run_cancel_on_thread,
    run_delete,
    runs_cancel_many,
)
from runs.services.claims import (
    DEFAULT_CLAIM_MINUTES,
    MAX_CLAIM_MINUTES,
    tool_call_claim,
    tool_call_release,
)
from runs.services.core import (
    DEFAULT_DECLINE_TEXT,
    QUEUE_CHANNEL,
    REJECT_MESSAGE,
)
from runs.services.decisions import (
    thread_resume,
    tool_call_answer,
    tool_call_approve,
    tool_call_decline,
)
from runs.services.finish import run_acknowledge_cancel, run_fail_attempt, run_finish
from runs.services.notices import (
    CANCEL_CHANNEL,
    Notice,
    cancel_channel,
    cancel_notices_held,
    is_cancel_channel,
    send_cancel_notices,
)
from runs.services.notifications import (
    deliveries_claim,
    delivery_record,
    run_url,
    runs_announce_stuck,
)
from runs.services.queue import run_claim, run_heartbeat, run_release, run_set_deadline, runs_reap
from runs.services.retention import (
    PruneResult,
    audit_prune,
    prunable_runs,
    retention_apply,
    runs_prune,
    threads_prune,
)
from runs.services.retry import RETRY_MANY_LIMIT, RetryManyResult, run_retry, runs_retry_many
from runs.services.review_deadlines import (
    DEADLINE_ACTOR,
    review_deadline_passed,
    reviews_expire,
)
from runs.services.runs import run_create, run_create_child
from runs.services.saved_views import saved_view_create, saved_view_delete, saved_view_rename
from runs.services.search import (
    DocumentSource,
    search_refresh,
    search_refresh_thread,
    source_in_hand,
)
from runs.services.steps import (
    run_emit,
    run_save_steps,
    run_suspend,
    tool_call_update,
    tool_calls_not_started,
)
from runs.services.tenants import staff_scope_set
from runs.services.threads import (
    thread_create,
    thread_delete,
    thread_resolve_suspended,
    thread_ttl_minutes,
    thread_update,
    thread_update_state,
)

__all__ = [
    "CANCEL_CHANNEL",
    "DEADLINE_ACTOR",
    "DEFAULT_CLAIM_MINUTES",
    "DEFAULT_DECLINE_TEXT",
    "GROUP_PERMISSIONS",
    "MAX_CLAIM_MINUTES",
    "QUEUE_CHANNEL",
    "REJECT_MESSAGE",
    "RETRY_MANY_LIMIT",
    "Actor",
    "BulkCancelResult",
    "CancelAnswer",
    "ClaimedRun",
    "DocumentSource",
    "FenceResult",
    "HeldWrites",
    "Lease",
    "Notice",
    "PruneResult",
    "RetryManyResult",
    "StepWrite",
    "SuspendPlan",
    "ToolOutcome",
    "actor_name",
    "api_key_create",
    "api_key_revoke",
    "api_key_touch",
    "api_key_touch_due",
    "audit_prune",
    "bulk_cancel_planned",
    "cancel_channel",
    "cancel_notices_held",
    "deliveries_claim",
    "delivery_record",
    "groups_ensure",
    "is_cancel_channel",
    "prunable_runs",
    "retention_apply",
    "review_deadline_passed",
    "reviews_expire",
    "run_acknowledge_cancel",
    "run_cancel",
    "run_cancel_on_thread",
    "run_claim",
    "run_create",
    "run_create_child",
    "run_delete",
    "run_emit",
    "run_fail_attempt",
    "run_finish",
    "run_heartbeat",
    "run_release",
    "run_retry",
    "run_save_steps",
    "run_set_deadline",
    "run_suspend",
    "run_url",
    "runs_announce_stuck",
    "runs_cancel_many",
    "runs_prune",
    "runs_reap",
    "runs_retry_many",
    "saved_view_create",
    "saved_view_delete",
    "saved_view_rename",
    "search_refresh",
    "search_refresh_thread",
    "send_cancel_notices",
    "source_in_hand",
    "staff_scope_set",
    "step_event",
    "thread_create",
    "thread_delete",
    "thread_resolve_suspended",
    "thread_resume",
    "thread_ttl_minutes",
    "thread_update",
    "thread_update_state",
    "threads_prune",
    "tool_call_answer",
    "tool_call_approve",
    "tool_call_claim",
    "tool_call_decline",
    "tool_call_inbox_decide",
    "tool_call_release",
    "tool_call_update",
    "tool_calls_not_started",
]
