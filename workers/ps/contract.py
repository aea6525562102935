"""The environment contract of a parameter-server job's processes, in one place.

Whoever starts the processes (today a test or ``bench/ps``; later the agent, on the
controller's orders) sets these variables, and the processes read them with ``from_environ``.
It mirrors torchrun's contract: a role, an index within the role, the counts, the addresses to
reach. Hybrid workers additionally get torchrun's own variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ...) for the dense network's process group, which spans the worker role only.

Roles:
- ``coordinator``: one per job; serves data shards, worker membership and the synchronous step
  barrier at TRAINYARD_PS_COORDINATOR.
- ``ps``: index i of TRAINYARD_PS_COUNT; listens on the i-th address of TRAINYARD_PS_ADDRESSES
  and keeps its checkpoints in TRAINYARD_PS_CHECKPOINT_DIR.
- ``worker``: index i of the workers started in its round (the worker count changes while a job
  runs: it is informational); reaches every PS and the coordinator.

Every role gets the job's secret in TRAINYARD_PS_SECRET: the PS and the coordinator answer only
calls that present it (workers/ps/auth.py), so nobody else on the network can read or overwrite
the job's rows. It is required: a server never runs open.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

ENV_ROLE = "TRAINYARD_PS_ROLE"
ENV_INDEX = "TRAINYARD_PS_INDEX"
ENV_PS_COUNT = "TRAINYARD_PS_COUNT"
ENV_WORKER_COUNT = "TRAINYARD_PS_WORKER_COUNT"
ENV_ADDRESSES = "TRAINYARD_PS_ADDRESSES"
ENV_COORDINATOR = "TRAINYARD_PS_COORDINATOR"
ENV_MODE = "TRAINYARD_PS_MODE"
ENV_MAX_STALENESS = "TRAINYARD_PS_MAX_STALENESS"
ENV_SEED = "TRAINYARD_PS_SEED"
ENV_CHECKPOINT_DIR = "TRAINYARD_PS_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_S = "TRAINYARD_PS_CHECKPOINT_EVERY_S"
ENV_MAX_ROWS = "TRAINYARD_PS_MAX_ROWS"
ENV_MAX_DATA_BYTES = "TRAINYARD_PS_MAX_DATA_BYTES"
ENV_LEASE_S = "TRAINYARD_PS_LEASE_S"
ENV_WORKER_ID = "TRAINYARD_PS_WORKER_ID"
ENV_STATS_EVERY_S = "TRAINYARD_PS_STATS_EVERY_S"
ENV_RETRY_S = "TRAINYARD_PS_RETRY_S"
ENV_SECRET = "TRAINYARD_PS_SECRET"

ALL = (
    ENV_ROLE,
    ENV_INDEX,
    ENV_PS_COUNT,
    ENV_WORKER_COUNT,
    ENV_ADDRESSES,
    ENV_COORDINATOR,
    ENV_MODE,
    ENV_MAX_STALENESS,
    ENV_SEED,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_S,
    ENV_MAX_ROWS,
    ENV_MAX_DATA_BYTES,
    ENV_LEASE_S,
    ENV_WORKER_ID,
    ENV_STATS_EVERY_S,
    ENV_RETRY_S,
    ENV_SECRET,
)
# What a gRPC metadata value may hold (printable ASCII, no spaces: it follows "Bearer ").
SECRET_TEXT = re.compile(r"[\x21-\x7e]+")


class Role(StrEnum):
    COORDINATOR = "coordinator"
    PS = "ps"
    WORKER = "worker"


class Mode(StrEnum):
    """How gradients reach the parameters.

    ASYNC: each push is applied on arrival (optionally refused when older than the PS version
    minus ``max_staleness``). SYNC: the PS applies one update per step, averaged over the live
    workers' pushes. HYBRID (after Persia): embedding rows asynchronous on the PS, the dense
    network synchronous by allreduce among the workers (DDP)."""

    ASYNC = "async"
    SYNC = "sync"
    HYBRID = "hybrid"


class ContractError(ValueError):
    """The environment does not describe a valid PS process (the message names the variable)."""


@dataclass(frozen=True)
class PsEnv:
    role: Role
    index: int
    ps_addresses: tuple[str, ...]
    coordinator: str
    mode: Mode = Mode.ASYNC
    worker_count: int = 0
    max_staleness: int | None = None
    seed: int = 0
    checkpoint_dir: str = ""
    checkpoint_every_s: float = 30.0
    max_rows: int | None = None
    # Once started, a PS caps its data segment (RLIMIT_DATA) at its size then plus this many bytes.
    max_data_bytes: int | None = None
    lease_s: float = 10.0
    worker_id: str = ""
    stats_every_s: float = 5.0
    # How long a worker keeps calling a PS or the coordinator that does not answer (restarting).
    retry_s: float = 120.0
    # Kept out of repr: a PsEnv in a log line or a failed assertion must not show it.
    secret: str = field(default="", repr=False)
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def ps_count(self) -> int:
        return len(self.ps_addresses)

    def to_environ(self) -> dict[str, str]:
        """The variables a launcher sets for this process (inverse of ``from_environ``)."""
        env = {
            ENV_ROLE: self.role.value,
            ENV_INDEX: str(self.index),
            ENV_PS_COUNT: str(self.ps_count),
            ENV_WORKER_COUNT: str(self.worker_count),
            ENV_ADDRESSES: ",".join(self.ps_addresses),
            ENV_COORDINATOR: self.coordinator,
            ENV_MODE: self.mode.value,
            ENV_MAX_STALENESS: "" if self.max_staleness is None else str(self.max_staleness),
            ENV_SEED: str(self.seed),
            ENV_CHECKPOINT_DIR: self.checkpoint_dir,
            ENV_CHECKPOINT_EVERY_S: repr(self.checkpoint_every_s),
            ENV_MAX_ROWS: "" if self.max_rows is None else str(self.max_rows),
            ENV_MAX_DATA_BYTES: "" if self.max_data_bytes is None else str(self.max_data_bytes),
            ENV_LEASE_S: repr(self.lease_s),
            ENV_WORKER_ID: self.worker_id,
            ENV_STATS_EVERY_S: repr(self.stats_every_s),
            ENV_RETRY_S: repr(self.retry_s),
            ENV_SECRET: self.secret,
            # torchrun's role variables, so generic tooling sees the role as well.
            "ROLE_NAME": self.role.value,
            "ROLE_RANK": str(self.index),
        }
        env.update(self.extra)
        return env

    @property
    def listen_address(self) -> str:
        """Where this process serves: its own PS address, or the coordinator's."""
        if self.role is Role.PS:
            return self.ps_addresses[self.index]
        if self.role is Role.COORDINATOR:
            return self.coordinator
        raise ContractError("a worker does not listen")

    def default_worker_id(self) -> str:
        return self.worker_id or f"worker-{self.index}-{socket.gethostname()}-{os.getpid()}"


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ContractError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ContractError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ContractError(f"{name} must be a number, got {text!r}") from None
    if not value > 0:
        raise ContractError(f"{name} must be positive, got {value}")
    return value


def _address(name: str, text: str) -> str:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ContractError(f"{name}: {text!r} is not host:port")
    return text.strip()


def _secret(env: Mapping[str, str]) -> str:
    """The job's secret; the messages never echo it."""
    secret = env.get(ENV_SECRET, "").strip()
    if not secret:
        raise ContractError(
            f"{ENV_SECRET} must be set: the job's PS and coordinator answer only callers with it"
        )
    if not SECRET_TEXT.fullmatch(secret):
        raise ContractError(f"{ENV_SECRET} must be printable ASCII without spaces")
    return secret


def from_environ(env: Mapping[str, str] | None = None) -> PsEnv:
    """Reads and checks the contract; raises ``ContractError`` naming the bad variable."""
    env = os.environ if env is None else env
    try:
        role = Role(env.get(ENV_ROLE, "").strip())
    except ValueError:
        raise ContractError(
            f"{ENV_ROLE} must be one of {', '.join(r.value for r in Role)}, got {env.get(ENV_ROLE)!r}"
        ) from None
    try:
        mode = Mode(env.get(ENV_MODE, "").strip() or Mode.ASYNC.value)
    except ValueError:
        raise ContractError(
            f"{ENV_MODE} must be one of {', '.join(m.value for m in Mode)}, got {env.get(ENV_MODE)!r}"
        ) from None
    addresses = tuple(
        _address(ENV_ADDRESSES, part) for part in env.get(ENV_ADDRESSES, "").split(",") if part.strip()
    )
    if not addresses and role is not Role.COORDINATOR:
        raise ContractError(f"{ENV_ADDRESSES} must list the PS addresses (host:port,...)")
    count = _int(env, ENV_PS_COUNT, len(addresses), minimum=1)
    if addresses and count != len(addresses):
        raise ContractError(f"{ENV_PS_COUNT} is {count} but {ENV_ADDRESSES} lists {len(addresses)}")
    coordinator_text = env.get(ENV_COORDINATOR, "").strip()
    if not coordinator_text:
        raise ContractError(f"{ENV_COORDINATOR} must be the coordinator's host:port")
    index = _int(env, ENV_INDEX, 0) or 0
    if role is Role.PS and index >= len(addresses):
        raise ContractError(f"{ENV_INDEX} is {index} but there are {len(addresses)} PS")
    return PsEnv(
        role=role,
        index=index,
        ps_addresses=addresses,
        coordinator=_address(ENV_COORDINATOR, coordinator_text),
        mode=mode,
        worker_count=_int(env, ENV_WORKER_COUNT, 0) or 0,
        max_staleness=_int(env, ENV_MAX_STALENESS, None),
        seed=_int(env, ENV_SEED, 0) or 0,
        checkpoint_dir=env.get(ENV_CHECKPOINT_DIR, "").strip(),
        checkpoint_every_s=_float(env, ENV_CHECKPOINT_EVERY_S, 30.0),
        max_rows=_int(env, ENV_MAX_ROWS, None, minimum=1),
        max_data_bytes=_int(env, ENV_MAX_DATA_BYTES, None, minimum=1),
        lease_s=_float(env, ENV_LEASE_S, 10.0),
        worker_id=env.get(ENV_WORKER_ID, "").strip(),
        stats_every_s=_float(env, ENV_STATS_EVERY_S, 5.0),
        retry_s=_float(env, ENV_RETRY_S, 120.0),
        secret=_secret(env),
    )
