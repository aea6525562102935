"""Sweeps and their trials: a search over a job spec's hyperparameters, each trial one job.

The whole state of a sweep lives in these rows (and the trials' jobs), so the controller that
advances it (console/experiments/sweeps.py, every tick) can be killed and restarted at any time:
the next tick reads them and goes on. Optuna decides (console/experiments/study.py) from a study
rebuilt in memory from these rows; nothing of it is kept between ticks.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.jobs.models import Job


class SweepState(models.TextChoices):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # every trial of the budget ran (or the grid is exhausted)
    STOPPED = "STOPPED"  # an operator stopped it
    FAILED = "FAILED"  # it could not go on (every trial failed to start, a spec the console refuses)

    @property
    def is_terminal(self) -> bool:
        return self is not SweepState.RUNNING


class TrialState(models.TextChoices):
    RUNNING = "RUNNING"  # its job is live (pending, starting or running)
    COMPLETE = "COMPLETE"  # its job succeeded and reported the objective
    PRUNED = "PRUNED"  # stopped early by the pruner: it was losing
    FAILED = "FAILED"  # its job failed, or ended without reporting the objective
    STOPPED = "STOPPED"  # stopped by an operator (the job's stop, or the sweep's)


class Sampler(models.TextChoices):
    GRID = "grid"
    RANDOM = "random"
    TPE = "tpe"


class Pruner(models.TextChoices):
    NONE = "none"
    MEDIAN = "median"
    SUCCESSIVE_HALVING = "successive_halving"


class Direction(models.TextChoices):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class Sweep(models.Model):
    name = models.CharField(max_length=100)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="sweeps"
    )
    # The job spec every trial starts from (the API's JSON, validated at submission); a trial's
    # parameters go into its hyperparameters and into any "{name}" of its args.
    spec = models.JSONField()
    # {name: {"type": "float" | "int" | "categorical", "low", "high", "log", "step", "choices"}}
    # (console/experiments/space.py checks it).
    space = models.JSONField()
    sampler = models.CharField(max_length=16, choices=Sampler.choices, default=Sampler.TPE)
    seed = models.IntegerField(default=0)
    objective = models.CharField(max_length=128, help_text="The metric the trials report")
    direction = models.CharField(max_length=8, choices=Direction.choices, default=Direction.MINIMIZE)
    max_trials = models.PositiveIntegerField()
    parallel = models.PositiveIntegerField(default=1)
    pruner = models.CharField(max_length=24, choices=Pruner.choices, default=Pruner.NONE)
    # median: {"startup_trials", "warmup_steps"}; successive_halving: {"min_resource",
    # "reduction_factor", "min_early_stopping_rate"}.
    pruner_options = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=SweepState.choices, default=SweepState.RUNNING)
    message = models.TextField(blank=True, help_text="Why it ended")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "id"], name="sweep_by_state")]
        constraints = [
            models.CheckConstraint(condition=Q(max_trials__gte=1), name="sweep_max_trials_positive"),
            models.CheckConstraint(condition=Q(parallel__gte=1), name="sweep_parallel_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (sweep #{self.pk})"

    @property
    def sweep_state(self) -> SweepState:
        return SweepState(self.state)


class Trial(models.Model):
    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField(help_text="0, 1, 2, ... in the order they were asked for")
    job = models.OneToOneField(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="trial")
    params = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=TrialState.choices, default=TrialState.RUNNING)
    value = models.FloatField(null=True, blank=True, help_text="The objective: its last reported value")
    # The objective as reported, {step (as text): value}; what the pruner compares.
    intermediate = models.JSONField(default=dict, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True, help_text="The newest step reported")
    checked_step = models.BigIntegerField(
        null=True, blank=True, help_text="The newest step the pruner has judged"
    )
    # Optuna's bookkeeping of the trial (a grid point's id, successive halving's rungs), kept so a
    # study rebuilt from these rows decides as the one before did.
    system_attrs = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["sweep", "number"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "number"], name="trial_unique_number_per_sweep"),
        ]

    def __str__(self) -> str:
        return f"trial {self.number} of sweep {self.sweep_id}"

    @property
    def trial_state(self) -> TrialState:
        return TrialState(self.state)

    @property
    def live(self) -> bool:
        return self.state == TrialState.RUNNING
