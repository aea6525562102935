"""Where a job's metrics were mirrored (the SDK's ``tracker.*`` events, workers/sdk/trackers.py),
as the job page shows them: a link to an MLflow run on an http(s) tracking server, the host and
directory of TensorBoard event files with the command that opens them. The events come from the
job's own process, so nothing in them becomes a link unless it is a plain http(s) URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit

from console.jobs.models import Job
from console.telemetry.models import Event

MAX_TRACKERS = 20


def safe_url(url: Any) -> str | None:
    if not isinstance(url, str) or len(url) > 2000:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return url


def tracker_links(job: Job) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    events = Event.objects.filter(job=job, kind__in=["tracker.tensorboard", "tracker.mlflow"]).order_by("id")
    for event in events[:MAX_TRACKERS]:
        data = event.data or {}
        rank = data.get("rank")
        if event.kind == "tracker.tensorboard":
            logdir = str(data.get("logdir", ""))[:1024]
            key = ("tensorboard", logdir)
            if not logdir or key in seen:
                continue
            seen.add(key)
            found.append(
                {
                    "kind": "TensorBoard",
                    "rank": rank,
                    "text": f"{str(data.get('host', ''))[:255]}:{logdir}",
                    "command": f"tensorboard --logdir {logdir}",
                    "url": None,
                }
            )
        else:
            run, uri, experiment = (
                str(data.get(k, ""))[:512] for k in ("run_id", "tracking_uri", "experiment_id")
            )
            key = ("mlflow", run)
            if not run or key in seen:
                continue
            seen.add(key)
            base = safe_url(uri)
            url = f"{base.rstrip('/')}/#/experiments/{quote(experiment)}/runs/{quote(run)}" if base else None
            found.append(
                {"kind": "MLflow", "rank": rank, "text": f"run {run} at {uri}", "command": None, "url": url}
            )
    return found
