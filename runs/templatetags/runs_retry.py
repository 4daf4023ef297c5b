"""Template filters of the retry links on a run's page."""

from __future__ import annotations

from django import template

from runs.models import Run
from runs.selectors import retry as retry_reads

register = template.Library()


@register.filter
def retried_as(run: Run) -> list[Run]:
    """The runs that retried this one, newest first (one query, bounded)."""
    return retry_reads.run_retries(run, limit=10)
