"""python manage.py retryruns (RUN_ID … | --status S [--agent A]) [--new-thread] [--dry-run] [--yes]"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import services
from runs.exceptions import RunsError
from runs.models import TERMINAL_STATUSES
from runs.selectors import retry as retry_reads


class Command(BaseCommand):
    help = (
        "Re-run ended runs with their own input as new runs (on the same thread, queued behind "
        "anything in flight, or --new-thread). Audited; the new runs link to the originals."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_ids", nargs="*", metavar="RUN_ID")
        parser.add_argument("--status", choices=[str(s) for s in TERMINAL_STATUSES])
        parser.add_argument("--agent", default=None, help="with --status: only this agent's runs")
        parser.add_argument("--new-thread", action="store_true")
        parser.add_argument("--reason", default="")
        parser.add_argument("--dry-run", action="store_true", help="count, retry nothing")
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def handle(self, *args: Any, **options: Any) -> None:
        raw_ids: list[str] = options["run_ids"]
        status: str | None = options["status"]
        if bool(raw_ids) == bool(status):
            raise CommandError("give RUN_IDs or --status (with optional --agent), not both")
        if options["agent"] and not status:
            raise CommandError("--agent needs --status")
        try:
            run_ids = [UUID(r) for r in raw_ids] if raw_ids else None
        except ValueError as exc:
            raise CommandError(f"not a run id: {exc}") from None
        queryset = (
            retry_reads.runs_for_retry(status=status, agent_id=options["agent"]) if status else None
        )
        preview = retry_reads.runs_retry_preview(run_ids=run_ids, queryset=queryset)
        total = preview["total"]
        self.stdout.write(
            f"{total} ended run(s) selected"
            + (f"; {preview['not_ended']} not ended (skipped)" if preview["not_ended"] else "")
        )
        if options["dry_run"] or total == 0:
            return
        if total > services.RETRY_MANY_LIMIT:
            raise CommandError(
                f"{total} runs is more than {services.RETRY_MANY_LIMIT}; narrow the selection"
            )
        if not options["yes"]:
            answer = input(f"Type {total} to retry {total} run(s): ")
            if answer.strip() != str(total):
                raise CommandError("not confirmed; nothing retried")
        try:
            result = services.runs_retry_many(
                actor="command:retryruns",
                run_ids=run_ids,
                queryset=queryset,
                new_thread=options["new_thread"],
                reason=options["reason"],
            )
        except RunsError as exc:
            raise CommandError(exc.detail) from None
        for old, new in result.retried:
            self.stdout.write(f"{old} retried as {new}")
        for old, why in result.skipped:
            self.stderr.write(f"{old} skipped: {why}")
        self.stdout.write(f"Retried {len(result.retried)}, skipped {len(result.skipped)}")
