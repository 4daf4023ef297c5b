"""python manage.py createapikey NAME [--resource RESOURCE_ID]: prints the raw key last."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import services
from runs.exceptions import RunsError


class Command(BaseCommand):
    help = "Create an API key (stored hashed). The raw key is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--resource", default=None, help="pin the key to this resource_id")

    def handle(self, *args: Any, name: str, resource: str | None, **options: Any) -> None:
        try:
            key, raw = services.api_key_create(name=name, resource_id=resource)
        except RunsError as exc:
            raise CommandError(exc.detail) from None
        pinned = f", pinned to resource {key.resource_id}" if key.resource_id else ""
        self.stderr.write(
            f"Created API key {key.name!r} ({key.prefix}…){pinned}. It is shown once:"
        )
        self.stdout.write(raw)
