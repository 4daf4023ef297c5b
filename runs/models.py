"""Runsite's data: threads, runs, checkpoints (snapshots), tool calls, events, audit, API keys.

Models hold data and invariants only. Every state change goes through runs/services.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.ids import uuid7

if TYPE_CHECKING:
    from datetime import datetime
    from uuid import UUID


class ThreadStatus(models.TextChoices):
    IDLE = "idle"
    BUSY = "busy"
    INTERRUPTED = "interrupted"  # a run on it is suspended, waiting for a human
    ERROR = "error"


class RunStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"  # cancelled with action=interrupt; never "waiting for a human"


ACTIVE_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED)
TERMINAL_STATUSES = (
    RunStatus.SUCCESS,
    RunStatus.ERROR,
    RunStatus.TIMEOUT,
    RunStatus.INTERRUPTED,
)


class MultitaskStrategy(models.TextChoices):
    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


class CancelAction(models.TextChoices):
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


class ToolCallStatus(models.TextChoices):
    PROPOSED = "proposed"  # the model asked for it; not looked at yet
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    DECLINED = "declined"
    AWAITING_INPUT = "awaiting_input"  # the tool called ctx.suspend()
    ANSWERED = "answered"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ReviewTimeoutAction(models.TextChoices):
    NONE = "", "none (only marked overdue)"
    DECLINE = "decline"
    CANCEL = "cancel"  # the run is interrupted


PENDING_DECISION_STATUSES = (ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.AWAITING_INPUT)


class Thread(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    resource_id = models.CharField(max_length=255, null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=ThreadStatus.choices, default=ThreadStatus.IDLE
    )
    values = models.JSONField(null=True, blank=True)
    # A stateless run's temporary thread (on_completion="delete"): once its run has ended,
    # `expires_at` is set and the reaper deletes the thread after it.
    delete_when_done = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    # LangGraph's thread `ttl` (strategy "delete"), in minutes: `expires_at` is re-armed to
    # last activity + ttl, and the reaper deletes the thread once it expires idle.
    ttl_minutes = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes: ClassVar = [
            models.Index(
                fields=["expires_at"],
                condition=Q(expires_at__isnull=False),
                name="thread_expiry_idx",
            ),
            models.Index(fields=["-created_at"], name="thread_created_idx"),
            models.Index(fields=["resource_id", "-created_at"], name="thread_resource_idx"),
            models.Index(fields=["status"], name="thread_status_idx"),
        ]

    def __str__(self) -> str:
        return str(self.id)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # No index of its own: run_thread_created_idx leads with thread_id (see Meta.indexes).
    thread = models.ForeignKey(
        Thread,
        null=True,
        blank=True,
        on_delete=models.DB_CASCADE,
        related_name="runs",
        db_index=False,
    )
    agent_id = models.CharField(max_length=128)
    parent_run = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DB_CASCADE,
        related_name="child_runs",
        db_index=False,  # run_parent_idx, partial
    )
    # The ended run this one re-runs (services.run_retry); the original lists `retries`.
    retry_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DB_SET_NULL,
        related_name="retries",
        db_index=False,  # run_retry_of_idx, partial
    )
    # Copied from the thread at creation so every filter on it needs no join.
    resource_id = models.CharField(max_length=255, null=True, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)  # {"error": class name, "message": text}
    metadata = models.JSONField(default=dict, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)  # stream_mode, command, config...
    multitask_strategy = models.CharField(
        max_length=16, choices=MultitaskStrategy.choices, default=MultitaskStrategy.ENQUEUE
    )
    attempt = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=128, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)  # time limit of this attempt
    not_before = models.DateTimeField(null=True, blank=True)  # after_seconds
    cancel_action = models.CharField(
        max_length=16, choices=CancelAction.choices, null=True, blank=True
    )
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True, default="")
    # LangGraph's `webhook`: POSTed the run when it suspends or ends (runs/services/notifications).
    webhook = models.CharField(max_length=2000, blank=True, default="")
    last_seq = models.PositiveIntegerField(default=0)  # last RunEvent.seq handed out
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Not columns: run_claim sets them on the runs it hands to a worker. `fresh`: never started
    # before; on PostgreSQL also the thread state it starts from (id None: no checkpoint yet).
    fresh: bool
    base_checkpoint_id: UUID | None
    base_values: dict[str, Any] | None
    resumed_from: tuple[Checkpoint | None, list[ToolCall]]
    # ...and the calls its claim marked `running` (tool_call_id -> the status they had), and
    # its thread's metadata as the claim read it (what the run's search document takes from it).
    marked_calls: dict[str, str]
    thread_metadata: Any
    ends_announced: bool
    # services.core._lock_newest_suspended_run(waiting=True): the calls it locked and read.
    waiting_calls: list[ToolCall]
    # selectors.with_queue_holders sets it on the runs a page shows: the run it waits behind.
    behind_run_id: UUID | None

    class Meta:
        permissions: ClassVar = [
            ("review_run", "Can approve, decline, edit and answer suspended runs"),
            ("cancel_run", "Can cancel (interrupt) and roll back runs"),
        ]
        indexes: ClassVar = [
            # The queue: pending top-level runs, oldest first (claim query).
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="pending"),
                name="run_queue_idx",
            ),
            # The head of each thread's queue (claim query: runs on a thread run in order).
            models.Index(
                fields=["thread", "created_at", "id"],
                condition=Q(status="pending", parent_run__isnull=True),
                name="run_thread_queue_idx",
            ),
            # Suspended-run listing per agent, newest suspension first (selectors).
            models.Index(
                fields=["agent_id", "-suspended_at", "-id"],
                condition=Q(status="suspended"),
                name="run_suspended_idx",
            ),
            # The same per tenant: an API key pinned to a resource always filters by it.
            models.Index(
                fields=["agent_id", "resource_id", "-suspended_at", "-id"],
                condition=Q(status="suspended"),
                name="run_suspended_resource_idx",
            ),
            models.Index(fields=["thread", "-created_at"], name="run_thread_created_idx"),
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            models.Index(fields=["agent_id", "-created_at"], name="run_agent_created_idx"),
            models.Index(fields=["resource_id", "-created_at"], name="run_resource_created_idx"),
            models.Index(fields=["-created_at", "-id"], name="run_created_idx"),
            # Claim: a run waiting for a human holds its thread (checked per queue head).
            models.Index(
                fields=["thread"],
                condition=Q(status="suspended", parent_run__isnull=True),
                name="run_thread_suspended_idx",
            ),
            # Retention: ended runs, oldest end first (services.runs_prune).
            models.Index(
                fields=["finished_at"],
                condition=Q(status__in=["success", "error", "timeout", "interrupted"]),
                name="run_ended_idx",
            ),
            # Reaper: running runs by lease expiry.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="running"),
                name="run_lease_idx",
            ),
            # Child runs and retries of a run (and the database's ON DELETE of a run). Partial:
            # most runs have neither, and an update that changes status writes a new entry to
            # every index whose condition the row meets (no HOT update), so those stay out.
            models.Index(
                fields=["parent_run"],
                condition=Q(parent_run__isnull=False),
                name="run_parent_idx",
            ),
            models.Index(
                fields=["retry_of"],
                condition=Q(retry_of__isnull=False),
                name="run_retry_of_idx",
            ),
        ]
        constraints: ClassVar = [
            # Runs on one thread execute one at a time: a second claim on the same thread
            # fails here even if two workers raced past the NOT EXISTS check.
            models.UniqueConstraint(
                fields=["thread"],
                condition=Q(status="running"),
                name="one_running_run_per_thread",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class Checkpoint(models.Model):
    """A snapshot of a run's state after one step. Thread state = its latest checkpoint."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # Neither foreign key has an index of its own: checkpoint_thread_idx and
    # one_checkpoint_per_step lead with them.
    thread = models.ForeignKey(
        Thread,
        null=True,
        blank=True,
        on_delete=models.DB_CASCADE,
        related_name="checkpoints",
        db_index=False,
    )
    # Null for a checkpoint written by hand (POST /threads/{id}/state), not by a run.
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.DB_CASCADE,
        related_name="checkpoints",
        db_index=False,
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DB_SET_NULL, related_name="+"
    )
    step = models.PositiveIntegerField()
    values = models.JSONField(default=dict)
    # tool_call_ids proposed in this step and not resolved yet (the run's pending work)
    pending = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            # A step is written once: a worker that lost its lease cannot add a duplicate.
            models.UniqueConstraint(fields=["run", "step"], name="one_checkpoint_per_step"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["thread", "-created_at"], name="checkpoint_thread_idx"),
        ]

    def __str__(self) -> str:
        return f"checkpoint {self.step} of {self.run_id}"


class ToolCall(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # unique_tool_call_id leads with run_id: no index of its own.
    run = models.ForeignKey(
        Run, on_delete=models.DB_CASCADE, related_name="tool_calls", db_index=False
    )
    tool_call_id = models.CharField(max_length=128)
    step = models.PositiveIntegerField(default=0)
    tool_name = models.CharField(max_length=128)
    args = models.JSONField(default=dict)
    original_args = models.JSONField(null=True, blank=True)  # before a reviewer's edit
    requires_approval = models.BooleanField(default=False)
    status = models.CharField(
        max_length=20, choices=ToolCallStatus.choices, default=ToolCallStatus.PROPOSED
    )
    suspend_payload = models.JSONField(null=True, blank=True)
    resume_schema = models.JSONField(null=True, blank=True)
    resume_data = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    # The sub-agent run this call delegated to (nested agents).
    child_run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.DB_SET_NULL,
        related_name="delegated_from",
        db_index=False,  # toolcall_child_run_idx, partial
    )
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True, default="")
    # A reviewer's optional note on an approval; the model sees it with the tool's result
    # when the tool declares share_review_comment.
    decision_comment = models.TextField(blank=True, default="")
    suspended_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Review deadline, stamped from the agent's (or tool's) policy when the call suspends, so
    # the reaper and the inbox need no registry lookup (runs/services/reviews.py).
    review_deadline_at = models.DateTimeField(null=True, blank=True)
    review_timeout_action = models.CharField(
        max_length=16, choices=ReviewTimeoutAction.choices, blank=True, default=""
    )
    review_timeout_reason = models.TextField(blank=True, default="")
    # Set once by the reaper that handled the passed deadline: two reapers, one action.
    review_expired_at = models.DateTimeField(null=True, blank=True)
    # "I'm on it": who reviews this call, until when (an expired claim is no claim).
    claimed_by = models.CharField(max_length=150, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "tool_call_id"], name="unique_tool_call_id"),
        ]
        indexes: ClassVar = [
            models.Index(
                fields=["tool_name"],
                condition=Q(status__in=["awaiting_approval", "awaiting_input"]),
                name="toolcall_waiting_idx",
            ),
            # Overdue reviews: the reaper's scan, the overview card and the metrics gauge.
            models.Index(
                fields=["review_deadline_at"],
                condition=Q(
                    status__in=["awaiting_approval", "awaiting_input"],
                    review_deadline_at__isnull=False,
                ),
                name="toolcall_review_deadline_idx",
            ),
            # The inbox's "mine" filter.
            models.Index(
                fields=["claimed_by"],
                condition=Q(status__in=["awaiting_approval", "awaiting_input"]),
                name="toolcall_claimed_idx",
            ),
            # Calls that delegated to a sub-agent run (the database's ON DELETE of a run).
            models.Index(
                fields=["child_run"],
                condition=Q(child_run__isnull=False),
                name="toolcall_child_run_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.tool_call_id} ({self.status})"

    @property
    def is_waiting(self) -> bool:
        return self.status in PENDING_DECISION_STATUSES

    def claim_holder(self, now: datetime) -> str:
        """Who holds the call at `now` ("" when nobody: unclaimed or the claim ran out)."""
        if self.claimed_by and self.claimed_until is not None and self.claimed_until > now:
            return self.claimed_by
        return ""

    def is_overdue(self, now: datetime) -> bool:
        return (
            self.is_waiting
            and self.review_deadline_at is not None
            and self.review_deadline_at <= now
        )

    @property
    def decision(self) -> str:
        """What a human decided: approved, declined or answered ("" if nobody did).

        The status moves on after an approval (running, succeeded...), so it is derived.
        """
        if not self.decided_by:
            return ""
        if self.status == ToolCallStatus.DECLINED:
            return "declined"
        if self.resume_data is not None or self.status == ToolCallStatus.ANSWERED:
            return "answered"
        return "approved"


class RunEvent(models.Model):
    """One entry of a run's timeline, ordered by seq; the source for streams and live pushes."""

    id = models.BigAutoField(primary_key=True)
    # unique_event_seq leads with run_id: no index of its own.
    run = models.ForeignKey(Run, on_delete=models.DB_CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=32)
    data = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "seq"], name="unique_event_seq"),
        ]
        indexes: ClassVar = [models.Index(fields=["-created_at"], name="event_created_idx")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"


class AuditEntry(models.Model):
    """Who decided or cancelled what. Holds ids as plain values so it outlives a rollback."""

    id = models.BigAutoField(primary_key=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32)
    run_id = models.UUIDField(null=True, blank=True)
    thread_id = models.UUIDField(null=True, blank=True)
    agent_id = models.CharField(max_length=128, blank=True, default="")
    resource_id = models.CharField(max_length=255, null=True, blank=True)
    tool_call_id = models.CharField(max_length=128, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "audit entries"
        indexes: ClassVar = [
            models.Index(fields=["-created_at"], name="audit_created_idx"),
            models.Index(fields=["run_id"], name="audit_run_idx"),
            models.Index(fields=["actor", "-created_at"], name="audit_actor_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.run_id}"


class ApiKey(models.Model):
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12)  # shown in lists so a key can be recognised
    # SHA-256 of the key. Keys are 32 random bytes, so a fast hash is enough (no dictionary
    # to attack) and lets every request look the key up by an index.
    key_hash = models.CharField(max_length=64, unique=True)
    resource_id = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_key(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class StaffScope(models.Model):
    """Binds a dashboard user to one resource. A user with no rows is unbound and sees every
    run; a user with rows sees only the threads, runs and tool calls of those resources
    (runs/selectors/scope.py), the way an ApiKey's `resource_id` pins an API caller."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="staff_scopes"
    )
    resource_id = models.CharField(max_length=255)

    class Meta:
        verbose_name = "resource scope"
        constraints = [
            models.UniqueConstraint(fields=["user", "resource_id"], name="staff_scope_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} → {self.resource_id}"


class GraphCheckpoint(models.Model):
    """A LangGraph checkpoint of a registered graph's thread (runs/graphs/checkpointer.py).

    The layout mirrors langgraph-checkpoint-postgres, plus `run`: rollback deletes a run's
    checkpoints and writes by it (cascade). The checkpoint itself is the serde's bytes.
    """

    id = models.BigAutoField(primary_key=True)
    thread = models.ForeignKey(Thread, on_delete=models.DB_CASCADE, related_name="+")
    checkpoint_ns = models.CharField(max_length=255, blank=True, default="")
    checkpoint_id = models.CharField(max_length=64)
    parent_checkpoint_id = models.CharField(max_length=64, null=True, blank=True)
    # Null for a checkpoint written by update_state, not by a run.
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.DB_CASCADE, related_name="+"
    )
    type = models.CharField(max_length=32)
    checkpoint = models.BinaryField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "checkpoint_id"],
                name="unique_graph_checkpoint",
            ),
        ]

    def __str__(self) -> str:
        return f"graph checkpoint {self.checkpoint_id} of {self.thread_id}"


class GraphWrite(models.Model):
    """A pending write of one graph task against a checkpoint (no foreign key to it: LangGraph
    may write against a checkpoint before putting it). `run` is the run that wrote it."""

    id = models.BigAutoField(primary_key=True)
    thread = models.ForeignKey(Thread, on_delete=models.DB_CASCADE, related_name="+")
    checkpoint_ns = models.CharField(max_length=255, blank=True, default="")
    checkpoint_id = models.CharField(max_length=64)
    task_id = models.CharField(max_length=64)
    task_path = models.CharField(max_length=255, blank=True, default="")
    idx = models.IntegerField()
    channel = models.CharField(max_length=255)
    type = models.CharField(max_length=32)
    value = models.BinaryField()
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.DB_CASCADE, related_name="+"
    )

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                name="unique_graph_write",
            ),
        ]

    def __str__(self) -> str:
        return f"graph write {self.channel} of task {self.task_id}"


class NotificationEvent(models.TextChoices):
    """What a delivery announces. A run's own webhook hears suspended and every end; a rule
    picks among all of them. A new event is one more member here (and a call to
    services.notifications where it happens)."""

    SUSPENDED = "suspended"
    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    STUCK = "stuck"
    REVIEW_OVERDUE = "review_overdue"  # a waiting tool call passed its review deadline


class WebhookFormat(models.TextChoices):
    GENERIC = "generic", "Generic JSON"
    SLACK = "slack", 'Slack-compatible {"text": ...}'


class NotificationRule(models.Model):
    """When a run of `agent_id` (optionally on `resource_id`) meets one of `events`, notify a
    webhook and/or e-mail a group. Managed in the admin."""

    name = models.CharField(max_length=100)
    agent_id = models.CharField(max_length=128)
    resource_id = models.CharField(
        max_length=255, blank=True, default="", help_text="Empty: runs on every resource."
    )
    events = models.JSONField(default=list, help_text="NotificationEvent values")
    webhook_url = models.CharField(max_length=2000, blank=True, default="")
    webhook_format = models.CharField(
        max_length=16, choices=WebhookFormat.choices, default=WebhookFormat.GENERIC
    )
    email_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes: ClassVar = [models.Index(fields=["agent_id"], name="rule_agent_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.agent_id})"


class DeliveryChannel(models.TextChoices):
    WEBHOOK = "webhook"
    EMAIL = "email"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    RETRYING = "retrying"
    SENT = "sent"
    FAILED = "failed"  # gave up after RUNS_WEBHOOK_MAX_ATTEMPTS, or refused for good


DUE_DELIVERY_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.RETRYING)


class Delivery(models.Model):
    """One message of the outbox: written in the transaction that changed the run, sent (at
    least once) by the workers. Its id is the idempotency id a receiver dedupes on."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # A plain value, not a foreign key: a rollback deletes the run, not what was announced.
    run_id = models.UUIDField()
    agent_id = models.CharField(max_length=128, blank=True, default="")
    rule = models.ForeignKey(
        NotificationRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    event = models.CharField(max_length=32)
    channel = models.CharField(max_length=16, choices=DeliveryChannel.choices)
    target = models.CharField(max_length=2000)  # the URL, or the e-mail group's name
    format = models.CharField(max_length=16, default="langgraph")  # langgraph, generic, slack
    payload = models.JSONField(default=dict)  # the body (webhook) or subject/body (e-mail)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # The claim's lease: a worker killed mid-delivery leaves it; the row is due again after it.
    locked_by = models.CharField(max_length=128, blank=True, default="")
    locked_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    log = models.JSONField(default=list, blank=True)  # one entry per attempt
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        indexes: ClassVar = [
            # The outbox's due rows (claim query).
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status__in=["pending", "retrying"]),
                name="delivery_due_idx",
            ),
            models.Index(fields=["run_id", "created_at"], name="delivery_run_idx"),
        ]
        constraints: ClassVar = [
            # A stuck run is announced once per rule and channel, however many workers scan.
            models.UniqueConstraint(
                fields=["run_id", "rule", "channel"],
                condition=Q(event="stuck"),
                name="one_stuck_delivery_per_rule",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} of {self.run_id} to {self.target} ({self.status})"


class RunSearch(models.Model):
    """A run's search document: its input, output, error, tool calls' arguments and results,
    and its thread's metadata as plain text, rewritten by the services that change any of them
    (runs/services/search.py). On PostgreSQL migration 0007 adds a generated `document_tsv`
    column (to_tsvector('simple', document)) with a GIN index; SQLite searches `document`."""

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.DB_CASCADE, related_name="+")
    document = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"search document of {self.run_id}"


class SavedView(models.Model):
    """A named runs-list query (filters, search and sort, normalised), owned by one user and
    optionally shared with the members of one group."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views"
    )
    name = models.CharField(max_length=100)
    query = models.CharField(max_length=2000, blank=True, default="")
    shared_with_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_saved_view_name"),
        ]

    def __str__(self) -> str:
        return self.name
