"""A parameter-server process: its state (workers/ps/state.py) behind gRPC.

``PsState`` (state.py) makes every decision (dedupe, staleness, synchronous steps, versions,
checkpoint contents) and is tested in-process; ``Servicer`` only converts messages; ``main`` reads
the environment contract (workers/ps/contract.py), restores the last checkpoint, serves, writes a
checkpoint every TRAINYARD_PS_CHECKPOINT_EVERY_S seconds and a final one on SIGTERM. It answers
only callers with the job's secret (workers/ps/auth.py).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import asdict
from typing import TypeVar

import grpc
import torch
from google.protobuf.message import EncodeError

from workers.ps import auth, checkpoint, contract, ps_pb2, ps_pb2_grpc, tensors
from workers.ps.contract import Mode
from workers.ps.optim import OptimizerConfig, OptimizerError
from workers.ps.state import PsError, PsState
from workers.ps.stats import PsStats, Reporter, now
from workers.ps.store import RowBudgetExceeded, TableConfig

log = logging.getLogger("trainyard.ps")

# Big enough for a pull of a million 64-wide float32 rows in one message; clients split larger
# ones (workers/ps/client.py).
MAX_MESSAGE_BYTES = 512 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
HANDLER_THREADS = 16
# Stack of each handler thread when the data segment is capped (the default is 8 MiB each).
THREAD_STACK_BYTES = 1 << 20

T = TypeVar("T")


def table_config(spec: ps_pb2.TableSpec) -> TableConfig:
    return TableConfig(
        spec.name, int(spec.dim), float(spec.init_std), OptimizerConfig.from_proto(spec.optimizer)
    )


class Servicer(ps_pb2_grpc.ParameterServerServicer):
    """Converts messages to ``PsState`` calls and its errors to gRPC statuses."""

    def __init__(self, state: PsState, checkpoint_dir: str) -> None:
        self.state = state
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_lock = threading.Lock()

    def _guarded(self, context: grpc.ServicerContext, call: Callable[[], T]) -> T:
        """Runs ``call``; a refusal becomes its status, running out of memory (the row budget,
        the data-segment cap, torch's allocator) RESOURCE_EXHAUSTED."""
        try:
            return call()
        except PsError as error:
            context.abort(error.code, str(error))
        except (RowBudgetExceeded, MemoryError, EncodeError) as error:
            # EncodeError: upb could not allocate the reply under the data-segment cap (the
            # messages are proto3 with no required fields; it has no other cause here)
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"PS {self.state.index}: {error or 'out of memory'}"
            )
        except RuntimeError as error:
            if "allocate" not in str(error):  # torch's allocator: "can't allocate memory"
                raise
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"PS {self.state.index}: {error}")
        except (ValueError, OptimizerError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        raise AssertionError("unreachable: abort raises")

    def Declare(self, request: ps_pb2.DeclareRequest, context: grpc.ServicerContext) -> ps_pb2.DeclareReply:
        def call() -> ps_pb2.DeclareReply:
            known = self.state.declare(
                [table_config(spec) for spec in request.tables],
                [
                    (spec.name, tensors.decode(spec.initial), OptimizerConfig.from_proto(spec.optimizer))
                    for spec in request.dense
                ],
            )
            return ps_pb2.DeclareReply(dense_known=known)

        return self._guarded(context, call)

    def Pull(self, request: ps_pb2.PullRequest, context: grpc.ServicerContext) -> ps_pb2.PullReply:
        started = now()

        def call() -> ps_pb2.PullReply:
            rows, dense, version = self.state.pull(
                [(item.table, tensors.decode(item.ids)) for item in request.tables],
                list(request.dense),
                request.step,
                request.finalize_step,
                request.finalize_workers,
            )
            return ps_pb2.PullReply(
                rows=[tensors.encode(r) for r in rows],
                dense=[tensors.encode(d) for d in dense],
                version=version,
            )

        reply = self._guarded(context, call)
        self.state.pull_latency.add(now() - started)
        return reply

    def Push(self, request: ps_pb2.PushRequest, context: grpc.ServicerContext) -> ps_pb2.PushReply:
        started = now()
        key = (request.key.epoch, request.key.shard, request.key.batch) if request.HasField("key") else None

        def call() -> ps_pb2.PushReply:
            status, version = self.state.push(
                request.worker,
                key,
                request.version,
                request.examples,
                [(t.table, tensors.decode(t.ids), tensors.decode(t.grads)) for t in request.tables],
                [(d.name, tensors.decode(d.value)) for d in request.dense],
                request.step,
                request.step_workers,
            )
            return ps_pb2.PushReply(status=status, version=version)  # type: ignore[arg-type]

        reply = self._guarded(context, call)
        self.state.push_latency.add(now() - started)
        return reply

    def Stats(self, request: ps_pb2.StatsRequest, context: grpc.ServicerContext) -> ps_pb2.StatsReply:
        import json

        return ps_pb2.StatsReply(json=json.dumps(asdict(self.state.stats())))

    def Checkpoint(
        self, request: ps_pb2.CheckpointRequest, context: grpc.ServicerContext
    ) -> ps_pb2.CheckpointReply:
        if not self.checkpoint_dir:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this PS has no checkpoint directory")
        path, version = self.save()
        return ps_pb2.CheckpointReply(path=str(path), version=version)

    def save(self) -> tuple[str, int]:
        """Writes this PS's checkpoint and records it in the console as the SDK's checkpoints are
        (a ``checkpoint`` telemetry record: the version as its step, the file, its size, and how
        long pulls and pushes waited: the copy of the state under its lock)."""
        from workers.sdk.telemetry import telemetry

        with self.checkpoint_lock:
            started = time.perf_counter()
            state = self.state.state()
            blocking_ms = (time.perf_counter() - started) * 1000.0
            path = checkpoint.write(self.checkpoint_dir, self.state.index, self.state.count, state)
            version = int(state["version"])
            self.state.checkpoint_version = version
            telemetry().emit(
                "checkpoint",
                step=version,
                path=str(path),
                size_bytes=path.stat().st_size,
                blocking_ms=round(blocking_ms, 3),
            )
            return str(path), version


def serve(env: contract.PsEnv) -> int:
    state = PsState(
        index=env.index,
        count=env.ps_count,
        mode=Mode.ASYNC if env.mode is Mode.HYBRID else env.mode,
        seed=env.seed,
        max_staleness=env.max_staleness,
        max_rows=env.max_rows,
    )
    source = checkpoint.choose(env.checkpoint_dir, env.index, env.ps_count)
    if source is not None:
        state.restore(source)
        print(
            f"PS {env.index}/{env.ps_count}: restored version {state.version}, "
            f"{state.stats().rows} rows from {state.restored_from}",
            flush=True,
        )
    warm_up()
    if env.max_data_bytes is not None:
        # Thread stacks count as data: keep the ones started from here on small.
        threading.stack_size(THREAD_STACK_BYTES)
    servicer = Servicer(state, env.checkpoint_dir)
    executor = futures.ThreadPoolExecutor(max_workers=HANDLER_THREADS)
    server = grpc.server(executor, interceptors=[auth.RequireSecret(env.secret)], options=GRPC_OPTIONS)
    ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
    if server.add_insecure_port(env.listen_address) == 0:
        print(f"PS {env.index}: cannot listen on {env.listen_address}", file=sys.stderr, flush=True)
        return 1
    server.start()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    report = _telemetry_reporter(state)
    report()  # starts the telemetry writer thread now, before any cap
    reporter = Reporter(env.stats_every_s, report)
    reporter.start()
    if env.max_data_bytes is not None:
        cap_data_segment(executor, env.max_data_bytes)
    print(f"PS {env.index}/{env.ps_count} serving on {env.listen_address} ({state.mode.value})", flush=True)
    last_checkpoint = time.monotonic()
    while not stopping.wait(0.5):
        due = time.monotonic() - last_checkpoint >= env.checkpoint_every_s
        if env.checkpoint_dir and due and state.version != state.checkpoint_version:
            servicer.save()
            last_checkpoint = time.monotonic()
    # Stop taking requests, let running ones finish, then write the final checkpoint: a PS
    # count change re-shards from it.
    server.stop(grace=5).wait()
    reporter.stop()
    if env.checkpoint_dir:
        path, version = servicer.save()
        print(f"PS {env.index}: final checkpoint at version {version}: {path}", flush=True)
    return 0


def warm_up() -> None:
    """Runs every kind of update once on a scratch state before serving: the first use of torch's
    optimizers imports more modules (torch._dynamo, sympy), which must not happen on the first
    request, nor after the data segment is capped."""
    scratch = PsState(index=0, count=1, mode=Mode.ASYNC)
    for name in ("sgd", "adagrad", "adam"):
        config = OptimizerConfig(name, lr=0.1)
        scratch.declare([TableConfig(name, 2, 0.1, config)], [(name, torch.zeros(2), config)])
        ids = torch.tensor([0, 1])
        scratch.push("warm-up", None, 0, 1, [(name, ids, torch.ones(2, 2))], [(name, torch.ones(2))])
        scratch.pull([(name, ids)], [name])
    scratch.state()


def cap_data_segment(executor: futures.ThreadPoolExecutor, growth: int) -> int:
    """Caps this process's data segment (RLIMIT_DATA: heap and private writable mappings) at its
    current size plus ``growth`` bytes; returns the cap. The handler threads are started first
    (their stacks count as data), so the cap bounds what the PS's state may still grow by. An
    allocation past it fails (MemoryError, or torch's allocator error), which a push answers with
    RESOURCE_EXHAUSTED; the row budget (TRAINYARD_PS_MAX_ROWS) normally refuses earlier."""
    import resource

    barrier = threading.Barrier(HANDLER_THREADS + 1)
    for _ in range(HANDLER_THREADS):
        executor.submit(barrier.wait)
    barrier.wait()
    used = _data_bytes()
    cap = used + growth
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    log.info("data segment capped at %d MB (%d MB in use)", cap >> 20, used >> 20)
    return cap


def _data_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def _telemetry_reporter(state: PsState) -> Callable[[], None]:
    from workers.sdk.telemetry import telemetry

    sink = telemetry()
    previous: list[tuple[PsStats, float]] = []

    def report() -> None:
        current = state.stats()
        at = time.monotonic()
        since, then = previous[0] if previous else (None, at)
        sink.metric(current.version, current.metrics(since, at - then), echo=False)
        previous[:] = [(current, at)]

    return report


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        env = contract.from_environ()
    except contract.ContractError as error:
        print(f"parameter server: {error}", file=sys.stderr)
        return 2
    if env.role is not contract.Role.PS:
        print(f"parameter server: {contract.ENV_ROLE} is {env.role.value!r}, not 'ps'", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    return serve(env)


if __name__ == "__main__":
    sys.exit(main())
