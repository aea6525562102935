"""Hybrid mode's dense weights kept on the PS: saved by the dense group's rank 0, loaded by the
workers of a later round, so a new worker group carries on from them instead of a new init."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from workers.ps import checkpoint, ps_pb2
from workers.ps.contract import Mode, PsEnv, Role
from workers.ps.local import LocalPsJob
from workers.ps.optim import OptimizerConfig
from workers.ps.server import PsState
from workers.ps.store import TableConfig
from workers.sdk import ps as sdk_ps

ADAM = OptimizerConfig("adam", lr=0.1)
KEEP = OptimizerConfig("assign", lr=0.0)


def test_a_saved_dense_value_is_kept_as_pushed_and_is_no_training_update(tmp_path: Path) -> None:
    ps = PsState(index=0, count=1, mode=Mode.ASYNC, max_staleness=0)
    ps.declare([TableConfig("t", 2, 0.0, ADAM)], [("dense/w", torch.zeros(3), KEEP)])
    status, version = ps.push("w0", None, 0, 1, [], [("dense/w", torch.tensor([1.0, 2.0, 3.0]))])
    assert status == ps_pb2.PushReply.APPLIED and version == 0  # no version: nothing goes stale
    assert ps.tables["t"].steps == 0  # no table update (Adam's bias correction counts on)
    _, values, _ = ps.pull([], ["dense/w"])
    assert values[0].tolist() == [1.0, 2.0, 3.0]
    restored = PsState(index=0, count=1, mode=Mode.ASYNC)
    checkpoint.write(str(tmp_path), 0, 1, ps.state())
    source = checkpoint.choose(str(tmp_path), 0, 1)
    assert source is not None
    restored.restore(source)  # the saved weights are in the PS's checkpoint too
    assert restored.dense["dense/w"].value.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="dense parameters only"):
        TableConfig("u", 2, 0.0, KEEP).check()


def session(job: LocalPsJob, index: int) -> sdk_ps.Session:
    env = PsEnv(
        role=Role.WORKER,
        index=index,
        ps_addresses=job.ps_addresses,
        coordinator=job.coordinator,
        mode=Mode.HYBRID,
        worker_id=f"worker-{index}",
        secret=job.secret,
    )
    return sdk_ps.connect(env)


def model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))


def weights(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def test_a_new_worker_group_loads_the_dense_weights_saved_before_it(
    ps_job: Callable[..., LocalPsJob],
) -> None:
    job: LocalPsJob = ps_job(ps_count=2, mode=Mode.HYBRID)
    job.start_servers()
    first = session(job, 0)
    net = model(1)
    first.dense(net, sdk_ps.SGD(lr=0.5))
    x = torch.randn(8, 4)
    optimizer = first.local_optimizer
    assert optimizer is not None
    for _ in range(3):  # local training: DDP's part in hybrid mode, one worker here
        net(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    first.save_dense()
    saved = weights(net)
    net(x).pow(2).mean().backward()  # trained on after the save, then killed: this step is lost
    optimizer.step()
    assert first.saves_dense
    first.client.close()  # no close(): the worker died

    second = session(job, 1)
    fresh = model(2)
    assert not all(torch.equal(a, b) for a, b in zip(weights(fresh), saved, strict=True))
    second.dense(fresh, sdk_ps.SGD(lr=0.5))
    assert all(torch.equal(a, b) for a, b in zip(weights(fresh), saved, strict=True))
    with torch.no_grad():
        next(fresh.parameters()).add_(1.0)
    second.close()  # rank 0 saves on close
    third = session(job, 2)
    again = model(3)
    third.dense(again, sdk_ps.SGD(lr=0.5))
    assert torch.equal(next(again.parameters()), next(fresh.parameters()))
    third.close()
