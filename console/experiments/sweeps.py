"""Sweeps as actions: submit, stop, and the controller's pass that advances every running sweep.

``advance_sweeps`` runs on every controller tick (console/experiments/tasks.py). For each running
sweep, in one transaction holding its row: read the objective each running trial reported since
the last pass (the metrics ingest stored), settle trials whose job ended, stop the trials the
pruner judges losing (through ``jobs.actions.stop_job``, the console's own stop), start trials
(through ``jobs.actions.submit_job``) while the budget and the parallel limit allow, and end the
sweep once every trial of its budget has ended. Everything it knows is in the database, so a
controller killed mid-pass loses nothing: the transaction rolls back and the next pass redoes it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from console.core.models import AuditEntry
from console.core.states import JobState
from console.experiments import study
from console.experiments.models import Sweep, SweepState, Trial, TrialState
from console.jobs import actions as job_actions
from console.jobs.models import Job
from console.telemetry import events
from console.telemetry.models import Metric

log = logging.getLogger(__name__)

# Sweeps are advanced one pass at a time (a second controller thread skips the pass).
SWEEP_LOCK_KEY = 0x7377_6565_7073
# Reports kept per trial: the pruners compare values at the same steps, so every report is
# kept up to this bound (a script that logs its objective every step for a long run stops adding).
MAX_REPORTS = 10_000
# A sweep whose trials fail to start this many times in a row gives up.
MAX_START_FAILURES = 3


def settings_of(sweep: Sweep) -> study.Settings:
    return study.Settings(
        space=sweep.space,
        sampler=sweep.sampler,
        seed=sweep.seed,
        direction="maximize" if sweep.direction == "maximize" else "minimize",
        pruner=sweep.pruner,
        pruner_options=sweep.pruner_options,
    )


def record_of(trial: Trial) -> study.TrialRecord:
    return study.TrialRecord(
        number=trial.number,
        state=trial.state,
        params=trial.params,
        value=trial.value,
        intermediate={int(step): value for step, value in trial.intermediate.items()},
        system_attrs=trial.system_attrs,
    )


def trial_spec(sweep: Sweep, number: int, params: dict[str, Any]) -> dict[str, Any]:
    """The job spec of trial ``number``: the sweep's spec, named after the trial, its parameters
    merged into the hyperparameters and put in place of any ``{name}`` in its args."""
    spec = dict(sweep.spec)
    spec["name"] = f"{sweep.name}-t{number}"[:128]
    spec["hyperparameters"] = {**(spec.get("hyperparameters") or {}), **params}
    if spec.get("args"):
        spec["args"] = [substitute(str(arg), params) for arg in spec["args"]]
    return spec


def substitute(arg: str, params: dict[str, Any]) -> str:
    """``--lr={lr}`` → ``--lr=0.003``: only names of the search space are replaced."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return str(params[name]) if name in params else match.group(0)

    return re.sub(r"\{([\w.\-]+)\}", value, arg)


def build_job(spec: dict[str, Any], owner: Any) -> Job:
    """A trial's job from its spec, checked as the jobs API checks a submission; raises
    ``job_actions.InvalidRequest`` with the API's field errors."""
    from console.jobs.api import JobSpecSerializer

    serializer = JobSpecSerializer(data=spec)
    if not serializer.is_valid():
        raise job_actions.InvalidRequest(_flatten(serializer.errors))
    return serializer.to_job(owner)


def _flatten(errors: Any) -> str:
    if isinstance(errors, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in errors.items())
    if isinstance(errors, list):
        return " ".join(_flatten(e) for e in errors)
    return str(errors)


def submit_sweep(sweep: Sweep, actor: Any) -> Sweep:
    """Store a validated sweep; the next controller tick starts its first trials."""
    with transaction.atomic():
        sweep.state = SweepState.RUNNING
        sweep.save()
        AuditEntry.record(actor, "sweep.submit", sweep, name=sweep.name, trials=sweep.max_trials)
    from console.core.transport import request_tick

    request_tick()
    return sweep


def stop_sweep(sweep_id: int, actor: Any) -> Sweep:
    """Stop a sweep: no new trials, and every running trial's job is stopped."""
    with transaction.atomic():
        _lock_sweeps()
        sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
        if sweep.sweep_state.is_terminal:
            raise job_actions.ControlError(f"Sweep {sweep.name} is already {sweep.state}.")
        AuditEntry.record(actor, "sweep.stop", sweep)
        who = getattr(actor, "username", "") or "system"
        for trial in sweep.trials.filter(state=TrialState.RUNNING).select_related("job"):
            _stop_trial_job(trial, actor)
            _finish(trial, TrialState.STOPPED, f"The sweep was stopped by {who}.")
        _end(sweep, SweepState.STOPPED, f"Stopped by {who}.")
    return sweep


def _lock_sweeps() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SWEEP_LOCK_KEY])


def _try_lock_sweeps() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SWEEP_LOCK_KEY])
        row = cursor.fetchone()
    return bool(row and row[0])


def advance_sweeps() -> None:
    """One pass over every running sweep (see the module's docstring)."""
    ids = list(Sweep.objects.filter(state=SweepState.RUNNING).order_by("id").values_list("id", flat=True))
    for sweep_id in ids:
        try:
            with transaction.atomic():
                if not _try_lock_sweeps():
                    return  # another controller thread is advancing the sweeps
                sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
                if sweep.state == SweepState.RUNNING:
                    advance(sweep)
        except Exception:
            log.exception("advancing sweep %s failed; the next tick tries again", sweep_id)


def advance(sweep: Sweep) -> None:
    """One pass over one sweep, its row locked by the caller."""
    trials = list(sweep.trials.select_related("job").order_by("number"))
    running = [t for t in trials if t.live]
    collect_reports(sweep, running)
    for trial in running:
        job = trial.job
        if job is None:
            _finish(trial, TrialState.FAILED, "Its job was deleted.")
        elif job.job_state.is_terminal:
            settle(trial, job)
    if sweep.pruner != "none":
        prune_losers(sweep, trials)
    start_trials(sweep, trials)
    if any(t.live for t in trials) or sweep.state != SweepState.RUNNING:
        return
    if len(trials) >= sweep.max_trials or study.grid_exhausted(
        settings_of(sweep), [record_of(t) for t in trials]
    ):
        best = best_trial(sweep, trials)
        note = f"Best: trial {best.number} ({sweep.objective} {best.value:.6g})." if best else ""
        _end(sweep, SweepState.SUCCEEDED, f"Every trial ran. {note}".strip())


def collect_reports(sweep: Sweep, running: Iterable[Trial]) -> None:
    """Each running trial's objective points after the last one held, one value per step (the
    lowest rank's, which is rank 0 where every rank logs it)."""
    by_job = {t.job_id: t for t in running if t.job_id is not None}
    if not by_job:
        return
    after = min((t.last_step if t.last_step is not None else -1) for t in by_job.values())
    rows = (
        Metric.objects.filter(job_id__in=list(by_job), name=sweep.objective, step__gt=after)
        .order_by("job_id", "step", "rank", "round_number")
        .values_list("job_id", "step", "value")
    )
    changed: set[int] = set()
    for job_id, step, value in rows.iterator(chunk_size=5000):
        trial = by_job[job_id]
        if trial.last_step is not None and step <= trial.last_step:
            continue
        key = str(step)
        if key in trial.intermediate or len(trial.intermediate) >= MAX_REPORTS:
            continue
        trial.intermediate[key] = value
        changed.add(trial.pk)
    for trial in by_job.values():
        if trial.pk in changed:
            trial.last_step = max(int(s) for s in trial.intermediate)
            trial.save(update_fields=["intermediate", "last_step"])


def settle(trial: Trial, job: Job) -> None:
    """A trial whose job ended: complete with its last reported objective, or why not."""
    if job.state == JobState.SUCCEEDED:
        value = last_value(trial)
        if value is None:
            _finish(trial, TrialState.FAILED, "Its job succeeded without reporting the objective.")
        else:
            trial.value = value
            _finish(trial, TrialState.COMPLETE, "")
    elif job.state == JobState.FAILED:
        _finish(trial, TrialState.FAILED, "Its job failed.")
    else:
        _finish(trial, TrialState.STOPPED, "Its job was stopped.")


def last_value(trial: Trial) -> float | None:
    if not trial.intermediate:
        return None
    value = trial.intermediate[str(max(int(s) for s in trial.intermediate))]
    return None if value is None or value != value else float(value)


def prune_losers(sweep: Sweep, trials: list[Trial]) -> None:
    settings = settings_of(sweep)
    records = [record_of(t) for t in trials]
    for trial in [t for t in trials if t.live and t.last_step is not None]:
        if trial.checked_step is not None and (trial.last_step or 0) <= trial.checked_step:
            continue
        verdict = study.judge(settings, records, trial.number, trial.checked_step)
        trial.checked_step = verdict.checked_step
        trial.system_attrs = verdict.system_attrs
        record = next(r for r in records if r.number == trial.number)
        record.system_attrs = verdict.system_attrs
        if verdict.prune_at is None:
            trial.save(update_fields=["checked_step", "system_attrs"])
            continue
        value = trial.intermediate.get(str(verdict.prune_at))
        message = (
            f"Pruned at step {verdict.prune_at} ({sweep.objective} {value:.6g}): losing to the other trials."
        )
        if trial.job is not None:
            events.emit("sweep.trial_pruned", message, job=trial.job, sweep=sweep.pk, trial=trial.number)
            _stop_trial_job(trial, None)
        trial.value = value
        record.state = TrialState.PRUNED
        _finish(trial, TrialState.PRUNED, message)


def _stop_trial_job(trial: Trial, actor: Any) -> None:
    if trial.job is None or trial.job.job_state.is_terminal:
        return
    with contextlib.suppress(job_actions.ControlError):  # it ended meanwhile
        job_actions.stop_job(trial.job.pk, actor)


def start_trials(sweep: Sweep, trials: list[Trial]) -> None:
    settings = settings_of(sweep)
    failures = 0
    while sum(t.live for t in trials) < sweep.parallel and len(trials) < sweep.max_trials:
        records = [record_of(t) for t in trials]
        if study.grid_exhausted(settings, records):
            return
        asked = study.ask(settings, records)
        trial = Trial(sweep=sweep, number=len(trials), params=asked.params, system_attrs=asked.system_attrs)
        try:
            with transaction.atomic():
                job = build_job(trial_spec(sweep, trial.number, asked.params), sweep.owner)
                trial.job = job_actions.submit_job(job, sweep.owner)
                trial.save()
        except job_actions.ControlError as exc:
            failures += 1
            trial.state = TrialState.FAILED
            trial.message = f"Its job could not be submitted: {exc}"
            trial.finished_at = timezone.now()
            trial.save()
            if failures >= MAX_START_FAILURES:
                _end(sweep, SweepState.FAILED, f"Trials could not be submitted: {exc}")
                trials.append(trial)
                return
        trials.append(trial)


def best_trial(sweep: Sweep, trials: Iterable[Trial]) -> Trial | None:
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    number = study.best(sweep.direction, [(t.number, t.value) for t in complete])  # type: ignore[misc]
    return next((t for t in complete if t.number == number), None)


def _finish(trial: Trial, state: TrialState, message: str) -> None:
    trial.state = state
    trial.message = message
    trial.finished_at = timezone.now()
    trial.save(update_fields=["state", "message", "finished_at", "value", "checked_step", "system_attrs"])


def _end(sweep: Sweep, state: SweepState, message: str) -> None:
    sweep.state = state
    sweep.message = message
    sweep.finished_at = timezone.now()
    sweep.save(update_fields=["state", "message", "finished_at"])
    log.info("sweep %s %s: %s", sweep.pk, state, message)
