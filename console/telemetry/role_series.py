"""A parameter-server job's role series: one metric of one role (``ps``, ``worker`` or the
shard queue's ``coordinator``) as a series per process of a round, for the job page's role charts
(GET /api/v1/jobs/<id>/metrics/roles/series/?role=&name=).

Each process's telemetry is stored under its rank in the round (``Allocation.processes`` maps
local ranks to a role, an index and a global rank), and its steps are the process's own counter
(a PS's version, a worker's pushes, the queue's examples done): a series per process, never one
mean over processes whose counters mean different things.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.jobs.models import Job, Round
from console.teams import access
from console.telemetry.downsample import MAX_QUERY_POINTS, query_series

ROLES = ("ps", "worker", "coordinator")
# What each role's metric names start with (workers/ps/stats.py, workers/sdk/ps.py).
PREFIXES = {"ps": "ps_", "worker": "worker_", "coordinator": "queue_"}
DEFAULT_POINTS = 300
# Series per answer: a chart of more lines than this is unreadable anyway.
MAX_PROCESSES = 64


def processes(rnd: Round, role: str) -> dict[int, int]:
    """{index: global rank} of the round's processes of ``role`` (removed ones included: their
    points are history)."""
    found: dict[int, int] = {}
    for alloc in rnd.allocations.all():
        for process in alloc.processes or []:
            if process.get("role") == role:
                found[int(process["index"])] = int(process["rank"])
    return dict(sorted(found.items()))


def role_series(
    job: Job, rnd: Round, role: str, name: str, *, start: int | None, points: int
) -> dict[str, list[dict[str, Any]]]:
    """{index: buckets} of metric ``name`` for every process of ``role`` in ``rnd``."""
    chosen = list(processes(rnd, role).items())[:MAX_PROCESSES]
    return {
        str(index): [
            b.as_json()
            for b in query_series(job.pk, name, start=start, points=points, members=[(rnd.number, rank)])
        ]
        for index, rank in chosen
    }


class RoleSeriesQuery(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES)
    name = serializers.CharField(max_length=128)
    round = serializers.IntegerField(required=False, min_value=1)
    points = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_QUERY_POINTS, default=DEFAULT_POINTS
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = serializers.IntegerField(required=False, min_value=0)
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        prefix = PREFIXES[attrs["role"]]
        if not attrs["name"].startswith(prefix):
            raise serializers.ValidationError({"name": [f"a {attrs['role']} metric starts with {prefix!r}."]})
        return attrs


class RoleSeriesSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    round = serializers.IntegerField()
    role = serializers.CharField()
    name = serializers.CharField()
    series = serializers.DictField(
        child=serializers.ListField(child=serializers.DictField()),
        help_text="Buckets ({step, last_step, min, max, mean, count}) by process index",
    )


class RoleSeriesView(APIView):
    """One metric of a parameter-server role, a series per process of the round (default: the
    current one), each on the process's own counter: a PS's version, a worker's pushes, the
    queue's examples done. ``from`` bounds the steps from below (what a chart already holds)."""

    @extend_schema(parameters=[RoleSeriesQuery], responses={200: RoleSeriesSerializer})
    def get(self, request: Request, job_id: int) -> Response:
        job = access.visible(request.user, Job.objects.all()).filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"Job {job_id} does not exist.")
        if not job.is_parameter_server:
            raise ValidationError({"job": ["is not a parameter_server job: it has no roles."]})
        serializer = RoleSeriesQuery(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        params = serializer.validated_data
        number = params.get("round") or job.round_number
        rnd = job.rounds.filter(number=number).first() if number else None
        if rnd is None:
            if "round" in params:
                raise NotFound(f"Job {job.pk} has no round {params['round']}.")
            return Response(
                {"job": job.pk, "round": 0, "role": params["role"], "name": params["name"], "series": {}}
            )
        series = role_series(
            job, rnd, params["role"], params["name"], start=params.get("from"), points=params["points"]
        )
        return Response(
            {
                "job": job.pk,
                "round": rnd.number,
                "role": params["role"],
                "name": params["name"],
                "series": series,
            }
        )
