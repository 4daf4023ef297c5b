"""Request and response schemas of the review API's claims (runs/api/review.py)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from ninja import Field, Schema

from runs.api.schemas import BodyIn


class ClaimIn(BodyIn):
    run_id: UUID
    tool_call_id: str | None = None  # optional when the run waits on exactly one call
    minutes: int = 15  # 1..480; the service refuses anything else (422 naming `minutes`)
    assignee: str | None = Field(None, max_length=150)  # a reviewer's username: assign to them


class ReleaseIn(BodyIn):
    run_id: UUID
    tool_call_id: str | None = None


class ClaimOut(Schema):
    run_id: UUID
    tool_call_id: str
    tool_name: str
    claimed_by: str  # "" after a release
    claimed_until: datetime | None = None
    review_deadline_at: datetime | None = None
