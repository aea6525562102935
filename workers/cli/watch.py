"""``trainyard logs``, ``events``, ``checkpoints`` and ``metrics``: what a job is doing, once or followed."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Annotated, Any

import typer
from rich.live import Live

from workers.cli import bundle as bundles
from workers.cli.base import (
    FINAL_STATES,
    FOLLOW_INTERVAL,
    JobId,
    JsonOption,
    LimitOption,
    OutputOption,
    app,
    console,
    wants_json,
)
from workers.cli.errors import CliError, Exit
from workers.cli.live import LiveUnavailable, follow_job
from workers.cli.output import err, out, print_json, table, when


@app.command()
def logs(
    job: JobId,
    rank: Annotated[int | None, typer.Option(help="Only this rank.", min=0)] = None,
    grep: Annotated[str | None, typer.Option(help="Only lines containing this text.")] = None,
    tail: Annotated[int, typer.Option(help="Start with the last N lines.", min=1, max=5000)] = 200,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C ends).")
    ] = False,
    json_flag: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    output: OutputOption = None,
) -> None:
    """A job's log lines; with -f, new ones as they come until the job ends (a live stream)."""
    session = console()
    as_json = wants_json(json_flag, output)

    def emit(line: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line) + "\n" if as_json else f"[{line['rank']}] {line['text']}\n")

    if not follow_:
        for line in session.get(f"jobs/{job}/logs/", rank=rank, q=grep, limit=tail)["lines"]:
            emit(line)
        sys.stdout.flush()
        return
    after: int | None = None
    while True:
        query = {"rank": rank, "q": grep, "after": after, "tail": tail if after is None else None}
        for event, data, _ in session.stream_events(f"jobs/{job}/logs/stream/", query):
            body = json.loads(data)
            if event == "line":
                emit(body)
                after = body["id"]
                sys.stdout.flush()
            elif event == "end":
                after = body.get("last_id", after)
                if body.get("reason") == "finished":
                    return
            elif event == "error":
                raise CliError(str(body.get("detail") or body), Exit.ERROR)
        # The stream ended without the job finishing (its timeout, a dropped connection): resume.
        time.sleep(FOLLOW_INTERVAL)


@app.command()
def events(
    job: JobId, limit: LimitOption = None, json_flag: JsonOption = False, output: OutputOption = None
) -> None:
    """A job's events, oldest first (every page, or --limit)."""
    items = console().all(f"jobs/{job}/events/", limit)
    if wants_json(json_flag, output):
        print_json(items)
        return
    rows = [
        [
            e.get("seq"),
            when(e.get("at")),
            e.get("severity"),
            e.get("kind"),
            e.get("round"),
            e.get("node"),
            e.get("message"),
        ]
        for e in items
    ]
    out.print(table(rows, ["SEQ", "AT", "SEVERITY", "KIND", "ROUND", "NODE", "MESSAGE"]))


@app.command()
def checkpoints(
    job: JobId, limit: LimitOption = None, json_flag: JsonOption = False, output: OutputOption = None
) -> None:
    """A job's checkpoints, newest step first (every page, or --limit)."""
    items = console().all(f"jobs/{job}/checkpoints/", limit)
    if wants_json(json_flag, output):
        print_json(items)
        return
    rows = [
        [
            c.get("round"),
            c.get("step"),
            bundles.human(c.get("size_bytes") or 0),
            c.get("blocking_ms"),
            when(c.get("created_at")),
            c.get("path"),
        ]
        for c in items
    ]
    out.print(table(rows, ["ROUND", "STEP", "SIZE", "BLOCKING MS", "AT", "PATH"]))


@app.command()
def metrics(
    job: JobId,
    name: Annotated[str | None, typer.Option(help="Comma-separated series names (default: all).")] = None,
    points: Annotated[int, typer.Option(help="Buckets per series.", min=1)] = 20,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep a live table until the job ends.")
    ] = False,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """A job's metric series, bucketed; with --follow, live until the job ends: the history's
    buckets, then each new point as the job's websocket brings it (a table of the latest values
    on a terminal, lines otherwise, JSON lines with --json; a live point is a bucket of one).
    Polls the API every second instead when the websocket cannot be opened."""
    session = console()
    as_json = wants_json(json_flag, output)

    def fetch() -> tuple[dict[str, list[dict[str, Any]]], str]:
        body = session.get(f"jobs/{job}/metrics/", name=name, points=points)
        return body["series"], session.get(f"jobs/{job}/")["state"]

    def bucket_row(series: str, bucket: dict[str, Any]) -> list[Any]:
        steps = f"{bucket.get('step')}-{bucket.get('last_step')}"
        return [series, steps, bucket.get("mean"), bucket.get("min"), bucket.get("max"), bucket.get("count")]

    header = ["SERIES", "STEPS", "MEAN", "MIN", "MAX", "N"]
    series, state = fetch()
    if not follow_:
        if as_json:
            print_json({"job": job, "state": state, "series": series})
        else:
            rows = [bucket_row(n, b) for n, buckets in sorted(series.items()) for b in buckets]
            out.print(table(rows, header, title=f"job {job} — {state}"))
        return
    names = set(name.split(",")) if name else None
    lines = as_json or not out.is_terminal
    shown: dict[str, int] = {}  # the last step printed (or tabled) per series
    latest: dict[str, list[Any]] = {}  # series -> [step, value, min, max] for the live table

    def take(n: str, bucket: dict[str, Any]) -> None:
        if bucket["last_step"] <= shown.get(n, -1):
            return
        shown[n] = bucket["last_step"]
        row = latest.get(n)
        low, high = bucket.get("min"), bucket.get("max")
        if row is not None:
            low = min((v for v in (low, row[2]) if v is not None), default=None)
            high = max((v for v in (high, row[3]) if v is not None), default=None)
        latest[n] = [bucket["last_step"], bucket.get("mean"), low, high]
        if as_json:
            sys.stdout.write(json.dumps({"series": n, **bucket}) + "\n")
        elif lines:
            sys.stdout.write("  ".join(str(c) for c in bucket_row(n, bucket)) + "\n")

    def take_all(fetched: dict[str, list[dict[str, Any]]]) -> None:
        for n, buckets in sorted(fetched.items()):
            for bucket in buckets:
                take(n, bucket)
        sys.stdout.flush()

    def view() -> Any:
        rows = [[n, *row] for n, row in sorted(latest.items())]
        title = f"job {job} — {state} — {time.strftime('%H:%M:%S')}"
        return table(rows, ["SERIES", "STEP", "VALUE", "MIN", "MAX"], title=title)

    with contextlib.ExitStack() as stack:
        live = None if lines else stack.enter_context(Live(view(), console=out, refresh_per_second=4))

        def refresh() -> None:
            if live is not None:
                live.update(view())

        take_all(series)
        refresh()
        if state in FINAL_STATES:
            return
        # Live frames over the job's websocket; polling the REST API when it cannot be had.
        try:
            assert session.token is not None
            for message in follow_job(session.url, session.token, job):
                kind = message.get("type") if message is not None else None
                if message is not None and kind == "metrics":
                    for n, live_points in sorted(message["series"].items()):
                        if names is None or n in names:
                            for step, value in live_points:
                                take(n, point_bucket(step, value))
                    sys.stdout.flush()
                elif message is not None and kind == "state":
                    state = message["job"]["state"]
                refresh()
                if state in FINAL_STATES:
                    return
        except LiveUnavailable as exc:
            err.print(f"Live updates unavailable ({exc}); polling every {FOLLOW_INTERVAL:g} s.")
        while state not in FINAL_STATES:
            time.sleep(FOLLOW_INTERVAL)
            series, state = fetch()
            take_all(series)
            refresh()


def point_bucket(step: int, value: float | None) -> dict[str, Any]:
    """A live point in the shape of a metrics bucket (of one point), so --json lines have one shape."""
    return {"step": step, "last_step": step, "mean": value, "min": value, "max": value, "count": 1}


# --- nodes ---------------------------------------------------------------------------------------
