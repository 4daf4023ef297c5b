from __future__ import annotations

import hashlib
from typing import Any

from runs.engine import Agent, FinalAnswer, ModelInput, ProposedCall, ScriptedModel, ToolCalls, tool

INPUT_SCHEMA: dict[str, Any] = {  # a JSON schema
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "minLength": 1, "maxLength": 200},
        "amount": {"type": "number", "exclusiveMinimum": 0},
    },
    "required": ["order_id", "amount"],
}


@tool(
    description="Look up an order by id.",
    read_only=True,
    parameters={
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
)
def lookup_order(ctx: Any, order_id: str) -> dict[str, Any]:
    digest = int(hashlib.sha256(order_id.encode()).hexdigest(), 16)
    return {"order_id": order_id, "status": "delivered", "customer": f"customer-{digest % 1000}"}


@tool(
    description="Refund an amount on an order. Needs a human's approval.",
    requires_approval=True,
    # The reviewer's approval comment ("refund as goodwill, no return needed") reaches the
    # model with the refund's result.
    share_review_comment=True,
    parameters={
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "minLength": 1},
            "amount": {"type": "number", "exclusiveMinimum": 0},
        },
        "required": ["order_id", "amount"],
    },
)
def issue_refund(ctx: Any, order_id: str, amount: float) -> dict[str, Any]:
    # A real payment API would receive ctx.idempotency_key so a retried call refunds once.
    return {
        "refunded": True,
        "order_id": order_id,
        "amount": amount,
        "reference": ctx.idempotency_key,
    }


def refund_script(state: ModelInput) -> ToolCalls | FinalAnswer:
    params = state.input or {}
    refund_result = state.last_result("issue_refund")
    if refund_result is not None:
        if refund_result.declined:
            return FinalAnswer(output={"refunded": False, "reason": refund_result.result["reason"]})
        r = refund_result.result
        output = {"refunded": True, "order_id": r["order_id"], "amount": r["amount"]}
        if r.get("reviewer_comment"):
            output["reviewer_comment"] = r["reviewer_comment"]
        return FinalAnswer(output=output)
    if state.last_result("lookup_order") is None:
        return ToolCalls([ProposedCall("lookup_order", {"order_id": params["order_id"]})])
    return ToolCalls(
        [ProposedCall("issue_refund", {"order_id": params["order_id"], "amount": params["amount"]})]
    )


refund = Agent(
    id="refund",
    description="Looks up an order, then refunds it once a human approves.",
    tools=[lookup_order, issue_refund],
    model=ScriptedModel(refund_script),
    input_schema=INPUT_SCHEMA,
    # A refund nobody looks at within half an hour is declined, and the customer told why.
    review_timeout_seconds=30 * 60,
    on_review_timeout="decline",
    review_timeout_reason="No reviewer approved the refund within 30 minutes.",
)
