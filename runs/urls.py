from __future__ import annotations

app_name = "runs"
urlpatterns: list = []
