"""The wire contract between the console (controller, ingest) and the agents.

Both sides import this module; it imports nothing from either, so an agent host needs no Django
and the console needs no agent code. Every message names (job, round); a receiver ignores a
message for a round older than the one it already knows (fencing).

Transport:
- Controller → agent: Celery tasks on queue ``node.<name>`` (names AGENT_*), JSON kwargs.
- Agent → controller: Celery tasks on queue ``control`` (names CONTROL_*), JSON kwargs. Every
  one carries ``token`` (the node's credential, workers/agent/credential.py) and ``node`` (the agent's name).
- Telemetry: agents XADD to the Redis stream TELEMETRY_STREAM, each entry sealed with the node's
  report key; ingest reads it with a consumer group and acks after its database commit.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NotRequired, TypedDict

CONTROL_QUEUE = "control"
TELEMETRY_STREAM = "trainyard:telemetry"
TELEMETRY_GROUP = "ingest"


def node_queue(name: str) -> str:
    return f"node.{name}"


# --- controller → agent --------------------------------------------------------------------
AGENT_START_ROUND = "trainyard.agent.start_round"
"""kwargs: ``spec`` (RoundSpec). Stop this job's older round on the host (graceful), then start
this one. Ignored when the host already runs or ran a newer round of the job; for the round it
runs, only a parameter-server round's changed worker processes are acted on (PsRound)."""

AGENT_STOP_JOB = "trainyard.agent.stop_job"
"""kwargs: ``job_id``, ``round`` (stop this round and any older), ``grace_period`` (seconds)."""

AGENT_SYNC = "trainyard.agent.sync"
"""kwargs: ``rounds`` (list of RoundSpec the host should be running now). The agent stops
every local round not in the list and starts listed rounds it is not running. Sent after
registration and whenever the controller wants to repair drift."""

# --- agent → controller --------------------------------------------------------------------
CONTROL_REGISTER = "trainyard.control.register"
"""kwargs: token, node, session, info (NodeInfo)."""

CONTROL_HEARTBEAT = "trainyard.control.heartbeat"
"""kwargs: token, node, session, load (NodeLoad), rounds (list of RoundStatus)."""

CONTROL_RANK_EXITED = "trainyard.control.rank_exited"
"""kwargs: token, node, job_id, round, exit (RankExit). Sent for every rank that ends on its
own (not when the agent stopped it), success or failure, within a second of the exit."""

CONTROL_ROUND_ENDED = "trainyard.control.round_ended"
"""kwargs: token, node, job_id, round, outcome ("succeeded" | "failed" | "stopped"),
failures (list of RankExit). Sent once the last local rank of a round has ended."""

CONTROL_OFFLINE = "trainyard.control.node_offline"
"""kwargs: token, node, session. Sent by an agent that shuts down cleanly."""

AGENT_REGISTER_AGAIN = "trainyard.agent.register_again"
"""kwargs: ``reason`` (text). The controller got a heartbeat it cannot place (the node is unknown,
OFFLINE or LOST, or the session is not the registered one): the agent registers again at once."""

AGENT_HEARTBEAT_NOW = "trainyard.agent.heartbeat_now"
"""No kwargs. A rank failure waits for every host of its round to show it is alive since: the
agent sends its next heartbeat at once instead of at the end of its interval."""


AGENT_COLLECT_STACKS = "trainyard.agent.collect_stacks"
"""kwargs: ``job_id``, ``round``, ``reason`` (text). Another host of the round hung, or its ranks
drifted apart: the agent answers with CONTROL_HANG_REPORTED for its ranks of that round (their
stacks), whether or not it sees them stalled itself."""

CONTROL_HANG_REPORTED = "trainyard.control.hang_reported"
"""kwargs: token, node, job_id, round, report (HangReport). A local rank of the round made no
progress for longer than the job's hang threshold (workers/agent/hang.py), or the controller
asked (AGENT_COLLECT_STACKS): every local rank's stacks. Sent once per stall."""

PROTOCOL_VERSION = 2
"""The wire contract's version, sent in NodeInfo. 2: pre-flight network checks (AGENT_PREFLIGHT,
CONTROL_PREFLIGHT) and the version itself. A console refuses a registration below
MIN_PROTOCOL_VERSION (AGENT_REFUSED): the agent must be upgraded."""
MIN_PROTOCOL_VERSION = 2

AGENT_PREFLIGHT = "trainyard.agent.preflight"
"""kwargs: ``request`` (PreflightRequest). Listen on ``listen_port`` at the node's address until
every peer has probed it (or ``deadline`` passes), probe every peer (TCP reach, latency,
bandwidth), the console URL and DNS, then answer CONTROL_PREFLIGHT. Runs beside the node's other
work (workers/agent/preflight.py)."""

CONTROL_PREFLIGHT = "trainyard.control.preflight"
"""kwargs: token, node, check_id, result (PreflightResult)."""

AGENT_REFUSED = "trainyard.agent.refused"
"""kwargs: ``reason`` (text). The console refused this agent's registration (it speaks an older
protocol than the console needs): the agent logs the reason and stops."""


class PreflightPeer(TypedDict):
    node: str
    address: str
    port: int  # where its pre-flight listener is (a port of the round range)


class PreflightRequest(TypedDict):
    check_id: int
    listen_port: int
    peers: list[PreflightPeer]
    console_url: str  # the console's own idea of its URL; the agent prefers the one it enrolled at
    deadline: float  # seconds the whole check may take on this host
    bandwidth_bytes: int  # sent to each peer to time the bandwidth


class PeerResult(TypedDict):
    node: str
    ok: bool
    latency_ms: float | None  # median of a few 1-byte round trips
    bandwidth_mbps: float | None  # megabits per second, bandwidth_bytes sent and acknowledged
    error: str


class PreflightResult(TypedDict):
    listening: bool  # its own listener was up (else its peers' failures to reach it say nothing)
    listen_error: str
    console_ok: bool
    console_ms: float | None
    console_error: str
    dns_ms: float | None  # forward look-up of the console's host name
    reverse_dns_ms: float | None  # reverse look-up of its own address (c10d's store does one per client)
    dns_error: str
    peers: list[PeerResult]
    seconds: float  # how long the check took on this host


class IllegalMove(Exception):
    """A move its machine's table does not list."""


class RankState(StrEnum):
    """A rank process on a host: RUNNING until it ends on its own (SUCCEEDED, FAILED) or is
    stopped (STOPPED). The agent moves it (``workers/agent/lifecycle.py``'s ``Rank.set_state``)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_final(self) -> bool:
        return not RANK_TRANSITIONS[self]

    def can_become(self, new: RankState) -> bool:
        return new in RANK_TRANSITIONS[self]


RANK_TRANSITIONS: dict[RankState, frozenset[RankState]] = {
    RankState.RUNNING: frozenset({RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED}),
    RankState.SUCCEEDED: frozenset(),
    RankState.FAILED: frozenset(),
    RankState.STOPPED: frozenset(),
}


class RoundState(StrEnum):
    """A round on one host, as its agent reports it in heartbeats and CONTROL_ROUND_ENDED.

    STARTING (preparing, launching) → RUNNING → STOPPING → SUCCEEDED | FAILED | STOPPED; a round
    whose launch fails goes STARTING → STOPPING | FAILED. An in-place round (carry_over) is
    RUNNING from the start. The table is what a report may show after the last one; the agent's
    finer states (`LocalState`, workers/agent/lifecycle.py) project onto it, and a move between
    two of those never projects onto a move this table lacks (tests/test_agent_local_states.py).
    Reports are samples: a heartbeat may miss a state in between (RUNNING, then FAILED)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_final(self) -> bool:
        return not ROUND_TRANSITIONS[self]

    def can_become(self, new: RoundState) -> bool:
        return new in ROUND_TRANSITIONS[self]


ROUND_TRANSITIONS: dict[RoundState, frozenset[RoundState]] = {
    RoundState.STARTING: frozenset({RoundState.RUNNING, RoundState.STOPPING, RoundState.FAILED}),
    RoundState.RUNNING: frozenset({RoundState.STOPPING, RoundState.SUCCEEDED}),
    RoundState.STOPPING: frozenset({RoundState.STOPPED, RoundState.FAILED}),
    RoundState.SUCCEEDED: frozenset(),
    RoundState.FAILED: frozenset(),
    RoundState.STOPPED: frozenset(),
}


class InplaceStatus(StrEnum):
    """How far an in-place rank is with the round it was told about: the SDK writes it per rank
    (workers/sdk/elastic_control.py's state file), the agent reports one per host in heartbeats
    (``RoundStatus.inplace``, from its ranks': ``workers/agent/monitor.py``'s ``inplace_state``)
    and the console keeps the host's last word (``Allocation.inplace``).

    FORMING: re-forming the process group at the round (a host: not every local rank formed yet).
    FORMED: formed (a host: every local rank formed or left).
    FAILED: could not form; the controller falls back to a restart.
    LEFT: this rank's node left the job at the round (per rank only; a host reports FORMED).
    WAITING: a peer died mid-step; the rank waits for the next round (a host: one rank waits, so
        the host is alive since the failure: failures.settle_failure's proof of life).
    """

    FORMING = "forming"
    FORMED = "formed"
    FAILED = "failed"
    LEFT = "left"
    WAITING = "waiting"

    @classmethod
    def _missing_(cls, value: object) -> InplaceStatus | None:
        # Agents before this enum reported a host not yet formed as "pending".
        return cls.FORMING if value == "pending" else None


class BundleRef(TypedDict):
    sha256: str
    # HTTP URL of the archive at the console's TRAINYARD_PUBLIC_URL. An agent that knows the
    # console URL it enrolled with fetches BUNDLE_PATH there instead (with the node's credential
    # as bearer): the console's own idea of its address may not be one the host can reach.
    url: str


BUNDLE_PATH = "/api/v1/bundles/{sha256}/archive/"


class PsProcess(TypedDict):
    role: str  # "coordinator" | "ps" | "worker" (workers/ps/contract.py's Role)
    index: int  # within the role
    rank: int  # among all the round's processes
    # A worker the controller took out when the worker role shrank: stopped, not restarted.
    # Local ranks keep their places, so a removed process stays in the list.
    removed: NotRequired[bool]
    # Hybrid mode: the worker's place in the dense (DDP) group of the workers started with it;
    # a worker change starts a new group (new workers, a new port), the PS run on.
    dense_rank: NotRequired[int]
    dense_world: NotRequired[int]
    dense_master: NotRequired[str]  # host:port of dense rank 0's store


class PsRound(TypedDict):
    """A parameter_server round's layout, the same for every host but ``processes``."""

    mode: str  # workers/ps/contract.py's Mode
    coordinator: str  # host:port
    addresses: list[str]  # PS i listens on addresses[i] (host:port)
    worker_count: int
    processes: list[PsProcess]  # this host's processes, by local rank (nproc_per_node of them)
    # The job's secret (the same in every round): its PS and coordinator answer only callers with
    # it (workers/ps/auth.py). Absent from an older console: the servers then refuse to start.
    secret: NotRequired[str]
    # The worker role is resized in place: AGENT_START_ROUND again for the same round with more
    # processes (started) or some marked removed (stopped); the other ranks run on untouched.


class CarryOver(TypedDict):
    """An in-place round (SDK jobs, workers/sdk/elastic.py): the previous round's ranks that stay.

    A host running ``from_round`` keeps those of its ranks that ``ranks`` maps (old global rank,
    a JSON string key, to new global rank) running, writes each its new control file, and starts
    only the round's other local ranks. A host not running ``from_round`` starts the round as usual."""

    from_round: int
    ranks: dict[str, int]


class RoundSpec(TypedDict):
    job_id: int
    round: int
    run_id: str
    node_rank: int
    nnodes: int
    nproc_per_node: int
    world_size: int
    master_addr: str
    master_port: int
    workload: str  # built-in workload name, or "" when entrypoint is set
    entrypoint: str  # script path (".py") or executable, relative to the bundle/workdir
    args: list[str]
    bundle: BundleRef | None
    workdir: str  # host path to run in when there is no bundle ("" = agent's default)
    env: dict[str, str]
    hyperparameters: dict[str, Any]
    strategy: str
    precision: str
    grad_accum_steps: int
    gpu_indices: list[int]
    restart_count: int
    max_restarts: int
    grace_period: float
    # parameter_server jobs only: each local rank is one process of a role, started with the
    # environment of workers/ps/contract.py (workers/agent/launcher.py).
    ps: NotRequired[PsRound]
    # In-place rounds only (the job's script uses sdk.elastic): survivors keep their processes.
    carry_over: NotRequired[CarryOver]
    # In-place jobs whose rank failures the controller recovers in place: a failed rank does not
    # stop the host's other ranks (their SDK waits for the next round, which carries them over).
    recover_in_place: NotRequired[bool]
    # The interface this host's ranks bind torch's transports to (GLOO_SOCKET_IFNAME,
    # NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME; not where the job's env sets them): the one holding
    # the address the host registered with.
    interface: NotRequired[str]
    # The job's hang detection (HangPolicy); absent: the defaults of workers/agent/hang.py.
    hang: NotRequired[HangPolicy]


class HangPolicy(TypedDict, total=False):
    """A job's hang detection (the job spec's ``hang``; console/jobs/hangs.py checks it).

    A rank is stalled once its progress stops for longer than its threshold: ``timeout_s`` when
    set, else ``multiple`` x the median gap between its step reports, at least ``floor_s``;
    before its first step ``first_step_s``. ``action`` once the job hangs: "notify" (the event
    only), "restart" (a new round, charged as a failure) or "fail". ``max_drift_steps``: ranks
    further apart than this many steps hang too (0 = off)."""

    timeout_s: float
    multiple: float
    floor_s: float
    first_step_s: float
    action: str
    max_drift_steps: int


class StackFrame(TypedDict):
    name: str
    file: str
    line: int


class ThreadStack(TypedDict):
    name: str  # the thread's name, or its id
    idle: bool
    frames: list[StackFrame]  # innermost first


class RankStack(TypedDict):
    rank: int
    local_rank: int
    pid: int
    process_state: str  # psutil's status: "running", "sleeping", "stopped" (SIGSTOP), ...
    step: int | None  # the last step the rank reported
    stalled_s: float  # seconds since its last progress
    cpu_percent: float  # over the last sample
    threads: list[ThreadStack]  # py-spy's dump: the main thread first
    native: bool  # native frames included (py-spy --native)
    error: str  # why no stack could be read ("" when it could)
    flight_recorder: NotRequired[str]  # NCCL Flight Recorder dump file, when one was written


class HangReport(TypedDict):
    reason: str  # "stall" (this host saw it), "asked" (AGENT_COLLECT_STACKS), "drift"
    detected_at: float  # unix time
    threshold_s: float  # the longest threshold of the stalled ranks
    stalled: list[int]  # global ranks of this host past their threshold
    ranks: list[RankStack]  # every local rank of the round


class GpuInfo(TypedDict):
    index: int
    name: str
    uuid: str
    memory_bytes: int


class NodeInfo(TypedDict):
    hostname: str
    address: str  # an IP address peers reach the host at (workers/agent/network.py), never a name
    # The interface holding it: the console puts it into every rank's GLOO_/NCCL_/TP_SOCKET_IFNAME.
    interface: NotRequired[str]
    # Set when a reverse DNS look-up of the address was slow (torch's c10d store makes one per
    # rank that connects): what the operator should fix.
    dns_warning: NotRequired[str]
    cpus: int
    memory_bytes: int
    slots: int
    gpus: list[GpuInfo]
    torch_version: str
    agent_version: str
    protocol: NotRequired[int]  # PROTOCOL_VERSION; agents before it sent none (version 1)


class GpuLoad(TypedDict):
    index: int
    utilization: float
    memory_used_bytes: int


class NodeLoad(TypedDict):
    cpu_percent: float
    memory_percent: float
    gpus: list[GpuLoad]


class RankStatus(TypedDict):
    local_rank: int
    rank: int
    pid: int
    state: RankState


class RoundStatus(TypedDict):
    job_id: int
    round: int
    state: RoundState
    ranks: list[RankStatus]
    # Latest step any local rank logged in this round (a round that carries ranks over in place
    # goes on from the step they had reached in the round before).
    last_step: int | None
    first_step_at: float | None  # unix time of the first step logged in this round
    # The script's own total (sdk.progress: the newest ``total_steps`` a local rank logged).
    total_steps: NotRequired[int]
    # In-place rounds only, from the SDK's state files: InplaceStatus (forming, formed, failed or
    # waiting; see there).
    inplace: NotRequired[InplaceStatus]
    inplace_reason: NotRequired[str]
    inplace_formed_at: NotRequired[float]  # unix time the host's last rank formed the round
    # Each local rank's last reported step (global rank as a JSON string key): the controller
    # compares hosts' for drift (console/jobs/hangs.py).
    rank_steps: NotRequired[dict[str, int]]


class RankExit(TypedDict):
    local_rank: int
    rank: int
    pid: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None  # e.g. "SIGKILL"
    error: str  # error file message, or the last stderr lines
    at: float  # unix time the exit was noticed
    # Set when the rank's Python code had ended (exit_code is the status it ended with) and the
    # process then died by this signal, or hung and was killed ("hung"), in the interpreter's
    # teardown (workers/agent/runner.py says why torch 2.13 gloo ranks can).
    teardown: NotRequired[str]
    # Set when the rank never started: the agent could not launch it (bundle, entrypoint,
    # interpreter); the error says why. The console calls it a launch failure (console/jobs/backoff.py).
    launch: NotRequired[bool]


# --- telemetry -----------------------------------------------------------------------------
# The SDK (inside a rank) appends JSON lines to the file named by TRAINYARD_TELEMETRY; the
# agent tails those files and each rank's stdout/stderr, and XADDs batches to TELEMETRY_STREAM,
# one entry per batch (workers/signing.py ``telemetry_entry``) with the fields "batch" (JSON),
# "node" (the agent's name) and "mac" (hex HMAC-SHA256 over the node's name and the batch's exact
# bytes, keyed by the node's report key). The batch:
#   {"job_id": J, "round": R, "rank": K, "node": name, "records": [record, ...]}
# Ingest drops (and acks) an entry that is unsealed, whose MAC does not verify with a live key
# of the node it names, or whose (job, round, rank) the console did not allocate to that node.
# Records (all have "kind", "seq" (per rank and kind-family, monotonic), "t" (unix seconds)):
#   {"kind": "metric", "seq", "t", "step", "values": {"loss": 0.31, ...}}
#   {"kind": "event", "seq", "t", "event": "gradient_anomaly", "severity", "message", "data"}
#   {"kind": "checkpoint", "seq", "t", "step", "path", "size_bytes", "blocking_ms"}
#   {"kind": "log", "seq", "t", "stream": "stdout" | "stderr", "text"}
#   {"kind": "dropped", "seq", "t", "count"}  (agent: metric points dropped past its buffer)

ENV_TELEMETRY = "TRAINYARD_TELEMETRY"
ENV_JOB_ID = "TRAINYARD_JOB_ID"
ENV_ROUND = "TRAINYARD_ROUND"
ENV_CHECKPOINT_DIR = "TRAINYARD_CHECKPOINT_DIR"
ENV_HYPERPARAMETERS = "TRAINYARD_HYPERPARAMETERS"
ENV_PRECISION = "TRAINYARD_PRECISION"
ENV_GRAD_ACCUM = "TRAINYARD_GRAD_ACCUM_STEPS"
ENV_STRATEGY = "TRAINYARD_STRATEGY"
ENV_NODE = "TRAINYARD_NODE"
# Where the rank may write TensorBoard event files (one directory per rank of a round, under the
# job's checkpoint directory, so `tensorboard --logdir` on it shows every rank and round): the agent
# reads their scalars and ships them as metric records (workers/agent/tensorboard.py), as it does
# the event files a rank's process writes under `runs/` in its working directory.
ENV_TENSORBOARD_DIR = "TRAINYARD_TENSORBOARD_DIR"
# Trackers sdk.log mirrors to (comma-separated: "tensorboard", "mlflow"); workers/sdk/trackers.py.
ENV_TRACKERS = "TRAINYARD_TRACKERS"
# Each rank's control file (workers/sdk/elastic_control.py): the agent writes the round the rank is in
# (job_id, round, rank (-1 = leave), local_rank, world_size, master_addr, master_port); the SDK
# writes its InplaceStatus (with round, step) to the same path plus ".state".
ENV_CONTROL = "TRAINYARD_CONTROL"
# Each rank's step cell (workers/sdk/progress_cell.py): sdk.step writes the step it completed; the
# agent reads it for hang detection and the heartbeats' per-rank steps.
ENV_PROGRESS = "TRAINYARD_PROGRESS"
