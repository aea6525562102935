"""A PS's decisions in-process: dedupe, staleness, synchronous steps, checkpoints and re-sharding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from workers.ps import checkpoint, ps_pb2
from workers.ps.contract import Mode
from workers.ps.optim import OptimizerConfig
from workers.ps.placement import ps_of_dense
from workers.ps.server import PsError, PsState
from workers.ps.store import TableConfig

SGD = OptimizerConfig("sgd", lr=1.0)
ADAM = OptimizerConfig("adam", lr=0.1)


def state(mode: Mode = Mode.ASYNC, index: int = 0, count: int = 1, **kwargs: object) -> PsState:
    ps = PsState(index=index, count=count, mode=mode, **kwargs)  # type: ignore[arg-type]
    ps.declare([TableConfig("t", 2, 0.0, SGD)], [])
    return ps


def grads(ids: list[int], value: float = 1.0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [("t", torch.tensor(ids), torch.full((len(ids), 2), value))]


def test_a_batch_pushed_twice_is_applied_once() -> None:
    ps = state()
    first = ps.push("w1", (0, 3, 1), 0, 8, grads([1, 2]), [])
    again = ps.push("w2", (0, 3, 1), 0, 8, grads([1, 2]), [])
    assert first[0] == ps_pb2.PushReply.APPLIED and again[0] == ps_pb2.PushReply.DUPLICATE
    rows, _, version = ps.pull([("t", torch.tensor([1, 2, 3]))], [])
    assert rows[0].tolist() == [[-1.0, -1.0], [-1.0, -1.0], [0.0, 0.0]] and version == 1


def test_bounded_staleness_refuses_a_push_older_than_the_bound() -> None:
    ps = state(max_staleness=1)
    for batch in range(3):
        ps.push("fast", (0, 0, batch), batch, 1, grads([0]), [])
    status, version = ps.push("slow", (0, 1, 0), 1, 1, grads([0]), [])
    assert status == ps_pb2.PushReply.STALE and version == 3
    assert ps.push("slow", (0, 1, 0), 2, 1, grads([0]), [])[0] == ps_pb2.PushReply.APPLIED


def test_a_synchronous_step_averages_its_members_by_examples() -> None:
    ps = state(Mode.SYNC)
    ps.push("a", (0, 0, 0), 0, 30, grads([0], 1.0), [], step=0, step_workers=2)
    assert ps.applied_step == -1  # waits for b
    ps.push("b", (0, 1, 0), 0, 10, grads([0], 5.0), [], step=0, step_workers=2)
    rows, _, version = ps.pull([("t", torch.tensor([0]))], [])
    # (30 * 1 + 10 * 5) / 40 = 2
    assert rows[0].tolist() == [[-2.0, -2.0]] and version == 1 and ps.applied_step == 0


def test_a_step_a_worker_died_in_is_applied_from_the_survivors_and_its_push_dropped() -> None:
    # Given a step with members a and b where b pushed to this PS and then died
    ps = state(Mode.SYNC)
    ps.push("b", (0, 1, 0), 0, 10, grads([0], 5.0), [], step=0, step_workers=2)
    ps.push("a", (0, 0, 0), 0, 10, grads([0], 1.0), [], step=0, step_workers=3)  # a third never came
    # when a pulls for step 1, naming itself as the only worker that completed step 0
    rows, _, _ = ps.pull([("t", torch.tensor([0]))], [], step=1, finalize_step=0, finalize_workers=["a"])
    # then step 0 is a's gradient alone, and b's batch is still free to be applied later
    assert rows[0].tolist() == [[-1.0, -1.0]]
    assert (0, 1, 0) not in ps.applied and (0, 0, 0) in ps.applied
    assert ps.push("b", (0, 1, 0), 0, 10, grads([0]), [], step=0, step_workers=1)[0] == ps_pb2.PushReply.LATE


def test_bad_requests_get_clear_errors() -> None:
    ps = state(count=2)
    with pytest.raises(PsError, match="unknown table"):
        ps.pull([("nope", torch.tensor([0]))], [])
    with pytest.raises(PsError, match="owned by this PS"):
        ps.pull([("t", torch.tensor([1]))], [])
    with pytest.raises(PsError, match="float32"):
        ps.push("w", None, 0, 1, [("t", torch.tensor([0]), torch.ones(1, 3))], [])
    with pytest.raises(PsError, match="exists as"):
        ps.declare([TableConfig("t", 3, 0.0, SGD)], [])


def test_changing_the_ps_count_reshards_rows_optimizer_state_and_dense_through_a_checkpoint(
    tmp_path: Path,
) -> None:
    # Given two PS trained with Adam (rows hold per-row state) and a dense parameter
    old = [PsState(index=i, count=2, mode=Mode.ASYNC, seed=3) for i in range(2)]
    dense_owner: dict[str, int] = {}
    for i, ps in enumerate(old):
        dense = [("w", torch.zeros(3), ADAM)] if ps_of_dense("w", 2) == i else []
        ps.declare([TableConfig("t", 2, 0.1, ADAM)], dense)
        if dense:
            dense_owner["w"] = i
        ids = torch.arange(i, 40, 2)
        for step in range(3):
            ps.push(
                "w",
                (0, step, i),
                0,
                1,
                [("t", ids, torch.randn(len(ids), 2))],
                [("w", torch.ones(3))] if dense else [],
            )
        checkpoint.write(str(tmp_path), i, 2, ps.state())
    before = torch.cat([old[i % 2].pull([("t", torch.tensor([i]))], [])[0][0] for i in range(40)])
    # when three PS start from that directory
    new = []
    for i in range(3):
        ps = PsState(index=i, count=3, mode=Mode.ASYNC, seed=3)
        source = checkpoint.choose(str(tmp_path), i, 3)
        assert source is not None and source.reshard and source.count == 2
        ps.restore(source)
        new.append(ps)
    # then every row is on its new owner with the same value and the same Adam state
    after = torch.cat([new[i % 3].pull([("t", torch.tensor([i]))], [])[0][0] for i in range(40)])
    assert torch.equal(before, after)
    assert sum(ps.stats().rows for ps in new) == 40
    one_old = old[0].tables["t"]
    one_new = new[0].tables["t"]
    row = 6  # on old PS 0 and on new PS 0
    old_state = one_old._gather(1, np.array([one_old.index[row]]))
    new_state = one_new._gather(1, np.array([one_new.index[row]]))
    assert torch.equal(old_state, new_state) and one_new.steps == one_old.steps
    owner = [ps for ps in new if "w" in ps.dense]
    assert len(owner) == 1 and torch.equal(owner[0].dense["w"].value, old[dense_owner["w"]].dense["w"].value)
    assert all(ps.applied == old[0].applied | old[1].applied for ps in new)
    # and a PS of the new count restarting later reads its own file, not the old set
    checkpoint.write(str(tmp_path), 1, 3, new[1].state())
    for i in (0, 2):
        checkpoint.write(str(tmp_path), i, 3, new[i].state())
    source = checkpoint.choose(str(tmp_path), 1, 3)
    assert source is not None and not source.reshard and len(source.paths) == 1
