"""The shard coordinator of a PS job: data shards with leases, worker membership, step barrier.

``ShardQueue`` makes the decisions and is tested in-process; ``Servicer`` converts messages;
``main`` serves it under the environment contract (the controller will start it with the job), to
callers with the job's secret only (workers/ps/auth.py).

Dynamic sharding after ElasticDL's master: an epoch is split into shards of ``shard_size``
examples, handed out one at a time with a lease. A worker renews its lease by heartbeat; a worker
that leaves, or whose lease runs out, has its shards put back at the front of the queue. A shard
counts as done only when the worker that holds it completes it, so each example is processed
exactly once per epoch. (Its gradients may reach a PS twice, once from the worker that died in
the middle of it: the PS dedupes them by batch key, workers/ps/state.py.)

Synchronous mode adds a barrier: a step closes when every live worker has arrived (one that
leaves or loses its lease stops being waited for); the members are the arrivals with a batch.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections import Counter, deque
from concurrent import futures
from dataclasses import asdict, dataclass, field

import grpc

from workers.ps import auth, contract, ps_pb2, ps_pb2_grpc
from workers.ps.stats import QueueStats, Reporter

log = logging.getLogger("trainyard.ps.coordinator")

# How long a BeginStep call waits on the server before telling the worker to call again (keeps
# a gRPC thread from being held forever by a barrier that waits for a slow joiner).
BARRIER_WAIT_S = 20.0
# Synchronous mode: how long the first step waits for the job's initial workers to register.
START_WAIT_S = 120.0


class CoordinatorError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Dataset:
    examples: int
    shard_size: int
    batch_size: int
    epochs: int
    shuffle_seed: int = -1

    def check(self) -> None:
        for name in ("examples", "shard_size", "batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise CoordinatorError(grpc.StatusCode.INVALID_ARGUMENT, f"dataset {name} must be at least 1")

    @property
    def shards(self) -> int:
        return -(-self.examples // self.shard_size)

    def bounds(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_size
        return start, min(self.examples, start + self.shard_size)


@dataclass
class StepResult:
    step: int
    members: list[str]
    finalize_step: int
    finalize_workers: list[str]


@dataclass
class ShardQueue:
    lease_s: float
    mode: str = "async"
    clock: object = time.monotonic
    # Synchronous mode: the first step waits for this many workers (or START_WAIT_S), like a
    # rendezvous: otherwise the first worker to start runs alone until the others arrive.
    min_workers: int = 0
    first_registered: float | None = None
    dataset: Dataset | None = None
    epoch: int = 0
    leases: dict[str, float] = field(default_factory=dict)  # worker -> deadline
    todo: deque[int] = field(default_factory=deque)
    in_progress: dict[int, str] = field(default_factory=dict)  # shard -> worker
    done: set[int] = field(default_factory=set)
    completions: Counter[tuple[int, int]] = field(default_factory=Counter)
    examples_done: int = 0
    requeued: int = 0
    rejected: int = 0
    # Synchronous barrier.
    open_step: int = 0
    arrived: dict[str, bool] = field(default_factory=dict)
    results: dict[str, StepResult] = field(default_factory=dict)
    last_member_step: int = -1
    last_members: list[str] = field(default_factory=list)
    completed_last: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.lock = threading.Condition()

    def _now(self) -> float:
        return self.clock()  # type: ignore[operator,no-any-return]

    @property
    def finished(self) -> bool:
        return self.dataset is not None and self.epoch >= self.dataset.epochs

    # --- membership ---------------------------------------------------------------------
    def register(self, worker: str, dataset: Dataset | None) -> None:
        with self.lock:
            if dataset is not None:
                dataset.check()
                if self.dataset is None:
                    self.dataset = dataset
                    self._fill()
                elif dataset != self.dataset:
                    raise CoordinatorError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"this job's dataset is {self.dataset}; worker {worker!r} declared {dataset}",
                    )
            self.leases[worker] = self._now() + self.lease_s
            if self.first_registered is None:
                self.first_registered = self._now()
            self._try_close()

    def heartbeat(self, worker: str) -> bool:
        with self.lock:
            self.expire()
            if worker not in self.leases:
                return False
            self.leases[worker] = self._now() + self.lease_s
            return True

    def leave(self, worker: str) -> None:
        with self.lock:
            self._drop(worker)
            self._try_close()

    def expire(self) -> list[str]:
        """Drops workers whose lease ran out; returns them."""
        with self.lock:
            now = self._now()
            gone = [worker for worker, deadline in self.leases.items() if deadline < now]
            for worker in gone:
                log.info("worker %s missed its lease: its shards go back to the queue", worker)
                self._drop(worker)
            if gone:
                self._try_close()
            return gone

    def _drop(self, worker: str) -> None:
        self.leases.pop(worker, None)
        self.arrived.pop(worker, None)
        self.results.pop(worker, None)
        held = sorted(shard for shard, owner in self.in_progress.items() if owner == worker)
        for shard in reversed(held):
            del self.in_progress[shard]
            self.todo.appendleft(shard)
            self.requeued += 1
        self.lock.notify_all()

    def _require(self, worker: str) -> None:
        if worker not in self.leases:
            raise CoordinatorError(
                grpc.StatusCode.FAILED_PRECONDITION, f"worker {worker!r} is not registered (lease lost?)"
            )

    # --- shards -------------------------------------------------------------------------
    def _fill(self) -> None:
        assert self.dataset is not None
        order = list(range(self.dataset.shards))
        if self.dataset.shuffle_seed >= 0:
            import random

            random.Random(self.dataset.shuffle_seed * 1_000_003 + self.epoch).shuffle(order)
        self.todo = deque(order)
        self.done = set()

    def acquire(self, worker: str) -> tuple[int, tuple[int, int, int, int] | None]:
        """(status, (epoch, shard, start, end)) with status one of ``AcquireReply.Status``."""
        with self.lock:
            self.expire()
            self._require(worker)
            self.leases[worker] = self._now() + self.lease_s
            if self.dataset is None:
                raise CoordinatorError(grpc.StatusCode.FAILED_PRECONDITION, "no dataset declared")
            if self.finished:
                return ps_pb2.AcquireReply.FINISHED, None
            if not self.todo:
                return ps_pb2.AcquireReply.WAIT, None
            shard = self.todo.popleft()
            self.in_progress[shard] = worker
            start, end = self.dataset.bounds(shard)
            return ps_pb2.AcquireReply.GRANTED, (self.epoch, shard, start, end)

    def complete(self, worker: str, epoch: int, shard: int) -> bool:
        with self.lock:
            self.expire()
            if epoch != self.epoch or self.in_progress.get(shard) != worker:
                self.rejected += 1
                return False
            assert self.dataset is not None
            del self.in_progress[shard]
            self.done.add(shard)
            self.completions[(epoch, shard)] += 1
            start, end = self.dataset.bounds(shard)
            self.examples_done += end - start
            if len(self.done) == self.dataset.shards:
                self.epoch += 1
                if not self.finished:
                    self._fill()
                else:
                    self.todo.clear()
            self.lock.notify_all()
            return True

    # --- synchronous barrier --------------------------------------------------------------
    def begin_step(self, worker: str, has_batch: bool, wait_s: float = BARRIER_WAIT_S) -> StepResult | None:
        """Blocks until the step this worker joins closes; None: not yet, call again."""
        deadline = time.monotonic() + wait_s
        with self.lock:
            self.expire()
            self._require(worker)
            self.leases[worker] = self._now() + self.lease_s
            if worker not in self.results:
                self.arrived[worker] = has_batch
                self._try_close()
            while worker not in self.results:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or worker not in self.leases:
                    return None
                self.lock.wait(min(remaining, 0.2))
                self.expire()
                self._try_close()  # the start-up wait may have run out
            return self.results.pop(worker)

    def _try_close(self) -> None:
        if not self.arrived or not set(self.leases) <= set(self.arrived):
            return
        if self.open_step == 0 and len(self.leases) < self.min_workers:
            started = self.first_registered if self.first_registered is not None else self._now()
            if self._now() - started < START_WAIT_S:
                return
        arrived = set(self.arrived)
        self.completed_last |= arrived & set(self.last_members)
        members = sorted(worker for worker, has_batch in self.arrived.items() if has_batch)
        result = StepResult(self.open_step, members, self.last_member_step, sorted(self.completed_last))
        for worker in arrived:
            self.results[worker] = result
        if members:
            self.last_member_step = self.open_step
            self.last_members = members
            self.completed_last = set()
        self.open_step += 1
        self.arrived = {}
        self.lock.notify_all()

    # --- stats ----------------------------------------------------------------------------
    def stats(self) -> QueueStats:
        with self.lock:
            self.expire()
            dataset = self.dataset
            return QueueStats(
                epoch=self.epoch,
                epochs=dataset.epochs if dataset else 0,
                shards_per_epoch=dataset.shards if dataset else 0,
                done=len(self.done) if not self.finished else (dataset.shards if dataset else 0),
                in_progress=len(self.in_progress),
                todo=len(self.todo),
                examples_done=self.examples_done,
                examples_per_epoch=dataset.examples if dataset else 0,
                workers=len(self.leases),
                requeued=self.requeued,
                rejected_completions=self.rejected,
                finished=self.finished,
                completions={f"{e}:{s}": n for (e, s), n in sorted(self.completions.items())},
            )


def dataset_from_proto(spec: ps_pb2.DatasetSpec) -> Dataset | None:
    if spec.examples == 0:
        return None
    return Dataset(spec.examples, spec.shard_size, spec.batch_size, spec.epochs, spec.shuffle_seed)


def dataset_to_proto(dataset: Dataset) -> ps_pb2.DatasetSpec:
    return ps_pb2.DatasetSpec(**asdict(dataset))


class Servicer(ps_pb2_grpc.CoordinatorServicer):
    def __init__(self, queue: ShardQueue) -> None:
        self.queue = queue

    def _call(self, context: grpc.ServicerContext, function, *args):  # type: ignore[no-untyped-def]
        try:
            return function(*args)
        except CoordinatorError as error:
            context.abort(error.code, str(error))

    def Register(
        self, request: ps_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> ps_pb2.RegisterReply:
        if not request.worker:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a worker needs an id")
        self._call(context, self.queue.register, request.worker, dataset_from_proto(request.dataset))
        return ps_pb2.RegisterReply(lease_s=self.queue.lease_s, mode=self.queue.mode)

    def Heartbeat(
        self, request: ps_pb2.WorkerRequest, context: grpc.ServicerContext
    ) -> ps_pb2.HeartbeatReply:
        return ps_pb2.HeartbeatReply(known=self.queue.heartbeat(request.worker))

    def Leave(self, request: ps_pb2.WorkerRequest, context: grpc.ServicerContext) -> ps_pb2.HeartbeatReply:
        self.queue.leave(request.worker)
        return ps_pb2.HeartbeatReply(known=False)

    def Acquire(self, request: ps_pb2.WorkerRequest, context: grpc.ServicerContext) -> ps_pb2.AcquireReply:
        status, shard = self._call(context, self.queue.acquire, request.worker)
        if shard is None:
            return ps_pb2.AcquireReply(status=status)
        epoch, number, start, end = shard
        return ps_pb2.AcquireReply(
            status=status, shard=ps_pb2.Shard(epoch=epoch, id=number, start=start, end=end)
        )

    def Complete(
        self, request: ps_pb2.CompleteRequest, context: grpc.ServicerContext
    ) -> ps_pb2.CompleteReply:
        accepted = self.queue.complete(request.worker, request.epoch, request.shard)
        return ps_pb2.CompleteReply(accepted=accepted)

    def BeginStep(
        self, request: ps_pb2.BeginStepRequest, context: grpc.ServicerContext
    ) -> ps_pb2.BeginStepReply:
        result = self._call(context, self.queue.begin_step, request.worker, request.has_batch)
        if result is None:
            return ps_pb2.BeginStepReply(retry=True)
        return ps_pb2.BeginStepReply(
            step=result.step,
            members=result.members,
            finalize_step=result.finalize_step,
            finalize_workers=result.finalize_workers,
        )

    def Queue(self, request: ps_pb2.QueueRequest, context: grpc.ServicerContext) -> ps_pb2.QueueReply:
        return ps_pb2.QueueReply(json=json.dumps(asdict(self.queue.stats())))


def serve(env: contract.PsEnv) -> int:
    queue = ShardQueue(lease_s=env.lease_s, mode=env.mode.value, min_workers=env.worker_count)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=64), interceptors=[auth.RequireSecret(env.secret)]
    )
    ps_pb2_grpc.add_CoordinatorServicer_to_server(Servicer(queue), server)
    if server.add_insecure_port(env.listen_address) == 0:
        print(f"coordinator: cannot listen on {env.listen_address}", file=sys.stderr, flush=True)
        return 1
    server.start()
    print(
        f"coordinator serving on {env.listen_address} ({env.mode.value}, lease {env.lease_s} s)", flush=True
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    from workers.sdk.telemetry import telemetry

    sink = telemetry()

    def report() -> None:
        stats = queue.stats()
        sink.metric(stats.examples_done, stats.metrics(), echo=False)

    reporter = Reporter(env.stats_every_s, report)
    reporter.start()
    # Leases run out without any call arriving (every worker may be dead): sweep them.
    while not stopping.wait(min(0.5, env.lease_s / 4)):
        queue.expire()
    reporter.stop()
    server.stop(grace=2).wait()
    # The queue as it ended (the job's progress reads it): the sink writes it out at exit.
    report()
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        env = contract.from_environ()
    except contract.ContractError as error:
        print(f"coordinator: {error}", file=sys.stderr)
        return 2
    if env.role is not contract.Role.COORDINATOR:
        print(f"coordinator: {contract.ENV_ROLE} is {env.role.value!r}, not 'coordinator'", file=sys.stderr)
        return 2
    return serve(env)


if __name__ == "__main__":
    sys.exit(main())
