"""Worker side of the PS runtime: sharded pull/push over every PS, the coordinator, a shard iterator.

``PsClient`` splits a request by owner (row ``i`` on PS ``i mod M``, dense parameters by a stable
hash), sends the parts to their PS in parallel (gRPC futures) and puts the replies back in
request order. A PS that is restarting answers UNAVAILABLE: calls are tried again with backoff
for ``retry_s`` (a re-sent push is harmless: the PS dedupes it by its batch key). Every call
carries the job's secret (workers/ps/auth.py); a refusal of it (UNAUTHENTICATED) is not retried.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import torch

from workers.ps import auth, ps_pb2, ps_pb2_grpc, tensors
from workers.ps.coordinator import Dataset, dataset_to_proto
from workers.ps.optim import OptimizerConfig
from workers.ps.placement import ps_of_dense, split_rows
from workers.ps.server import GRPC_OPTIONS
from workers.ps.stats import Latencies
from workers.ps.store import TableConfig

T = TypeVar("T")
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Rows per pull message: 64-wide float32 rows make ~32 MB messages, well under the raised limit.
MAX_ROWS_PER_CALL = 131072


class PsClientError(RuntimeError):
    """A PS or the coordinator refused a call (the message is theirs)."""


def _retrying(call: Callable[[], T], retry_s: float, what: str) -> T:
    deadline = time.monotonic() + retry_s
    delay = 0.05
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            code = error.code()  # type: ignore[attr-defined]
            if code not in RETRYABLE or time.monotonic() + delay > deadline:
                raise PsClientError(f"{what}: {code.name}: {error.details()}") from None  # type: ignore[attr-defined]
            time.sleep(delay)
            delay = min(1.0, delay * 2)


def channel(address: str, secret: str) -> grpc.Channel:
    """A channel to a PS or the coordinator whose every call presents the job's secret."""
    return auth.authenticated(grpc.insecure_channel(address, options=GRPC_OPTIONS), secret)


@dataclass
class StepInfo:
    """A synchronous step, as the coordinator's barrier closed it."""

    step: int
    members: list[str]
    finalize_step: int
    finalize_workers: list[str]


@dataclass
class PushOutcome:
    applied: int = 0
    duplicate: int = 0
    stale: int = 0
    late: int = 0
    staleness: list[int] = field(default_factory=list)


class PsClient:
    def __init__(
        self, addresses: tuple[str, ...] | list[str], worker: str, retry_s: float = 120.0, *, secret: str
    ) -> None:
        self.addresses = tuple(addresses)
        self.worker = worker
        self.retry_s = retry_s
        self.channels = [channel(address, secret) for address in self.addresses]
        self.stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self.channels]
        self.pull_latency = Latencies()
        self.push_latency = Latencies()

    @property
    def count(self) -> int:
        return len(self.addresses)

    def close(self) -> None:
        for c in self.channels:
            c.close()

    def _each(self, method: str, requests: dict[int, Any], what: str) -> dict[int, Any]:
        """Calls ``method`` on each PS in ``requests`` in parallel (futures); retries a PS that is
        unavailable (restarting) for up to ``retry_s``."""
        pending = {ps: getattr(self.stubs[ps], method).future(request) for ps, request in requests.items()}
        results: dict[int, Any] = {}
        for ps, future in pending.items():
            try:
                results[ps] = future.result()
            except grpc.RpcError as error:
                code = error.code()  # type: ignore[attr-defined]
                if code not in RETRYABLE:
                    raise PsClientError(f"{what} on PS {ps}: {code.name}: {error.details()}") from None  # type: ignore[attr-defined]
                call = functools.partial(getattr(self.stubs[ps], method), requests[ps])
                results[ps] = _retrying(call, self.retry_s, f"{what} on PS {ps}")
        return results

    def declare(
        self, tables: list[TableConfig], dense: dict[str, tuple[torch.Tensor, OptimizerConfig]] | None = None
    ) -> list[str]:
        """Declares tables on every PS and each dense parameter on its owner; returns the dense
        parameters that already existed (their values come from the PS, not from this worker)."""
        specs = [
            ps_pb2.TableSpec(name=t.name, dim=t.dim, init_std=t.init_std, optimizer=t.optimizer.to_proto())
            for t in tables
        ]
        requests = {ps: ps_pb2.DeclareRequest(tables=specs) for ps in range(self.count)}
        for name, (value, optimizer) in (dense or {}).items():
            requests[ps_of_dense(name, self.count)].dense.append(
                ps_pb2.DenseSpec(name=name, initial=tensors.encode(value), optimizer=optimizer.to_proto())
            )
        replies = self._each("Declare", requests, "declare")
        return [name for reply in replies.values() for name in reply.dense_known]

    def pull(
        self,
        tables: dict[str, torch.Tensor],
        dense: tuple[str, ...] | list[str] = (),
        step: StepInfo | None = None,
        all_ps: bool = False,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[int, int]]:
        """Rows of ``tables`` (name -> 1-d int64 ids; rows come back in id order) and dense
        values; also each PS's version. ``all_ps``: contact every PS even with nothing to ask
        (a synchronous step must reach them all)."""
        started = time.perf_counter()
        requests: dict[int, ps_pb2.PullRequest] = {}
        positions: dict[int, list[tuple[str, torch.Tensor]]] = {}
        dims: dict[str, int] = {}

        def request(ps: int) -> ps_pb2.PullRequest:
            if ps not in requests:
                requests[ps] = ps_pb2.PullRequest(worker=self.worker)
                if step is not None:
                    requests[ps].step = step.step
                    requests[ps].finalize_step = step.finalize_step
                    requests[ps].finalize_workers.extend(step.finalize_workers)
                positions[ps] = []
            return requests[ps]

        for name, ids in tables.items():
            for ps, where in enumerate(split_rows(ids, self.count)):
                if where.numel():
                    request(ps).tables.append(ps_pb2.TableIds(table=name, ids=tensors.encode(ids[where])))
                    positions[ps].append((name, where))
        dense_owner: dict[str, int] = {}
        for name in dense:
            ps = ps_of_dense(name, self.count)
            request(ps).dense.append(name)
            dense_owner[name] = ps
        if all_ps:
            for ps in range(self.count):
                request(ps)
        replies = self._each("Pull", requests, "pull")
        rows: dict[str, torch.Tensor] = {}
        for ps, reply in replies.items():
            for (name, where), encoded in zip(positions[ps], reply.rows, strict=True):
                part = tensors.decode(encoded)
                if where.numel() == tables[name].numel():
                    rows[name] = part  # one PS holds them all, in request order
                    continue
                if name not in rows:
                    dims[name] = part.shape[1]
                    rows[name] = torch.empty(tables[name].numel(), dims[name])
                rows[name].index_copy_(0, where, part)
        values: dict[str, torch.Tensor] = {}
        for ps, reply in replies.items():
            names = [n for n in dense if dense_owner[n] == ps]
            for name, encoded in zip(names, reply.dense, strict=True):
                values[name] = tensors.decode(encoded)
        self.pull_latency.add(time.perf_counter() - started)
        return rows, values, {ps: reply.version for ps, reply in replies.items()}

    def push(
        self,
        key: tuple[int, int, int] | None,
        tables: dict[str, tuple[torch.Tensor, torch.Tensor]],
        dense: dict[str, torch.Tensor],
        versions: dict[int, int],
        examples: int,
        step: StepInfo | None = None,
        all_ps: bool = False,
    ) -> PushOutcome:
        started = time.perf_counter()
        requests: dict[int, ps_pb2.PushRequest] = {}

        def request(ps: int) -> ps_pb2.PushRequest:
            if ps not in requests:
                message = ps_pb2.PushRequest(
                    worker=self.worker, version=versions.get(ps, 0), examples=examples
                )
                if key is not None:
                    message.key.CopyFrom(ps_pb2.BatchKey(epoch=key[0], shard=key[1], batch=key[2]))
                if step is not None:
                    message.step = step.step
                    message.step_workers = len(step.members)
                requests[ps] = message
            return requests[ps]

        for name, (ids, grads) in tables.items():
            for ps, where in enumerate(split_rows(ids, self.count)):
                if where.numel():
                    request(ps).tables.append(
                        ps_pb2.TableGrad(
                            table=name, ids=tensors.encode(ids[where]), grads=tensors.encode(grads[where])
                        )
                    )
        for name, grad in dense.items():
            request(ps_of_dense(name, self.count)).dense.append(
                ps_pb2.NamedTensor(name=name, value=tensors.encode(grad))
            )
        if all_ps:
            for ps in range(self.count):
                request(ps)
        replies = self._each("Push", requests, "push")
        outcome = PushOutcome()
        for ps, reply in replies.items():
            if reply.status == ps_pb2.PushReply.APPLIED:
                outcome.applied += 1
                outcome.staleness.append(max(0, reply.version - 1 - versions.get(ps, reply.version - 1)))
            elif reply.status == ps_pb2.PushReply.DUPLICATE:
                outcome.duplicate += 1
            elif reply.status == ps_pb2.PushReply.STALE:
                outcome.stale += 1
            else:
                outcome.late += 1
        self.push_latency.add(time.perf_counter() - started)
        return outcome

    def stats(self) -> list[dict[str, Any]]:
        import json

        replies = self._each("Stats", {ps: ps_pb2.StatsRequest() for ps in range(self.count)}, "stats")
        return [json.loads(replies[ps].json) for ps in range(self.count)]

    def checkpoint(self) -> list[tuple[str, int]]:
        requests = {ps: ps_pb2.CheckpointRequest() for ps in range(self.count)}
        replies = self._each("Checkpoint", requests, "checkpoint")
        return [(replies[ps].path, replies[ps].version) for ps in range(self.count)]


@dataclass(frozen=True)
class Batch:
    """Examples [start, end) of shard ``shard`` in ``epoch``; ``key`` names it for dedupe."""

    epoch: int
    shard: int
    batch: int
    start: int
    end: int
    last_of_shard: bool

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.epoch, self.shard, self.batch)

    @property
    def examples(self) -> int:
        return self.end - self.start


class CoordinatorClient:
    """Registration, a heartbeat thread that keeps the lease, shards, the step barrier."""

    def __init__(self, address: str, worker: str, retry_s: float = 120.0, *, secret: str) -> None:
        self.address = address
        self.worker = worker
        self.retry_s = retry_s
        self.channel = channel(address, secret)
        self.stub = ps_pb2_grpc.CoordinatorStub(self.channel)
        self.dataset: Dataset | None = None
        self.lease_s = 10.0
        self.mode = "async"
        self.lease_lost = 0
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _call(self, method: Any, request: Any, what: str) -> Any:
        return _retrying(lambda: method(request, timeout=60), self.retry_s, what)

    def register(self, dataset: Dataset | None = None) -> None:
        self.dataset = dataset or self.dataset
        request = ps_pb2.RegisterRequest(worker=self.worker)
        if self.dataset is not None:
            request.dataset.CopyFrom(dataset_to_proto(self.dataset))
        try:
            reply = self._call(self.stub.Register, request, "register")
        except grpc.RpcError as error:
            raise PsClientError(f"register: {error.details()}") from None  # type: ignore[attr-defined]
        self.lease_s = reply.lease_s
        self.mode = reply.mode
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, name="trainyard-ps-lease", daemon=True)
            self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stopped.wait(self.lease_s / 3):
            try:
                known = self.stub.Heartbeat(
                    ps_pb2.WorkerRequest(worker=self.worker), timeout=self.lease_s
                ).known
            except grpc.RpcError:
                continue
            if not known and not self._stopped.is_set():
                # The lease ran out (a long pause): our shards went to others. Join again.
                self.lease_lost += 1
                self.register()

    def acquire(self) -> tuple[int, ps_pb2.Shard | None]:
        reply = self._call(self.stub.Acquire, ps_pb2.WorkerRequest(worker=self.worker), "acquire")
        if reply.status == ps_pb2.AcquireReply.GRANTED:
            return reply.status, reply.shard
        return reply.status, None

    def complete(self, epoch: int, shard: int) -> bool:
        request = ps_pb2.CompleteRequest(worker=self.worker, epoch=epoch, shard=shard)
        return bool(self._call(self.stub.Complete, request, "complete").accepted)

    def begin_step(self, has_batch: bool) -> StepInfo:
        while True:
            request = ps_pb2.BeginStepRequest(worker=self.worker, has_batch=has_batch)
            try:
                reply = self._call(self.stub.BeginStep, request, "begin step")
            except PsClientError as error:
                if "not registered" not in str(error):
                    raise
                self.lease_lost += 1
                self.register()
                continue
            if not reply.retry:
                return StepInfo(
                    reply.step, list(reply.members), reply.finalize_step, list(reply.finalize_workers)
                )

    def queue(self) -> dict[str, Any]:
        import json

        return dict(json.loads(self._call(self.stub.Queue, ps_pb2.QueueRequest(), "queue").json))

    def leave(self) -> None:
        self._stopped.set()
        with contextlib.suppress(grpc.RpcError):  # else the lease runs out on its own
            self.stub.Leave(ps_pb2.WorkerRequest(worker=self.worker), timeout=5)

    def close(self) -> None:
        self._stopped.set()
        self.channel.close()

    def batches(self, poll_s: float = 0.05, wait: bool = True) -> Iterator[Batch | None]:
        """Batches of the shards this worker is granted, until every epoch is done. After a
        shard's last batch the caller's ``complete`` call is made by ``finish``; with
        ``wait=False`` it yields None instead of sleeping when nothing is available now (the
        synchronous loop must keep reaching the barrier)."""
        assert self.dataset is not None, "register with a dataset first"
        size = self.dataset.batch_size
        while True:
            status, shard = self.acquire()
            if status == ps_pb2.AcquireReply.FINISHED:
                return
            if shard is None:
                if not wait:
                    yield None
                else:
                    time.sleep(poll_s)
                continue
            starts = list(range(shard.start, shard.end, size))
            for number, start in enumerate(starts):
                yield Batch(
                    shard.epoch,
                    shard.id,
                    number,
                    start,
                    min(shard.end, start + size),
                    number == len(starts) - 1,
                )
