from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from runsite import health
from runsite.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("healthz", health.liveness, name="healthz"),
    path("readyz", health.readiness, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("runs.urls")),
]
