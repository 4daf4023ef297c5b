"""The live-list planner (runs/live_lists.py): which rows a pushed batch inserts, updates or
deletes. Pure: no socket, no database."""

from __future__ import annotations

from typing import Any

from runs.live_lists import RowAction, plan_rows, relevant_changes


def change(run_id: str, status: str, seq: int = 1, *statuses: str, **extra: Any) -> dict:
    return {
        "run_id": run_id,
        "status": status,
        "seq": seq,
        "statuses": {status, *statuses},
        **extra,
    }


def plan(changes: list[dict], *, inbox: bool = False, shown=(), watched=(), positions=None, **kw):
    positions = positions or {}
    return plan_rows(
        changes,
        inbox=inbox,
        shown=set(shown),
        watched=set(watched),
        matching=set(positions),
        position=positions.get,
        start=kw.get("start", 0),
        page_size=kw.get("page_size", 50),
    )


def test_it_updates_a_shown_run_of_the_runs_list_in_place_without_asking_its_position() -> None:
    def no_position(run_id: str) -> int:
        raise AssertionError("a shown row of the runs list keeps its place")

    result = plan_rows(
        [change("a", "running", 7)],
        inbox=False,
        shown={"a"},
        watched=set(),
        matching={"a"},
        position=no_position,
        start=0,
        page_size=50,
    )
    assert result.actions == [RowAction("a", "update", None, 7)]
    assert result.membership_changed is False
    assert result.shown == {"a"}


def test_it_inserts_a_matching_run_at_its_index_on_the_page() -> None:
    result = plan([change("n", "pending", 1)], positions={"n": 52}, start=50)
    assert result.actions == [RowAction("n", "row", 2, 1)]
    assert result.shown == {"n"} and result.membership_changed


def test_it_leaves_out_a_matching_run_that_belongs_on_another_page() -> None:
    result = plan([change("n", "running", 1)], positions={"n": 70}, page_size=50)
    assert result.actions == [] and result.shown == set()


def test_it_deletes_a_shown_run_that_no_longer_matches() -> None:
    result = plan([change("a", "success", 9)], shown={"a", "b"})
    assert result.actions == [RowAction("a", "delete", None, 9)]
    assert result.shown == {"b"} and result.membership_changed


def test_it_deletes_a_rolled_back_run_even_when_it_was_not_shown() -> None:
    result = plan([change("x", "deleted", 4)])
    assert result.actions == [RowAction("x", "delete", None, 4)]


def test_it_ignores_a_run_that_neither_matches_nor_is_shown() -> None:
    result = plan([change("x", "running", 3)])
    assert result.actions == [] and not result.membership_changed


def test_the_inbox_places_a_shown_run_again_and_counts_a_run_that_went_through_suspended() -> None:
    result = plan(
        [change("a", "suspended", 5, "running")], inbox=True, shown={"a"}, positions={"a": 0}
    )
    assert result.actions == [RowAction("a", "row", 0, 5)]
    assert result.membership_changed  # it suspended again within the batch: recount


def test_the_inbox_keeps_a_watched_run_as_decided_instead_of_deleting_it() -> None:
    result = plan([change("w", "pending", 6)], inbox=True, shown={"w"}, watched={"w"})
    assert result.actions == [RowAction("w", "decided", None, 6)]
    assert result.shown == set() and result.membership_changed
    assert result.rendered_ids == ["w"]


def test_a_watched_run_that_was_rolled_back_is_deleted() -> None:
    result = plan([change("w", "deleted", 6)], inbox=True, shown={"w"}, watched={"w"})
    assert result.actions == [RowAction("w", "delete", None, 6)]


def test_the_plan_does_not_change_the_callers_set() -> None:
    shown = {"a"}
    plan_rows(
        [change("a", "success")],
        inbox=False,
        shown=shown,
        watched=set(),
        matching=set(),
        position=lambda _: None,
        start=0,
        page_size=50,
    )
    assert shown == {"a"}


def test_a_list_of_top_level_runs_ignores_sub_agent_runs() -> None:
    changes = [change("a", "running"), change("c", "running", parent_run_id="a")]
    assert [c["run_id"] for c in relevant_changes(changes, top_level_only=True)] == ["a"]
    assert len(relevant_changes(changes, top_level_only=False)) == 2
