"""Operators learn what is wrong before they ask (issue 24): alerts at a local webhook receiver.

    .venv/bin/python bench/ops/run.py [--reps 5] [--events 24]

Per repetition: a controller (Celery worker and beat, its own database and Redis) with a rule on
``job.failed`` and a signed webhook channel to a receiver on 127.0.0.1. ``events`` events are
stored 0.25 s apart; after a third of them the controller is SIGKILLed (when nothing is in flight)
and started again after two thirds. Figures: the latency from an event's row to its webhook's
arrival, for events stored while a controller ran (``alert_latency_p95_s``, the median over reps
of each rep's p95; those stored while it was down are sent once the new controller is up, and are
not timed); events with no signed webhook (``alerts_lost``) and webhooks beyond one per
event (``alerts_duplicated``), summed over reps.

Not measured here (null in the JSON): ``goodput_error_pts``, ``goodput_faults_plain_pct`` and
``goodput_faults_sdk_pct`` need a job with a separately measured truth and 4-minute fault runs;
they are not written yet (the goodput of a scripted job is checked by tests/test_goodput_e2e.py).
``hang_detect_margin_s`` comes from ``bench.ops.hang.measure`` when that module exists.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402

KEYS = [
    "goodput_error_pts",
    "goodput_faults_plain_pct",
    "goodput_faults_sdk_pct",
    "alert_latency_p95_s",
    "alerts_lost",
    "alerts_duplicated",
    "hang_detect_margin_s",
]


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def alerts_rep(bench: harness.Bench, events: int) -> dict[str, float]:
    from django.contrib.auth.models import User

    from console.alerts.api import new_secret
    from console.alerts.models import Channel, Delivery, DeliveryState, Rule
    from console.jobs.models import Job
    from console.telemetry.models import Event
    from tests.support.receiver import webhook_receiver

    controller = bench.console.start_controller(
        TRAINYARD_ALERTS_ALLOW_PRIVATE_TARGETS="1", TRAINYARD_ALERTS_RETRY_BASE_SECONDS="0.5"
    )
    owner, _ = User.objects.get_or_create(username="bench-ops")
    job = Job.objects.create(name="watched", workload="mlp", owner=owner)
    with webhook_receiver() as receiver:
        channel = Channel.objects.create(
            owner=owner, name="hook", kind="webhook", url=receiver.url, secret=new_secret()
        )
        rule = Rule.objects.create(owner=owner, name="failures", kind="event", event_kinds=["job.failed"])
        rule.channels.add(channel)
        stored = [Event.objects.create(job=job, kind="job.failed", message="warm-up", severity="error")]
        wait_for(lambda: receiver.received, 180, "the controller's first alert")
        timed: set[int] = set()
        for i in range(1, events):
            if i == events // 3:
                wait_for(
                    lambda: (
                        Delivery.objects.filter(alert__rule=rule, state=DeliveryState.SENT).count()
                        == len(stored)
                    ),
                    60,
                    "the alerts so far",
                )
                controller.kill()
            if i == 2 * events // 3:
                controller.start()
                # The events stored while it was down are sent once it is up; the rest are timed.
                wait_for(
                    lambda: (
                        Delivery.objects.filter(alert__rule=rule, state=DeliveryState.SENT).count()
                        == len(stored)
                    ),
                    240,
                    "the alerts stored while the controller was down",
                )
            down = events // 3 <= i < 2 * events // 3
            event = Event.objects.create(job=job, kind="job.failed", message=f"failure {i}", severity="error")
            stored.append(event)
            if not down:
                timed.add(event.pk)
            time.sleep(0.25)
        with contextlib.suppress(TimeoutError):  # what never came is counted as lost below
            wait_for(
                lambda: (
                    Delivery.objects.filter(alert__rule=rule, state=DeliveryState.SENT).count() == len(stored)
                ),
                180,
                "every alert",
            )
        time.sleep(2)
        arrivals: dict[int, list[float]] = {}
        for got in receiver.received:
            body = got.verified(channel.secret)
            arrivals.setdefault(body["event"]["seq"], []).append(got.at)
    controller.kill()
    created = {e.pk: e.created_at.timestamp() for e in stored}
    latencies = [min(arrivals[pk]) - created[pk] for pk in timed if pk in arrivals]
    return {
        "latency_p95": p95(latencies) if latencies else float("nan"),
        "lost": float(sum(1 for pk in created if pk not in arrivals)),
        "duplicated": float(sum(len(v) - 1 for v in arrivals.values())),
        "events": float(len(stored)),
    }


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    reps = []
    with harness.Bench("ops", database="ty_ops_bench") as bench:
        for rep in range(args.reps):
            result = alerts_rep(bench, args.events)
            reps.append(result)
            print(
                f"rep {rep + 1}: {int(result['events'])} events, alert latency p95 {result['latency_p95']:.2f} s, "
                f"lost {int(result['lost'])}, duplicated {int(result['duplicated'])}",
                flush=True,
            )
    latencies = [r["latency_p95"] for r in reps if r["latency_p95"] == r["latency_p95"]]
    figures: dict[str, Any] = {
        "goodput_error_pts": None,
        "goodput_faults_plain_pct": None,
        "goodput_faults_sdk_pct": None,
        "alert_latency_p95_s": round(statistics.median(latencies), 3) if latencies else None,
        "alerts_lost": int(sum(r["lost"] for r in reps)),
        "alerts_duplicated": int(sum(r["duplicated"] for r in reps)),
        "hang_detect_margin_s": None,
    }
    print(f"{'figure':28} value   (range over {len(reps)} reps)")
    if latencies:
        print(
            f"{'alert_latency_p95_s':28} {figures['alert_latency_p95_s']:.3f}  ({min(latencies):.3f}-{max(latencies):.3f})"
        )
    print(f"{'alerts_lost':28} {figures['alerts_lost']}")
    print(f"{'alerts_duplicated':28} {figures['alerts_duplicated']}")
    try:
        from bench.ops import hang  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        print("bench.ops.hang is not there: hang_detect_margin_s not measured", flush=True)
    else:
        figures.update(hang.measure(args.reps))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--events", type=int, default=24)
    args = parser.parse_args()
    figures = harness.run(run_bench, args)
    harness.print_json(figures, KEYS)


if __name__ == "__main__":
    main()
