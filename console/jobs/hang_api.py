"""GET /api/v1/jobs/{id}/hangs/: a job's hangs, newest first, each with every rank's stacks and the
ranks grouped by identical stack (console/jobs/hangs.py ``hang_dict``)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.jobs.hang_models import Hang
from console.jobs.hangs import hang_dict
from console.jobs.tenancy import visible_job

# The newest hangs shown; a job that hangs again and again is restarted or failed long before.
MAX_HANGS = 20


class HangsView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("job_id", int, OpenApiParameter.PATH)],
        responses={
            200: inline_serializer(
                "HangList",
                {
                    "results": serializers.ListField(
                        child=serializers.DictField(), help_text="hangs, newest first"
                    )
                },
            )
        },
    )
    def get(self, request: Request, job_id: int) -> Response:
        visible_job(request.user, job_id)  # 404 for a job of another workspace, as for none
        hangs = (
            Hang.objects.filter(job_id=job_id).prefetch_related("stacks").order_by("-detected_at")[:MAX_HANGS]
        )
        return Response({"results": [hang_dict(hang) for hang in hangs]})
