"""Which rows a live list (inbox, runs) inserts, updates or deletes for a batch of changes.

A pure function of what the socket believes the page shows and what the database says now:
no socket, no query (the caller passes the matching ids and a position lookup). The consumer
(runs/consumers.py) renders the plan with runs/fragments.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal

# Statuses a run can have right after entering or leaving the suspended state.
INBOX_RELEVANT = frozenset({"suspended", "pending", "interrupted", "deleted"})

Action = Literal["row", "update", "decided", "delete"]


@dataclass(frozen=True)
class RowAction:
    run_id: str
    action: Action  # row: insert or replace at `insert_at`; update: replace in place
    insert_at: int | None
    seq: int


@dataclass
class ListPlan:
    actions: list[RowAction] = field(default_factory=list)
    shown: set[str] = field(default_factory=set)  # what the page lists once the plan is applied
    membership_changed: bool = False  # the total (and the inbox count) must be pushed too

    @property
    def rendered_ids(self) -> list[str]:
        return [a.run_id for a in self.actions if a.action != "delete"]


def relevant_changes(
    changes: Iterable[Mapping[str, Any]], *, top_level_only: bool
) -> list[Mapping[str, Any]]:
    """A list of top-level runs ignores its runs' sub-agents."""
    return [c for c in changes if not c.get("parent_run_id") or not top_level_only]


def plan_rows(
    changes: Iterable[Mapping[str, Any]],
    *,
    inbox: bool,
    shown: AbstractSet[str],
    watched: set[str],
    matching: set[str],
    position: Callable[[str], int | None],
    start: int,
    page_size: int,
) -> ListPlan:
    """Plan a batch. `changes` carry run_id, seq, status and `statuses` (every status the run
    went through since the last batch); `matching` are the changed runs the list's filter
    matches now; `position(run_id)` is a matching run's index in the whole ordered list, or
    None when it is not on the page (called only for a run that may move or enter); the page
    shows [start, start+page_size).

    The runs list orders by creation, which never changes: a shown run is updated in place.
    The inbox orders by waiting time, so a shown run is placed again.
    """
    plan = ListPlan(shown=set(shown))
    for change in changes:
        run_id, seq = str(change["run_id"]), int(change.get("seq") or 0)
        status = change.get("status")
        relevant = bool(set(change.get("statuses") or ()) & INBOX_RELEVANT)
        if run_id not in matching:
            if inbox and run_id in watched and status != "deleted":
                # The reviewer decided it from this page: the row stays, marked decided.
                plan.actions.append(RowAction(run_id, "decided", None, seq))
                plan.membership_changed |= run_id in plan.shown or relevant
                plan.shown.discard(run_id)
            elif run_id in plan.shown or relevant or status == "deleted":
                plan.actions.append(RowAction(run_id, "delete", None, seq))
                plan.shown.discard(run_id)
                plan.membership_changed = True
            continue
        if run_id in plan.shown and not inbox:
            plan.actions.append(RowAction(run_id, "update", None, seq))
            continue
        plan.membership_changed |= run_id not in plan.shown or relevant
        at = position(run_id)
        if at is not None and start <= at < start + page_size:
            plan.actions.append(RowAction(run_id, "row", at - start, seq))
            plan.shown.add(run_id)
        elif run_id in plan.shown:
            plan.actions.append(RowAction(run_id, "delete", None, seq))
            plan.shown.discard(run_id)
    return plan
