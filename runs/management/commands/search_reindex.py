"""Rebuild every run's search document (after migration 0007, or a change of what it holds)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from runs import services
from runs.models import Run


class Command(BaseCommand):
    help = "Rebuild the search documents of all runs, in batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=1000, help="runs per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size = max(1, int(options["batch"]))
        ids = Run.objects.order_by("id").values_list("id", flat=True)
        written = 0
        batch: list[Any] = []
        for run_id in ids.iterator(chunk_size=batch_size):
            batch.append(run_id)
            if len(batch) >= batch_size:
                with transaction.atomic():
                    written += services.search_refresh(run_ids=batch)
                batch = []
        with transaction.atomic():
            written += services.search_refresh(run_ids=batch)
        self.stdout.write(f"rebuilt {written} search documents")
