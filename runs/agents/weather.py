from __future__ import annotations

import hashlib
from typing import Any

from runs.engine import Agent, FinalAnswer, ModelInput, ProposedCall, ScriptedModel, ToolCalls, tool

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
}
CONDITIONS = ["sunny", "cloudy", "rain", "snow", "windy", "fog"]


def forecast_for(city: str) -> str:
    """Deterministic: the same city always gets the same forecast."""
    digest = int(hashlib.sha256(city.strip().lower().encode()).hexdigest(), 16)
    return f"{CONDITIONS[digest % len(CONDITIONS)]}, {digest % 35 - 5}°C"


@tool(description="Ask the user which city they mean.", parameters={"type": "object"})
def ask_city(ctx: Any) -> dict[str, str]:
    if ctx.resume_data is None:
        ctx.suspend({"message": "Which city?"}, resume_schema=CITY_SCHEMA)
    return {"city": ctx.resume_data["city"]}


@tool(
    description="Forecast for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
def get_forecast(ctx: Any, city: str) -> dict[str, str]:
    return {"city": city, "forecast": forecast_for(city)}


def _script(state: ModelInput) -> ToolCalls | FinalAnswer:
    forecast = state.last_result("get_forecast")
    if forecast is not None:
        return FinalAnswer(
            output={"city": forecast.result["city"], "forecast": forecast.result["forecast"]}
        )
    city = (state.input or {}).get("city")
    asked = state.last_result("ask_city")
    if asked is not None:
        if asked.declined:
            return FinalAnswer(
                output={"city": None, "forecast": None, "reason": asked.result["reason"]}
            )
        city = asked.result["city"]
    if city:
        return ToolCalls([ProposedCall("get_forecast", {"city": city})])
    return ToolCalls([ProposedCall("ask_city", {})])


weather = Agent(
    id="weather",
    description="Gives a forecast; asks which city when it is not given.",
    tools=[ask_city, get_forecast],
    model=ScriptedModel(_script),
    input_schema={
        "type": ["object", "null"],
        "properties": {"city": {"type": "string", "minLength": 1}},
    },
)
