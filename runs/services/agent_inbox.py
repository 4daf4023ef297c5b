"""The Agent Inbox's choices (accept, edit, respond, ignore) on a graph's HumanInterrupt.

A LangGraph graph that interrupts with an Agent Inbox request (`action_request`, `config` with
`allow_accept/edit/respond/ignore`, `description`; alone or as the only item of a list) is
offered exactly the choices its config allows, and each one is recorded so that
runs/graphs/interrupts.resume_value hands the graph the matching HumanResponse:

| choice  | recorded as                              | the graph's interrupt() returns            |
|---------|------------------------------------------|--------------------------------------------|
| accept  | approved                                 | {"type": "accept", "args": action_request} |
| edit    | approved with the edited arguments       | {"type": "edit", "args": {action, args}}   |
| respond | answered with the HumanResponse itself   | {"type": "response", "args": text}         |
| ignore  | declined without a reason                | {"type": "ignore", "args": None}           |

(a one-item list of it when the request was a list). Runsite agents are not offered these
choices: their Agent Inbox answers go through the API's conventions (services/conventions.py).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from django.db import transaction

from runs.contracts import Actor, JSONObject
from runs.engine.registry import all_agents
from runs.exceptions import Conflict, ValidationFailed
from runs.graphs.loader import is_graph_agent
from runs.models import PENDING_DECISION_STATUSES, Run
from runs.services.claims import check_claim
from runs.services.core import _check_json_size, _check_scope, _lock_run, _now
from runs.services.decisions import (
    _after_decision,
    _decide,
    _ensure_waiting,
    _pick_tool_call,
)

Choice = Literal["accept", "edit", "respond", "ignore"]
CHOICES: tuple[Choice, ...] = get_args(Choice)
_ALLOWED_BY = {
    "accept": "allow_accept",
    "edit": "allow_edit",
    "respond": "allow_respond",
    "ignore": "allow_ignore",
}
MAX_TEXT = 10_000


def agent_inbox_request(agent_id: str, payload: Any) -> dict[str, Any] | None:
    """The HumanInterrupt a graph's waiting call asks about, or None (not a graph, or another
    value). The same shape runs/graphs/interrupts.py reads when it suspends the run."""
    if isinstance(payload, list) and len(payload) == 1:
        payload = payload[0]
    if (
        isinstance(payload, dict)
        and isinstance(payload.get("action_request"), dict)
        and isinstance(payload.get("config"), dict)
        and is_graph_agent(all_agents().get(agent_id))
    ):
        return payload
    return None


def allowed_choices(request: dict[str, Any]) -> list[Choice]:
    return [c for c in CHOICES if request["config"].get(_ALLOWED_BY[c]) is True]


def tool_call_inbox_decide(
    *,
    run: Run,
    actor: Actor,
    choice: str,
    tool_call_id: str | None = None,
    args: JSONObject | None = None,
    text: str = "",
    pinned_resource_id: str | None = None,
    take_over: bool = False,
) -> Run:
    """Decide a graph's Agent Inbox request with one of the choices its config allows
    (a call another reviewer claimed needs `take_over`)."""
    _check_scope(run, pinned_resource_id, "Run")
    if choice not in CHOICES:
        raise ValidationFailed.field("choice", f"expected one of {', '.join(CHOICES)}")
    if choice == "respond":
        if not text.strip():
            raise ValidationFailed.field("text", "required", detail="Write a response.")
        if len(text) > MAX_TEXT:
            raise ValidationFailed.field("text", f"too long ({MAX_TEXT} characters at most)")
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "decide")
        _ensure_waiting(tc, PENDING_DECISION_STATUSES, "decided")
        check_claim(locked, tc, actor, take_over=take_over, now=_now())
        request = agent_inbox_request(locked.agent_id, tc.suspend_payload)
        if request is None:
            raise Conflict(
                f"Tool call {tc.tool_call_id} is not an Agent Inbox request of a graph",
                code="not_an_inbox_request",
            )
        if choice not in allowed_choices(request):
            raise Conflict(
                f"The request does not allow {choice!r} "
                f"(allowed: {', '.join(allowed_choices(request)) or 'nothing'})",
                code="choice_not_allowed",
                extra={"allowed": list(allowed_choices(request))},
            )
        if choice == "edit":
            if not isinstance(args, dict):
                raise ValidationFailed.field("args", "must be an object")
            _check_json_size(args, "args")
        via = f"agent_inbox:{choice}"
        if not tc.requires_approval:
            # A request without allow_accept waits as input and kept no arguments of its
            # own: its arguments are the request's.
            tc.args = request["action_request"].get("args") or {}
        response: Any = None
        if choice == "respond":
            response = {"type": "response", "args": text}
        elif choice == "edit" and args == tc.args and "accept" not in allowed_choices(request):
            # Unchanged arguments are an accept (as in the Agent Inbox app), unless the
            # request does not allow one: then it is the edit, as sent.
            action = request["action_request"].get("action")
            response = {"type": "edit", "args": {"action": action, "args": args}}
        if response is not None:
            if isinstance(tc.suspend_payload, list):
                response = [response]
            _decide(locked, tc, decision="answered", actor=actor, resume_data=response, via=via)
        elif choice in ("accept", "edit"):
            _decide(locked, tc, decision="approved", actor=actor, args=args, via=via)
        else:
            # Declined with no reason is what resume_value hands the graph as "ignore".
            _decide(locked, tc, decision="declined", actor=actor, via=via)
        return _after_decision(locked, actor)
