"""Built-in example agents, registered by default (RUNS_AGENTS = runs.agents.BUILTIN_AGENTS)."""

from runs.agents.echo import echo
from runs.agents.flaky import flaky
from runs.agents.refund import refund
from runs.agents.slow import slow
from runs.agents.support import billing, support
from runs.agents.weather import weather

BUILTIN_AGENTS = [echo, slow, refund, weather, support, billing, flaky]
