"""The one NinjaAPI: routers per area live in runs/api/, errors are mapped here once."""

from __future__ import annotations

from ninja import NinjaAPI

from runs.api import build_api

api: NinjaAPI = build_api()
