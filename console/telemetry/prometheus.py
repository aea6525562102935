"""``/metrics``: the console's state for Prometheus, exposed through prometheus-client.

A custom collector reads the database and the telemetry stream at scrape time (no state is kept
between scrapes), and prometheus-client writes the exposition: the text format or OpenMetrics,
whichever the scraper's Accept header prefers. The metric names and labels are listed in the
README ("Prometheus metrics"). Signed-in session or ``Authorization: Bearer <API token>`` with the
``read`` scope; anonymous callers get 401/403.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from console.cluster.models import Gpu, Node
from console.core.states import JobState, NodeState
from console.jobs.models import Job
from console.telemetry import goodput, goodput_data
from console.telemetry.ingest.stats import REFUSED_PREFIX, STATS_KEY
from console.telemetry.ingest.trust import Refusal
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

# An ingest consumer that has not reported for this long no longer counts as live.
STALE_CONSUMER_SECONDS = 30.0


def ingest_figures(client: Any) -> dict[str, float]:
    """Pending entries, age of the oldest pending one, undelivered entries and totals (with the
    entries refused, by reason)."""
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
    for reason in Refusal:
        figures[REFUSED_PREFIX + reason] = float(stats.get(REFUSED_PREFIX + reason, 0))
    now = time.time()
    figures["consumers"] = float(
        sum(
            1
            for key in stats
            if key.startswith("seen:") and now - float(stats[key] or 0) < STALE_CONSUMER_SECONDS
        )
    )
    return figures


class ConsoleCollector:
    """Collects at scrape time: jobs and nodes by state, host and GPU gauges, ingest health."""

    def collect(self) -> Iterator[Metric]:
        yield from self.jobs_and_nodes()
        yield from self.hosts()
        yield from self.ingest()
        yield from self.goodput()

    def jobs_and_nodes(self) -> Iterator[Metric]:
        jobs = dict(Job.objects.values_list("state").annotate(n=Count("pk")).order_by())
        family = GaugeMetricFamily("trainyard_jobs", "Jobs by state.", labels=["state"])
        for state in JobState.values:
            family.add_metric([state], float(jobs.get(state, 0)))
        yield family
        nodes = dict(Node.objects.values_list("state").annotate(n=Count("pk")).order_by())
        family = GaugeMetricFamily("trainyard_nodes", "Nodes by state.", labels=["state"])
        for state in NodeState.values:
            family.add_metric([state], float(nodes.get(state, 0)))
        yield family

    def goodput(self) -> Iterator[Metric]:
        """Each job not yet ended: goodput and seconds per bucket; the cluster's per window."""
        ratio = GaugeMetricFamily(
            "trainyard_job_goodput_ratio", "Productive step time over wall time.", labels=["job"]
        )
        seconds = GaugeMetricFamily(
            "trainyard_job_goodput_seconds", "Wall time by goodput bucket.", labels=["job", "bucket"]
        )
        active = Job.objects.exclude(state__in=[s.value for s in JobState if s.is_terminal])
        for job_id, timeline in goodput_data.timelines(active).items():
            result = goodput.compute(timeline)
            if result.ratio is not None:
                ratio.add_metric([str(job_id)], result.ratio)
            for bucket, value in result.totals().items():
                seconds.add_metric([str(job_id), bucket], value)
        yield ratio
        yield seconds
        cluster = GaugeMetricFamily(
            "trainyard_cluster_goodput_ratio", "Every job's goodput over a window.", labels=["window"]
        )
        for name, window in goodput_data.WINDOWS.items():
            figure = goodput_data.cluster_goodput(window)["goodput"]
            if isinstance(figure, float):
                cluster.add_metric([name], figure)
        yield cluster

    def hosts(self) -> Iterator[Metric]:
        cpu = GaugeMetricFamily(
            "trainyard_node_cpu_utilization_ratio", "Host CPU use (0-1), latest heartbeat.", labels=["node"]
        )
        memory = GaugeMetricFamily(
            "trainyard_node_memory_utilization_ratio",
            "Host memory use (0-1), latest heartbeat.",
            labels=["node"],
        )
        memory_total = GaugeMetricFamily("trainyard_node_memory_bytes", "Host memory.", labels=["node"])
        heartbeat = GaugeMetricFamily(
            "trainyard_node_last_heartbeat_timestamp_seconds",
            "Unix time of the node's latest heartbeat.",
            labels=["node"],
        )
        for node in Node.objects.order_by("name"):
            cpu.add_metric([node.name], node.cpu_percent / 100)
            memory.add_metric([node.name], node.memory_percent / 100)
            memory_total.add_metric([node.name], float(node.memory_bytes))
            if node.last_heartbeat is not None:
                heartbeat.add_metric([node.name], node.last_heartbeat.timestamp())
        yield from (cpu, memory, memory_total, heartbeat)
        utilization = GaugeMetricFamily(
            "trainyard_gpu_utilization_ratio",
            "GPU utilisation (0-1), latest heartbeat.",
            labels=["node", "gpu"],
        )
        used = GaugeMetricFamily(
            "trainyard_gpu_memory_used_bytes", "GPU memory in use, latest heartbeat.", labels=["node", "gpu"]
        )
        total = GaugeMetricFamily("trainyard_gpu_memory_bytes", "GPU memory.", labels=["node", "gpu"])
        for gpu in Gpu.objects.select_related("node").order_by("node__name", "index"):
            labels = [gpu.node.name, str(gpu.index)]
            # Agents report NVML's percent; older ones sent a ratio.
            utilization.add_metric(labels, gpu.utilization / 100 if gpu.utilization > 1 else gpu.utilization)
            used.add_metric(labels, float(gpu.memory_used_bytes))
            total.add_metric(labels, float(gpu.memory_bytes))
        yield from (utilization, used, total)

    def ingest(self) -> Iterator[Metric]:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        try:
            figures = ingest_figures(client)
        except (redis.ConnectionError, redis.TimeoutError):
            figures = {}
        finally:
            client.close()
        yield GaugeMetricFamily(
            "trainyard_ingest_up", "1 when the telemetry stream was readable.", value=1.0 if figures else 0.0
        )
        if not figures:
            return
        yield GaugeMetricFamily(
            "trainyard_ingest_pending_entries",
            "Stream entries read but not yet acked.",
            value=figures["pending"],
        )
        yield GaugeMetricFamily(
            "trainyard_ingest_oldest_pending_age_seconds",
            "Age of the oldest read-but-unacked stream entry.",
            value=round(figures["oldest_pending_age"], 3),
        )
        if "lag" in figures:
            yield GaugeMetricFamily(
                "trainyard_ingest_lag_entries", "Stream entries not yet read by ingest.", value=figures["lag"]
            )
        yield GaugeMetricFamily(
            "trainyard_ingest_consumers",
            "Ingest consumers that reported in the last 30 s.",
            value=figures["consumers"],
        )
        yield CounterMetricFamily(
            "trainyard_ingest_points", "Metric points ingested.", value=figures["points_total"]
        )
        yield CounterMetricFamily(
            "trainyard_ingest_records", "Telemetry records ingested.", value=figures["records_total"]
        )
        refused = CounterMetricFamily(
            "trainyard_ingest_refused_entries",
            "Telemetry stream entries dropped unstored: unsealed, an unknown or revoked node, a bad MAC, "
            "or a rank not allocated to the node.",
            labels=["reason"],
        )
        for reason in Refusal:
            refused.add_metric([reason.value], figures[REFUSED_PREFIX + reason])
        yield refused


def registry() -> CollectorRegistry:
    """A registry of its own (not the process-global one), holding only the console's collector."""
    own = CollectorRegistry(auto_describe=False)
    own.register(ConsoleCollector())  # type: ignore[arg-type]
    return own


class PassThroughRenderer(BaseRenderer):
    """Errors (401/403/429) as a comment line; the exposition itself is an HttpResponse."""

    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        detail = data.get("detail", "") if isinstance(data, dict) else data
        return f"# {detail}\n".encode()


class AnyAccept(BaseContentNegotiation):
    """Scrapers ask for OpenMetrics or text; prometheus-client picks, so DRF must not refuse."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


@extend_schema(exclude=True)  # not part of the JSON API; the README lists the metrics
class PrometheusView(APIView):
    renderer_classes = [PassThroughRenderer]
    content_negotiation_class = AnyAccept

    def get(self, request: Request) -> HttpResponse:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return HttpResponse(encoder(registry()), content_type=content_type)
