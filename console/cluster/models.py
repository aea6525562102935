"""The cluster inventory: nodes (hosts running an agent) and their GPUs."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.core.states import NodeState


class Node(models.Model):
    """A host running a Trainyard agent. The name is the agent's identity and queue."""

    name = models.SlugField(max_length=64, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    address = models.CharField(max_length=255, blank=True, help_text="Address peers reach this host at")
    interface = models.CharField(
        max_length=64, blank=True, help_text="Interface holding the address: the ranks' transports use it"
    )
    state = models.CharField(
        max_length=16, choices=NodeState.choices, default=NodeState.ONLINE, db_index=True
    )
    cpus = models.PositiveIntegerField(default=0)
    memory_bytes = models.PositiveBigIntegerField(default=0)
    slots = models.PositiveIntegerField(default=0, help_text="CPU rank slots when a job asks for no GPUs")
    agent_version = models.CharField(max_length=32, blank=True)
    torch_version = models.CharField(max_length=32, blank=True)
    cpu_percent = models.FloatField(default=0.0)
    memory_percent = models.FloatField(default=0.0)
    registered_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(null=True, blank=True, db_index=True)
    agent_session = models.CharField(
        max_length=64, blank=True, help_text="Changes each time the agent starts"
    )
    agent_protocol = models.PositiveSmallIntegerField(
        default=0, help_text="workers.protocol.PROTOCOL_VERSION"
    )
    # A peer's broken collective made this node a suspect: the controller asked it for a heartbeat
    # then (console/cluster/watch.py's suspect) and declares it LOST if none comes by PING_DEADLINE.
    pinged_at = models.DateTimeField(null=True, blank=True)
    # Set by an admin (GPU model, zone, anything): node pools and jobs' node selectors match them.
    labels = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def node_state(self) -> NodeState:
        return NodeState(self.state)

    def set_state(self, new: NodeState) -> None:
        if self.state == new:
            return
        self.node_state.check_transition(new)
        self.state = new

    @property
    def queue(self) -> str:
        return f"node.{self.name}"

    @classmethod
    def mark_seen(cls, name: str, at: datetime) -> None:
        """Any report from a node's agent proves its host is alive, like a heartbeat."""
        cls.objects.filter(name=name).update(last_heartbeat=at)

    def heartbeat_overdue(self) -> bool:
        if self.last_heartbeat is None:
            return True
        limit = timedelta(seconds=settings.HEARTBEAT_INTERVAL * settings.HEARTBEAT_MISSES)
        return timezone.now() - self.last_heartbeat > limit


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=128)
    uuid = models.CharField(max_length=64, blank=True)
    memory_bytes = models.PositiveBigIntegerField(default=0)
    utilization = models.FloatField(default=0.0)
    memory_used_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} {self.name}"


class JoinToken(models.Model):
    """A one-time token an operator creates so that a new host can enrol (console/cluster/tokens.py).

    Only its hash is stored; the raw value is shown once. It expires, and is spent by the first
    enrolment that presents it."""

    name = models.CharField(max_length=64, help_text="What it is for, e.g. the host it was made for")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, db_index=True)
    node_name = models.SlugField(
        max_length=64, blank=True, help_text="Only this node may enrol with it; any name when empty"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.SlugField(max_length=64, blank=True, help_text="The node that enrolled with it")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def expired(self) -> bool:
        return self.expires_at <= timezone.now()


class NodeCredential(models.Model):
    """A node's own secret, received at enrolment; only its hash is stored. One per node name
    (a new enrolment replaces it); revoked, it is refused for every message and download."""

    node_name = models.SlugField(max_length=64, unique=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(default=timezone.now)
    join_token = models.ForeignKey(
        JoinToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_refused_at = models.DateTimeField(
        null=True, blank=True, help_text="When a message or download with it was last refused (revoked)"
    )

    class Meta:
        ordering = ["node_name"]

    def __str__(self) -> str:
        return f"{self.node_name} ({self.prefix}…){' revoked' if self.revoked else ''}"


class NetworkCheck(models.Model):
    """One pre-flight network check over a set of nodes (console/cluster/network.py): each
    node's agent probed the others and answered with its ``PreflightResult`` (``results``, by
    node name). Why it ran: a node enrolled, a job's first round on nodes not checked together,
    or an operator asked."""

    class Reason(models.TextChoices):
        ENROLMENT = "enrolment"
        FIRST_ROUND = "first_round"
        OPERATOR = "operator"

    reason = models.CharField(max_length=16, choices=Reason.choices)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    deadline_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    nodes = models.JSONField(default=list, help_text="Node names checked")
    ports = models.JSONField(default=dict, help_text="Node name → its listen port (rounds avoid them)")
    results = models.JSONField(default=dict, help_text="Node name → its PreflightResult")

    class Meta:
        ordering = ["-created_at"]

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    @property
    def silent(self) -> list[str]:
        """Nodes that have not answered (yet)."""
        return [n for n in self.nodes if n not in self.results]


class NodeLink(models.Model):
    """The latest word on one direction of a node pair: ``source`` probed ``target``'s listener
    in a pre-flight check. A pair whose link fails in either direction keeps jobs off it
    (console/jobs/planning.py reads ``network.bad_pairs``)."""

    source = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="links_out")
    target = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="links_in")
    check_run = models.ForeignKey(NetworkCheck, on_delete=models.CASCADE, related_name="links")
    ok = models.BooleanField()
    latency_ms = models.FloatField(null=True, blank=True)
    bandwidth_mbps = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["source__name", "target__name"]
        constraints = [models.UniqueConstraint(fields=["source", "target"], name="node_link_unique_pair")]

    def __str__(self) -> str:
        return f"{self.source} → {self.target}: {'ok' if self.ok else 'failed'}"
