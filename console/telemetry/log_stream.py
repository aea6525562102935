"""``/api/v1/jobs/<id>/logs/stream/``: a job's log lines as Server-Sent Events, as they arrive.

The polling endpoint (``logs/?after=``) stays for simple clients; this one holds the response open
and sends each new line as an event whose ``id`` is the line's id, so a client that reconnects
with ``Last-Event-ID`` (browsers' EventSource do) resumes without gaps or repeats. It reads the
database (where ingest commits lines) every POLL_SECONDS rather than the live channel layer: a
stream then sees exactly what the polling endpoint sees, in order, including lines committed
while it was reconnecting. It ends with an ``end`` event once the job is finished and its last
lines are sent, or after ``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from console.core.states import JobState
from console.jobs.models import Job
from console.telemetry.api import JOB_ID, get_job, log_line_json, log_lines, validated

POLL_SECONDS = 0.5
BATCH = 500
KEEPALIVE_SECONDS = 15.0
# Lines still in flight when a job finishes (agent shipping, ingest batching) arrive within this.
FINISH_GRACE_SECONDS = 3.0
MAX_TIMEOUT_SECONDS = 24 * 3600


class JsonErrors(BaseContentNegotiation):
    """The stream itself is a StreamingHttpResponse; everything DRF renders here is an error,
    and errors are JSON whatever the Accept header (EventSource sends text/event-stream)."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class LogStreamQuery(serializers.Serializer):
    rank = serializers.IntegerField(required=False, min_value=0)
    stream = serializers.ChoiceField(required=False, choices=["stdout", "stderr"])
    q = serializers.CharField(required=False, max_length=200, trim_whitespace=False)
    after = serializers.IntegerField(
        required=False, min_value=0, help_text="Send lines after this id (default: the Last-Event-ID header)"
    )
    tail = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=5000,
        default=0,
        help_text="Without 'after': first send this many past lines",
    )
    timeout = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_TIMEOUT_SECONDS,
        default=3600,
        help_text="End after this many seconds",
    )


# One event of the stream, as OpenAPI describes text/event-stream items.
SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["line", "end", "error"]},
        "id": {"type": "string", "description": "The line's id (line events)"},
        "data": {"type": "string", "description": "JSON: a log line, or {reason, last_id} for end"},
    },
    "required": ["event", "data"],
}


def _sse(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


class LogStreamView(APIView):
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JsonErrors

    @extend_schema(
        parameters=[
            JOB_ID,
            LogStreamQuery,
            OpenApiParameter("Last-Event-ID", int, OpenApiParameter.HEADER, required=False),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                SSE_EVENT,
                description="Events 'line' (data: a log line as in logs/, id: its id), 'end' when the job "
                "finished or the timeout passed; ': keep-alive' comments every 15 s.",
            )
        },
    )
    def get(self, request: Request, job_id: int) -> StreamingHttpResponse:
        job = get_job(request.user, job_id)
        params = validated(LogStreamQuery, request)
        after = params.get("after")
        if after is None:
            after = _last_event_id(request)
        if after is None:
            after = _tail_start(job, params)
        response = StreamingHttpResponse(
            follow(job.pk, params, after, float(params["timeout"])), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a reverse proxy must not buffer the stream
        return response


def _last_event_id(request: Request) -> int | None:
    raw = request.headers.get("Last-Event-ID", "").strip()
    return int(raw) if raw.isdigit() else None


def _tail_start(job: Job, params: dict[str, Any]) -> int:
    """The id before the last ``tail`` lines (or the newest id: only new lines)."""
    ids = list(log_lines(job, params).order_by("-pk").values_list("pk", flat=True)[: params["tail"] + 1])
    if params["tail"] == 0:
        return ids[0] if ids else 0
    return ids[params["tail"]] if len(ids) > params["tail"] else 0


def _fetch(job_id: int, params: dict[str, Any], after: int) -> tuple[list[dict[str, Any]], bool]:
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return [], True
    rows = list(log_lines(job, params).filter(pk__gt=after).order_by("pk")[:BATCH])
    return [log_line_json(r) for r in rows], JobState(job.state).is_terminal


async def follow(job_id: int, params: dict[str, Any], after: int, timeout: float) -> AsyncIterator[str]:
    fetch = sync_to_async(_fetch)
    deadline = time.monotonic() + timeout
    last_sent = time.monotonic()
    finished_at: float | None = None
    yield f": stream of job {job_id}'s log lines\n\n"
    while True:
        lines, finished = await fetch(job_id, params, after)
        for line in lines:
            yield _sse("line", line, line["id"])
            after = line["id"]
        now = time.monotonic()
        if lines:
            last_sent = now
            if len(lines) == BATCH:
                continue  # a backlog: send it without waiting
        if finished:
            finished_at = finished_at or now
            if now - finished_at >= FINISH_GRACE_SECONDS and not lines:
                yield _sse("end", {"reason": "finished", "last_id": after})
                return
        if now >= deadline:
            yield _sse("end", {"reason": "timeout", "last_id": after})
            return
        if now - last_sent >= KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            last_sent = now
        await asyncio.sleep(POLL_SECONDS)
