"""Hangs and the stacks kept with them (console/jobs/hangs.py records and concludes them).

Imported by console/jobs/models.py, so the jobs app owns these tables.
"""

from __future__ import annotations

from django.db import models


class Hang(models.Model):
    """A job's ranks stopped making progress (or drifted apart) in one of its rounds.

    Opened by the first host's report (or the controller's drift check), it gathers every host's
    stacks, and is *concluded* once every host of the round has reported or HANG_GATHER_SECONDS
    passed: then the ``job.hang`` event names the ranks at fault and the job's policy acts."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="hangs")
    round_number = models.PositiveIntegerField()
    reason = models.CharField(max_length=16, help_text="stall or drift")
    threshold_s = models.FloatField(default=0.0, help_text="The stalled ranks' threshold")
    stalled = models.JSONField(default=list, blank=True, help_text="Ranks hosts saw past their threshold")
    ranks = models.JSONField(default=list, blank=True, help_text="Ranks named at fault once concluded")
    summary = models.TextField(blank=True)
    action = models.CharField(max_length=16, blank=True, help_text="What the job's policy did")
    detected_at = models.DateTimeField()
    concluded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "-detected_at"]
        indexes = [models.Index(fields=["concluded_at", "detected_at"], name="hang_open")]

    def __str__(self) -> str:
        return f"hang of job {self.job_id} round {self.round_number}"


class RankStack(models.Model):
    """One rank's stacks as its agent read them (py-spy) for a hang."""

    hang = models.ForeignKey(Hang, on_delete=models.CASCADE, related_name="stacks")
    node_name = models.CharField(max_length=128)
    rank = models.IntegerField()
    local_rank = models.IntegerField()
    pid = models.IntegerField()
    process_state = models.CharField(max_length=32, blank=True)
    step = models.BigIntegerField(null=True, blank=True)
    stalled_s = models.FloatField(default=0.0)
    cpu_percent = models.FloatField(default=0.0)
    threads = models.JSONField(
        default=list, blank=True, help_text="[{name, idle, frames: [{name, file, line}]}]"
    )
    native = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    flight_recorder = models.CharField(max_length=1024, blank=True)
    collected_at = models.DateTimeField()

    class Meta:
        ordering = ["hang", "rank"]
        constraints = [models.UniqueConstraint(fields=["hang", "rank"], name="rank_stack_once_per_hang")]

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.hang}"
