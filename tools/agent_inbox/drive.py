#!/usr/bin/env python3
"""The real Agent Inbox app (langchain-ai/agent-inbox) reviewing Runsite runs, driven in Playwright.

Started by tools/agent_inbox/check.sh, which builds the app, serves it with `next start` and starts
Runsite (Daphne with its embedded worker, API auth off, CORS open to the app's origin). This
script only talks to those two servers:

- it creates waiting runs with Runsite's LangGraph-compatible API (`refund` suspends on
  `issue_refund` for approval, `weather` asks for a city);
- it adds inboxes through the app's own "Add Inbox" dialog and reviews every run by clicking the
  app's buttons (Accept, Submit after an edit, Send Response, Mark as Resolved, Ignore);
- after each step it checks the app's UI, the run in Runsite's API (status, output, decision,
  reason, audit actor) and Runsite's own dashboard inbox, kept open in a second tab where the
  outcome arrives over the websocket.

One line per step on stdout (`ok` / `FAIL`); for a failure, the requests the app sent to Runsite
in that step with Runsite's answers and the browser console errors. Exit status 1 when a step
failed. Screenshots and the whole network log go to --artifacts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
from playwright.sync_api import Page, Request, Response, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

WAITING = {"pending", "running", "suspended"}
UI_TIMEOUT = 30_000  # ms
REFUND_DESCRIPTION = "Refund an amount on an order"  # the issue_refund tool's description


class StepFailed(AssertionError):
    pass


def check(cond: Any, message: str) -> None:
    if not cond:
        raise StepFailed(message)


# --- network capture ---------------------------------------------------------------------------


@dataclass
class Exchange:
    seq: int
    method: str
    url: str
    body: str | None
    status: int | None = None
    failure: str | None = None
    response: Response | None = None
    response_text: str | None = None

    def text(self, limit: int = 2000) -> str:
        if self.response_text is None and self.response is not None:
            try:
                self.response_text = self.response.text()
            except Exception as e:
                self.response_text = f"<body unavailable: {e}>"
        t = self.response_text or ""
        return t if len(t) <= limit else t[:limit] + f"… ({len(t)} chars)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "method": self.method,
            "url": self.url,
            "request_body": self.body,
            "status": self.status,
            "failure": self.failure,
            "response_body": self.text(20_000),
        }


@dataclass
class Network:
    api_prefix: str
    exchanges: list[Exchange] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    _by_request: dict[int, Exchange] = field(default_factory=dict)

    def attach(self, page: Page) -> None:
        page.on("request", self._on_request)
        page.on("response", self._on_response)
        page.on("requestfailed", self._on_failed)
        page.on("requestfinished", self._on_finished)
        page.on(
            "console",
            lambda m: (
                self.console.append(f"[{m.type}] {m.text}")
                # (the app links fonts/avatars on the internet: unresolvable here, and harmless)
                if m.type in ("error", "warning") and "ERR_NAME_NOT_RESOLVED" not in m.text
                else None
            ),
        )
        page.on("pageerror", lambda e: self.console.append(f"[pageerror] {e}"))

    def _on_request(self, request: Request) -> None:
        if not request.url.startswith(self.api_prefix):
            return
        ex = Exchange(len(self.exchanges), request.method, request.url, request.post_data)
        self.exchanges.append(ex)
        self._by_request[id(request)] = ex

    def _on_response(self, response: Response) -> None:
        ex = self._by_request.get(id(response.request))
        if ex is not None:
            ex.status = response.status
            ex.response = response

    def _on_finished(self, request: Request) -> None:
        """Keep the body now: the browser drops it when the app navigates or reloads."""
        ex = self._by_request.get(id(request))
        if ex is not None and ex.response is not None and ex.response_text is None:
            try:
                ex.response_text = ex.response.text()
            except Exception as e:
                ex.response_text = f"<body unavailable: {e}>"

    def _on_failed(self, request: Request) -> None:
        ex = self._by_request.get(id(request))
        if ex is not None:
            ex.failure = request.failure or "failed"

    def mark(self) -> tuple[int, int]:
        return len(self.exchanges), len(self.console)

    def since(self, mark: tuple[int, int]) -> tuple[list[Exchange], list[str]]:
        return self.exchanges[mark[0] :], self.console[mark[1] :]


# --- Runsite's API ------------------------------------------------------------------------------


class Runsite:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.api = f"{self.base}/api"
        self.http = httpx.Client(base_url=self.api, timeout=30)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, path, **kw)
        if r.status_code >= 400:
            raise StepFailed(f"Runsite {method} /api{path} → {r.status_code}: {r.text[:1500]}")
        return r.json() if r.content else None

    def start_run(self, agent: str, input: dict[str, Any] | None) -> tuple[str, str]:
        thread = self.call("POST", "/threads", json={})
        run = self.call(
            "POST",
            f"/threads/{thread['thread_id']}/runs",
            json={"assistant_id": agent, "input": input},
        )
        return thread["thread_id"], run["run_id"]

    def thread(self, thread_id: str) -> dict[str, Any]:
        return self.call("GET", f"/threads/{thread_id}")

    def run(self, run_id: str) -> dict[str, Any]:
        return self.call("GET", f"/runs/{run_id}")

    def wait_thread_status(self, thread_id: str, status: str, timeout: float = 30) -> dict:
        end = time.monotonic() + timeout
        while True:
            t = self.thread(thread_id)
            if t["status"] == status:
                return t
            if time.monotonic() > end:
                raise StepFailed(f"thread {thread_id} is {t['status']!r}, not {status!r}")
            time.sleep(0.2)

    def final_run(self, run_id: str, timeout: float = 30) -> dict[str, Any]:
        """The run once it left pending/running/suspended (a resume keeps the run's id)."""
        end = time.monotonic() + timeout
        while True:
            r = self.run(run_id)
            if r["status"] not in WAITING:
                return r
            if time.monotonic() > end:
                raise StepFailed(f"run {run_id} still {r['status']!r} after {timeout}s")
            time.sleep(0.3)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/runs/{run_id}/events", params={"limit": 500})["events"]

    def suspended_total(self, agent: str) -> int:
        return self.call("GET", f"/agents/{agent}/suspended-runs")["total"]

    def interrupted_threads(self, graph_id: str) -> list[dict[str, Any]]:
        """What the app asks for: interrupted threads of a graph, newest first (as it sorts)."""
        threads = self.call(
            "POST",
            "/threads/search",
            json={"status": "interrupted", "metadata": {"graph_id": graph_id}, "limit": 100},
        )
        return sorted(threads, key=lambda t: t["created_at"], reverse=True)


def interrupt_value(thread: dict[str, Any]) -> dict[str, Any]:
    for items in (thread.get("interrupts") or {}).values():
        for item in items:
            return item.get("value") or {}
    return {}


def decision_summary(rs: Runsite, run: dict[str, Any]) -> str:
    """Who decided and how, from the run's tool calls and its events (the audit trail)."""
    parts = []
    for tc in run.get("tool_calls", []):
        if tc.get("decided_by"):
            parts.append(
                f"{tc['tool_name']}: {tc['status']} by {tc['decided_by']}"
                + (f" ({tc['decision_reason']!r})" if tc.get("decision_reason") else "")
            )
    actors = sorted({e.get("actor") for e in rs.events(run["run_id"]) if e.get("actor")})
    if actors:
        parts.append(f"event actors {actors}")
    return "; ".join(parts)


# --- the scenario -------------------------------------------------------------------------------


@dataclass
class Item:
    name: str
    agent: str
    input: dict[str, Any] | None
    thread_id: str = ""
    run_id: str = ""


class Scenario:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rs = Runsite(args.runsite)
        self.app = args.app.rstrip("/")
        self.artifacts = Path(args.artifacts)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.net = Network(api_prefix=self.rs.api)
        self.failures: list[str] = []
        self.skipped: list[str] = []
        self.results: list[tuple[str, bool, str]] = []
        self.page: Page | None = None
        self.navigations = 0
        self.added_by: dict[
            str, str
        ] = {}  # main-frame navigations of the app's page (reloads included)
        self.dash: Page | None = None
        self.dash_ok = False
        self.items = {
            i.name: i
            for i in [
                # Created oldest first; the app lists the newest first.
                Item("resolve", "refund", {"order_id": "AI-RESOLVE", "amount": 44}),
                Item("respond", "refund", {"order_id": "AI-RESPOND", "amount": 33}),
                Item("edit", "refund", {"order_id": "AI-EDIT", "amount": 22}),
                Item("accept", "refund", {"order_id": "AI-ACCEPT", "amount": 11}),
                Item("ignore", "weather", None),
                Item("answer", "weather", None),
            ]
        }

    # -- reporting

    def do(self, name: str, fn: Callable[[list[str]], None], needs: tuple[str, ...] = ()) -> None:
        missing = [n for n in needs if n in self.failures or n in self.skipped]
        if missing:
            print(f"SKIP {name}: needs {', '.join(missing)}", flush=True)
            self.skipped.append(name)
            self.results.append((name, False, f"skipped: needs {missing}"))
            return
        detail: list[str] = []
        mark = self.net.mark()
        started = time.monotonic()
        try:
            fn(detail)
        except Exception as e:  # every failure becomes a FAIL line
            took = time.monotonic() - started
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if not isinstance(e, StepFailed):
                msg = f"{type(e).__name__}: {msg}"
            print(f"FAIL {name} ({took:.1f}s): {msg}", flush=True)
            if not isinstance(e, StepFailed):
                print(_indent(traceback.format_exc(limit=-2)), flush=True)
            for line in detail:
                print(f"     · {line}", flush=True)
            self._dump(mark)
            self._shot(f"FAIL-{name}")
            self.failures.append(name)
            self.results.append((name, False, msg))
            self._recover()
        else:
            took = time.monotonic() - started
            print(f"ok   {name} ({took:.1f}s): " + "; ".join(detail), flush=True)
            self.results.append((name, True, "; ".join(detail)))
            self._shot(name)

    def _dump(self, mark: tuple[int, int]) -> None:
        exchanges, console = self.net.since(mark)
        bad = [x for x in exchanges if x.failure or (x.status or 0) >= 400]
        shown = bad or exchanges[-6:]
        if shown:
            label = "failed" if bad else "last"
            print(f"     {label} requests from the app to Runsite in this step:", flush=True)
        for x in shown:
            outcome = x.failure or x.status
            print(f"     > {x.method} {x.url}  →  {outcome}", flush=True)
            if x.body:
                print(f"       request:  {x.body[:1500]}", flush=True)
            if x.status is not None:
                print(f"       response: {x.text(1500)}", flush=True)
        for line in console[-8:]:
            print(f"     console {line[:800]}", flush=True)

    def _shot(self, name: str) -> None:
        if self.page is None:
            return
        with contextlib.suppress(Exception):  # a screenshot is a help, never a failure
            self.page.screenshot(path=str(self.artifacts / f"{len(self.results):02d}-{name}.png"))

    def _recover(self) -> None:
        """Back to the inbox list, so the next step starts from a known page."""
        if self.page is None:
            return
        with contextlib.suppress(Exception):  # the next step reports what is still wrong
            self.open_app()

    # -- app helpers

    def rows(self) -> Any:
        assert self.page is not None
        return self.page.locator("div.grid.grid-cols-12.cursor-pointer")

    def toasts(self) -> list[str]:
        assert self.page is not None
        try:
            return [t.replace("\n", " ") for t in self.page.locator("ol > li").all_inner_texts()]
        except Exception:
            return []

    def wait_toast(self, text: str, *, errors: tuple[str, ...] = ()) -> None:
        assert self.page is not None
        end = time.monotonic() + UI_TIMEOUT / 1000
        seen: list[str] = []
        while time.monotonic() < end:
            seen = self.toasts()
            for t in seen:
                for bad in errors:
                    if bad in t:
                        raise StepFailed(f"the app says: {t!r}")
            if any(text in t for t in seen):
                return
            self.page.wait_for_timeout(150)
        raise StepFailed(f"no {text!r} toast in the app (toasts: {seen})")

    def field(self, label: str) -> Any:
        assert self.page is not None
        return self.page.locator(
            f"xpath=//p[normalize-space()='{label}']/following-sibling::textarea[1]"
        )

    def open_item(self, item: Item, graph_id: str, detail: list[str]) -> None:
        """Click the item's row in the app's list (the app sorts interrupted threads newest
        first; its position is taken from the same search the app makes)."""
        page = self.page
        assert page is not None
        pending = [t["thread_id"] for t in self.rs.interrupted_threads(graph_id)]
        check(item.thread_id in pending, f"Runsite does not list {item.name}'s thread as waiting")
        rows = self.rows()
        expect(rows).to_have_count(len(pending), timeout=UI_TIMEOUT)
        title = page.locator("p.text-2xl")
        for _attempt in range(2):
            self.settle(quiet=1.0)
            rows.nth(pending.index(item.thread_id)).click()
            try:
                page.wait_for_url(re.compile(r"view_state_thread_id="), timeout=5_000)
                expect(title).to_be_visible(timeout=5_000)
                detail.append("opened by clicking its row")
                break
            except (PlaywrightTimeout, AssertionError):
                detail.append("a click on its row did not open it")
        else:
            # With this snapshot of the app (Next.js 16) a click on a row can leave the URL as
            # it was, or set ?…&view_state_thread_id=… and go back to the list at once (the
            # app's router and its effects race); the item's own link, the URL the click
            # produces, opens it.
            list_query = urlparse(page.url).query
            page.goto(f"{self.app}/?{list_query}&view_state_thread_id={item.thread_id}")
            expect(title).to_be_visible(timeout=UI_TIMEOUT)
            detail.append("opened its link instead (app issue)")
        self.settle(quiet=1.0)
        opened = parse_qs(urlparse(page.url).query)["view_state_thread_id"][0]
        check(opened == item.thread_id, f"the row opened thread {opened}, not {item.thread_id}")
        detail.append(f"opened {item.name} ({item.thread_id[:8]}…)")

    def back_in_list(self, item: Item, graph_id: str) -> None:
        """The app went back to its list, which no longer shows the item."""
        page = self.page
        assert page is not None
        expect(page).not_to_have_url(re.compile(r"view_state_thread_id="), timeout=UI_TIMEOUT)
        left = len([t for t in self.rs.interrupted_threads(graph_id)])
        expect(self.rows()).to_have_count(left, timeout=UI_TIMEOUT)

    # -- Runsite's dashboard

    def dashboard_login(self, browser: Any) -> None:
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        self.dash = ctx.new_page()
        self.dash.goto(f"{self.rs.base}/accounts/login/?next=/inbox/")
        self.dash.fill("#id_username", self.args.user)
        self.dash.fill("#id_password", self.args.password)
        self.dash.get_by_role("button", name="Sign in").click()
        expect(self.dash).to_have_url(f"{self.rs.base}/inbox/", timeout=UI_TIMEOUT)
        expect(self.dash.locator("body")).to_have_attribute("data-live", "up", timeout=15_000)
        self.dash.evaluate("window.__sameDocument = true")

    def dashboard_agrees(self, item: Item, status: str, detail: list[str]) -> None:
        """Runsite's own inbox (not reloaded) no longer offers the run for review, and its
        waiting count matches the API's."""
        if self.dash is None:
            return
        d = self.dash
        row = d.locator(f"#inbox-row-{item.run_id}")
        waiting = self.rs.suspended_total("refund") + self.rs.suspended_total("weather")
        noun = "waiting run" if waiting == 1 else "waiting runs"
        expect(d.locator("#inbox-total")).to_have_text(f"{waiting} {noun}", timeout=15_000)
        end = time.monotonic() + 15
        while row.count() and row.locator("[data-act]").count() and time.monotonic() < end:
            d.wait_for_timeout(200)
        check(
            row.count() == 0 or row.locator("[data-act]").count() == 0,
            "Runsite's inbox still offers the run for review",
        )
        check(d.evaluate("window.__sameDocument") is True, "Runsite's inbox page reloaded")
        shown = "gone from the list" if row.count() == 0 else f"row shows {row.inner_text()!r}"
        detail.append(f"Runsite inbox live: {waiting} waiting, run {shown[:120]}")
        d.screenshot(path=str(self.artifacts / f"{len(self.results):02d}-runsite-inbox.png"))

    # -- steps

    def run(self) -> int:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=self.args.chromium, args=["--no-sandbox"], headless=True
            )
            try:
                self.steps(browser)
            finally:
                (self.artifacts / "network.json").write_text(
                    json.dumps([x.as_dict() for x in self.net.exchanges], indent=1)
                )
                (self.artifacts / "console.txt").write_text("\n".join(self.net.console))
                browser.close()
        passed = sum(ok for _, ok, _ in self.results)
        bad = self.failures + self.skipped
        print(
            f"{'PASSED' if not bad else 'FAILED'}: {passed}/{len(self.results)} steps"
            + (f"; failed: {', '.join(self.failures)}" if self.failures else "")
            + (f"; skipped: {', '.join(self.skipped)}" if self.skipped else ""),
            flush=True,
        )
        return 1 if bad else 0

    def steps(self, browser: Any) -> None:
        it = self.items

        def runsite_waiting_runs(d: list[str]) -> None:
            for item in it.values():
                item.thread_id, item.run_id = self.rs.start_run(item.agent, item.input)
                time.sleep(0.05)  # distinct created_at: the app orders by it
            for item in it.values():
                t = self.rs.wait_thread_status(item.thread_id, "interrupted")
                md = t.get("metadata") or {}
                check(
                    md.get("graph_id") == item.agent,
                    f"thread metadata has no graph_id={item.agent!r} after the run was created: "
                    f"{md}",
                )
                check("assistant_id" in md, f"thread metadata has no assistant_id: {md}")
            refund_value = interrupt_value(self.rs.thread(it["accept"].thread_id))
            weather_value = interrupt_value(self.rs.thread(it["ignore"].thread_id))
            d.append(f"{len(it)} runs suspended; thread metadata {md}")
            d.append(f"refund interrupt keys {sorted(refund_value)}")
            d.append(f"weather interrupt keys {sorted(weather_value)}")
            (self.artifacts / "interrupt-values.json").write_text(
                json.dumps({"refund": refund_value, "weather": weather_value}, indent=1)
            )

        self.do("runsite-waiting-runs", runsite_waiting_runs)

        def cors_preflight(d: list[str]) -> None:
            origin = f"{urlparse(self.app).scheme}://{urlparse(self.app).netloc}"
            r = httpx.options(
                f"{self.rs.api}/threads/search",
                headers={
                    "Origin": origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type,x-api-key",
                },
            )
            allow = r.headers.get("access-control-allow-origin")
            headers = (r.headers.get("access-control-allow-headers") or "").lower()
            check(
                r.status_code < 400 and allow in (origin, "*"),
                f"OPTIONS /api/threads/search from {origin} → {r.status_code}, "
                f"Access-Control-Allow-Origin={allow!r}",
            )
            check(
                "x-api-key" in headers, f"Access-Control-Allow-Headers lacks x-api-key: {headers}"
            )
            d.append(f"{r.status_code}, allow-origin {allow}, allow-headers has x-api-key")

        self.do("cors-preflight", cors_preflight)

        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = page = context.new_page()
        self.net.attach(page)
        page.on("framenavigated", lambda f: self._navigated(f))

        def runsite_dashboard_login(d: list[str]) -> None:
            self.dashboard_login(browser)
            total = self.dash.locator("#inbox-total").inner_text() if self.dash else ""
            d.append(f"reviewer {self.args.user!r} on /inbox/, live; {total}")

        self.do("runsite-dashboard-login", runsite_dashboard_login)

        def app_add_inbox_refund(d: list[str]) -> None:
            page.goto(self.app)
            dialog = page.get_by_role("dialog")
            expect(dialog).to_contain_text("Welcome to the Agent Inbox", timeout=UI_TIMEOUT)
            self.add_inbox("refund", "Runsite refunds", welcome=True)
            stored = self.stored_inboxes()
            check(
                any(
                    i.get("graphId") == "refund" and i.get("deploymentUrl") == self.rs.api
                    for i in stored
                ),
                f"the app stored {stored}",
            )
            d.append(
                f"added {self.added_by['refund']}: graph id 'refund', deployment URL {self.rs.api}"
            )

        self.do("app-add-inbox-refund", app_add_inbox_refund)

        def app_lists_waiting_runs(d: list[str]) -> None:
            pending = self.rs.interrupted_threads("refund")
            check(len(pending) == 4, f"Runsite lists {len(pending)} waiting refund threads, not 4")
            rows = self.rows()
            expect(rows).to_have_count(4, timeout=UI_TIMEOUT)
            value = interrupt_value(pending[0])
            req = (value.get("action_requests") or [{}])[0]
            description = req.get("description") or ""
            for i in range(4):
                expect(rows.nth(i)).to_contain_text("issue_refund")
                if description:
                    expect(rows.nth(i)).to_contain_text(description[:40])
            check(description, f"the interrupt carries no description: {value}")
            check(
                REFUND_DESCRIPTION in description,
                f"the description does not carry the tool's description: {description!r}",
            )
            allowed = ((value.get("review_configs") or [{}])[0]).get("allowed_decisions")
            check(
                set(allowed or []) >= {"approve", "edit", "reject"},
                f"review_configs allowed_decisions = {allowed}",
            )
            d.append(f"4 rows 'issue_refund' — {description[:60]!r}; allowed {allowed}")
            # The item view shows the tool, its arguments and the description.
            item = it["accept"]
            self.open_item(item, "refund", d)
            expect(page.locator("p.text-2xl")).to_have_text("issue_refund", timeout=UI_TIMEOUT)
            expect(self.field("Order Id")).to_have_value("AI-ACCEPT")
            expect(self.field("Amount")).to_have_value("11")
            for b in ("Accept", "Send Response", "Mark as Resolved"):
                expect(page.get_by_role("button", name=b, exact=True)).to_be_visible()
            page.get_by_role("button", name="Description", exact=True).click()
            expect(page.get_by_text(REFUND_DESCRIPTION).first).to_be_visible(timeout=UI_TIMEOUT)
            d.append("item view: title issue_refund, Order Id AI-ACCEPT, Amount 11, description")

        self.do("app-lists-waiting-runs", app_lists_waiting_runs, needs=("app-add-inbox-refund",))

        def app_accept(d: list[str]) -> None:
            item = it["accept"]
            if "view_state_thread_id" not in page.url:
                self.open_item(item, "refund", d)
            page.get_by_role("button", name="Accept", exact=True).click()
            self.wait_toast("Response submitted successfully", errors=("Failed", "Error"))
            self.back_in_list(item, "refund")
            run = self.rs.final_run(item.run_id)
            check(run["status"] == "success", f"run ended {run['status']!r}: {run.get('error')}")
            out = run.get("output") or {}
            check(out.get("refunded") is True and out.get("amount") == 11, f"output {out}")
            d.append(f"run success, output {out}; {decision_summary(self.rs, run)}")
            self.dashboard_agrees(item, "success", d)

        self.do("app-accept", app_accept, needs=("app-add-inbox-refund",))

        def app_edit(d: list[str]) -> None:
            item = it["edit"]
            self.open_item(item, "refund", d)
            amount = self.field("Amount")
            expect(amount).to_have_value("22", timeout=UI_TIMEOUT)
            amount.fill("7.5")
            page.get_by_role("button", name="Submit", exact=True).click()
            self.wait_toast("Response submitted successfully", errors=("Failed", "Error"))
            self.back_in_list(item, "refund")
            run = self.rs.final_run(item.run_id)
            check(run["status"] == "success", f"run ended {run['status']!r}: {run.get('error')}")
            out = run.get("output") or {}
            check(
                out.get("refunded") is True and out.get("amount") == 7.5,
                f"output {out} (the app sends edited values as strings: amount '7.5')",
            )
            refund = next(tc for tc in run["tool_calls"] if tc["tool_name"] == "issue_refund")
            d.append(
                f"run success, output {out}; args {refund['args']} "
                f"(original {refund.get('original_args')}); {decision_summary(self.rs, run)}"
            )
            self.dashboard_agrees(item, "success", d)

        self.do("app-edit", app_edit, needs=("app-add-inbox-refund",))

        def app_respond(d: list[str]) -> None:
            item = it["respond"]
            reason = "Customer already got store credit"
            self.open_item(item, "refund", d)
            page.get_by_placeholder("Your response here...").fill(reason)
            page.get_by_role("button", name="Send Response", exact=True).click()
            self.wait_toast("Response submitted successfully", errors=("Failed", "Error"))
            self.back_in_list(item, "refund")
            run = self.rs.final_run(item.run_id)
            check(run["status"] == "success", f"run ended {run['status']!r}: {run.get('error')}")
            out = run.get("output") or {}
            check(out == {"refunded": False, "reason": reason}, f"output {out}")
            refund = next(tc for tc in run["tool_calls"] if tc["tool_name"] == "issue_refund")
            check(refund["status"] == "declined", f"issue_refund is {refund['status']!r}")
            d.append(f"run success, output {out}; {decision_summary(self.rs, run)}")
            self.dashboard_agrees(item, "success", d)

        self.do("app-respond", app_respond, needs=("app-add-inbox-refund",))

        def app_mark_resolved(d: list[str]) -> None:
            item = it["resolve"]
            self.open_item(item, "refund", d)
            page.get_by_role("button", name="Mark as Resolved", exact=True).click()
            self.wait_toast("Ignored thread", errors=("Failed to ignore thread",))
            self.back_in_list(item, "refund")
            run = self.rs.final_run(item.run_id)
            check(run["status"] == "interrupted", f"run ended {run['status']!r}, not 'interrupted'")
            refund = next(tc for tc in run["tool_calls"] if tc["tool_name"] == "issue_refund")
            check(refund.get("result") is None, f"issue_refund ran: {refund.get('result')}")
            d.append(
                f"run interrupted, reason {run.get('cancel_reason')!r}, issue_refund "
                f"{refund['status']}; {decision_summary(self.rs, run)}"
            )
            self.dashboard_agrees(item, "interrupted", d)

        self.do("app-mark-resolved", app_mark_resolved, needs=("app-add-inbox-refund",))

        def app_add_inbox_weather(d: list[str]) -> None:
            self.settle()
            page.get_by_role("button", name="Add Inbox", exact=True).click()
            dialog = page.get_by_role("dialog")
            expect(dialog).to_contain_text("Add a new agent inbox", timeout=UI_TIMEOUT)
            self.add_inbox("weather", "Runsite weather", welcome=False)
            pending = self.rs.interrupted_threads("weather")
            check(len(pending) == 2, f"Runsite lists {len(pending)} waiting weather threads")
            rows = self.rows()
            expect(rows).to_have_count(2, timeout=UI_TIMEOUT)
            value = interrupt_value(pending[0])
            action = (value.get("action_request") or {}).get("action")
            config = value.get("config") or {}
            check(action, f"the weather interrupt has no action_request.action: {value}")
            check(
                config.get("allow_respond") and config.get("allow_ignore"),
                f"the weather interrupt's config is {config}",
            )
            expect(rows.nth(0)).to_contain_text(action)
            d.append(
                f"added {self.added_by['weather']}; 2 rows {action!r}, config {config}, "
                f"description {value.get('description')!r}"
            )

        self.do("app-add-inbox-weather", app_add_inbox_weather, needs=("app-add-inbox-refund",))

        def app_respond_input(d: list[str]) -> None:
            item = it["answer"]
            self.open_item(item, "weather", d)
            page.get_by_placeholder("Your response here...").fill("Paris")
            page.get_by_role("button", name="Send Response", exact=True).click()
            self.wait_toast("Response submitted successfully", errors=("Failed", "Error"))
            self.back_in_list(item, "weather")
            run = self.rs.final_run(item.run_id)
            check(run["status"] == "success", f"run ended {run['status']!r}: {run.get('error')}")
            out = run.get("output") or {}
            check(out.get("city") == "Paris", f"output {out}")
            d.append(f"run success, output {out}; {decision_summary(self.rs, run)}")
            self.dashboard_agrees(item, "success", d)

        self.do("app-respond-input", app_respond_input, needs=("app-add-inbox-weather",))

        def app_ignore(d: list[str]) -> None:
            item = it["ignore"]
            self.open_item(item, "weather", d)
            ignore = page.get_by_role("button", name="Ignore", exact=True)
            expect(ignore).to_be_visible(timeout=UI_TIMEOUT)
            ignore.click()
            self.wait_toast("Successfully ignored thread")
            self.back_in_list(item, "weather")
            run = self.rs.final_run(item.run_id)
            check(run["status"] == "interrupted", f"run ended {run['status']!r}, not 'interrupted'")
            reasons = [run.get("cancel_reason") or "", run.get("error") or ""] + [
                tc.get("decision_reason") or "" for tc in run["tool_calls"]
            ]
            check(
                any("ignored in review" in str(r) for r in reasons),
                f"no 'ignored in review' reason on the run: {reasons}",
            )
            d.append(
                f"run interrupted, reason {run.get('cancel_reason')!r}; "
                f"{decision_summary(self.rs, run)}"
            )
            self.dashboard_agrees(item, "interrupted", d)

        self.do("app-ignore", app_ignore, needs=("app-add-inbox-weather",))

        def runsite_review_api_empty(d: list[str]) -> None:
            totals = {a: self.rs.suspended_total(a) for a in ("refund", "weather")}
            check(totals == {"refund": 0, "weather": 0}, f"suspended-runs totals {totals}")
            statuses = {name: self.rs.run(i.run_id)["status"] for name, i in it.items()}
            d.append(f"suspended-runs totals {totals}; runs {statuses}")

        self.do("runsite-review-api-empty", runsite_review_api_empty)

    def _navigated(self, frame: Any) -> None:
        if self.page is not None and frame == self.page.main_frame:
            self.navigations += 1

    def settle(self, quiet: float = 1.5, timeout: float = 20) -> None:
        """Wait until the app stops rewriting its URL (it adds its query parameters one by one
        after loading, re-rendering the page each time)."""
        page = self.page
        assert page is not None
        end = time.monotonic() + timeout
        last, since = (page.url, self.navigations), time.monotonic()
        while time.monotonic() < end:
            page.wait_for_timeout(100)
            now = (page.url, self.navigations)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return

    def stored_inboxes(self) -> list[dict[str, Any]]:
        assert self.page is not None
        for _ in range(20):
            try:
                raw = self.page.evaluate("localStorage.getItem('inbox:agent_inboxes')")
            except Exception:  # the page is reloading
                time.sleep(0.25)
                continue
            return json.loads(raw or "[]")
        return []

    def add_inbox(self, graph_id: str, name: str, *, welcome: bool) -> None:
        """Fill and submit the app's "Add Inbox" dialog. The app rewrites its URL several times
        while it starts (each time re-rendering the dialog, which can drop typed values), so the
        values are checked before submitting and the submission is retried until the app has
        stored the inbox."""
        page = self.page
        assert page is not None
        dialog = page.get_by_role("dialog")
        added_by = ""
        for attempt in range(4):
            try:
                if attempt and welcome:
                    page.goto(self.app)  # start again from a fresh page
                self.settle()
                try:
                    expect(dialog).to_be_visible(timeout=5_000)
                except AssertionError:
                    if welcome:  # the welcome dialog opens by itself while there is no inbox
                        page.goto(self.app)
                        self.settle()
                    else:
                        page.get_by_role("button", name="Add Inbox", exact=True).click()
                expect(dialog).to_be_visible(timeout=10_000)
                dialog.locator("#graph-id").fill(graph_id, timeout=5_000)
                dialog.locator("#deployment-url").fill(self.rs.api, timeout=5_000)
                dialog.locator("#name").fill(name, timeout=5_000)
                page.wait_for_timeout(300)
                fields = ("#graph-id", "#deployment-url")
                values = [dialog.locator(f).input_value(timeout=5_000) for f in fields]
                if values != [graph_id, self.rs.api]:
                    continue
                dialog.get_by_role("button", name="Add Inbox", exact=True).click(timeout=5_000)
            except (PlaywrightTimeout, AssertionError):
                continue  # the app re-rendered the dialog under the script's hands
            end = time.monotonic() + 10
            while time.monotonic() < end:
                if any(i.get("graphId") == graph_id for i in self.stored_inboxes()):
                    added_by = "through the app's Add Inbox dialog"
                    break
                page.wait_for_timeout(200)
            if added_by:
                break
        else:
            # The dialog kept being re-rendered (the app's reload loop, see open_app): store
            # the inbox exactly as the dialog does, so that the rest still proves the server.
            inbox = {
                "id": str(uuid.uuid4()),
                "graphId": graph_id,
                "deploymentUrl": self.rs.api,
                "name": name,
                "selected": True,
                "createdAt": datetime.now(UTC).isoformat(),
            }
            others = [{**i, "selected": False} for i in self.stored_inboxes()]
            page.evaluate(
                "v => localStorage.setItem('inbox:agent_inboxes', v)", json.dumps([*others, inbox])
            )
            added_by = "in localStorage as the dialog stores it (the dialog was not usable)"
        self.added_by[graph_id] = added_by
        # The app reloads itself after adding, at a URL with its list parameters but without
        # agent_inbox (and, for the first inbox, with no_inboxes_found=true, which reopens the
        # welcome dialog): with this snapshot of the app such a URL can make it reload itself in
        # a loop (see open_app), so the list is opened again at the app's own settled URL.
        self.open_app()
        entry = page.locator("li button", has_text=name)
        expect(entry).to_be_visible(timeout=UI_TIMEOUT)
        selected = [i for i in self.stored_inboxes() if i.get("selected")]
        if not selected or selected[0].get("graphId") != graph_id:
            entry.click()
            self.settle()
        expect(page).to_have_url(re.compile(r"inbox=interrupted"), timeout=UI_TIMEOUT)

    def open_app(self) -> None:
        """The app's list for the selected inbox, at the URL the app settles on by itself
        (?agent_inbox=…&offset=0&limit=10&inbox=interrupted). Opening its root instead makes the
        app set these parameters in two racing effects; when agent_inbox loses the race, this
        snapshot of the app (Next.js 16) reloads itself in a loop, whatever the backend (it does
        the same with an unreachable deployment URL)."""
        page = self.page
        assert page is not None
        selected = [i for i in self.stored_inboxes() if i.get("selected")]
        if selected:
            page.goto(
                f"{self.app}/?agent_inbox={selected[0]['id']}&offset=0&limit=10&inbox=interrupted"
            )
        else:
            page.goto(self.app)
        self.settle()
        dialog = page.get_by_role("dialog")
        if dialog.count():
            page.keyboard.press("Escape")
        expect(dialog).to_have_count(0, timeout=UI_TIMEOUT)


def _indent(text: str) -> str:
    return "\n".join(f"     | {line}" for line in text.rstrip().splitlines())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", required=True, help="the Agent Inbox app, e.g. http://127.0.0.1:3000")
    ap.add_argument("--runsite", required=True, help="Runsite, e.g. http://127.0.0.1:8000")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--user", default="reviewer", help="a Runsite user in the Reviewers group")
    ap.add_argument("--password", default="reviewer")
    ap.add_argument("--artifacts", required=True, help="a folder for screenshots and logs")
    return Scenario(ap.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
