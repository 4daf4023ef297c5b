"""python manage.py pruneruns --older-than DAYS [--status S …] [--dry-run] [--audit-days DAYS]"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import services
from runs.exceptions import RunsError
from runs.models import TERMINAL_STATUSES


class Command(BaseCommand):
    help = (
        "Delete ended runs older than DAYS with their events, checkpoints and tool calls, and "
        "the threads they leave empty, in small batches. Pending, running and suspended runs "
        "(and their threads) are never touched; the audit log is kept unless --audit-days."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=float, required=True, metavar="DAYS")
        parser.add_argument(
            "--status",
            action="append",
            choices=[str(s) for s in TERMINAL_STATUSES],
            help="only runs that ended with this status (repeatable; default: every ended one)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--batch-size", type=int, default=services.retention.DEFAULT_BATCH_SIZE)
        parser.add_argument(
            "--audit-days",
            type=float,
            default=None,
            metavar="DAYS",
            help="also delete audit entries older than DAYS",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days: float = options["older_than"]
        if days < 0:
            raise CommandError("--older-than must not be negative")
        try:
            result = services.runs_prune(
                older_than=timedelta(days=days),
                statuses=options["status"],
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
                actor="command:pruneruns",
            )
            audit = None
            if options["audit_days"] is not None:
                audit = services.audit_prune(
                    older_than=timedelta(days=options["audit_days"]), dry_run=options["dry_run"]
                )
        except RunsError as exc:
            raise CommandError(exc.detail) from None
        if result.dry_run:
            self.stdout.write(
                f"Would delete {result.runs} run(s) ended more than {days:g} days ago"
            )
        else:
            self.stdout.write(
                f"Deleted {result.runs} run(s) and {result.threads} emptied thread(s) "
                f"in {result.batches} batch(es)"
                + ("" if result.complete else "; some rows were busy, run it again")
            )
        if audit is not None:
            verb = "Would delete" if audit.dry_run else "Deleted"
            self.stdout.write(f"{verb} {audit.runs} audit entr{'y' if audit.runs == 1 else 'ies'}")
