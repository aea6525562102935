"""What membership planning reads and writes: plain, frozen dataclasses, no database.

console/jobs/snapshot.py turns rows into a ``Snapshot`` (a job's ``JobView`` and every node's
``NodeView``); console/jobs/planning.py turns a snapshot into a ``Plan`` (a new round) or a
``WorkerPlan`` (a parameter-server round's workers changed in place); console/jobs/wiring.py adds
where the listeners go; console/jobs/rounds.py applies it. The pages read the same views
(console/web/nodes.py: why a pending job waits).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from console.core.states import RoundReason


@dataclass(frozen=True)
class NodeView:
    """A node as planning sees it, with the capacity the other jobs' live rounds leave free, and
    its labels (a job's selector must be among them)."""

    id: int
    name: str
    takes_work: bool  # ONLINE: new rounds may be placed here
    free_slots: int  # CPU rank slots
    free_gpus: tuple[int, ...] = ()  # GPU indices, lowest first
    address: str = "127.0.0.1"  # where peers reach it (a round's listeners bind there)
    # Ports a listener here held or was handed lately (rounds' stores, PS, coordinators): a new
    # round's listeners take others (a store left half-closed made gloo refuse the next one).
    recent_ports: frozenset[int] = frozenset()
    labels: frozenset[tuple[str, str]] = frozenset()  # what an admin set on it (GPU model, zone ...)

    def give(self, slots: int, gpus: tuple[int, ...]) -> NodeView:
        """With ``slots`` and ``gpus`` free again (a job that held them let them go)."""
        return replace(
            self, free_slots=self.free_slots + slots, free_gpus=tuple(sorted({*self.free_gpus, *gpus}))
        )

    def take(self, slots: int, gpus: tuple[int, ...]) -> NodeView:
        return replace(
            self,
            free_slots=self.free_slots - slots,
            free_gpus=tuple(g for g in self.free_gpus if g not in gpus),
        )


@dataclass(frozen=True)
class Hold:
    """What a job's live round holds on one node: CPU slots (a CPU job) or GPU indices."""

    node_id: int
    slots: int = 0
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Process:
    """One process of a parameter-server round: its role ("coordinator", "ps" or "worker"), its
    index within the role and its rank among all the round's processes; where it listens (the
    coordinator and the PS), and a hybrid worker's place in its dense (DDP) group."""

    role: str
    index: int
    rank: int
    port: int | None = None
    dense_rank: int | None = None
    dense_world: int | None = None
    dense_master: str | None = None  # host:port of dense rank 0's store
    # A worker started in a running round: "resize" (the operator's) or "replacement" (a hybrid
    # group after a failure). None: started with its round.
    joined: str | None = None
    removed: bool = False  # taken out of the round (a resize, a hybrid group replaced): stopped
    ended: bool = False  # its host reported its exit (a snapshot's word; not stored in the row)

    @property
    def running(self) -> bool:
        return not self.removed and not self.ended

    def row(self) -> dict[str, Any]:
        """As ``Allocation.processes`` stores it (and protocol.PsProcess carries it)."""
        row: dict[str, Any] = {"role": self.role, "index": self.index, "rank": self.rank}
        if self.port is not None:
            row["port"] = self.port
        if self.joined is not None:
            row["joined"] = self.joined
        if self.dense_master is not None:
            row.update(
                dense_rank=self.dense_rank, dense_world=self.dense_world, dense_master=self.dense_master
            )
        if self.removed:
            row["removed"] = True
        return row

    @classmethod
    def of_row(cls, row: Mapping[str, Any], ended: bool = False) -> Process:
        dense = "dense_master" in row
        return cls(
            str(row["role"]),
            int(row["index"]),
            int(row["rank"]),
            port=int(row["port"]) if "port" in row else None,
            dense_rank=int(row["dense_rank"]) if dense else None,
            dense_world=int(row["dense_world"]) if dense else None,
            dense_master=str(row["dense_master"]) if dense else None,
            joined=str(row["joined"]) if "joined" in row else None,
            removed=bool(row.get("removed")),
            ended=ended,
        )

    def ports(self) -> set[int]:
        """The ports it listens on (its own, and the dense store as dense rank 0)."""
        held = {self.port} if self.port is not None else set()
        if self.dense_master is not None and self.dense_rank == 0:
            held.add(int(self.dense_master.rpartition(":")[2]))
        return held


@dataclass(frozen=True)
class JobView:
    """A job's shape and its current (or, while PENDING, last) round: members by node rank, what
    its live allocations hold, whether it failed or runs, and a parameter-server round's
    processes. console/jobs/snapshot.py's ``job_view`` builds it, for planning and the pages."""

    id: int
    name: str
    min_nodes: int
    max_nodes: int
    desired_nodes: int
    nproc_per_node: int = 1
    gpus_per_proc: int = 0
    priority: int = 0
    members: tuple[int, ...] = ()
    round_number: int = 0  # the round ``members`` are in (0: none yet)
    round_open: bool = True  # that round has not ended: its ranks may still run and must stop
    # A rank of it failed (settling, or ended for it): it is broken like a lost node's.
    round_failed: bool = False
    # Its ranks still run, in a group (an in-place round needs them: not one still re-forming).
    round_running: bool = True
    failed_ranks: tuple[int, ...] = ()  # its failed global ranks (the first failure's, and others)
    holds: tuple[Hold, ...] = ()  # what its live allocations hold, node by node
    inplace: bool = False  # its script keeps its processes across rounds (sdk.elastic)
    # parameter_server jobs: the PS and worker counts (0 for allreduce), and whether the workers
    # all-reduce the dense part in a DDP group of their own (mode "hybrid").
    ps_count: int = 0
    workers: int = 0
    hybrid: bool = False
    # A parameter-server round's processes on each member (by node rank), and whether each
    # member's allocation is live (a host whose part has ended starts nothing more).
    processes: tuple[tuple[Process, ...], ...] = ()
    member_live: tuple[bool, ...] = ()
    # Labels every node of it must have: its pool's selector and its own node selector.
    selector: frozenset[tuple[str, str]] = frozenset()

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes

    @property
    def parameter_server(self) -> bool:
        return self.ps_count > 0

    @property
    def slots_per_node(self) -> int:
        """CPU slots a node of the job needs: nproc_per_node, or for a parameter-server job its
        share of the coordinator, the PS and the workers spread over ``desired_nodes``."""
        if not self.parameter_server:
            return self.nproc_per_node
        total = 1 + self.ps_count + self.workers
        return -(-total // max(1, self.desired_nodes))

    @property
    def gpus_per_node(self) -> int:
        return self.nproc_per_node * self.gpus_per_proc

    @property
    def units_per_node(self) -> int:
        """What quotas count of one node's share: its GPUs, or its CPU slots for a CPU job."""
        return self.gpus_per_node if self.gpus_per_proc else self.slots_per_node

    def needs(self) -> str:
        """What a node must have free for one node's share of the job, in words."""
        where = "".join(f", {k}={v}" for k, v in sorted(self.selector))
        if self.gpus_per_proc:
            return f"{self.gpus_per_node} free GPU(s){where}"
        return f"{self.slots_per_node} free slot(s){where}"


@dataclass(frozen=True)
class Snapshot:
    """One job and every known node, as one decision sees them."""

    job: JobView
    nodes: Mapping[int, NodeView]
    # Node pairs whose pre-flight network check failed (console/cluster/network.py), with what
    # failed: a new round never puts both nodes of such a pair in one job.
    failed_pairs: Mapping[frozenset[int], str] = field(default_factory=dict)

    def reaches(self, node: NodeView, others: Iterable[NodeView]) -> bool:
        """No failed network check between ``node`` and any of ``others``."""
        return not any(frozenset((node.id, o.id)) in self.failed_pairs for o in others if o.id != node.id)

    def fill(
        self, members: Sequence[NodeView], candidates: Sequence[NodeView], target: int
    ) -> list[NodeView]:
        """``members`` plus those ``candidates``, in order, that reach every node taken so far,
        until there are ``target``."""
        grown = list(members)
        for node in candidates:
            if len(grown) >= target:
                break
            if self.reaches(node, grown):
                grown.append(node)
        return grown

    def placeable(self) -> list[NodeView]:
        """The fitting nodes, by name, less those a failed network check keeps apart from the
        ones before them (a greedy pick: the largest set whose pairs all reach each other)."""
        return self.fill([], self.fitting(), len(self.nodes))

    def fits(self, node: NodeView) -> bool:
        """``node`` takes work and has room for one node's share of the job."""
        if not node.takes_work or not self.job.selector <= node.labels:
            return False
        if self.job.gpus_per_proc:
            return len(node.free_gpus) >= self.job.gpus_per_node
        return node.free_slots >= self.job.slots_per_node

    def fitting(self) -> list[NodeView]:
        """Every node the job fits on, by name."""
        return sorted((n for n in self.nodes.values() if self.fits(n)), key=lambda n: n.name)

    def members(self) -> list[NodeView]:
        """The current round's nodes in node-rank order."""
        return [self.nodes[pk] for pk in self.job.members if pk in self.nodes]

    def survivors(self, leaving: int | None = None) -> list[NodeView]:
        """The current round's nodes that can stay in a new round, in node-rank order: those
        that still take work, less ``leaving`` (a node being lost, drained or restarted)."""
        return [n for n in self.members() if n.takes_work and n.id != leaving]

    def free_fitting(self, leaving: int | None = None) -> list[NodeView]:
        """Nodes outside the round that could join it, by name."""
        taken = {*self.job.members, leaving}
        return [n for n in self.fitting() if n.id not in taken]

    def shortfall(self) -> int:
        """How many more fitting nodes (that reach each other) a PENDING job needs before it can be placed."""
        return max(0, self.job.min_nodes - len(self.placeable()))

    def apart(self) -> list[str]:
        """What failed between the fitting nodes (pre-flight checks), one line per pair."""
        fitting = {n.id for n in self.fitting()}
        return [why for pair, why in self.failed_pairs.items() if pair <= fitting]

    def after(self, other: JobView, plan: Plan) -> Snapshot:
        """This snapshot once ``other``'s ``plan`` has been applied: what ``other`` held is free
        again and what the plan gives it is taken (a preemption shrinking a job frees nodes for
        this one), without reading the rows again."""
        nodes = dict(self.nodes)
        for hold in other.holds:
            if hold.node_id in nodes:
                nodes[hold.node_id] = nodes[hold.node_id].give(hold.slots, hold.gpus)
        for place in plan.placements:
            if place.node_id in nodes:
                slots = 0 if other.gpus_per_proc else place.nproc
                nodes[place.node_id] = nodes[place.node_id].take(slots, place.gpus)
        return replace(self, nodes=nodes)


@dataclass(frozen=True)
class Placement:
    """A node's place in the next round."""

    node_id: int
    node_rank: int
    gpus: tuple[int, ...] = ()
    processes: tuple[Process, ...] = ()  # parameter_server jobs only, by local rank
    nproc: int = 1  # its rank processes: nproc_per_node, or its parameter-server processes


@dataclass(frozen=True)
class Plan:
    """The next round of a job, or (no placements) its return to the queue."""

    reason: RoundReason
    placements: tuple[Placement, ...]
    stop: tuple[int, ...]  # nodes whose ranks of the previous round must stop
    stop_at_once: bool  # the previous round is broken: no grace period
    charged: bool  # counted against max_restarts
    # In place: the previous round's ranks that stay, (old global rank, new global rank); their
    # nodes keep them running and start only the others. Empty: every rank starts afresh.
    carry_over: tuple[tuple[int, int], ...] = ()
    carry_from: int = 0  # the round they carry over from
    # Where rank 0's store listens (a parameter-server round: its coordinator): console/jobs/wiring.py.
    master_addr: str = ""
    master_port: int = 0

    @property
    def inplace(self) -> bool:
        return bool(self.carry_over)

    @property
    def world_size(self) -> int:
        return sum(p.nproc for p in self.placements)

    @property
    def requeue(self) -> bool:
        return not self.placements

    @property
    def node_ids(self) -> list[int]:
        return [p.node_id for p in self.placements]


@dataclass(frozen=True)
class WorkerPlan:
    """A parameter-server round's worker role changed in place: the same round on the same
    nodes, new workers started and removed ones stopped while the PS and the coordinator run on
    (a hybrid job's workers all replaced by a new dense group)."""

    reason: RoundReason  # RESIZE (the operator's), or FAILURE (a hybrid group broken: charged)
    round_number: int
    workers: int  # the worker count asked for
    # Every node of the round, by node rank, with its processes after the change (removed ones
    # kept, marked), and its live processes' count.
    placements: tuple[Placement, ...]
    changed: tuple[int, ...]  # nodes whose processes changed: they get the round's spec again
    added: tuple[int, ...]  # worker indexes started
    removed: tuple[int, ...]  # worker indexes stopped
    charged: bool  # counted against max_restarts
    hybrid: bool
    lost: int | None = None  # the failed worker that broke a hybrid group

    @property
    def world_size(self) -> int:
        return max(1, sum(p.nproc for p in self.placements))
