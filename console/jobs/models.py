"""Jobs and their life on the cluster: jobs, rounds, allocations, checkpoints, code bundles."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from console.cluster.models import Node
from console.core.states import AllocationState, JobState, RoundOutcome, RoundPhase, RoundReason
from console.teams.models import NodePool, Workspace, default_workspace_id
from workers.protocol import InplaceStatus

__all__ = [
    "Allocation",
    "AllocationState",
    "Bundle",
    "Checkpoint",
    "Hang",
    "Job",
    "Precision",
    "RankStack",
    "Round",
    "RoundOutcome",
    "RoundPhase",
    "RoundReason",
    "Strategy",
    "job_summary",
]


class Strategy(models.TextChoices):
    ALLREDUCE = "allreduce"
    PARAMETER_SERVER = "parameter_server"


class Precision(models.TextChoices):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Bundle(models.Model):
    """An uploaded code archive, stored once per content hash."""

    sha256 = models.CharField(max_length=64, unique=True)
    size_bytes = models.PositiveBigIntegerField()
    filename = models.CharField(max_length=255, blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    # Stored once per content hash: each workspace that uploaded it may see and use it.
    workspaces = models.ManyToManyField(Workspace, related_name="bundles", blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.filename or 'bundle'} ({self.sha256[:12]})"


class Job(models.Model):
    name = models.CharField(max_length=128)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    # Who may see and change it (console/teams/access.py), whose quota it uses.
    workspace = models.ForeignKey(
        Workspace, on_delete=models.PROTECT, related_name="jobs", default=default_workspace_id
    )
    # Where it may run: a pool's nodes (its quotas count the job), and labels every node must have.
    pool = models.ForeignKey(NodePool, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    node_selector = models.JSONField(default=dict, blank=True, help_text="Labels a node must have")
    # Why it waits, as the scheduler last said (over quota, pool full, behind whom); "" otherwise.
    wait_reason = models.CharField(max_length=255, blank=True)
    # What to run: a built-in workload, or an entrypoint from a bundle or a host path.
    workload = models.CharField(max_length=64, blank=True)
    entrypoint = models.CharField(max_length=1024, blank=True)
    args = models.JSONField(default=list, blank=True)
    bundle = models.ForeignKey(Bundle, null=True, blank=True, on_delete=models.PROTECT)
    workdir = models.CharField(max_length=1024, blank=True, help_text="Host path the entrypoint runs in")
    # Shape.
    min_nodes = models.PositiveIntegerField(default=1)
    max_nodes = models.PositiveIntegerField(default=1)
    desired_nodes = models.PositiveIntegerField(default=1, help_text="Node count the operator asked for")
    nproc_per_node = models.PositiveIntegerField(default=1)
    gpus_per_proc = models.PositiveIntegerField(default=0)
    strategy = models.CharField(max_length=32, choices=Strategy.choices, default=Strategy.ALLREDUCE)
    precision = models.CharField(max_length=8, choices=Precision.choices, default=Precision.FP32)
    grad_accum_steps = models.PositiveIntegerField(default=1)
    max_restarts = models.PositiveIntegerField(default=3)
    priority = models.IntegerField(default=0)
    grace_period = models.FloatField(default=30.0, help_text="Seconds between SIGTERM and SIGKILL")
    env = models.JSONField(default=dict, blank=True)
    # Write-only: given at submit, handed to the ranks, never returned by the API, shown in the
    # admin or written to a log (names only: JobSerializer's secret_env).
    secret_env = models.JSONField(default=dict, blank=True, editable=False)
    hyperparameters = models.JSONField(default=dict, blank=True)
    # parameter_server only: {"ps": {"count": M, "mode": "async"}, "worker": {"count": N, "min": a,
    # "max": b}} (console/jobs/roles.py checks it). Empty for allreduce.
    roles = models.JSONField(default=dict, blank=True)
    # The script keeps its processes across membership changes (workers/sdk/elastic.py): resizes,
    # drains and preemptions are in-place rounds, survivors re-form instead of restarting.
    inplace = models.BooleanField(default=False, help_text="Membership changes are in-place rounds")
    # Hang detection (protocol.HangPolicy, checked by console/jobs/hangs.py): {} = the defaults.
    hang_policy = models.JSONField(default=dict, blank=True)
    # Life.
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING, db_index=True)
    round_number = models.PositiveIntegerField(default=0, help_text="Current round; 0 before the first")
    restarts = models.PositiveIntegerField(default=0, help_text="Failure restarts used")
    progress = models.JSONField(default=dict, blank=True)
    failure = models.JSONField(default=dict, blank=True, help_text="Root cause when FAILED")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        # The jobs list's filters and sort orders (console/jobs/queries.py), each a keyset the
        # cursor pagination can seek into: every page costs the same, however deep.
        indexes = [
            models.Index(fields=["created_at", "id"], name="job_by_created"),
            models.Index(fields=["state", "created_at", "id"], name="job_by_state_created"),
            models.Index(fields=["owner", "created_at", "id"], name="job_by_owner_created"),
            models.Index(fields=["name", "id"], name="job_by_name"),
            # LIKE 'prefix%' can use a btree only with the pattern operator class (PostgreSQL).
            models.Index(fields=["name"], name="job_name_prefix", opclasses=["varchar_pattern_ops"]),
            models.Index(fields=["priority", "created_at", "id"], name="job_by_priority"),
            models.Index(fields=["workspace", "state"], name="job_by_workspace_state"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(min_nodes__gte=1), name="job_min_nodes_positive"),
            models.CheckConstraint(condition=Q(min_nodes__lte=F("max_nodes")), name="job_min_le_max_nodes"),
            models.CheckConstraint(
                condition=Q(desired_nodes__gte=F("min_nodes")) & Q(desired_nodes__lte=F("max_nodes")),
                name="job_desired_within_range",
            ),
            models.CheckConstraint(condition=Q(nproc_per_node__gte=1), name="job_nproc_positive"),
            models.CheckConstraint(condition=Q(grad_accum_steps__gte=1), name="job_grad_accum_positive"),
            models.CheckConstraint(condition=Q(grace_period__gte=0), name="job_grace_non_negative"),
            models.CheckConstraint(
                condition=~Q(workload="") | ~Q(entrypoint=""), name="job_has_workload_or_entrypoint"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @classmethod
    def lock(cls, job_id: int) -> Job:
        """The job's row, locked for the rest of the transaction (the controller's decisions)."""
        return (
            cls.objects.select_for_update(of=("self",))
            .select_related("bundle", "pool", "workspace")
            .get(pk=job_id)
        )

    @property
    def job_state(self) -> JobState:
        return JobState(self.state)

    def set_state(self, new: JobState) -> None:
        """Move to ``new``; raises IllegalTransition when the state machine forbids it."""
        if self.state == new and new in (JobState.RESIZING, JobState.RESTARTING):
            return
        self.job_state.check_transition(new)
        self.state = new

    @property
    def nnodes(self) -> str:
        return (
            str(self.min_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"
        )

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes

    @property
    def is_parameter_server(self) -> bool:
        return self.strategy == Strategy.PARAMETER_SERVER

    def role_count(self, role: str) -> int:
        """The count the operator asked for of a parameter-server role ("ps" or "worker")."""
        return int(self.roles.get(role, {}).get("count", 0))

    def current_round(self) -> Round | None:
        if not self.round_number:
            return None
        return self.rounds.filter(number=self.round_number).first()


class Round(models.Model):
    """A fixed membership of a job: which nodes, their ranks, world size, master address.

    Its life is ``state`` (a RoundPhase) and nothing else; ``set_state`` is the only way it moves
    and stamps the moment each move happened (formed, failed, ended). ``outcome`` is set once, when
    it ends. The timestamps are for people and benches, never read as the state.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="rounds")
    number = models.PositiveIntegerField()
    reason = models.CharField(max_length=16, choices=RoundReason.choices)
    world_size = models.PositiveIntegerField()
    master_addr = models.CharField(max_length=255)
    master_port = models.PositiveIntegerField()
    charged = models.BooleanField(default=False, help_text="Counted against max_restarts")
    state = models.CharField(max_length=16, choices=RoundPhase.choices, default=RoundPhase.STARTING)
    outcome = models.CharField(
        max_length=16, null=True, blank=True, choices=RoundOutcome.choices, help_text="How it ended"
    )
    inplace = models.BooleanField(default=False, help_text="The previous round's ranks carried over")
    # In-place rounds: the previous round's ranks that stay, {"from_round": N, "ranks": {old: new}}
    # (protocol.CarryOver, what the agents are sent); {} for a round that starts every rank afresh.
    carry_over = models.JSONField(default=dict, blank=True)
    failure = models.JSONField(default=dict, blank=True, help_text="The first failing rank and its error")
    created_at = models.DateTimeField(auto_now_add=True)
    formed_at = models.DateTimeField(
        null=True, blank=True, help_text="When every host reported its ranks re-formed in place"
    )
    first_step_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(
        null=True, blank=True, help_text="When its first rank failure was reported"
    )
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="round_unique_number_per_job"),
            models.CheckConstraint(condition=Q(number__gte=1), name="round_number_positive"),
            models.CheckConstraint(condition=Q(world_size__gte=1), name="round_world_positive"),
            models.CheckConstraint(
                condition=Q(master_port__gte=1) & Q(master_port__lte=65535), name="round_port_valid"
            ),
            # The state is the life; the other columns only record it (Round.set_state keeps them so).
            models.CheckConstraint(
                condition=Q(state=RoundPhase.ENDED, outcome__isnull=False, ended_at__isnull=False)
                | (~Q(state=RoundPhase.ENDED) & Q(outcome__isnull=True, ended_at__isnull=True)),
                name="round_ended_with_outcome",
            ),
            models.CheckConstraint(
                condition=~Q(state=RoundPhase.SETTLING) | Q(failed_at__isnull=False),
                name="round_settling_since_failure",
            ),
            models.CheckConstraint(
                condition=~Q(state=RoundPhase.FORMING) | Q(inplace=True), name="round_forming_in_place"
            ),
            models.CheckConstraint(
                condition=(Q(inplace=True) & ~Q(carry_over={})) | Q(inplace=False, carry_over={}),
                name="round_inplace_carries_over",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} round {self.number}"

    @property
    def round_state(self) -> RoundPhase:
        return RoundPhase(self.state)

    @property
    def round_outcome(self) -> RoundOutcome | None:
        return RoundOutcome(self.outcome) if self.outcome else None

    @property
    def ended(self) -> bool:
        return self.state == RoundPhase.ENDED

    @property
    def failed(self) -> bool:
        """A rank of it failed: settling now, or ended for it."""
        return self.state == RoundPhase.SETTLING or self.outcome == RoundOutcome.FAILED

    @property
    def change_seconds(self) -> float | None:
        """How long the membership change into this round took: to the re-formed group for an
        in-place round, to the first step for a restart (None for the first round, or before)."""
        end = self.formed_at if self.inplace else self.first_step_at
        if self.number <= 1 or end is None:
            return None
        return max(0.0, (end - self.created_at).total_seconds())

    def set_state(
        self, new: RoundPhase, *, at: datetime | None = None, outcome: RoundOutcome | None = None
    ) -> list[str]:
        """Move to ``new`` at ``at`` (now by default), stamping the matching time: ``formed_at`` for
        FORMING → RUNNING, ``failed_at`` for → SETTLING, ``ended_at`` (and ``outcome``, required
        then and only then) for → ENDED. Raises IllegalTransition when the table forbids the move.
        Moving to the state it is in changes nothing (a redelivered report). Returns the fields
        changed, for ``save(update_fields=...)``."""
        if (new is RoundPhase.ENDED) != (outcome is not None):
            raise ValueError("a round's outcome is given with its move to ENDED, and only then")
        if self.state == new:
            return []
        current = self.round_state
        current.check_transition(new)
        when = at or timezone.now()
        self.state = new
        changed = ["state"]
        if current is RoundPhase.FORMING and new is RoundPhase.RUNNING:
            self.formed_at = when
            changed.append("formed_at")
        elif new is RoundPhase.SETTLING:
            self.failed_at = when
            changed.append("failed_at")
        elif new is RoundPhase.ENDED:
            self.outcome = RoundOutcome.FAILED if current is RoundPhase.SETTLING else outcome
            self.ended_at = when
            changed += ["outcome", "ended_at"]
        return changed


class Allocation(models.Model):
    """A node's place in a round."""

    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    node_rank = models.PositiveIntegerField()
    nproc = models.PositiveIntegerField()
    gpu_indices = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=AllocationState.choices, default=AllocationState.ASSIGNED)
    exit_info = models.JSONField(default=dict, blank=True)
    # parameter_server only: this node's processes by local rank, [{"role", "index", "rank",
    # "port"}] (port for the coordinator and PS, which listen); empty for allreduce.
    processes = models.JSONField(default=list, blank=True)
    # In-place rounds: what the host's heartbeats last said of its ranks; "" before any word.
    inplace = models.CharField(max_length=16, blank=True, choices=[(s.value, s.value) for s in InplaceStatus])
    # Each running rank's last step, from the host's heartbeats (drift: console/jobs/hangs.py).
    rank_steps = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["round", "node_rank"]
        constraints = [
            models.UniqueConstraint(fields=["round", "node"], name="allocation_one_per_node"),
            models.UniqueConstraint(fields=["round", "node_rank"], name="allocation_unique_rank"),
            models.CheckConstraint(condition=Q(nproc__gte=1), name="allocation_nproc_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.round} node {self.node.name} rank {self.node_rank}"

    @property
    def allocation_state(self) -> AllocationState:
        return AllocationState(self.state)

    @property
    def is_live(self) -> bool:
        return self.allocation_state.is_live

    def set_state(self, new: AllocationState) -> None:
        """Move to ``new``; raises IllegalTransition when the state machine forbids it."""
        if self.state == new:
            return
        self.allocation_state.check_transition(new)
        self.state = new


class Checkpoint(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    round_number = models.PositiveIntegerField()
    step = models.PositiveBigIntegerField()
    path = models.CharField(max_length=1024)
    size_bytes = models.PositiveBigIntegerField(default=0)
    blocking_ms = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "-step"]
        constraints = [models.UniqueConstraint(fields=["job", "step", "path"], name="checkpoint_unique")]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step}"


def job_summary(job: Job) -> dict[str, Any]:
    """The compact form of a job that websockets and events carry."""
    return {
        "id": job.pk,
        "name": job.name,
        "workspace": job.workspace_id,
        "state": job.state,
        "round": job.round_number,
        "restarts": job.restarts,
        "progress": job.progress,
    }


from console.jobs.hang_models import Hang, RankStack  # noqa: E402  (the app's tables)
