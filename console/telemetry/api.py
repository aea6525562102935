"""Telemetry queries under /api/v1/jobs/<id>/: metrics, per-rank timing, events, logs, checkpoints."""

from __future__ import annotations

import statistics
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.jobs import parameter_server
from console.jobs.models import Checkpoint, Job
from console.teams import access
from console.telemetry.anomalies import STEP_TIME_NAMES, STRAGGLER_FACTOR, THROUGHPUT_NAMES
from console.telemetry.downsample import (
    DEFAULT_QUERY_POINTS,
    MAX_QUERY_POINTS,
    finite_or_none,
    query_series,
    series_names,
)
from console.telemetry.events import event_payload
from console.telemetry.models import Event, LogLine

# Per-rank timing looks at this many of each rank's latest points.
RANK_WINDOW = 20
DEFAULT_LOG_LIMIT = 200
MAX_LOG_LIMIT = 5000
MAX_SERIES_PER_QUERY = 50


def get_job(user: Any, job_id: int) -> Job:
    """The job, if ``user`` may see its workspace; otherwise as if it did not exist (404)."""
    job = access.visible(user, Job.objects.all()).filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"Job {job_id} does not exist.")
    return job


def validated(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.query_params)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class MetricsQuery(serializers.Serializer):
    name = serializers.CharField(required=False, max_length=128 * MAX_SERIES_PER_QUERY)
    to = serializers.IntegerField(required=False, min_value=0)
    points = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_QUERY_POINTS, default=DEFAULT_QUERY_POINTS
    )
    rank = serializers.IntegerField(required=False, min_value=0)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # "from" is a Python keyword, so it cannot be declared as a class attribute.
        fields["from"] = serializers.IntegerField(required=False, min_value=0)
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start, end = attrs.get("from"), attrs.get("to")
        if start is not None and end is not None and start > end:
            raise serializers.ValidationError({"from": ["must not be after 'to'."]})
        return attrs


class BucketSerializer(serializers.Serializer):
    step = serializers.IntegerField(help_text="First step in the bucket")
    last_step = serializers.IntegerField()
    min = serializers.FloatField(allow_null=True, help_text="null when not finite")
    max = serializers.FloatField(allow_null=True)
    mean = serializers.FloatField(allow_null=True)
    count = serializers.IntegerField()
    time = serializers.FloatField(allow_null=True, help_text="Unix time of the bucket's first point")


class MetricsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    points = serializers.IntegerField(help_text="At most this many buckets per series")
    series = serializers.DictField(child=BucketSerializer(many=True), help_text="Buckets by series name")


JOB_ID = OpenApiParameter("job_id", int, OpenApiParameter.PATH, description="The job's id")


class MetricsView(APIView):
    """Series downsampled to at most ``points`` buckets each: {"series": {name: [bucket, ...]}}.

    Steps are the x axis: ``from``/``to`` bound steps; a bucket carries its first and last step and
    the min, max, mean and count of the values in it (raw and rolled-up points alike)."""

    @extend_schema(parameters=[JOB_ID, MetricsQuery], responses={200: MetricsSerializer})
    def get(self, request: Request, job_id: int) -> Response:
        job = get_job(request.user, job_id)
        params = validated(MetricsQuery, request)
        names = (
            [n for n in params["name"].split(",") if n][:MAX_SERIES_PER_QUERY]
            if params.get("name")
            else series_names(job.pk)[:MAX_SERIES_PER_QUERY]
        )
        series = {
            name: [
                b.as_json()
                for b in query_series(
                    job.pk,
                    name,
                    start=params.get("from"),
                    end=params.get("to"),
                    points=params["points"],
                    rank=params.get("rank"),
                )
            ]
            for name in names
        }
        return Response({"job": job.pk, "points": params["points"], "series": series})


class RanksQuery(serializers.Serializer):
    round = serializers.IntegerField(required=False, min_value=1)


class RankTimingSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    step_time = serializers.FloatField(allow_null=True, help_text="Median seconds per step")
    throughput = serializers.FloatField(allow_null=True, help_text="Median samples per second")
    last_step = serializers.IntegerField()
    straggler = serializers.BooleanField()


class RanksSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    round = serializers.IntegerField()
    ranks = RankTimingSerializer(many=True)


class RanksView(APIView):
    """Per-rank step time and throughput over each rank's latest points, with stragglers marked
    (step time above 1.5x the other ranks' median, as the ingest detector uses)."""

    @extend_schema(parameters=[JOB_ID, RanksQuery], responses={200: RanksSerializer})
    def get(self, request: Request, job_id: int) -> Response:
        job = get_job(request.user, job_id)
        params = validated(RanksQuery, request)
        round_number = params.get("round") or job.round_number
        sql = """
            SELECT rank, name, value, step FROM (
                SELECT rank, name, value, step,
                       row_number() OVER (PARTITION BY rank, name ORDER BY step DESC) AS rn
                FROM telemetry_metric
                WHERE job_id = %(job)s AND round_number = %(round)s
                    AND name IN (%(t1)s, %(t2)s, %(x1)s, %(x2)s)
            ) recent
            WHERE rn <= %(window)s
        """
        with connection.cursor() as cur:
            cur.execute(
                sql,
                {
                    "job": job.pk,
                    "round": round_number,
                    "t1": STEP_TIME_NAMES[0],
                    "t2": STEP_TIME_NAMES[1],
                    "x1": THROUGHPUT_NAMES[0],
                    "x2": THROUGHPUT_NAMES[1],
                    "window": RANK_WINDOW,
                },
            )
            grouped: dict[tuple[int, str], list[tuple[int, float]]] = {}
            for rank, name, value, step in cur.fetchall():
                kind = "step_time" if name in STEP_TIME_NAMES else "throughput"
                grouped.setdefault((rank, kind), []).append((step, value))
        ranks: dict[int, dict[str, Any]] = {}
        for (rank, name), points in grouped.items():
            values = [v for _, v in points]
            last_step = max(s for s, _ in points)
            entry = ranks.setdefault(
                rank, {"rank": rank, "step_time": None, "throughput": None, "last_step": 0}
            )
            finite = [v for v in values if v == v and abs(v) != float("inf")]
            entry[name] = statistics.median(finite) if finite else None
            entry["last_step"] = max(entry["last_step"], last_step)
        times = {r: e["step_time"] for r, e in ranks.items() if e["step_time"] is not None}
        for rank, entry in ranks.items():
            others = [t for r, t in times.items() if r != rank]
            median = statistics.median(others) if others else None
            entry["straggler"] = bool(
                median and entry["step_time"] is not None and entry["step_time"] > STRAGGLER_FACTOR * median
            )
            entry["step_time"] = finite_or_none(entry["step_time"])
            entry["throughput"] = finite_or_none(entry["throughput"])
        return Response({"job": job.pk, "round": round_number, "ranks": [ranks[r] for r in sorted(ranks)]})


class RoleStatsQuery(serializers.Serializer):
    round = serializers.IntegerField(required=False, min_value=1)


class RoleProcessSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="The process's index in its role")
    rank = serializers.IntegerField()
    node = serializers.CharField()
    running = serializers.BooleanField(help_text="Still running in the round (not ended or removed)")
    at = serializers.DateTimeField(allow_null=True, help_text="When it last reported; null: not yet")


def _nullable(names: dict[str, str], help_text: str) -> dict[str, serializers.Field]:
    return {field: serializers.FloatField(allow_null=True, help_text=help_text) for field in names}


PsStatsSerializer = type(
    "PsStatsSerializer",
    (RoleProcessSerializer,),
    _nullable(parameter_server.PS_METRICS, "Latest value; null until the PS reports it"),
)
WorkerStatsSerializer = type(
    "WorkerStatsSerializer",
    (RoleProcessSerializer,),
    _nullable(parameter_server.WORKER_METRICS, "Latest value; null until the worker reports it"),
)
QueueStatsSerializer = type(
    "QueueStatsSerializer",
    (RoleProcessSerializer,),
    _nullable(parameter_server.QUEUE_METRICS, "Latest value; null until the coordinator reports it"),
)


class RoleStatsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    round = serializers.IntegerField(allow_null=True)
    mode = serializers.CharField(allow_blank=True)
    ps = PsStatsSerializer(many=True)
    workers = WorkerStatsSerializer(many=True)
    queue = QueueStatsSerializer(allow_null=True, help_text="The coordinator's shard queue")


class RoleStatsView(APIView):
    """A parameter-server job's roles in a round (default: the current one): each PS's rows
    held, memory, pull/push rate and latency; each worker's throughput and staleness; the shard
    queue (done / in progress / to do) with the epoch. The latest value each process reported."""

    @extend_schema(parameters=[JOB_ID, RoleStatsQuery], responses={200: RoleStatsSerializer})
    def get(self, request: Request, job_id: int) -> Response:
        job = get_job(request.user, job_id)
        if not job.is_parameter_server:
            raise ValidationError({"job": ["is not a parameter_server job: it has no roles."]})
        params = validated(RoleStatsQuery, request)
        number = params.get("round") or job.round_number
        rnd = job.rounds.filter(number=number).first() if number else None
        if "round" in params and rnd is None:
            raise NotFound(f"Job {job.pk} has no round {params['round']}.")
        return Response(parameter_server.role_stats(job, rnd))


class EventsQuery(serializers.Serializer):
    after = serializers.IntegerField(required=False, min_value=0, default=0)


class EventSerializer(serializers.Serializer):
    """An event as console/telemetry/events.py publishes it (the websocket sends the same)."""

    seq = serializers.IntegerField()
    job = serializers.IntegerField(allow_null=True)
    node = serializers.CharField(allow_null=True)
    round = serializers.IntegerField(allow_null=True)
    kind = serializers.CharField()
    severity = serializers.ChoiceField(choices=["info", "warning", "error"])
    message = serializers.CharField(allow_blank=True)
    # A field named like Serializer.data: the event's own data.
    data = serializers.DictField()  # type: ignore[assignment]
    at = serializers.DateTimeField()

    def to_representation(self, instance: Event) -> dict[str, Any]:
        return event_payload(instance)


class EventsView(ListAPIView[Event]):
    """A job's events oldest first; ``after`` is the last seq the caller has (cursor-paginated)."""

    serializer_class = EventSerializer
    cursor_ordering = ("id",)

    @extend_schema(parameters=[JOB_ID, EventsQuery])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Event]:
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Event.objects.none()
        job = get_job(self.request.user, self.kwargs["job_id"])
        params = validated(EventsQuery, self.request)
        return Event.objects.filter(job=job, pk__gt=params["after"]).select_related("node")


class LogsQuery(serializers.Serializer):
    rank = serializers.IntegerField(required=False, min_value=0)
    q = serializers.CharField(required=False, max_length=200, trim_whitespace=False)
    after = serializers.IntegerField(required=False, min_value=0)
    before = serializers.IntegerField(required=False, min_value=1)
    round = serializers.IntegerField(required=False, min_value=1)
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_LOG_LIMIT, default=DEFAULT_LOG_LIMIT
    )
    stream = serializers.ChoiceField(required=False, choices=["stdout", "stderr"])


class LogLineSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="Increasing; give the last one as 'after' to follow")
    round = serializers.IntegerField()
    rank = serializers.IntegerField()
    stream = serializers.ChoiceField(choices=["stdout", "stderr"])
    seq = serializers.IntegerField()
    text = serializers.CharField(allow_blank=True)
    time = serializers.DateTimeField()


class LogsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    lines = LogLineSerializer(many=True)
    last_id = serializers.IntegerField(allow_null=True, help_text="The cursor for the next call's 'after'")


def log_line_json(line: LogLine) -> dict[str, Any]:
    return {
        "id": line.pk,
        "round": line.round_number,
        "rank": line.rank,
        "stream": line.stream,
        "seq": line.seq,
        "text": line.text,
        "time": line.time.isoformat(),
    }


def log_lines(job: Job, params: dict[str, Any]) -> QuerySet[LogLine]:
    """A job's lines with the ``rank``, ``stream``, ``round``, ``before`` and ``q`` filters of
    LogsQuery applied."""
    lines = LogLine.objects.filter(job=job)
    if "rank" in params:
        lines = lines.filter(rank=params["rank"])
    if "stream" in params:
        lines = lines.filter(stream=params["stream"])
    if "round" in params:
        lines = lines.filter(round_number=params["round"])
    if "before" in params:
        lines = lines.filter(pk__lt=params["before"])
    if params.get("q"):
        lines = lines.filter(text__icontains=params["q"])
    return lines


class LogsView(APIView):
    """Without ``after``: the newest ``limit`` lines (a tail), or with ``before`` the newest
    ``limit`` lines older than that id (paging back through history). With ``after``: the
    ``limit`` lines after that id (follow). ``q`` searches case-insensitively; ``rank``,
    ``round`` and ``stream`` filter."""

    @extend_schema(parameters=[JOB_ID, LogsQuery], responses={200: LogsSerializer})
    def get(self, request: Request, job_id: int) -> Response:
        job = get_job(request.user, job_id)
        params = validated(LogsQuery, request)
        lines = log_lines(job, params)
        limit = params["limit"]
        if "after" in params:
            rows = list(lines.filter(pk__gt=params["after"]).order_by("pk")[:limit])
        else:
            rows = list(lines.order_by("-pk")[:limit])[::-1]
        return Response(
            {
                "job": job.pk,
                "lines": [log_line_json(ln) for ln in rows],
                "last_id": rows[-1].pk if rows else params.get("after"),
            }
        )


class CheckpointSerializer(serializers.ModelSerializer):
    round = serializers.IntegerField(source="round_number")

    class Meta:
        model = Checkpoint
        fields = ["id", "round", "step", "path", "size_bytes", "blocking_ms", "created_at"]
        read_only_fields = fields


class CheckpointsView(ListAPIView[Checkpoint]):
    """A job's checkpoints, newest step first (cursor-paginated)."""

    serializer_class = CheckpointSerializer
    cursor_ordering = ("-step", "-id")

    @extend_schema(parameters=[JOB_ID])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Checkpoint]:
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Checkpoint.objects.none()
        return Checkpoint.objects.filter(job=get_job(self.request.user, self.kwargs["job_id"]))
