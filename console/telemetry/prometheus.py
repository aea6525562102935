"""``/metrics``: Prometheus text exposition (format 0.0.4), written by hand.

Signed-in session or ``Authorization: Bearer <API token>``; anonymous callers get 401/403."""

from __future__ import annotations

import time
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.cluster.models import Gpu, Node
from console.core.states import JobState, NodeState
from console.jobs.models import Job
from console.telemetry.ingest.stats import STATS_KEY
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

# An ingest consumer that has not reported for this long no longer counts towards the rate.
STALE_CONSUMER_SECONDS = 30.0


class PrometheusRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if isinstance(data, str):
            return data.encode()
        # Errors (401/403) arrive as dicts from the exception handler.
        detail = data.get("detail", "") if isinstance(data, dict) else data
        return f"# {detail}\n".encode()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            rendered = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{rendered}}} {value}" if rendered else f"{name} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def ingest_figures(client: Any) -> dict[str, float]:
    """Pending entries, age of the oldest pending one, undelivered entries, totals and rate."""
    figures: dict[str, float] = {}
    try:
        summary = client.xpending(TELEMETRY_STREAM, TELEMETRY_GROUP)
        figures["pending"] = float(summary["pending"])
        oldest = summary.get("min")
        if oldest:
            millis = int(oldest.split(b"-")[0] if isinstance(oldest, bytes) else oldest.split("-")[0])
            figures["oldest_pending_age"] = max(0.0, time.time() - millis / 1000)
        else:
            figures["oldest_pending_age"] = 0.0
        for group in client.xinfo_groups(TELEMETRY_STREAM):
            name = group.get("name")
            if name in (TELEMETRY_GROUP, TELEMETRY_GROUP.encode()) and group.get("lag") is not None:
                figures["lag"] = float(group["lag"])
    except redis.ResponseError:
        figures.update(pending=0.0, oldest_pending_age=0.0)  # no stream or group yet: nothing waits
    stats = {k.decode(): v.decode() for k, v in client.hgetall(STATS_KEY).items()}
    figures["points_total"] = float(stats.get("points_total", 0))
    figures["records_total"] = float(stats.get("records_total", 0))
    now = time.time()
    figures["rate"] = sum(
        float(stats[key])
        for key in stats
        if key.startswith("rate:") and now - float(stats.get("seen:" + key[5:], 0)) < STALE_CONSUMER_SECONDS
    )
    return figures


def exposition() -> str:
    out = Exposition()
    jobs = dict(Job.objects.values_list("state").annotate(n=Count("pk")).order_by())
    out.metric(
        "trainyard_jobs",
        "gauge",
        "Jobs by state.",
        [({"state": s}, float(jobs.get(s, 0))) for s in JobState.values],
    )
    nodes = dict(Node.objects.values_list("state").annotate(n=Count("pk")).order_by())
    out.metric(
        "trainyard_nodes",
        "gauge",
        "Nodes by state.",
        [({"state": s}, float(nodes.get(s, 0))) for s in NodeState.values],
    )
    gpus = Gpu.objects.select_related("node").order_by("node__name", "index")
    out.metric(
        "trainyard_gpu_utilization_ratio",
        "gauge",
        "GPU utilisation (0-1) from the latest heartbeat.",
        [
            (
                {"node": g.node.name, "gpu": str(g.index)},
                g.utilization / 100 if g.utilization > 1 else g.utilization,
            )
            for g in gpus
        ],
    )
    out.metric(
        "trainyard_node_cpu_percent",
        "gauge",
        "Host CPU use from the latest heartbeat.",
        [({"node": n.name}, n.cpu_percent) for n in Node.objects.order_by("name")],
    )
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        figures = ingest_figures(client)
    except (redis.ConnectionError, redis.TimeoutError):
        figures = {}
    finally:
        client.close()
    out.metric(
        "trainyard_ingest_up",
        "gauge",
        "1 when the telemetry stream was readable.",
        [({}, 1.0 if figures else 0.0)],
    )
    if figures:
        out.metric(
            "trainyard_ingest_pending_entries",
            "gauge",
            "Stream entries read but not yet acked.",
            [({}, figures["pending"])],
        )
        out.metric(
            "trainyard_ingest_oldest_pending_seconds",
            "gauge",
            "Age of the oldest read-but-unacked stream entry.",
            [({}, round(figures["oldest_pending_age"], 3))],
        )
        if "lag" in figures:
            out.metric(
                "trainyard_ingest_lag_entries",
                "gauge",
                "Stream entries not yet read by ingest.",
                [({}, figures["lag"])],
            )
        out.metric(
            "trainyard_ingest_points_total",
            "counter",
            "Metric points ingested.",
            [({}, figures["points_total"])],
        )
        out.metric(
            "trainyard_ingest_records_total",
            "counter",
            "Telemetry records ingested.",
            [({}, figures["records_total"])],
        )
        out.metric(
            "trainyard_ingest_points_per_second",
            "gauge",
            "Ingest rate over the last second, summed over live consumers.",
            [({}, figures["rate"])],
        )
    return out.text()


class PrometheusView(APIView):
    renderer_classes = [PrometheusRenderer]

    def get(self, request: Request) -> Response:
        return Response(exposition(), content_type="text/plain; version=0.0.4; charset=utf-8")
