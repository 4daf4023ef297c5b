"""Websockets of the dashboard: each open page gets its regions pushed as they change.

`RunsConsumer` serves the list pages (overview, inbox, runs) on the `runs` group and the
thread page on `thread.<id>`; `RunConsumer` serves one run page on `run.<id>` (which also hears
its sub-agent runs). Both authenticate the session in `connect` (the origin is checked by
`AllowedHostsOriginValidator` in runsite/asgi.py), read the database only through
`database_sync_to_async`, and push the same fragments the views render (runs/fragments.py),
rendered for the connected user's permissions and tenant scope: a user bound to resources
hears only the changes of runs of those resources (the message names the run's resource), and
every read of a render goes through the scoped selectors, so no row or count of another tenant
reaches the socket. Renders are shared only between sockets with the same `permission_key`,
which includes the scope.

`run.changed` messages arrive for every committed change. A consumer collects them and renders
once per batch, so a run stepping ten times a second costs a few renders, not ten per viewer.
The list pages' sockets that show the same view to users with the same permissions flush as one
group (runs/live_groups.py): one moment, one render per distinct batch, the same bytes to each.
A run page, a thread page and an inbox following its reviewer's own decisions render alone.
Messages carry the run's event seq; the browser drops fragments older than what it shows and
re-fetches a region when it sees a gap (static/runs/app.js).

Flow control: a page says how many frames it has swapped and painted (`{"ack": n}`, the first
one on open). A socket that has FLOW_WINDOW frames not acknowledged yet is sent nothing more:
its changes keep collecting (latest per run) and are rendered as one catch-up once the page
acknowledges. A page whose browser is slower than the pushes (a busy run, a slow machine, a
tab in the background, where nothing is painted) gets fewer, fuller pushes instead of a queue
of frames that keeps its clicks waiting. A socket that never acknowledges is not held.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict

from runs import live_groups, metrics, selectors
from runs.exceptions import NotFound
from runs.forms import PAGE_SIZE, InboxFilterForm, RunFilterForm
from runs.fragments import Fragments, RunPushState
from runs.hub import hub
from runs.live import RUNS_GROUP, run_group, thread_group
from runs.live_lists import plan_rows, relevant_changes
from runs.models import TERMINAL_STATUSES
from runs.permissions import can_use_dashboard, permission_key
from runs.selectors import search

logger = logging.getLogger(__name__)

MAX_WATCHED = 100
# Frames a page may have unacknowledged before its pushes wait (a run page's push is ~3 frames).
FLOW_WINDOW = 3


def _change_signature(changes: list[dict[str, Any]]) -> tuple:
    return tuple(
        sorted(
            (
                str(c.get("run_id")),
                int(c.get("seq") or 0),
                str(c.get("status")),
                tuple(sorted(c.get("statuses") or ())),
                str(c.get("parent_run_id") or ""),
            )
            for c in changes
        )
    )


class _BatchingConsumer(AsyncWebsocketConsumer):
    """Collects `run.changed` messages and renders them in batches (latest seq per run)."""

    # A busy list's pause between flushes (runs/live_groups.py). 10 ms, not 25: with renders as
    # cheap as they are now, bench/load.py's delivery p50 91-96 ms, p99 240-265 ms (25 ms:
    # 104-109 / 264-338 ms) for ~30 % more frames (docs/benchmarks.md).
    batch_seconds = 0.010

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.groups_joined: list[str] = []
        self.pending: dict[str, dict[str, Any]] = {}
        self.closed = False
        self._flush_task: asyncio.Task[None] | None = None
        self._group: live_groups.Group | None = None
        # How it hears changes: not yet, on the hub itself, or through its group (`_schedule`).
        self._hearing = "none"
        self.flow = False  # set by the page's first {"ack": n}
        self.frames_sent = 0
        self.frames_acked = 0
        if not can_use_dashboard(self.user):
            # Closing before accept() refuses the handshake (the browser sees HTTP 403).
            await self.close()
            return
        self.params = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            groups = await database_sync_to_async(self._prepare)()
        except (ValueError, NotFound):
            await self.close()
            return
        # One subscription per process (runs/hub.py), not a channel-layer group per socket; a
        # socket that shares renders hears through its group, once for all its members.
        self.hub = hub()
        self.groups_joined = list(groups)
        key = self.share_key()
        if key is None:
            self._listen_directly()
        else:
            self._listen_through(live_groups.join(key, self.batch_seconds, self))
        await self.hub.start()
        await self.accept()
        self.counted = True
        metrics.WEBSOCKETS.inc()
        await self.catch_up()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            metrics.WEBSOCKETS.dec()
            self.counted = False
        self.closed = True
        if self._flush_task is not None:
            self._flush_task.cancel()
        group = getattr(self, "_group", None)
        if group is not None:
            live_groups.leave(group, self)
            self._group = None
        if getattr(self, "_hearing", "none") == "direct":
            for name in self.groups_joined:
                self.hub.unlisten(name, self.hear)

    async def send(  # type: ignore[override]  # as channels' own send overrides AsyncConsumer's
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        if text_data is not None or bytes_data is not None:
            self.frames_sent += 1

    def blocked(self) -> bool:
        """The page has FLOW_WINDOW frames it has not acknowledged: send it nothing now."""
        return self.flow and self.frames_sent - self.frames_acked >= FLOW_WINDOW

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if "ack" in message:
            self.acknowledge(message["ack"])
        else:
            self.receive_message(message)

    def acknowledge(self, count: Any) -> None:
        """The page has swapped and painted `count` frames of this socket. A count that is not
        one this socket could have been sent (not an int, lower than the last, above what was
        sent) is ignored."""
        if type(count) is not int or not self.frames_acked <= count <= self.frames_sent:
            return
        was_blocked = self.blocked()
        self.flow = True
        self.frames_acked = count
        if was_blocked and not self.blocked() and self.pending:
            self._schedule()

    def receive_message(self, message: dict[str, Any]) -> None:
        """A message of the page other than an acknowledgement (none by default)."""

    def _prepare(self) -> list[str]:
        # Read once, here in a thread; cached on the user for every later render.
        self.visibility = selectors.scope_for(self.user)
        return self.prepare()

    def hear(self, event: dict[str, Any]) -> None:
        """A published change: dropped unread when its run belongs to a tenant this user is
        not bound to (nothing rendered, nothing counted, not even a row deletion). Or the hub's
        word that changes published since a moment may have been lost (`resync`)."""
        if "resync" in event:
            self._resync_task = asyncio.ensure_future(self.resync(float(event["resync"])))
        elif self.visibility.allows(event.get("resource_id")):
            self.queue(event)

    async def resync(self, since: float) -> None:
        """Queue what changed since `since` (wall time), read from the database."""
        if self.closed:
            return
        key = self.share_key()
        try:
            if key is None:
                changed = await database_sync_to_async(self.changed_since)(since)
            else:
                # One read for the sockets that show the same rows (their page too).
                changed = await live_groups.read_once(
                    ("resync", *key, self.render_state(), since),
                    lambda: database_sync_to_async(self.changed_since)(since),
                )
        except Exception:
            logger.exception("live: reading changes for a resync failed")
            return
        for event in changed:
            self.queue(event)

    def queue(self, event: dict[str, Any]) -> None:
        """Keep the latest message per run, and every status the run went through meanwhile
        (a run can suspend and resume within one batch: the inbox must still hear of it)."""
        live_groups.merge_change(self.pending, event)
        self._schedule()

    def _schedule(self) -> None:
        """Flush with the group of sockets that share renders (runs/live_groups.py), or alone."""
        key = self.share_key()
        if self._group is not None and self._group.key != key:
            # Its renders became its own (an inbox following a decided run): it takes what the
            # group heard for it and listens for itself.
            live_groups.leave(self._group, self)
            self._group = None
            self._listen_directly()
        if key is None:
            if self._flush_task is None:
                self._flush_task = asyncio.ensure_future(self._flush_later())
            return
        if self._group is None:
            self._listen_through(live_groups.join(key, self.batch_seconds, self))
        assert self._group is not None
        self._group.wake()

    def _listen_directly(self) -> None:
        if self._hearing != "direct":
            self._hearing = "direct"
            for name in self.groups_joined:
                self.hub.listen(name, self.hear)

    def _listen_through(self, group: live_groups.Group) -> None:
        self._group = group
        group.tap(self.hub, self.groups_joined, self.visibility.allows)
        if self._hearing == "direct":
            for name in self.groups_joined:
                self.hub.unlisten(name, self.hear)
        self._hearing = "group"

    def share_key(self) -> tuple | None:
        """The sockets of this process that hear the same changes and render them alike (same
        view, filters and permissions), or None when this socket's renders are its own."""
        return None

    def cache_key(self, changes: list[dict[str, Any]]) -> tuple | None:
        """What a render depends on, when sockets of this process may share it (None: never):
        nothing but the share key, `render_state()` and the changes."""
        return None

    def render_state(self) -> Any:
        """What of this socket, beyond its share key, its renders depend on (the rows shown)."""
        return None

    def render_shared(self, changes: list[dict[str, Any]]) -> tuple[str | list[str], Any]:
        """Render, returning the html and the state the render leaves (adopted by sharers)."""
        return self.render(changes), None

    def adopt(self, state: Any) -> None:
        pass

    async def _flush_later(self) -> None:
        """A socket whose renders are its own: a fixed delay after the first message, then
        everything pending, rendered as often as changes keep coming."""
        try:
            await asyncio.sleep(self.batch_seconds)
            # A held socket keeps its pending changes: its next acknowledgement flushes them.
            while self.pending and not self.blocked():
                batch, self.pending = self.pending, {}
                try:
                    html = await database_sync_to_async(self.render)(list(batch.values()))
                except Exception:
                    # A failed render must not kill the socket: the page re-fetches on the next
                    # change (or its poll) and the error is in the log.
                    logger.exception("live: rendering a push failed")
                    continue
                await live_groups.send_frames(self, html)
        finally:
            self._flush_task = None

    # Subclasses: which groups to join (sync, may read the database), what to send on connect,
    # and how to render a batch of changes (sync, runs in a thread).
    def prepare(self) -> list[str]:
        raise NotImplementedError

    async def catch_up(self) -> None:
        return None

    def changed_since(self, since: float) -> list[dict[str, Any]]:
        """The changes to queue after a resync (sync, runs in a thread)."""
        raise NotImplementedError

    def render(self, changes: list[dict[str, Any]]) -> str | list[str]:
        """The frames to send (one html string, or several sent in order)."""
        raise NotImplementedError


class RunsConsumer(_BatchingConsumer):
    """Overview, inbox and runs pages (group `runs`), and a thread page (`thread.<id>`)."""

    def prepare(self) -> list[str]:
        # loads the permission cache once, here, in a thread
        self.permission_key = permission_key(self.user)
        self.fragments = Fragments(self.user)
        self._sent_regions: dict[str, int] = {}
        self.watched: set[str] = set()
        thread_id = self.scope["url_route"]["kwargs"].get("thread_id")
        if thread_id is not None:
            self.view = "thread"
            self.thread_id = thread_id
            if self.visibility.bound:
                # Another tenant's thread is refused like a missing one (NotFound: closed).
                selectors.visible_thread(self.user, thread_id)
            # A busy run writes a checkpoint per step: the thread page follows once a second.
            self.batch_seconds = 1.0
            return [thread_group(thread_id)]
        self.view = self.params.get("view", "runs")
        if self.view == "overview":
            # The whole page re-renders on a change: at most once a second.
            self.batch_seconds = 1.0
        elif self.view == "inbox":
            form = InboxFilterForm(self.params)
            assert self.user is not None  # connect() refused anonymous sockets
            self.filters = form.run_filters(viewer=self.user.get_username())
            self.queryset = selectors.inbox(
                self.filters, user=self.user, oldest_first=form.oldest_first
            )
            self.ordering: tuple[str, ...] | None = form.ordering
            self.page = form.page_number
            self.shown = frozenset(self._page_ids())
        elif self.view == "runs":
            runs_form = RunFilterForm(self.params)
            self.filters = runs_form.run_filters()
            # The page's own query (filters, search, sort). A search or a sort other than by
            # creation updates the rows shown but inserts no new ones (no live_ordering).
            self.run_list = search.runs_list(self.user, runs_form.list_query())
            self.queryset = self.run_list.queryset
            self.ordering = self.run_list.live_ordering
            self.page = runs_form.page_number
            self.shown = frozenset(self._page_ids())
        else:
            raise ValueError(f"unknown view {self.view!r}")
        return [RUNS_GROUP]

    def _page_ids(self) -> list[str]:
        """The ids the page lists now, in order."""
        start = (self.page - 1) * PAGE_SIZE
        ids = self.queryset.values_list("id", flat=True)[start : start + PAGE_SIZE]
        return [str(i) for i in ids]

    async def catch_up(self) -> None:
        """Changes committed between the page's render and this connection."""
        try:
            since = float(self.params.get("at", ""))
        except ValueError:
            return
        changed = await database_sync_to_async(self._changed_since)(since)
        for event in changed:
            self.queue(event)

    def changed_since(self, since: float) -> list[dict[str, Any]]:
        if self.view not in ("inbox", "runs"):
            # The overview and a thread page render from the database whatever the change.
            return [{"run_id": "", "seq": 0, "status": "resync"}]
        changed = self._changed_since(since)
        # A run rolled back meanwhile left no row to find: drop the rows shown of runs gone.
        shown = [UUID(i) for i in self.shown]
        if shown:
            runs = selectors.runs_filtered(
                selectors.RunFilters(top_level_only=False), user=self.user
            )
            left = {str(i) for i in runs.filter(id__in=shown).values_list("id", flat=True)}
            changed += [
                {"run_id": i, "seq": 2**31 - 1, "status": "deleted"}
                for i in sorted(self.shown - left)
            ]
        return changed

    def _changed_since(self, since: float) -> list[dict[str, Any]]:
        from datetime import UTC, datetime

        if self.view not in ("inbox", "runs"):
            return []
        moment = datetime.fromtimestamp(since - 1.0, tz=UTC)  # a second of clock slack
        runs = selectors.runs_filtered(selectors.RunFilters(top_level_only=False), user=self.user)
        rows = runs.filter(updated_at__gte=moment).values_list(
            "id", "status", "last_seq", "parent_run_id"
        )[:200]
        return [
            {"run_id": str(rid), "status": status, "seq": seq, "parent_run_id": parent}
            for rid, status, seq, parent in rows
        ]

    def receive_message(self, message: dict[str, Any]) -> None:
        """The inbox asks to keep following a run its reviewer just decided: {"watch": id}."""
        try:
            run_id = str(UUID(str(message.get("watch"))))
        except ValueError:
            return
        if self.view == "inbox" and len(self.watched) < MAX_WATCHED:
            self.watched.add(run_id)
            self.queue({"run_id": run_id, "seq": 0, "status": "watch"})

    def share_key(self) -> tuple | None:
        if self.watched or self.view == "thread":
            return None  # personal: the reviewer's own decisions, the regions this page has
        # Asked on every change this socket hears (under load: every socket, every change);
        # what it is made of is fixed when the socket connects.
        key: tuple | None = self.__dict__.get("_share_key")
        if key is None:
            params = tuple(sorted((k, tuple(v)) for k, v in self.params.lists() if k != "at"))
            if getattr(self, "filters", None) is not None and self.filters.assigned == "mine":
                # "mine" lists different runs for each reviewer: never share its render.
                params += (("viewer", (self.filters.viewer,)),)
            key = self._share_key = (self.view, params, self.permission_key)
        return key

    def cache_key(self, changes: list[dict[str, Any]]) -> tuple | None:
        key = self.share_key()
        if key is None:
            return None
        return (*key, self.render_state(), _change_signature(changes))

    def render_state(self) -> frozenset[str]:
        # One frozenset shared by the sockets that adopted the same render: compared by
        # identity first, hashed once.
        return getattr(self, "shown", frozenset())

    def render_shared(self, changes: list[dict[str, Any]]) -> tuple[str | list[str], Any]:
        html = self.render(changes)
        return html, getattr(self, "shown", None)

    def adopt(self, state: Any) -> None:
        if state is not None and hasattr(self, "shown"):
            self.shown = state

    def render(self, changes: list[dict[str, Any]]) -> str | list[str]:
        if self.view == "overview":
            return self.fragments.overview_regions(selectors.dashboard_overview(user=self.user))
        if self.view == "thread":
            try:
                page = selectors.thread_page(UUID(str(self.thread_id)), user=self.user)
            except NotFound:
                return self.fragments.flash("This thread was deleted.", "warning")
            return self._unsent(self.fragments.thread_region_list(page))
        return self._render_list(changes)

    def _unsent(self, regions: list[tuple[str, str]]) -> list[str]:
        """Only the regions whose html differs from what this socket sent last, a frame
        each (the browser swaps them one at a time)."""
        parts = []
        for dom_id, html in regions:
            digest = hash(html)
            if self._sent_regions.get(dom_id) != digest:
                self._sent_regions[dom_id] = digest
                parts.append(html)
        return parts

    def _render_list(self, changes: list[dict[str, Any]]) -> str:
        """Rows to insert, update or delete for a batch of changed runs, then the total.

        `self.shown` is what this socket believes the page lists (its page at connect time,
        then every row pushed or deleted). The runs list reads the changed runs it matches as
        the rows it shows (the inbox reads which match, then its rows, which include runs its
        reviewer decided); a matching run not shown yet costs one read of the page's ids (to
        insert it in place); a change of membership one more, for the totals.
        """
        inbox = self.view == "inbox"
        prefix = "inbox-row-" if inbox else "run-row-"
        relevant = relevant_changes(changes, top_level_only=self.filters.top_level_only)
        if not relevant:
            return ""
        ids = [UUID(c["run_id"]) for c in relevant if c.get("status") != "deleted"]
        fetched: dict[str, Any] = {}
        if inbox:
            matching = {
                str(i) for i in self.queryset.filter(id__in=ids).values_list("id", flat=True)
            }
        else:
            fetched = self._rows([str(i) for i in ids])
            matching = set(fetched)
        start = (self.page - 1) * PAGE_SIZE
        page: list[str] | None = None

        def position(run_id: str) -> int | None:
            # The page as the database lists it now, read once per batch: a run off the page
            # has no position the plan needs (a count per run cost a query each).
            nonlocal page
            if self.ordering is None:
                return None
            if page is None:
                page = self._page_ids()
            return start + page.index(run_id) if run_id in page else None

        plan = plan_rows(
            relevant,
            inbox=inbox,
            shown=self.shown,
            watched=self.watched,
            matching=matching,
            position=position,
            start=start,
            page_size=PAGE_SIZE,
        )
        self.shown = frozenset(plan.shown)
        parts = []
        rows = self._rows(plan.rendered_ids) if inbox else fetched
        for step in plan.actions:
            run = rows.get(step.run_id)
            if step.action == "delete" or run is None:
                parts.append(self.fragments.row_delete(f"{prefix}{step.run_id}", step.seq))
            elif inbox:
                decided = step.action == "decided"
                if decided and run.status in TERMINAL_STATUSES:
                    self.watched.discard(step.run_id)
                parts.append(
                    self.fragments.inbox_row(run, insert_at=step.insert_at, decided=decided)
                )
            else:
                parts.append(self.fragments.run_row(run, insert_at=step.insert_at))
        if plan.membership_changed:
            if inbox and not _has_filters(self.filters):
                total = waiting = self.queryset.count()
            else:
                # The list's total and the navigation's inbox count in one statement.
                total, waiting = selectors.counts(
                    self.queryset, selectors.inbox(selectors.RunFilters(), user=self.user)
                )
            noun = "waiting run" if inbox else "run"
            parts.append(
                self.fragments.list_total("inbox-total" if inbox else "runs-total", total, noun)
            )
            parts.append(self.fragments.nav_inbox_count(waiting))
        return "\n".join(p for p in parts if p)

    def _rows(self, run_ids: list[str]) -> dict[str, Any]:
        if not run_ids:
            return {}
        ids = [UUID(r) for r in run_ids]
        if self.view == "inbox":
            runs = selectors.inbox_rows(ids, user=self.user)
        else:
            runs = self.run_list.decorate(self.queryset.filter(id__in=ids))
        return {str(run.id): run for run in runs}


def _has_filters(filters: selectors.RunFilters) -> bool:
    return filters != selectors.RunFilters()


class RunConsumer(_BatchingConsumer):
    """One run's page (group `run.<id>`, which also hears the run's sub-agent runs)."""

    batch_seconds = 0.1
    io_every_seconds = 2.0  # input/output/state can be large: refreshed at most this often

    def prepare(self) -> list[str]:
        assert self.user is not None  # connect() refused anonymous sockets
        self.user.get_all_permissions()
        self.fragments = Fragments(self.user)
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if self.visibility.bound:
            # Another tenant's run is refused like a missing one (NotFound: closed).
            selectors.visible_run(self.user, self.run_id)
        try:
            seq = max(0, int(self.params.get("seq", "0")))
        except ValueError:
            seq = 0
        self.sent = RunPushState(seq=seq, checkpoint_step=_int_param(self.params, "step"))
        self._io_status: str | None = None
        self._io_at = 0.0
        return [run_group(self.run_id)]

    async def catch_up(self) -> None:
        # Render once now: if the run moved on since the page was rendered, this sends it.
        self.queue({"run_id": str(self.run_id), "seq": 0, "status": "catch_up"})

    def changed_since(self, since: float) -> list[dict[str, Any]]:
        return [{"run_id": str(self.run_id), "seq": 0, "status": "catch_up"}]

    def render(self, changes: list[dict[str, Any]]) -> str | list[str]:
        mine = [c for c in changes if c.get("run_id") == str(self.run_id)]
        deleted = next((c for c in mine if c.get("status") == "deleted"), None)
        if deleted is not None:
            return self.fragments.run_deleted(self.run_id, int(deleted.get("seq") or 0))
        try:
            page = selectors.run_page(UUID(str(self.run_id)), user=self.user)
        except NotFound:
            return self.fragments.run_deleted(self.run_id, 2**31 - 1)
        others = len(mine) < len(changes)  # a sub-agent run changed
        if page.run.last_seq <= self.sent.seq and not others:
            self._io_status = self._io_status or page.run.status
            return ""  # nothing the page does not show already
        now = time.monotonic()
        with_io = page.run.status != self._io_status or now - self._io_at >= self.io_every_seconds
        if with_io:
            self._io_status, self._io_at = page.run.status, now
        return self.fragments.run_push(page, self.sent, with_io=with_io)


def _int_param(params: QueryDict, name: str) -> int | None:
    try:
        return max(0, int(params.get(name, "")))
    except ValueError:
        return None
