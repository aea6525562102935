"""``sdk.ps``: write your own parameter-server job (pull/push over sharded tables, a shard iterator).

A worker script, started with the PS environment contract (workers/ps/contract.py)::

    from workers import sdk

    ps = sdk.ps.connect()                                     # PS addresses, coordinator, mode
    users = ps.embedding_bag("users", dim=16, optimizer=sdk.ps.Adam(lr=0.05))
    model = MyModel(users)                                    # use it like nn.EmbeddingBag
    ps.dense(model.top, sdk.ps.Adam(lr=1e-3))                 # dense parameters (on the PS, or DDP)
    for batch in ps.batches(sdk.ps.Dataset(examples=N, shard_size=4096, batch_size=256, epochs=1)):
        with ps.step(batch):                                  # pulls; on exit pushes the gradients
            loss = loss_fn(model(*load(batch.start, batch.end)))
            loss.backward()
    ps.close()

Modes (TRAINYARD_PS_MODE): ``async`` (every push applied on arrival; a push older than the
PS version minus TRAINYARD_PS_MAX_STALENESS is refused and the batch recomputed), ``sync``
(``batches`` passes the coordinator's step barrier; the PS applies one averaged update per step)
and ``hybrid`` (rows asynchronous on the PS; ``dense`` keeps the module local with a torch
optimizer: wrap it in DistributedDataParallel yourself, over the worker role's process group,
and iterate ``for batches in ps.passes(dataset): with Join([ddp]): for batch in batches: ...``:
workers get uneven shard counts, and one may have none while a peer all-reduces the last).
In hybrid mode the PS also keeps a copy of the dense weights: ``dense`` loads it (the first
worker's initial values, or the weights saved before a new worker round), and the dense group's
rank 0 saves its weights there every TRAINYARD_PS_DENSE_SAVE_S seconds (default 10) and on
``close``, so workers that replace the whole group carry on from them, not from a new init.

Each batch is pushed under its (epoch, shard, batch) key, so the PS applies it once even when
the shard is re-done after a worker died; the shard is completed at the coordinator after its
last batch was pushed. Worker statistics (examples/s, staleness, pull/push latency) go to the
SDK's telemetry as ``worker_*`` metrics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from types import TracebackType

import torch
from torch import nn
from torch.nn import functional as F

from workers.ps import contract
from workers.ps.client import Batch, CoordinatorClient, PsClient, PushOutcome, StepInfo
from workers.ps.contract import Mode, PsEnv
from workers.ps.coordinator import Dataset
from workers.ps.optim import OptimizerConfig
from workers.ps.store import TableConfig
from workers.sdk.telemetry import telemetry

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "Batch",
    "Dataset",
    "Mode",
    "Session",
    "ShardedEmbeddingBag",
    "connect",
]

# Worker statistics are reported every this many pushes, or after this many seconds (a slow
# worker still shows up on the console's job page).
STATS_EVERY = 20
STATS_EVERY_S = 5.0
ENV_DENSE_SAVE_S = "TRAINYARD_PS_DENSE_SAVE_S"
# Hybrid mode: how long a worker whose peers hold the last shards waits before asking again.
PASS_POLL_S = 0.05


def SGD(lr: float) -> OptimizerConfig:
    return OptimizerConfig("sgd", lr=lr)


def Adagrad(lr: float, eps: float = 1e-10, initial_accumulator: float = 0.0) -> OptimizerConfig:
    return OptimizerConfig("adagrad", lr=lr, eps=eps, initial_accumulator=initial_accumulator)


def Adam(lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> OptimizerConfig:
    return OptimizerConfig("adam", lr=lr, beta1=betas[0], beta2=betas[1], eps=eps)


def connect(env: PsEnv | None = None, device: torch.device | str = "cpu") -> Session:
    """A session for this worker from the environment contract (or ``env``)."""
    return Session(env or contract.from_environ(), device=torch.device(device))


class ShardedEmbeddingBag(nn.Module):
    """``nn.EmbeddingBag`` over a table sharded across the PS: no local weight; rows are pulled
    for the ids of each batch and their gradients pushed when the step ends."""

    def __init__(self, session: Session, name: str, dim: int, mode: str = "mean") -> None:
        super().__init__()
        self.session = session
        self.name = name
        self.dim = dim
        self.mode = mode

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        weight = self.session.rows(self.name, unique.cpu())
        positions = inverse.view(ids.shape)
        return F.embedding_bag(positions, weight, offsets, mode=self.mode)


class Step:
    """One batch: pulls what it needs, pushes gradients on a clean exit (see ``Session.step``)."""

    def __init__(self, session: Session, batch: Batch | None, info: StepInfo | None) -> None:
        self.session = session
        self.batch = batch
        self.info = info
        self.segments: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.versions: dict[int, int] = {}
        self.outcome: PushOutcome | None = None

    def _merge(self, versions: dict[int, int]) -> None:
        for ps, version in versions.items():
            self.versions[ps] = min(version, self.versions.get(ps, version))

    def _pull(
        self, tables: dict[str, torch.Tensor], dense: list[str], all_ps: bool = False
    ) -> dict[str, torch.Tensor]:
        rows, values, versions = self.session.client.pull(tables, dense, self.info, all_ps=all_ps)
        self._merge(versions)
        for name, ids in tables.items():
            leaf = rows[name].to(self.session.device).requires_grad_(True)
            self.segments.setdefault(name, []).append((ids, leaf))
        return values

    def prefetch(self, tables: dict[str, torch.Tensor]) -> None:
        """Pulls the rows of several tables in one round trip (ids may repeat)."""
        self._pull({name: torch.unique(ids.reshape(-1).cpu()) for name, ids in tables.items()}, [])

    def rows(self, table: str, unique: torch.Tensor) -> torch.Tensor:
        for ids, leaf in self.segments.get(table, []):
            if ids.numel() == 0:
                continue
            where = torch.searchsorted(ids, unique).clamp_(max=ids.numel() - 1)
            if bool((ids[where] == unique).all()):
                return leaf[where.to(leaf.device)]
        self._pull({table: unique}, [])
        return self.segments[table][-1][1]

    def __enter__(self) -> Step:
        session = self.session
        session._current = self
        sync = session.mode is Mode.SYNC
        if session.dense_on_ps or sync:
            values = self._pull({}, session.dense_names, all_ps=sync)
            session._load_dense(values)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        session = self.session
        session._current = None
        if kind is not None:
            return  # nothing pushed: the shard's lease runs out or the worker leaves, and it is re-done
        tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, segments in self.segments.items():
            ids = torch.cat([segment_ids for segment_ids, _ in segments])
            grads = torch.cat(
                [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for _, leaf in segments]
            )
            tables[name] = (ids, grads.detach().float().cpu())
        dense = session._dense_grads()
        batch = self.batch
        self.outcome = session.client.push(
            batch.key if batch else None,
            tables,
            dense,
            self.versions,
            batch.examples if batch else 1,
            self.info,
            all_ps=session.mode is Mode.SYNC,
        )
        if session.local_optimizer is not None:
            session.local_optimizer.step()
            session.local_optimizer.zero_grad(set_to_none=True)
        session._after_push(self)


class Session:
    """A worker's connection to the PS and the coordinator (``connect()`` makes one)."""

    def __init__(self, env: PsEnv, device: torch.device | None = None) -> None:
        self.env = env
        self.mode = env.mode
        self.worker = env.default_worker_id()
        self.device = device or torch.device("cpu")
        self.client = PsClient(env.ps_addresses, self.worker, retry_s=env.retry_s, secret=env.secret)
        self.coordinator = CoordinatorClient(
            env.coordinator, self.worker, retry_s=env.retry_s, secret=env.secret
        )
        self.tables: dict[str, TableConfig] = {}
        self.dense_module: nn.Module | None = None
        self.dense_names: list[str] = []
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._current: Step | None = None
        self._retry: Batch | None = None
        self.step_info: StepInfo | None = None  # synchronous mode: the step of the current batch
        self.dense_save_every_s = float(os.environ.get(ENV_DENSE_SAVE_S, "10"))
        self._dense_saved_at = time.monotonic()
        # Statistics.
        self.pushes = 0
        self.examples = 0
        self.stale_retries = 0
        self.duplicates = 0
        self.first_push_at: float | None = None
        self._window_start = time.monotonic()
        self._window_examples = 0
        self._window_staleness: list[int] = []

    @property
    def dense_on_ps(self) -> bool:
        return self.dense_module is not None and self.mode is not Mode.HYBRID

    # --- model ------------------------------------------------------------------------------
    def embedding_bag(
        self, name: str, dim: int, optimizer: OptimizerConfig, init_std: float = 0.01, mode: str = "mean"
    ) -> ShardedEmbeddingBag:
        config = TableConfig(name, dim, init_std, optimizer)
        config.check()
        self.client.declare([config])
        self.tables[name] = config
        return ShardedEmbeddingBag(self, name, dim, mode)

    def dense(self, module: nn.Module, optimizer: OptimizerConfig, prefix: str = "dense") -> None:
        """Registers ``module``'s parameters: kept on the PS (async, sync: the first worker's
        initial values win, later workers load them), or local with a torch optimizer
        (hybrid: DDP all-reduces their gradients)."""
        self.dense_module = module
        named = dict(module.named_parameters())
        self._dense_map = {f"{prefix}/{name}": param for name, param in named.items()}
        self.dense_names = sorted(self._dense_map)
        if self.mode is Mode.HYBRID:
            self.local_optimizer = optimizer.torch_optimizer(list(named.values()))
            # The PS keeps the saved copy: the first worker's values, or the last ones saved.
            keep = OptimizerConfig("assign", lr=0.0)
            self.client.declare(
                [], {name: (param.detach().float().cpu(), keep) for name, param in self._dense_map.items()}
            )
            _, values, _ = self.client.pull({}, self.dense_names)
            self._load_dense(values)
            self._dense_saved_at = time.monotonic()
            return
        self.client.declare(
            [], {name: (param.detach().cpu(), optimizer) for name, param in self._dense_map.items()}
        )

    def _load_dense(self, values: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, value in values.items():
                self._dense_map[name].copy_(value)

    def _dense_grads(self) -> dict[str, torch.Tensor]:
        if not self.dense_on_ps:
            return {}
        grads = {}
        for name in self.dense_names:
            param = self._dense_map[name]
            grads[name] = (
                (param.grad if param.grad is not None else torch.zeros_like(param)).detach().float().cpu()
            )
            param.grad = None
        return grads

    @property
    def saves_dense(self) -> bool:
        """Whether this worker saves the hybrid dense weights: the dense group's rank 0."""
        if self.mode is not Mode.HYBRID or self.dense_module is None:
            return False
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank() == 0
        return os.environ.get("RANK", "0") == "0"

    def save_dense(self) -> None:
        """Hybrid mode: stores the module's dense weights on the PS (``dense`` of a later worker
        loads them)."""
        if self.mode is not Mode.HYBRID or self.dense_module is None:
            return
        values = {name: self._dense_map[name].detach().float().cpu().clone() for name in self.dense_names}
        self.client.push(None, {}, values, {}, 1)
        self._dense_saved_at = time.monotonic()

    def refresh_dense(self) -> None:
        """Loads the PS's current dense values into the module (before an evaluation)."""
        if self.dense_on_ps:
            _, values, _ = self.client.pull({}, self.dense_names)
            self._load_dense(values)

    def rows(self, table: str, unique: torch.Tensor) -> torch.Tensor:
        if self._current is not None:
            return self._current.rows(table, unique)
        rows, _, _ = self.client.pull({table: unique})
        return rows[table].to(self.device)

    # --- data -------------------------------------------------------------------------------
    def batches(self, dataset: Dataset) -> Iterator[Batch]:
        """This worker's batches from the coordinator's shards; a batch whose push was refused as
        stale comes again. Synchronous mode passes the step barrier before each one."""
        self.coordinator.register(dataset)
        if self.mode is Mode.SYNC:
            yield from self._sync_batches()
            return
        for batch in self.coordinator.batches():
            assert batch is not None
            yield batch
            while self._retry is not None:
                retry, self._retry = self._retry, None
                yield retry

    def passes(self, dataset: Dataset) -> Iterator[Iterator[Batch]]:
        """``batches`` for a loop whose every step is a collective of the hybrid dense group (DDP
        under ``Join``): in passes, one ``Join`` each. A pass ends on this worker when the
        coordinator has no shard for it now (the epoch's last shards are with its peers, whose
        collectives it then shadows) or none at all; then the group decides together whether
        another pass follows (none once a member saw the end or was asked to stop). Without
        passes the worker polling for a shard and its peer all-reducing the last one wait for each
        other for good. Outside hybrid mode, or without a process group: one pass, ``batches``."""
        distributed = torch.distributed
        if not (self.mode is Mode.HYBRID and distributed.is_available() and distributed.is_initialized()):
            yield self.batches(dataset)
            return
        from workers.sdk.stop import stop_requested

        self.coordinator.register(dataset)
        while True:
            seen: list[bool] = []  # [True] once a batch came; [False] at the end of every epoch
            yield self._pass(seen)
            over = (bool(seen) and not seen[-1]) or stop_requested()
            flag = torch.tensor([1.0 if over else 0.0], device=self.device)
            distributed.all_reduce(flag, op=distributed.ReduceOp.MAX)
            if flag.item():
                return
            if not seen:
                time.sleep(PASS_POLL_S)  # the shards are with the peers: ask again shortly

    def _pass(self, seen: list[bool]) -> Iterator[Batch]:
        for batch in self.coordinator.batches(wait=False):
            if batch is None:
                return
            seen[:] = [True]
            yield batch
            while self._retry is not None:
                retry, self._retry = self._retry, None
                yield retry
        seen[:] = [False]

    def _sync_batches(self) -> Iterator[Batch]:
        for batch in self.coordinator.batches(wait=False):
            info = self.coordinator.begin_step(has_batch=batch is not None)
            if batch is None:
                continue
            if self.worker not in info.members:
                raise RuntimeError(f"the barrier closed step {info.step} without this worker's batch")
            self.step_info = info
            yield batch

    def step(self, batch: Batch | None = None) -> Step:
        info = self.step_info if self.mode is Mode.SYNC else None
        return Step(self, batch, info)

    def _after_push(self, step: Step) -> None:
        outcome = step.outcome
        assert outcome is not None
        batch = step.batch
        if outcome.stale:
            self.stale_retries += 1
            self._retry = batch
            return
        self.pushes += 1
        self.duplicates += outcome.duplicate
        if self.first_push_at is None:
            self.first_push_at = time.time()
            # A joining worker's "I am in": the console can time a resize by it (and bench/ps does).
            telemetry().event(
                "ps_first_push",
                "info",
                f"{self.worker} pushed its first gradient",
                {"worker": self.worker, "at": self.first_push_at},
            )
        if batch is not None:
            self.examples += batch.examples
            self._window_examples += batch.examples
            if batch.last_of_shard:
                self.coordinator.complete(batch.epoch, batch.shard)
        self._window_staleness.extend(outcome.staleness)
        if self.saves_dense and time.monotonic() - self._dense_saved_at >= self.dense_save_every_s:
            self.save_dense()
        if self.pushes % STATS_EVERY == 0 or time.monotonic() - self._window_start >= STATS_EVERY_S:
            self.report()

    def report(self) -> dict[str, float]:
        now = time.monotonic()
        elapsed = max(1e-9, now - self._window_start)
        staleness = self._window_staleness or [0]
        values = {
            "worker_examples_per_s": self._window_examples / elapsed,
            "worker_staleness_mean": sum(staleness) / len(staleness),
            "worker_staleness_max": float(max(staleness)),
            "worker_pull_p50_ms": self.client.pull_latency.percentile_ms(0.5),
            "worker_pull_p99_ms": self.client.pull_latency.percentile_ms(0.99),
            "worker_push_p50_ms": self.client.push_latency.percentile_ms(0.5),
            "worker_push_p99_ms": self.client.push_latency.percentile_ms(0.99),
            "worker_examples": float(self.examples),
            "worker_stale_retries": float(self.stale_retries),
            "worker_duplicates": float(self.duplicates),
        }
        telemetry().metric(self.pushes, dict(values), echo=False)
        self._window_start = now
        self._window_examples = 0
        self._window_staleness = []
        return values

    def close(self) -> None:
        """Reports its last statistics, saves the hybrid dense weights (rank 0), leaves the coordinator (held shards go back to the queue at
        once) and closes channels."""
        if self._window_examples or self._window_staleness:
            self.report()
        if self.saves_dense:
            self.save_dense()
        self.coordinator.leave()
        self.coordinator.close()
        self.client.close()
