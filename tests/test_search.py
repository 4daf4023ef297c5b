"""Search and sorting of the runs list, as support staff meet them: the top-bar search (words,
phrases, an id or its start), inside the list's filters, highlighted; the documents kept in step
by the services; sorting in the URL. Both databases; the full-text specifics on PostgreSQL."""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from runs import services
from runs.engine import Agent, ProposedCall, ScriptedModel, ToolCalls, tool
from runs.models import Run, RunSearch, RunStatus

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
LIST = reverse("runs:run_list")


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def client(support: Any) -> Client:
    c = Client()
    c.force_login(support)
    return c


def listed(html: str) -> set[str]:
    return set(re.findall(r'id="run-row-([0-9a-f-]{36})"', html))


def echo(input: Any, thread_id: Any = None) -> Run:
    return services.run_create(agent_id="echo", thread_id=thread_id, input=input, actor="t")


def test_it_finds_a_run_by_a_word_of_its_input(client: Client) -> None:
    zebra = echo({"note": "customer asked about a zebra"})
    other = echo({"note": "customer asked about a lion"})
    response = client.get(LIST, {"q": "zebra"})
    assert response.status_code == 200
    assert listed(response.content.decode()) == {str(zebra.id)}
    assert str(other.id) not in response.content.decode()


def test_it_finds_runs_by_output_tool_call_arguments_results_and_errors(
    client: Client, drain: Any, register_agent: Any, settings: Any
) -> None:
    settings.RUNS_MAX_ATTEMPTS = 1

    @tool(description="always fails")
    def explode(ctx: Any, reason: str) -> None:
        raise RuntimeError(f"kaboom {reason}")

    def script(state: Any) -> Any:
        return ToolCalls([ProposedCall("explode", {"reason": "quartzite"})])

    register_agent(Agent(id="boom", tools=[explode], model=ScriptedModel(script)))
    thread = services.thread_create(metadata={})
    refund = services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={"order_id": "ORD-77", "amount": 5},
        actor="t",
    )
    echoed = echo("marmalade")
    failed = services.run_create(agent_id="boom", input={}, actor="t")
    drain()
    failed.refresh_from_db()
    assert failed.status == RunStatus.ERROR
    # output (echo's answer), a tool call's result (lookup_order's customer), arguments, an error
    customer = refund.tool_calls.get(tool_name="lookup_order").result["customer"]
    cases = {
        "marmalade": echoed,
        customer: refund,
        "issue_refund": refund,
        "quartzite": failed,  # the arguments of the failing call
        "RuntimeError": failed,  # the run's error
    }
    for q, run in cases.items():
        response = client.get(LIST, {"q": q})
        assert response.status_code == 200
        assert str(run.id) in listed(response.content.decode()), q


def test_it_searches_thread_metadata_and_follows_its_changes(client: Client) -> None:
    thread = services.thread_create(metadata={"customer": "Vandelay Industries"})
    run = echo({}, thread_id=thread.id)
    assert listed(client.get(LIST, {"q": "vandelay"}).content.decode()) == {str(run.id)}
    services.thread_update(thread=thread, metadata={"customer": "Kramerica"})
    assert listed(client.get(LIST, {"q": "vandelay"}).content.decode()) == set()
    assert listed(client.get(LIST, {"q": "kramerica"}).content.decode()) == {str(run.id)}


def test_it_searches_an_answer_and_edited_arguments(client: Client, drain: Any) -> None:
    run = services.run_create(
        agent_id="refund", input={"order_id": "ORD-9", "amount": 5}, actor="t"
    )
    drain()
    call = run.tool_calls.get(tool_name="issue_refund")
    services.tool_call_approve(
        run=run,
        tool_call_id=call.tool_call_id,
        actor="rita",
        args={"order_id": "ORD-9-cobalt", "amount": 4},
    )
    assert str(run.id) in listed(client.get(LIST, {"q": "ORD-9-cobalt"}).content.decode())


def test_it_searches_inside_the_current_filters(client: Client, drain: Any) -> None:
    done = echo({"topic": "walrus"})
    drain()
    waiting = services.run_create(
        agent_id="echo", input={"topic": "walrus"}, after_seconds=3600, actor="t"
    )
    response = client.get(LIST, {"q": "walrus", "status": "pending"})
    assert response.status_code == 200
    assert listed(response.content.decode()) == {str(waiting.id)}
    response = client.get(LIST, {"q": "walrus", "status": "success"})
    assert listed(response.content.decode()) == {str(done.id)}


def test_it_highlights_the_match_and_escapes_the_rest(client: Client) -> None:
    echo({"note": '<script>alert("x")</script> the pelican flew <b>away</b>'})
    html = client.get(LIST, {"q": "pelican"}).content.decode()
    match = re.search(r"<div class=\"sub match\" data-match>(.*?)</div>", html, re.S)
    assert match is not None
    passage = match.group(1)
    assert "<mark>pelican</mark>" in passage
    # Only the marks are markup: the document's own tags come out as text, or not at all.
    assert re.sub(r"</?mark>", "", passage).count("<") == 0
    assert "<script" not in html.split("<body", 1)[1]


def test_it_jumps_to_the_run_whose_id_starts_with_the_query(client: Client) -> None:
    run = echo({})
    for q in (str(run.id), str(run.id)[:13], str(run.id).replace("-", "")[:20]):
        response = client.get(LIST, {"q": q})
        assert response.status_code == 302, q
        assert response["Location"] == reverse("runs:run_detail", args=[run.id])


def test_it_lists_every_run_an_ambiguous_id_prefix_matches(client: Client) -> None:
    first, second = echo({}), echo({})
    common = 0
    a, b = first.id.hex, second.id.hex
    while a[common] == b[common]:
        common += 1
    prefix = a[: max(common, 8)]
    if common < 8:
        pytest.skip("ids differ within 8 digits")  # uuid7 ids made together share ≥ 8
    response = client.get(LIST, {"q": prefix})
    assert response.status_code == 200
    assert {str(first.id), str(second.id)} <= listed(response.content.decode())


def test_it_searches_text_when_an_id_like_query_names_no_run(client: Client) -> None:
    run = echo({"ref": "deadbeefcafe"})
    response = client.get(LIST, {"q": "deadbeefcafe"})
    assert response.status_code == 200
    assert listed(response.content.decode()) == {str(run.id)}


def test_it_drops_a_rolled_back_run_from_the_search(client: Client) -> None:
    run = services.run_create(agent_id="echo", input="osprey", after_seconds=3600, actor="t")
    assert RunSearch.objects.filter(run_id=run.id).exists()
    services.run_cancel(run=run, action="rollback", actor="sam")
    assert not RunSearch.objects.filter(run_id=run.id).exists()
    assert listed(client.get(LIST, {"q": "osprey"}).content.decode()) == set()


def test_it_counts_a_search_up_to_the_cap(client: Client, monkeypatch: Any) -> None:
    from runs.selectors import search

    monkeypatch.setattr(search, "SEARCH_COUNT_CAP", 2)
    for _ in range(3):
        echo({"animal": "heron"})
    html = client.get(LIST, {"q": "heron"}).content.decode()
    assert 'data-count="2"' in html and "2+ runs" in html
    assert len(listed(html)) == 3


def test_it_refuses_an_overlong_search_without_a_500(client: Client) -> None:
    response = client.get(LIST, {"q": "x" * 600})
    assert response.status_code == 200
    assert "Some filters were ignored" in response.content.decode()


def test_it_rebuilds_every_document_with_the_reindex_command(client: Client) -> None:
    run = echo({"bird": "kestrel"})
    RunSearch.objects.all().delete()
    assert listed(client.get(LIST, {"q": "kestrel"}).content.decode()) == set()
    out = io.StringIO()
    call_command("search_reindex", batch=1, stdout=out)
    assert "rebuilt 1 search documents" in out.getvalue()
    assert listed(client.get(LIST, {"q": "kestrel"}).content.decode()) == {str(run.id)}


def test_it_shows_the_search_box_in_the_top_bar_with_the_current_filters(client: Client) -> None:
    html = client.get(LIST, {"status": "pending", "q": "otter"}).content.decode()
    form = html[html.index('class="top-search"') : html.index("</form>", html.index("top-search"))]
    assert 'name="q"' in form and 'value="otter"' in form
    assert 'name="status" value="pending"' in form


# --- PostgreSQL full text ---------------------------------------------------------------------


@pytest.mark.postgres
def test_it_reads_web_search_syntax_on_postgres(client: Client) -> None:
    both = echo({"text": "red panda sanctuary"})
    red = echo({"text": "red fox"})
    panda = echo({"text": "giant panda"})
    assert listed(client.get(LIST, {"q": '"red panda"'}).content.decode()) == {str(both.id)}
    assert listed(client.get(LIST, {"q": "panda -red"}).content.decode()) == {str(panda.id)}
    assert listed(client.get(LIST, {"q": "fox or giant"}).content.decode()) == {
        str(red.id),
        str(panda.id),
    }


@pytest.mark.postgres
def test_it_matches_through_the_gin_index_on_postgres() -> None:
    echo({"text": "ibis"})
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT run_id FROM runs_runsearch"
            " WHERE document_tsv @@ websearch_to_tsquery('simple', 'ibis')"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "runsearch_document_tsv_idx" in plan


# --- sorting ---------------------------------------------------------------------------------


def _order(html: str) -> list[str]:
    return re.findall(r'id="run-row-([0-9a-f-]{36})"', html)


def test_it_sorts_by_attempts_activity_and_duration(client: Client) -> None:
    now = timezone.now()
    a, b, c = echo({}), echo({}), echo({})
    Run.objects.filter(id=a.id).update(
        attempt=3, started_at=now - timedelta(seconds=5), finished_at=now
    )
    Run.objects.filter(id=b.id).update(
        attempt=1, started_at=now - timedelta(seconds=50), finished_at=now
    )
    Run.objects.filter(id=c.id).update(attempt=2)
    Run.objects.filter(id=b.id).update(updated_at=now + timedelta(minutes=5))
    ids = [str(a.id), str(b.id), str(c.id)]
    cases = {
        "-created": [ids[2], ids[1], ids[0]],
        "created": ids,
        "-attempts": [ids[0], ids[2], ids[1]],
        "attempts": [ids[1], ids[2], ids[0]],
        "-duration": [ids[1], ids[0], ids[2]],  # not started: last
        "duration": [ids[0], ids[1], ids[2]],
    }
    for sort, expected in cases.items():
        response = client.get(LIST, {"sort": sort})
        assert response.status_code == 200, sort
        assert _order(response.content.decode()) == expected, sort
    assert _order(client.get(LIST, {"sort": "-activity"}).content.decode())[0] == ids[1]


def test_it_keeps_the_sort_in_the_column_links_and_the_filters(client: Client) -> None:
    html = client.get(LIST, {"sort": "-attempts", "status": "pending"}).content.decode()
    assert 'aria-sort="descending"' in html
    assert 'href="?sort=attempts&amp;status=pending"' in html or (
        'href="?status=pending&amp;sort=attempts"' in html
    )
    assert '<input type="hidden" name="sort" value="-attempts">' in html


def test_it_reports_an_unknown_sort_on_the_page_and_refuses_it_for_a_fragment(
    client: Client,
) -> None:
    run = echo({})
    response = client.get(LIST, {"sort": "colour"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "unknown sort &#x27;colour&#x27;" in html and "-created" in html
    assert str(run.id) in listed(html)
    fragment = client.get(LIST, {"sort": "colour"}, headers=HX)
    assert fragment.status_code == 400
    assert "unknown sort" in fragment.content.decode()


# --- a search page stays live ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_search_page_updates_its_rows_live_but_inserts_no_new_ones(support: Any) -> None:
    from tests.test_live import connect, db, receive_all_until

    def shown_run() -> Run:
        return services.run_create(
            agent_id="echo", input={"bird": "puffin"}, after_seconds=3600, actor="t"
        )

    run = await db(shown_run)()
    listing, ok = await connect("/ws/runs/?view=runs&q=puffin", support)
    assert ok
    try:
        newcomer = await db(shown_run)()  # matches, but a search inserts nothing live
        await db(services.run_cancel)(run=run, action="interrupt", actor="sam")
        # Every push until the shown row's update; after it, nothing more comes.
        pushed = await receive_all_until(listing, lambda t: f'id="run-row-{run.id}"' in t)
        assert await listing.receive_nothing(timeout=0.6)
        row = pushed[pushed.index(f'id="run-row-{run.id}"') :]
        assert "interrupted" in row
        assert "<mark>puffin</mark>" in row  # the pushed row keeps its highlight
        assert f'id="run-row-{newcomer.id}"' not in pushed
    finally:
        await listing.disconnect()


def test_bulk_cancel_of_every_matching_run_keeps_to_the_search(client: Client) -> None:
    hits = [
        services.run_create(agent_id="echo", input="narwhal", after_seconds=3600, actor="t")
        for _ in range(2)
    ]
    miss = services.run_create(agent_id="echo", input="beluga", after_seconds=3600, actor="t")
    body = {"q": "narwhal", "all_matching": "on", "action": "interrupt", "reason": ""}
    preview = client.post(reverse("runs:runs_bulk_cancel"), {**body, "step": "preview"})
    assert preview.status_code == 200
    done = client.post(
        reverse("runs:runs_bulk_cancel"), {**body, "step": "confirm", "expected": "2"}
    )
    assert done.status_code == 302
    statuses = dict(Run.objects.values_list("id", "status"))
    assert [statuses[r.id] for r in hits] == ["interrupted", "interrupted"]
    assert statuses[miss.id] == "pending"


def test_a_threads_first_run_stamps_its_graph_and_older_runs_documents_follow() -> None:
    """run_create stamps graph_id/assistant_id into a thread's metadata in one statement; the
    documents of runs the thread already had are rewritten, a first run's thread has none."""
    from runs.models import Thread

    fresh = services.thread_create(metadata={"team": "blue"})
    first = services.run_create(agent_id="echo", thread_id=fresh.id, input={"q": 1}, actor="t")
    assert Thread.objects.get(id=fresh.id).metadata == {
        "team": "blue",
        "graph_id": "echo",
        "assistant_id": Thread.objects.get(id=fresh.id).metadata["assistant_id"],
    }
    assert "graph_id echo" in RunSearch.objects.get(run=first).document

    # A thread whose runs predate the stamp (its metadata lacks graph_id): the next run's stamp
    # rewrites their documents too.
    Thread.objects.filter(id=fresh.id).update(metadata={"team": "green"})
    services.search_refresh(run_ids=[first.id])
    assert "graph_id" not in RunSearch.objects.get(run=first).document
    services.run_cancel(run=first, action="interrupt", actor="t")
    second = services.run_create(agent_id="echo", thread_id=fresh.id, input={"q": 2}, actor="t")
    for run in (first, second):
        document = RunSearch.objects.get(run=run).document
        assert "team green" in document and "graph_id echo" in document, document


@pytest.mark.django_db(transaction=True)
def test_a_runs_document_lists_its_calls_in_order_with_their_results(drain, reviewer) -> None:
    """search_refresh reads a run and its calls (in one statement on PostgreSQL): the document
    is the one `search_document` makes of them, calls in step order, results and all."""
    from runs.models import ToolCall
    from runs.services.search import search_document

    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "Z9", "amount": 7}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    drain()
    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.SUCCESS
    calls = list(
        ToolCall.objects.filter(run=run)
        .order_by("step", "created_at", "id")
        .values_list("tool_name", "args", "resume_data", "result")
    )
    assert [c[0] for c in calls] == ["lookup_order", "issue_refund"] and calls[1][3]
    expected = search_document(
        input=run.input,
        output=run.output,
        error=run.error,
        thread_metadata=run.thread.metadata,
        tool_calls=calls,
    )
    assert services.search_refresh(run_ids=[run.id]) == 1
    assert RunSearch.objects.get(run=run).document == expected
    assert "result issue_refund" in expected and "refunded true" in expected


def _document_as_read(run_id: Any) -> str:
    """The document `search_document` makes of the run as the ORM reads it now."""
    from runs.models import ToolCall
    from runs.services.search import search_document

    run = Run.objects.select_related("thread").get(id=run_id)
    return search_document(
        input=run.input,
        output=run.output,
        error=run.error,
        thread_metadata=run.thread.metadata if run.thread else None,
        tool_calls=ToolCall.objects.filter(run_id=run_id)
        .order_by("step", "created_at", "id")
        .values_list("tool_name", "args", "resume_data", "result"),
    )


@pytest.mark.django_db(transaction=True)
def test_every_write_of_the_engine_leaves_the_runs_document_as_its_rows_make_it(
    drain, reviewer
) -> None:
    """The step loop's writes carry the run's new document with them (read by their fence,
    not read back): after each one the stored document is the one the run's rows make."""
    thread = services.thread_create(metadata={"team": "blue"})
    echo = services.run_create(agent_id="echo", thread_id=thread.id, input={"q": "x1"}, actor="t")
    drain()
    assert Run.objects.get(id=echo.id).status == RunStatus.SUCCESS
    assert RunSearch.objects.get(run=echo).document == _document_as_read(echo.id)
    assert "output:" in RunSearch.objects.get(run=echo).document

    refund = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "Q7", "amount": 7}, actor="t"
    )
    drain()  # lookup_order ran (its result), issue_refund waits for a reviewer
    assert Run.objects.get(id=refund.id).status == RunStatus.SUSPENDED
    document = RunSearch.objects.get(run=refund).document
    assert document == _document_as_read(refund.id)
    assert "result lookup_order" in document and "tool issue_refund" in document
    services.tool_call_approve(run=Run.objects.get(id=refund.id), actor=reviewer)
    drain()
    assert Run.objects.get(id=refund.id).status == RunStatus.SUCCESS
    document = RunSearch.objects.get(run=refund).document
    assert document == _document_as_read(refund.id)
    assert "result issue_refund" in document


@pytest.mark.postgres
def test_values_in_hand_list_their_keys_as_postgresql_hands_them_back() -> None:
    from runs.services.search import as_stored

    value = {"zz": 1, "a": {"été": [1, {"b": 2, "aa": None}], "e": True}, "bb": "x", "ü": 0.5}
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [json.dumps(value)])
        stored = json.loads(cursor.fetchone()[0])
    assert list(stored) != list(value)  # PostgreSQL reorders them...
    assert json.dumps(as_stored(value)) == json.dumps(stored)
