"""The quotas page: each pool's size and each workspace's use, quota and borrowing there
(console/jobs/quotas.py's ``quota_rows``), and why each of the viewer's pending jobs waits."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.jobs.quotas import quota_rows


@login_required
def quotas_page(request: HttpRequest) -> HttpResponse:
    from console.web.nodes import pending_queue

    return render(
        request,
        "web/quotas.html",
        {"quotas": quota_rows(request.user), "queue": pending_queue(request.user), "nav": "quotas"},
    )
