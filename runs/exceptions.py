"""Domain errors. Each edge maps them once: HTTP status + {"detail", "code"}, or a flash message."""

from __future__ import annotations

from typing import Any


class RunsError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(
        self, detail: str, *, code: str | None = None, extra: dict[str, Any] | None = None
    ):
        super().__init__(detail)
        self.detail = detail
        if code:
            self.code = code
        self.extra = extra or {}


class NotFound(RunsError):
    status_code = 404
    code = "not_found"


class Conflict(RunsError):
    """The object is in a state that does not allow the operation; nothing was changed."""

    status_code = 409
    code = "conflict"


class AlreadyDecided(Conflict):
    code = "already_decided"


class ClaimedByOther(Conflict):
    """The tool call is claimed by another reviewer: deciding it needs an explicit take-over."""

    code = "claimed_by_other"

    def __init__(self, detail: str, *, claimed_by: str, claimed_until: str | None) -> None:
        super().__init__(detail, extra={"claimed_by": claimed_by, "claimed_until": claimed_until})
        self.claimed_by = claimed_by
        self.claimed_until = claimed_until


class ValidationFailed(RunsError):
    """Input was wrong. `errors` lists what, by field; nothing was changed."""

    status_code = 422
    code = "validation_error"

    def __init__(
        self, detail: str, *, errors: list[dict[str, Any]] | None = None, code: str | None = None
    ):
        super().__init__(detail, code=code, extra={"errors": errors or []})
        self.errors = errors or []

    @classmethod
    def field(cls, name: str, message: str, detail: str | None = None) -> ValidationFailed:
        """Field `name` is invalid because `message` (the one shape every edge reports)."""
        return cls(detail or f"{name}: {message}", errors=[{"field": name, "message": message}])


class Unsupported(ValidationFailed):
    """A request field Runsite does not implement for this target: refused, never ignored."""

    code = "unsupported"

    def __init__(self, field_name: str, detail: str | None = None):
        super().__init__(
            detail or f"{field_name} is not supported by Runsite",
            errors=[{"field": field_name, "message": "not supported"}],
        )
        self.extra["field"] = field_name


class PermissionDenied(RunsError):
    status_code = 403
    code = "permission_denied"


class LeaseLost(Exception):
    """A worker tried to write to a run it no longer owns (fencing). Never shown to users."""


class RunCancelled(LeaseLost):
    """The run was cancelled while this worker held it: a cancel ends a running run in its own
    transaction, so the worker's next fenced write finds it interrupted (or, rolled back, gone).
    The worker stops without writing; nothing is lost that a cancel at a boundary would keep."""

    def __init__(self, message: str, *, deleted: bool):
        super().__init__(message)
        self.deleted = deleted
