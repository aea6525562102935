"""A parameter server's state and every decision it makes, in-process (no gRPC server, no
threads of its own): ``PsState`` holds this PS's shards of the embedding tables and its dense
parameters, and decides dedupe, staleness, synchronous steps, versions and checkpoint contents.
workers/ps/server.py serves it over gRPC.

Dedupe: a push names its batch (epoch, shard, batch). Shard bookkeeping alone is exactly once,
but gradients are not: a worker killed in the middle of a shard has pushed part of it, and the
worker the shard is handed to pushes those batches again. The PS records the keys it applied
(and checkpoints them), so each batch's gradient takes effect once on each PS.

Synchronous steps: the coordinator's barrier gives each step its members; every member pulls
from and pushes to every PS once per step. A step is applied when all its members have pushed,
or, when one died mid-step, on the first pull of the next step, which names the members that
completed it: the dead worker's partial pushes are dropped (its batch is re-queued and pushed
again later), and nobody waits for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
import torch

from workers.ps import checkpoint, ps_pb2
from workers.ps.contract import Mode
from workers.ps.optim import OptimizerConfig
from workers.ps.placement import ps_of_dense
from workers.ps.stats import Latencies, PsStats, rss_bytes
from workers.ps.store import DenseParameter, RowBudget, TableConfig, TableShard, coalesce

log = logging.getLogger("trainyard.ps")

# How long a synchronous pull waits for the pushes of the step it finalizes; they were sent
# before their workers reached the barrier, so this only guards against a lost message.
FINALIZE_WAIT_S = 30.0

Key = tuple[int, int, int]


class PsError(Exception):
    """A request the PS refuses; ``code`` is the gRPC status it answers with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Contribution:
    key: Key | None
    examples: int
    tables: list[tuple[str, torch.Tensor, torch.Tensor]]
    dense: list[tuple[str, torch.Tensor]]


@dataclass
class PsState:
    index: int
    count: int
    mode: Mode
    seed: int = 0
    max_staleness: int | None = None
    max_rows: int | None = None
    tables: dict[str, TableShard] = field(default_factory=dict)
    dense: dict[str, DenseParameter] = field(default_factory=dict)
    version: int = 0
    applied: set[Key] = field(default_factory=set)
    applied_step: int = -1
    steps: dict[int, dict[str, Contribution]] = field(default_factory=dict)
    duplicates: int = 0
    stale: int = 0
    late: int = 0
    restored_from: str = ""
    checkpoint_version: int = -1

    def __post_init__(self) -> None:
        self.lock = threading.Condition()
        self.budget = RowBudget(self.max_rows)
        self.pull_latency = Latencies()
        self.push_latency = Latencies()

    # --- declarations ---------------------------------------------------------------------
    def declare(
        self, tables: Iterable[TableConfig], dense: Iterable[tuple[str, torch.Tensor, OptimizerConfig]]
    ) -> list[str]:
        """Creates tables and dense parameters that do not exist yet; an existing one must be
        declared the same way (a second worker, or a worker after a PS restart)."""
        known = []
        with self.lock:
            for config in tables:
                config.check()
                existing = self.tables.get(config.name)
                if existing is None:
                    self.tables[config.name] = TableShard(config, self.seed, self.budget)
                elif existing.config != config:
                    raise PsError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"table {config.name!r} exists as {existing.config}, declared now as {config}",
                    )
            for name, initial, optimizer in dense:
                if ps_of_dense(name, self.count) != self.index:
                    raise PsError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"dense parameter {name!r} belongs to PS {ps_of_dense(name, self.count)}, not {self.index}",
                    )
                held = self.dense.get(name)
                if held is None:
                    self.dense[name] = DenseParameter.create(initial, optimizer)
                    continue
                if tuple(held.value.shape) != tuple(initial.shape) or held.config != optimizer:
                    raise PsError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"dense parameter {name!r} exists with shape {tuple(held.value.shape)} and {held.config}",
                    )
                known.append(name)
        return known

    def _table(self, name: str) -> TableShard:
        table = self.tables.get(name)
        if table is None:
            raise PsError(grpc.StatusCode.NOT_FOUND, f"unknown table {name!r}: declare it first")
        return table

    def _dense(self, name: str) -> DenseParameter:
        held = self.dense.get(name)
        if held is None:
            raise PsError(grpc.StatusCode.NOT_FOUND, f"unknown dense parameter {name!r} on PS {self.index}")
        return held

    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.dtype != torch.int64 or ids.dim() != 1:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT, "row ids must be a 1-d int64 tensor")
        if ids.numel() and (bool((ids < 0).any()) or bool((ids % self.count != self.index).any())):
            raise PsError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"row ids must be non-negative and owned by this PS (id % {self.count} == {self.index})",
            )

    # --- pull -----------------------------------------------------------------------------
    def pull(
        self,
        tables: list[tuple[str, torch.Tensor]],
        dense: list[str],
        step: int = 0,
        finalize_step: int = -1,
        finalize_workers: Iterable[str] = (),
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        for _, ids in tables:
            self._check_ids(ids)
        with self.lock:
            if self.mode is Mode.SYNC and finalize_step > self.applied_step:
                self._finalize(finalize_step, set(finalize_workers))
            rows = [self._table(name).read(ids) for name, ids in tables]
            values = [self._dense(name).value.detach().clone() for name in dense]
            return rows, values, self.version

    # --- push -----------------------------------------------------------------------------
    def push(
        self,
        worker: str,
        key: Key | None,
        version: int,
        examples: int,
        tables: list[tuple[str, torch.Tensor, torch.Tensor]],
        dense: list[tuple[str, torch.Tensor]],
        step: int = 0,
        step_workers: int = 0,
    ) -> tuple[int, int]:
        """Returns (status, version) with status one of ``ps_pb2.PushReply.Status``."""
        for name, ids, grads in tables:
            self._check_ids(ids)
            table = self._table(name)
            if grads.dtype != torch.float32 or tuple(grads.shape) != (ids.numel(), table.config.dim):
                raise PsError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"table {name!r}: gradients must be float32 [{ids.numel()}, {table.config.dim}], "
                    f"got {grads.dtype} {list(grads.shape)}",
                )
        for name, grad in dense:
            if tuple(grad.shape) != tuple(self._dense(name).value.shape):
                raise PsError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"dense {name!r}: gradient of the wrong shape"
                )
        contribution = Contribution(key, max(1, examples), tables, dense)
        if dense and not tables and all(self._dense(name).config.name == "assign" for name, _ in dense):
            # Saved values (a hybrid job's dense weights): kept as they are, in any mode; not a
            # training update (no version, no step, no table's Adam count).
            with self.lock:
                for name, value in dense:
                    self.dense[name].apply(value)
                return ps_pb2.PushReply.APPLIED, self.version
        with self.lock:
            if self.mode is Mode.SYNC:
                return self._push_sync(worker, contribution, step, step_workers)
            if key is not None and key in self.applied:
                self.duplicates += 1
                return ps_pb2.PushReply.DUPLICATE, self.version
            if self.max_staleness is not None and self.version - version > self.max_staleness:
                self.stale += 1
                return ps_pb2.PushReply.STALE, self.version
            self._apply([contribution])
            return ps_pb2.PushReply.APPLIED, self.version

    def _push_sync(
        self, worker: str, contribution: Contribution, step: int, step_workers: int
    ) -> tuple[int, int]:
        if step <= self.applied_step:
            self.late += 1
            return ps_pb2.PushReply.LATE, self.version
        status = ps_pb2.PushReply.APPLIED
        if contribution.key is not None and contribution.key in self.applied:
            # Still counted as this worker's share of the step (the step waits for it), with
            # no effect: the batch was applied before.
            self.duplicates += 1
            contribution = Contribution(None, 0, [], [])
            status = ps_pb2.PushReply.DUPLICATE
        members = self.steps.setdefault(step, {})
        members[worker] = contribution
        if step_workers and len(members) >= step_workers:
            self._finalize(step, set(members))
        self.lock.notify_all()
        return status, self.version

    def _finalize(self, step: int, workers: set[str]) -> None:
        """Applies ``step`` from the pushes of ``workers`` (waiting briefly for any missing)."""
        deadline = time.monotonic() + FINALIZE_WAIT_S
        while not workers <= set(self.steps.get(step, {})):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "step %d: pushes of %s never arrived", step, workers - set(self.steps.get(step, {}))
                )
                break
            self.lock.wait(remaining)
            if self.applied_step >= step:
                return
        pushed = self.steps.pop(step, {})
        self._apply([pushed[w] for w in sorted(workers) if w in pushed])
        self.applied_step = step
        for older in [s for s in self.steps if s <= step]:
            del self.steps[older]  # partial pushes of workers that died in an applied step
        self.lock.notify_all()

    def _apply(self, contributions: list[Contribution]) -> None:
        """One optimizer update from the examples-weighted mean of ``contributions``' gradients
        (a single contribution in asynchronous mode)."""
        total = sum(c.examples for c in contributions)
        by_table: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        by_dense: dict[str, torch.Tensor] = {}
        for part in contributions:
            weight = part.examples / total if total else 0.0
            for name, ids, grads in part.tables:
                ids_list, grads_list = by_table.setdefault(name, ([], []))
                ids_list.append(ids)
                grads_list.append(grads * weight if len(contributions) > 1 else grads)
            for name, grad in part.dense:
                scaled = grad * weight if len(contributions) > 1 else grad
                by_dense[name] = by_dense[name] + scaled if name in by_dense else scaled
        for name, table in self.tables.items():
            # Every table counts the update (Adam's bias correction), touched or not.
            if name in by_table:
                ids, grads = coalesce(torch.cat(by_table[name][0]), torch.cat(by_table[name][1]))
                table.apply(ids, grads)
            else:
                table.apply(torch.empty(0, dtype=torch.int64), torch.empty(0, table.config.dim))
        for name, grad in by_dense.items():
            self.dense[name].apply(grad)
        for part in contributions:
            if part.key is not None:
                self.applied.add(part.key)
        self.version += 1

    # --- checkpoints ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        with self.lock:
            keys = torch.tensor(sorted(self.applied), dtype=torch.int64).view(-1, 3)
            return {
                "mode": self.mode.value,
                "seed": self.seed,
                "version": self.version,
                "applied_step": self.applied_step,
                "applied": keys,
                "tables": {
                    name: {"config": _config_dict(table.config), **table.state()}
                    for name, table in self.tables.items()
                },
                "dense": {
                    name: {
                        "value": held.value.detach().clone(),
                        "optimizer": asdict(held.config),
                        "optimizer_state": held.optimizer.state_dict(),
                    }
                    for name, held in self.dense.items()
                },
            }

    def restore(self, source: checkpoint.Source) -> None:
        """Loads this PS's part of ``source`` (its own file, or a re-shard of another count)."""
        with self.lock:
            for state in checkpoint.read(source):
                self.version = max(self.version, int(state["version"]))
                self.applied_step = max(self.applied_step, int(state["applied_step"]))
                self.applied.update((int(e), int(s), int(b)) for e, s, b in state["applied"].tolist())
                for name, saved in state["tables"].items():
                    config = _config_from_dict(saved["config"])
                    table = self.tables.setdefault(name, TableShard(config, self.seed, self.budget))
                    table.steps = max(table.steps, int(saved["steps"]))
                    for block in saved["blocks"]:
                        ids = block["ids"]
                        mine = (ids % self.count == self.index).nonzero(as_tuple=True)[0]
                        table.load_rows(ids[mine], [part[mine] for part in block["parts"]])
                for name, saved in state["dense"].items():
                    if ps_of_dense(name, self.count) != self.index:
                        continue
                    optimizer = OptimizerConfig(**saved["optimizer"])
                    held = DenseParameter.create(saved["value"], optimizer)
                    held.optimizer.load_state_dict(saved["optimizer_state"])
                    self.dense[name] = held
            self.restored_from = ",".join(str(path) for path in source.paths)
            self.checkpoint_version = self.version

    def stats(self) -> PsStats:
        return PsStats(
            index=self.index,
            count=self.count,
            mode=self.mode.value,
            version=self.version,
            rows=sum(table.rows for table in self.tables.values()),
            row_budget=self.max_rows,
            bytes_held=sum(table.bytes_held for table in self.tables.values()),
            rss_bytes=rss_bytes(),
            pulls=self.pull_latency.count,
            pushes=self.push_latency.count,
            pull_p50_ms=self.pull_latency.percentile_ms(0.5),
            pull_p99_ms=self.pull_latency.percentile_ms(0.99),
            push_p50_ms=self.push_latency.percentile_ms(0.5),
            push_p99_ms=self.push_latency.percentile_ms(0.99),
            duplicates=self.duplicates,
            stale=self.stale,
            late=self.late,
            applied_batches=len(self.applied),
            restored_from=self.restored_from,
            checkpoint_version=self.checkpoint_version,
        )


def _config_dict(config: TableConfig) -> dict[str, Any]:
    return {
        "name": config.name,
        "dim": config.dim,
        "init_std": config.init_std,
        "optimizer": asdict(config.optimizer),
    }


def _config_from_dict(saved: dict[str, Any]) -> TableConfig:
    return TableConfig(
        saved["name"], int(saved["dim"]), float(saved["init_std"]), OptimizerConfig(**saved["optimizer"])
    )
