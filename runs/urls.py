from __future__ import annotations

from django.urls import path

from runs import views
from runs.views import notifications, review_context, search
from runs.views import retry as retry_views
from runs.views import reviews as review_views

app_name = "runs"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("inbox/", views.inbox, name="inbox"),
    path("runs/", views.run_list, name="run_list"),
    path("runs/bulk-cancel/", views.runs_bulk_cancel, name="runs_bulk_cancel"),
    path("runs/export.csv", search.runs_export_csv, name="runs_export_csv"),
    path("runs/export.json", search.runs_export_json, name="runs_export_json"),
    path("runs/<uuid:run_id>/history.json", search.run_history_json, name="run_history_json"),
    path("views/", search.saved_views, name="saved_views"),
    path("views/menu/", search.saved_views_menu, name="saved_views_menu"),
    path("views/new/", search.saved_view_create, name="saved_view_create"),
    path("views/<int:view_id>/rename/", search.saved_view_rename, name="saved_view_rename"),
    path("views/<int:view_id>/delete/", search.saved_view_delete, name="saved_view_delete"),
    path("runs/bulk-retry/", retry_views.runs_bulk_retry, name="runs_bulk_retry"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/events/", views.run_events, name="run_events"),
    path("runs/<uuid:run_id>/events/<int:seq>/", views.run_event_data, name="run_event_data"),
    path("runs/<uuid:run_id>/deliveries/", notifications.run_deliveries, name="run_deliveries"),
    path("runs/<uuid:run_id>/state/", views.run_state, name="run_state"),
    path("runs/<uuid:run_id>/conversation/", review_context.run_chat, name="run_chat"),
    path("runs/<uuid:run_id>/approve/", views.tool_call_approve, name="tool_call_approve"),
    path("runs/<uuid:run_id>/decline/", views.tool_call_decline, name="tool_call_decline"),
    path("runs/<uuid:run_id>/answer/", views.tool_call_answer, name="tool_call_answer"),
    path("runs/<uuid:run_id>/claim/", review_views.tool_call_claim, name="tool_call_claim"),
    path("runs/<uuid:run_id>/release/", review_views.tool_call_release, name="tool_call_release"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<uuid:run_id>/retry/", retry_views.run_retry, name="run_retry"),
    path("threads/<uuid:thread_id>/", views.thread_detail, name="thread_detail"),
    path("threads/<uuid:thread_id>/values/", views.thread_values, name="thread_values"),
    path("threads/<uuid:thread_id>/conversation/", review_context.thread_chat, name="thread_chat"),
    path(
        "threads/<uuid:thread_id>/checkpoints/<uuid:checkpoint_id>/",
        views.thread_checkpoint_values,
        name="thread_checkpoint_values",
    ),
    path("audit/", views.audit_log, name="audit_log"),
    path("audit.csv", views.audit_csv, name="audit_csv"),
]
