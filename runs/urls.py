from __future__ import annotations

from django.urls import path

from runs import views
from runs.views import retry as retry_views

app_name = "runs"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("inbox/", views.inbox, name="inbox"),
    path("runs/", views.run_list, name="run_list"),
    path("runs/bulk-cancel/", views.runs_bulk_cancel, name="runs_bulk_cancel"),
    path("runs/bulk-retry/", retry_views.runs_bulk_retry, name="runs_bulk_retry"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/events/", views.run_events, name="run_events"),
    path("runs/<uuid:run_id>/state/", views.run_state, name="run_state"),
    path("runs/<uuid:run_id>/approve/", views.tool_call_approve, name="tool_call_approve"),
    path("runs/<uuid:run_id>/decline/", views.tool_call_decline, name="tool_call_decline"),
    path("runs/<uuid:run_id>/answer/", views.tool_call_answer, name="tool_call_answer"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<uuid:run_id>/retry/", retry_views.run_retry, name="run_retry"),
    path("threads/<uuid:thread_id>/", views.thread_detail, name="thread_detail"),
    path("threads/<uuid:thread_id>/values/", views.thread_values, name="thread_values"),
    path(
        "threads/<uuid:thread_id>/checkpoints/<uuid:checkpoint_id>/",
        views.thread_checkpoint_values,
        name="thread_checkpoint_values",
    ),
    path("audit/", views.audit_log, name="audit_log"),
    path("audit.csv", views.audit_csv, name="audit_csv"),
]
