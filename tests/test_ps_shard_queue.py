"""The coordinator's decisions: leases, re-queues, exactly-once completion, the step barrier."""

from __future__ import annotations

import threading

import pytest

from workers.ps import ps_pb2
from workers.ps.coordinator import CoordinatorError, Dataset, ShardQueue

GRANTED = ps_pb2.AcquireReply.GRANTED


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def queue(epochs: int = 1, lease_s: float = 2.0) -> tuple[ShardQueue, Clock]:
    clock = Clock()
    q = ShardQueue(lease_s=lease_s, clock=clock)
    q.register("a", Dataset(examples=100, shard_size=30, batch_size=10, epochs=epochs))
    return q, clock


def test_shards_cover_the_epoch_and_the_last_one_is_short() -> None:
    q, _ = queue()
    granted = [q.acquire("a")[1] for _ in range(4)]
    assert granted == [(0, 0, 0, 30), (0, 1, 30, 60), (0, 2, 60, 90), (0, 3, 90, 100)]
    assert q.acquire("a")[0] == ps_pb2.AcquireReply.WAIT  # all handed out, none done


def test_a_worker_that_misses_its_lease_has_its_shard_requeued_and_cannot_complete_it() -> None:
    # Given worker a holding shard 0 and worker b registered later
    q, clock = queue()
    q.acquire("a")
    clock.now = 1.5
    q.register("b", None)
    # when a's lease runs out while b keeps renewing
    clock.now = 2.5
    assert q.heartbeat("b")
    assert not q.heartbeat("a")
    # then shard 0 goes to b first, b's completion counts and a's late one is refused
    assert q.acquire("b") == (GRANTED, (0, 0, 0, 30))
    assert not q.complete("a", 0, 0)
    assert q.complete("b", 0, 0)
    stats = q.stats()
    assert stats.requeued == 1 and stats.rejected_completions == 1 and stats.completions == {"0:0": 1}


def test_leaving_requeues_at_once_and_epochs_advance_when_every_shard_is_done() -> None:
    q, _ = queue(epochs=2)
    q.register("b", None)
    q.acquire("a")
    q.leave("a")
    for _ in range(4):
        _, shard = q.acquire("b")
        assert shard is not None
        assert q.complete("b", shard[0], shard[1])
    assert q.epoch == 1 and q.examples_done == 100
    for _ in range(4):
        _, shard = q.acquire("b")
        assert shard is not None and shard[0] == 1
        q.complete("b", shard[0], shard[1])
    assert q.acquire("b")[0] == ps_pb2.AcquireReply.FINISHED
    assert q.stats().completions == {f"{e}:{s}": 1 for e in (0, 1) for s in range(4)}


def test_a_different_dataset_is_refused() -> None:
    q, _ = queue()
    with pytest.raises(CoordinatorError, match="dataset"):
        q.register("b", Dataset(examples=99, shard_size=30, batch_size=10, epochs=1))


def test_the_barrier_closes_for_the_live_workers_and_names_who_completed_the_last_step() -> None:
    # Given workers a and b in synchronous mode, both with a batch in step 0
    q, clock = queue()
    q.register("b", None)
    results: dict[str, object] = {}

    def arrive(worker: str, has_batch: bool) -> None:
        results[worker] = q.begin_step(worker, has_batch, wait_s=10)

    threads = [threading.Thread(target=arrive, args=(w, True)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    step0 = results["a"]
    assert step0 == results["b"] and step0.step == 0 and step0.members == ["a", "b"]  # type: ignore[attr-defined]
    # when b dies during step 0 (its lease runs out) and a reaches the next barrier
    clock.now = 1.9
    q.heartbeat("a")
    clock.now = 2.1
    step1 = q.begin_step("a", True, wait_s=5)
    # then step 1 closes without waiting for b, and step 0 is finalized from a's pushes alone
    assert step1 is not None and step1.step == 1 and step1.members == ["a"]
    assert step1.finalize_step == 0 and step1.finalize_workers == ["a"]


def test_the_first_synchronous_step_waits_for_the_initial_workers() -> None:
    # Given a job started with two workers, of which only a has registered
    clock = Clock()
    q = ShardQueue(lease_s=100.0, clock=clock, min_workers=2)
    q.register("a", Dataset(examples=100, shard_size=30, batch_size=10, epochs=1))
    # when a reaches the barrier, then the step does not close without b
    assert q.begin_step("a", True, wait_s=0.3) is None
    q.register("b", None)
    results: dict[str, object] = {}
    thread = threading.Thread(target=lambda: results.update(a=q.begin_step("a", True, wait_s=10)))
    thread.start()
    step = q.begin_step("b", True, wait_s=10)
    thread.join()
    assert step is not None and step.members == ["a", "b"] and results["a"] == step
