"""How far a job is: ``Job.progress``, what the job page, the jobs list, the dashboard, the API
and the CLI show.

Stored as ``{"step": int, "total": int | None, "unit": "steps" | "examples" | "shards",
"round": int}``. Where the numbers come from depends on the job's kind:

- allreduce jobs (plain scripts, SDK scripts, in place or not): ``step`` is the newest step any
  rank logged in the round (the agents' heartbeats, ``RoundStatus.last_step``), ``total`` the
  script's own ``sdk.progress(total)`` (``RoundStatus.total_steps``), else the ``steps``
  hyperparameter. Within a round the step only goes up (hosts report in turn, each its own
  newest); a new round may go back (a restart resumes from its checkpoint), except one that
  carries the ranks over in place, whose steps go on from where they were.
- parameter-server jobs: the coordinator's shard queue (``queue_*`` telemetry): examples done
  over the dataset's examples (every epoch), or shards done over shards when the queue does not
  report examples. The workers', PS's and queue's own counters are not steps of the job.

The pure part (``Progress``, ``combine``, ``from_queue``, ``label``, ``fraction``) is tested
without a database; ``record_heartbeat`` and ``settle_finished`` read rows and write the job.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from console.core import events
from console.core.states import JobState
from console.jobs.models import Allocation, Job, Round
from console.jobs.parameter_server import latest_values
from workers import protocol

log = logging.getLogger(__name__)

STEPS = "steps"
EXAMPLES = "examples"
SHARDS = "shards"
UNITS = (STEPS, EXAMPLES, SHARDS)
# Keys older records hold their total under.
_TOTAL_KEYS = ("total", "total_steps", "max_steps", "steps_total")
# A job's last telemetry reaches the database after it ended (the coordinator's final report is
# written once it is stopped; ingest runs apart from the controller): its progress is read again
# for this long after it ended.
SETTLE_SECONDS = 30.0
# The coordinator's queue statistics progress is read from (workers/ps/stats.py).
QUEUE_NAMES = (
    "queue_examples_done",
    "queue_examples_per_epoch",
    "queue_epochs",
    "queue_epoch",
    "queue_done",
    "queue_shards_per_epoch",
)


@dataclass(frozen=True)
class Progress:
    step: int
    total: int | None
    unit: str
    round: int

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "total": self.total, "unit": self.unit, "round": self.round}


def _whole(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return int(value)


def read(stored: Any) -> Progress | None:
    """The stored JSON as a Progress; None when it holds no step. Records written before units
    (``{"step": 40, "total": 100}``) read as steps of round 0."""
    if not isinstance(stored, dict):
        return None
    step = _whole(stored.get("step"))
    if step is None:
        return None
    total = next((_whole(stored[k]) for k in _TOTAL_KEYS if _whole(stored.get(k))), None)
    unit = str(stored["unit"]) if stored.get("unit") in UNITS else STEPS
    return Progress(step, total if total and total > 0 else None, unit, _whole(stored.get("round")) or 0)


def combine(previous: Progress | None, reading: Progress, *, carried_from: int | None = None) -> Progress:
    """What the job's progress becomes when ``reading`` arrives.

    Within a round the count only goes up (hosts report in turn, each its newest). A new round
    starts its own count (a restart resumes from its checkpoint, a restarted coordinator starts
    its queue again), unless it carries the ranks of the recorded round over in place
    (``carried_from``), whose steps go on. A reading of an older round than the one recorded is
    stale (a heartbeat that crossed a round change) and changes nothing."""
    if previous is None or previous.unit != reading.unit:
        return reading
    if reading.round < previous.round:
        return previous
    goes_on = reading.round == previous.round or (reading.unit == STEPS and carried_from == previous.round)
    step = max(previous.step, reading.step) if goes_on else reading.step
    return Progress(step, reading.total or previous.total, reading.unit, reading.round)


def from_queue(values: Mapping[str, float | None], round_number: int) -> Progress | None:
    """The coordinator's shard queue as progress: examples done over every epoch's examples, or,
    without an example count, shards done over every epoch's shards."""
    done_examples = _whole(values.get("queue_examples_done"))
    per_epoch = _whole(values.get("queue_examples_per_epoch"))
    epochs = _whole(values.get("queue_epochs"))
    if done_examples is not None and per_epoch and epochs:
        return Progress(done_examples, per_epoch * epochs, EXAMPLES, round_number)
    shards = _whole(values.get("queue_shards_per_epoch"))
    epoch, done = _whole(values.get("queue_epoch")), _whole(values.get("queue_done"))
    if shards and epochs and epoch is not None and done is not None:
        total = shards * epochs
        # A finished queue reports epoch == epochs and every shard of the last epoch done.
        return Progress(min(total, epoch * shards + done), total, SHARDS, round_number)
    if done_examples is not None:
        return Progress(done_examples, None, EXAMPLES, round_number)
    return None


def fraction(stored: Any) -> float | None:
    """0..1 when the job's progress has a total, else None."""
    if isinstance(stored, dict) and isinstance(stored.get("fraction"), int | float):
        return max(0.0, min(1.0, float(stored["fraction"])))
    progress = read(stored)
    if progress is None or not progress.total:
        return None
    return max(0.0, min(1.0, progress.step / progress.total))


def parts(stored: Any) -> tuple[str, str]:
    """The label's number part and its unit: ("1,200/4,000", "steps"), ("step 1,200", "")."""
    progress = read(stored)
    if progress is None:
        share = fraction(stored)
        return ("—" if share is None else f"{round(share * 100)}%"), ""
    if progress.total:
        return f"{progress.step:,}/{progress.total:,}", progress.unit
    if progress.unit == STEPS:
        return f"step {progress.step:,}", ""
    return f"{progress.step:,}", progress.unit


def label(stored: Any) -> str:
    """``1,200/4,000 steps``, ``3,072,000/4,608,000 examples``, ``step 1,200`` (no total)."""
    value, unit = parts(stored)
    return f"{value} {unit}" if unit else value


# --- reading the rows -------------------------------------------------------------------------
def _configured_total(job: Job) -> int | None:
    steps = _whole(job.hyperparameters.get("steps"))
    return steps if steps and steps > 0 else None


def _carried_from(rnd: Round) -> int | None:
    source = _whole((rnd.carry_over or {}).get("from_round"))
    return source if source is not None and source < rnd.number else None


def _coordinator(rnd: Round, alloc: Allocation | None = None) -> int | None:
    """The coordinator's global rank in ``rnd`` (on ``alloc``'s node only, when given)."""
    allocs = [alloc] if alloc is not None else list(rnd.allocations.all())
    for each in allocs:
        for process in each.processes or []:
            if process.get("role") == "coordinator":
                return int(process["rank"])
    return None


def queue_reading(job: Job, rnd: Round, rank: int) -> Progress | None:
    """The newest queue statistics the coordinator (``rank``) reported in ``rnd``."""
    latest = latest_values(job.pk, rnd.number, [(rank, name) for name in QUEUE_NAMES])
    return from_queue({name: point[0] for (_, name), point in latest.items()}, rnd.number)


def steps_reading(job: Job, number: int, status: protocol.RoundStatus | None) -> Progress | None:
    step = _whole(status.get("last_step")) if status is not None else None
    if status is None or step is None:
        return None
    total = _whole(status.get("total_steps")) or _configured_total(job)
    return Progress(step, total, STEPS, number)


def _store(job: Job, reading: Progress | None, rnd: Round) -> bool:
    """Combine ``reading`` into ``job.progress`` (not saved); True when it changed."""
    if reading is None:
        return False
    fresh = combine(read(job.progress), reading, carried_from=_carried_from(rnd)).as_json()
    if fresh == job.progress:
        return False
    job.progress = fresh
    return True


def record_heartbeat(
    job: Job, alloc: Allocation, status: protocol.RoundStatus, before: protocol.RoundStatus | None = None
) -> bool:
    """A heartbeat's status of the job's current round onto ``job.progress`` (job locked by the
    caller; not saved). ``before``: the same heartbeat's status of the round before, if the agent
    still lists it: its last steps count until the current round logs its own (a reading of an
    older round than the one recorded changes nothing). For a parameter-server job only the
    coordinator's host's heartbeat reads the queue (one short indexed read). Returns True when
    the progress changed."""
    rnd = alloc.round
    if job.is_parameter_server:
        rank = _coordinator(rnd, alloc)
        return rank is not None and _store(job, queue_reading(job, rnd, rank), rnd)
    earlier = _store(job, steps_reading(job, rnd.number - 1, before), rnd)
    return _store(job, steps_reading(job, rnd.number, status), rnd) or earlier


def last_logged_step(job: Job, number: int) -> int | None:
    """The newest step logged in round ``number``: each series' newest tile of the round (a short
        backward walk of the tiles' (job, name, bucket_step) index per name, the names found by a
        skip scan of the same index; per-layer norms and the agent's resource samples (``res_*``, whose
    step is the rank's, or its seconds running) left out). It reads the telemetry app's tiles
        table by SQL, as ``parameter_server.latest_values`` reads its points: jobs does not import
        telemetry, which reads jobs (tests/test_app_imports.py)."""
    sql = """
        WITH RECURSIVE names(name) AS (
            (SELECT name FROM telemetry_metricrollup WHERE job_id = %(job)s ORDER BY name LIMIT 1)
            UNION ALL
            SELECT (SELECT r.name FROM telemetry_metricrollup r
                    WHERE r.job_id = %(job)s AND r.name > names.name ORDER BY r.name LIMIT 1)
            FROM names WHERE names.name IS NOT NULL
        )
        SELECT max(tile.last_step)
        FROM names
        CROSS JOIN LATERAL (
            SELECT last_step FROM telemetry_metricrollup
            WHERE job_id = %(job)s AND name = names.name AND round_number = %(round)s
            ORDER BY bucket_step DESC
            LIMIT 1
        ) tile
        WHERE names.name IS NOT NULL
          AND names.name <> 'total_steps'
          AND NOT starts_with(names.name, 'grad_norm/')
          AND NOT starts_with(names.name, 'res_')
    """
    with connection.cursor() as cur:
        cur.execute(sql, {"job": job.pk, "round": number})
        row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else None


def settle(job: Job) -> bool:
    """Read a job's progress again from its stored telemetry (its last round); saves and
    broadcasts when it changed. For a job that has ended: its last points arrive after it did."""
    rnd = job.current_round()
    if rnd is None:
        return False
    if job.is_parameter_server:
        rank = _coordinator(rnd)
        reading = queue_reading(job, rnd, rank) if rank is not None else None
    else:
        step = last_logged_step(job, rnd.number)
        previous = read(job.progress)
        total = previous.total if previous is not None else _configured_total(job)
        reading = None if step is None else Progress(step, total, STEPS, rnd.number)
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if not _store(locked, reading, rnd):
            return False
        locked.save(update_fields=["progress"])
        events.job_changed(locked)
    job.progress = locked.progress
    return True


def settle_finished() -> int:
    """The tick's pass: jobs that ended in the last SETTLE_SECONDS read their progress again.
    Returns how many changed."""
    since = timezone.now() - timedelta(seconds=SETTLE_SECONDS)
    changed = 0
    terminal = [s.value for s in JobState if not s.is_active]
    for job in Job.objects.filter(finished_at__gte=since, state__in=terminal):
        try:
            changed += settle(job)
        except Exception:
            log.exception("job %s: settling its progress failed", job.pk)
    return changed
