from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A graph of RUNS_GRAPHS that fails to import stops start-up, naming the graph.
        from runs.graphs.loader import configured_graphs

        configured_graphs()
