from __future__ import annotations

from runs.agents.refund import INPUT_SCHEMA as REFUND_SCHEMA
from runs.agents.refund import issue_refund
from runs.engine import (
    Agent,
    FinalAnswer,
    ModelInput,
    ProposedCall,
    ScriptedModel,
    ToolCalls,
    delegate,
)

INPUT_SCHEMA = {
    **REFUND_SCHEMA,
    "properties": {**REFUND_SCHEMA["properties"], "message": {"type": "string"}},
}


def _billing_script(state: ModelInput) -> ToolCalls | FinalAnswer:
    result = state.last_result("issue_refund")
    if result is None:
        params = state.input or {}
        return ToolCalls(
            [
                ProposedCall(
                    "issue_refund", {"order_id": params["order_id"], "amount": params["amount"]}
                )
            ]
        )
    if result.declined:
        return FinalAnswer(output={"refunded": False, "reason": result.result["reason"]})
    return FinalAnswer(
        output={
            "refunded": True,
            "order_id": result.result["order_id"],
            "amount": result.result["amount"],
        }
    )


billing = Agent(
    id="billing",
    description="Billing sub-agent: issues refunds (each needs approval).",
    tools=[issue_refund],
    model=ScriptedModel(_billing_script),
    input_schema=INPUT_SCHEMA,
)


def _support_script(state: ModelInput) -> ToolCalls | FinalAnswer:
    result = state.last_result("ask_billing")
    if result is None:
        return ToolCalls([ProposedCall("ask_billing", dict(state.input or {}))])
    if result.declined:
        return FinalAnswer(
            output={
                "answer": "Billing was not consulted.",
                "billing": None,
                "reason": result.result["reason"],
            }
        )
    billing_result = result.result
    answer = (
        f"Refunded {billing_result['amount']} on order {billing_result['order_id']}."
        if billing_result.get("refunded")
        else f"No refund: {billing_result.get('reason')}"
    )
    return FinalAnswer(output={"answer": answer, "billing": billing_result})


support = Agent(
    id="support",
    description="Support supervisor: hands billing questions to the billing sub-agent.",
    tools=[
        delegate(
            "billing",
            name="ask_billing",
            description="Ask the billing agent",
            parameters=INPUT_SCHEMA,
        )
    ],
    model=ScriptedModel(_support_script),
    input_schema=INPUT_SCHEMA,
)
