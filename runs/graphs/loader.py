"""Loading `RUNS_GRAPHS`: a langgraph.json-style mapping graph id → "path.py:attr".

The target may be a compiled graph, a StateGraph (compiled here) or a function returning
either. Each file is imported once under a name registered in `sys.modules`, so graphs written
with `from __future__ import annotations` resolve their state annotations.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeGuard

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runs.engine.agent import Agent
from runs.engine.model import FinalAnswer, ModelInput

_modules_lock = threading.Lock()


class _GraphModel:
    """A graph decides for itself; the Agent protocol still wants a model."""

    def decide(self, state: ModelInput, tools: Any) -> FinalAnswer:
        raise RuntimeError("a LangGraph graph is executed by runs.graphs.executor")


@dataclass(eq=False)
class GraphAgent(Agent):
    """A registered LangGraph graph seen as a Runsite agent (same id = graph id = assistant)."""

    graph: Any = None  # the compiled graph (Pregel), without a checkpointer
    spec: str = ""
    value_keys: list[str] = field(default_factory=list)


def is_graph_agent(agent: Any) -> TypeGuard[GraphAgent]:
    return isinstance(agent, GraphAgent)


def _module_from_file(path: Path) -> ModuleType:
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    name = f"runsite_graphs.{resolved.stem}_{digest}"
    with _modules_lock:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {resolved}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module


def _target(spec: str, base_dir: Path) -> Any:
    if ":" not in spec:
        raise ImportError(f"{spec!r} is not of the form 'path/to/file.py:attribute'")
    location, attr = spec.rsplit(":", 1)
    if location.endswith(".py") or "/" in location:
        path = Path(location)
        if not path.is_absolute():
            path = base_dir / path
        if not path.exists():
            raise ImportError(f"file {path} does not exist")
        module = _module_from_file(path)
    else:
        module = importlib.import_module(location)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"{location} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _compiled(obj: Any) -> Any:
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    if isinstance(obj, Pregel):
        return obj
    if isinstance(obj, StateGraph):
        return obj.compile()
    if callable(obj):
        params = inspect.signature(obj).parameters
        made = obj({}) if params else obj()
        if inspect.isawaitable(made):
            raise TypeError("async graph factories are not supported; return a graph")
        if isinstance(made, Pregel | StateGraph):
            return _compiled(made)
        raise TypeError(f"the factory returned {type(made)!r}, not a graph")
    raise TypeError(f"expected a compiled graph, a StateGraph or a factory, got {type(obj)!r}")


REVIEW_KEYS = ("review_timeout_seconds", "on_review_timeout", "review_timeout_reason")


def graph_agent(
    graph_id: str, graph: Any, *, description: str = "", spec: str = "", **review: Any
) -> GraphAgent:
    """Wrap a graph as an agent (tests and plugins use this with registry.register)."""
    graph = _compiled(graph)
    if getattr(graph, "checkpointer", None) not in (None, True, False):
        # Persistence is Runsite's: a run gets a copy bound to the Runsite checkpointer.
        graph = graph.copy(update={"checkpointer": None})
    keys = graph.stream_channels_asis
    value_keys = [keys] if isinstance(keys, str) else list(keys)
    return GraphAgent(
        id=graph_id,
        model=_GraphModel(),
        description=description,
        graph=graph,
        spec=spec,
        value_keys=value_keys,
        **review,  # review deadline of the graph's interrupts (docs/reviews.md)
    )


def load_graphs(config: dict[str, Any] | None = None) -> dict[str, GraphAgent]:
    """Import every graph of RUNS_GRAPHS. A graph that fails stops start-up, naming it."""
    config = settings.RUNS_GRAPHS if config is None else config
    if not config:
        return {}
    base_dir = Path(config.get("base_dir") or settings.BASE_DIR)
    for dep in config.get("dependencies") or []:
        # langgraph.json's local dependencies ("." = the folder of the file) are importable.
        if isinstance(dep, str) and dep.startswith("."):
            folder = str((base_dir / dep).resolve())
            if folder not in sys.path:
                sys.path.insert(0, folder)
    agents: dict[str, GraphAgent] = {}
    for graph_id, entry in (config.get("graphs") or {}).items():
        spec, description, review = entry, "", {}
        if isinstance(entry, dict):
            spec, description = entry.get("path", ""), entry.get("description", "")
            review = {k: entry[k] for k in REVIEW_KEYS if entry.get(k) is not None}
        try:
            graph = _target(str(spec), base_dir)
            agents[graph_id] = graph_agent(
                graph_id, graph, description=description, spec=spec, **review
            )
        except Exception as exc:
            raise ImproperlyConfigured(
                f"RUNS_GRAPHS: graph {graph_id!r} ({spec}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return agents


@cache
def configured_graphs() -> dict[str, GraphAgent]:
    return load_graphs()
