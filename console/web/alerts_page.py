"""The Alerts page (``/alerts/``): the signed-in user's channels and rules, and the alerts that
fired for them with each delivery's state and attempts. Changes go through the API
(``/api/v1/alerts/...``), as the job page's buttons do."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.alerts.models import Alert, Channel, Rule

ALERTS_SHOWN = 100


@login_required
def alerts_page(request: HttpRequest) -> HttpResponse:
    user = request.user
    alerts = Alert.objects.select_related("rule").prefetch_related(
        "deliveries__channel", "deliveries__attempt_log"
    )
    if not user.is_staff:
        alerts = alerts.filter(rule__owner_id=user.pk)
    return render(
        request,
        "web/alerts.html",
        {
            "channels": Channel.objects.filter(owner_id=user.pk),
            "rules": Rule.objects.filter(owner_id=user.pk).prefetch_related("channels"),
            "alerts": alerts[:ALERTS_SHOWN],
            "nav": "alerts",
        },
    )
