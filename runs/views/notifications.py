"""The run page's deliveries region, on its own (it refreshes itself while a delivery is due)."""

from __future__ import annotations

from uuid import UUID

from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from runs import selectors
from runs.exceptions import NotFound
from runs.views import HtmxHttpRequest, dashboard_view


@require_GET
@dashboard_view
def run_deliveries(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    try:
        run = selectors.visible_run(request.user, run_id)
    except NotFound:
        raise Http404("Run not found (it may have been rolled back)") from None
    return render(request, "runs/_fragments/deliveries.html", {"run": run})
