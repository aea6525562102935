"""What a chaos run measures, from the training script's own step logs and the console's tables.

- ``check_sequence``: rank 0's step sequence. Each process starts with a ``start`` line naming
  the step it resumed from; after it, steps must follow one by one. A resume ahead of the
  highest step logged skips ahead; more than a checkpoint interval behind it goes back too far
  (exactly one interval is what a crash between logging a step and renaming its snapshot
  costs). Ranks that resumed from different steps, a step line from a process other than the
  newest one (an old round still training) or a step out of order within a process break the
  sequence too.
- ``compare_points``: the script's own log against the database, per (round, rank, step): a step
  the script logged with no stored point is lost, a step stored more than once is duplicated
  (ingest de-duplicates by sequence number; a second row for the same step means the same point
  came in under another one).
- ``orphans``: processes of the run that nothing owns any more.
- ``ApiPoller``: a client polling the REST API during a fault, counting its 5xx answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from bench.chaos.infra import marked_processes

StepKey = tuple[int, int, int]  # (round, rank, step)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


# --- the step sequence -------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    t: float
    text: str


@dataclass(frozen=True)
class Resume:
    t: float
    round: int
    pid: int
    resume_step: int
    highest: int  # the highest step logged before this process started

    @property
    def redone(self) -> int:
        """Steps logged before that this process trains again: what the crash cost."""
        return max(0, self.highest - self.resume_step)


@dataclass
class Sequence:
    problems: list[Problem] = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    highest: int = 0
    steps: int = 0

    def problems_between(self, start: float, end: float) -> list[Problem]:
        return [p for p in self.problems if start <= p.t < end]

    def resumes_between(self, start: float, end: float) -> list[Resume]:
        return [r for r in self.resumes if start <= r.t < end]


def check_sequence(records: Iterable[dict[str, Any]], every: int) -> Sequence:
    """Rank 0's log, in the order it was written, against the rules in the module docstring."""
    seq = Sequence()
    current_pid: int | None = None
    expect: int | None = None
    for record in records:
        t = float(record.get("t", 0.0))
        pid = int(record.get("pid", 0))
        event = record.get("event")
        if event == "start":
            resume = int(record["resume_step"])
            if resume > seq.highest:
                seq.problems.append(
                    Problem(t, f"pid {pid} resumed at step {resume}, ahead of step {seq.highest}")
                )
            elif resume < seq.highest - every:
                seq.problems.append(
                    Problem(
                        t, f"pid {pid} resumed at step {resume}, more than {every} behind step {seq.highest}"
                    )
                )
            peers = record.get("ranks_resume")
            if isinstance(peers, list) and len(set(peers)) > 1:
                seq.problems.append(Problem(t, f"pid {pid}: the ranks resumed from different steps {peers}"))
            seq.resumes.append(Resume(t, int(record.get("round", -1)), pid, resume, seq.highest))
            current_pid, expect = pid, resume + 1
            continue
        if event is not None or "step" not in record:
            continue
        step = int(record["step"])
        seq.steps += 1
        if pid != current_pid:
            seq.problems.append(
                Problem(
                    t,
                    f"step {step} logged by pid {pid} (round {record.get('round')}) while pid {current_pid} trains",
                )
            )
        elif step != expect:
            seq.problems.append(Problem(t, f"pid {pid} logged step {step} after step {(expect or 1) - 1}"))
        if pid == current_pid:
            expect = step + 1
        seq.highest = max(seq.highest, step)
    return seq


# --- metric points and log lines ---------------------------------------------------------------


def logged_steps(logs: Iterable[list[dict[str, Any]]]) -> Counter[StepKey]:
    """(round, rank, step) of every step line in the ranks' logs."""
    keys: Counter[StepKey] = Counter()
    for records in logs:
        for record in records:
            if record.get("event") is None and "step" in record:
                keys[(int(record["round"]), int(record["rank"]), int(record["step"]))] += 1
    return keys


@dataclass(frozen=True)
class PointCount:
    expected: int
    stored: int
    lost: int
    duplicated: int
    unlogged: int  # stored, but not in the script's log (a rank killed between the two writes)
    lost_keys: tuple[StepKey, ...] = ()


def compare_points(expected: Counter[StepKey], stored: Counter[StepKey]) -> PointCount:
    return PointCount(
        expected=len(expected),
        stored=sum(stored.values()),
        lost=sum(1 for key in expected if key not in stored),
        duplicated=sum(count - 1 for count in stored.values() if count > 1),
        unlogged=sum(1 for key in stored if key not in expected),
        lost_keys=tuple(sorted(key for key in expected if key not in stored)),
    )


def stored_metric_points(conn: Any, job_id: int, name: str = "loss") -> Counter[StepKey]:
    rows = conn.execute(
        "SELECT round_number, rank, step, count(*) FROM telemetry_metric WHERE job_id = %s AND name = %s "
        "GROUP BY round_number, rank, step",
        [job_id, name],
    ).fetchall()
    return Counter({(int(r), int(k), int(s)): int(n) for r, k, s, n in rows})


def stored_step_lines(conn: Any, job_id: int) -> Counter[StepKey]:
    """The script's ``step N loss X`` stdout lines the console stored, per (round, rank, step)."""
    rows = conn.execute(
        "SELECT round_number, rank, text FROM telemetry_logline WHERE job_id = %s AND stream = 'stdout' "
        "AND text LIKE 'step %%'",
        [job_id],
    ).fetchall()
    keys: Counter[StepKey] = Counter()
    for round_, rank, text in rows:
        parts = str(text).split()
        if len(parts) >= 2 and parts[1].isdigit():
            keys[(int(round_), int(rank), int(parts[1]))] += 1
    return keys


# --- orphans -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Orphan:
    pid: int
    ppid: int
    cmdline: str

    def __str__(self) -> str:
        return f"{self.pid} (parent {self.ppid}): {self.cmdline[:120]}"


def _describe(proc: psutil.Process) -> Orphan | None:
    try:
        return Orphan(proc.pid, proc.ppid(), " ".join(proc.cmdline()))
    except psutil.Error:
        return None


def orphans(run_id: str, owners: set[int], script: str, running_job_pids: set[int]) -> list[Orphan]:
    """Processes of the run nothing owns: their parent is neither another process of the run nor
    one of ``owners`` (the bench, the postmaster), plus any process of the training script that
    is not one of ``running_job_pids`` (the ranks of a job still running, and their DataLoader
    workers)."""
    procs = marked_processes(run_id)
    found: dict[int, Orphan] = {}
    for pid, proc in procs.items():
        if pid in owners:
            continue
        described = _describe(proc)
        if described is None:
            continue
        parent_owned = described.ppid in procs or described.ppid in owners
        is_script = script in described.cmdline
        if not parent_owned or (is_script and pid not in running_job_pids):
            found[pid] = described
    return sorted(found.values(), key=lambda o: o.pid)


# --- a client polling the API ------------------------------------------------------------------


class ApiPoller(threading.Thread):
    """Polls a job and the node list every ``interval`` seconds; counts 5xx answers and requests
    that got no answer at all (connection refused while the web server is down)."""

    def __init__(self, base_url: str, token: str, job_id: int, interval: float = 0.25) -> None:
        super().__init__(name="api-poller", daemon=True)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.urls = [f"{base_url}/api/v1/jobs/{job_id}/", f"{base_url}/api/v1/nodes/"]
        self.interval = interval
        self.requests = 0
        self.http_5xx = 0
        self.unanswered = 0
        self.statuses: Counter[int] = Counter()
        self.first_5xx: str = ""
        self.times_5xx: list[float] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        index = 0
        while not self._stopping.is_set():
            url = self.urls[index % len(self.urls)]
            index += 1
            self.requests += 1
            try:
                response = self.session.get(url, timeout=5)
            except requests.RequestException:
                self.unanswered += 1
            else:
                self.statuses[response.status_code] += 1
                if response.status_code >= 500:
                    self.http_5xx += 1
                    self.times_5xx.append(time.time())
                    if not self.first_5xx:
                        self.first_5xx = f"{response.status_code} {url}: {response.text[:200]}"
            self._stopping.wait(self.interval)

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)
        self.session.close()


def telemetry_drained(redis_url: str) -> bool:
    """Ingest has read every entry of the telemetry stream and acked each (nothing pending): all
    it will store of what the agents shipped is stored, a point stored twice included."""
    import redis

    from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
    try:
        added = int(client.xinfo_stream(TELEMETRY_STREAM)["entries-added"])
        groups = [
            g
            for g in client.xinfo_groups(TELEMETRY_STREAM)
            if g["name"] in (TELEMETRY_GROUP, TELEMETRY_GROUP.encode())
        ]
        return bool(groups) and all(
            int(g["entries-read"] or 0) >= added and not int(g["pending"]) for g in groups
        )
    except redis.RedisError:
        return False
    finally:
        client.close()


def wait_stable(count: Any, target: int, quiet: float = 3.0, timeout: float = 30.0) -> int:
    """Until ``count()`` reaches ``target`` or stops changing for ``quiet`` seconds (ingest has
    drained what it will store); returns the last count."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            now = int(count())
        except Exception:  # the database may be restarting
            time.sleep(0.5)
            continue
        if now >= target:
            return now
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
        time.sleep(0.3)
    return last
