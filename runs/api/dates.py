"""Date bounds from query strings: a date-only bound covers its whole day (UTC), naive is UTC."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta

from runs.exceptions import ValidationFailed

_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")
# The selector compares `created_at <= to_date`: the last instant of a day is the next day's
# midnight minus the finest step both databases store (a microsecond).
_LAST_INSTANT = timedelta(microseconds=1)


def date_bound(raw: str | None, *, field: str, end: bool) -> datetime | None:
    """An aware UTC datetime from `2026-11-30` or an ISO 8601 date-time (`Z`, offsets, naive).

    `end=True` (a `to_date`) turns a date-only value into its day's last instant, so that
    `to_date=2026-11-30` includes everything before 2026-12-01T00:00Z.
    """
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    try:
        if _DATE_ONLY.fullmatch(text):
            day = date.fromisoformat(text)
            start = datetime.combine(day, time.min, tzinfo=UTC)
            return start + timedelta(days=1) - _LAST_INSTANT if end else start
        value = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise ValidationFailed.field(
            field,
            "must be an ISO 8601 date (2026-11-30) or date-time (2026-11-30T12:00:00Z)",
            detail=f"{field} must be an ISO 8601 date or date-time, got {text!r}",
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
