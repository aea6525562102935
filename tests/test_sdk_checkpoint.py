"""SDK checkpoints: exact round trips, keep-last-K, atomic files, asynchronous snapshots, DDP and DCP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.test_workload_digits import REPO
from workers import sdk
from workers.sdk import telemetry as telemetry_module
from workers.sdk.telemetry import Telemetry


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Points the SDK's telemetry at a file, as the agent would."""
    path = tmp_path / "telemetry.jsonl"
    sink = Telemetry(str(path), print_every=0, rank=0)
    monkeypatch.setattr(telemetry_module, "_telemetry", sink)
    yield path
    sink.close()


def _records(path: Path, kind: str) -> list[dict[str, Any]]:
    sdk.flush()
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in lines if r["kind"] == kind]


def _trained_state() -> dict[str, Any]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 7, "tags": ("a", 1)}


def _assert_same(left: Any, right: Any) -> None:
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    elif isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            _assert_same(left[key], right[key])
    elif isinstance(left, list | tuple):
        assert type(left) is type(right) and len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            _assert_same(a, b)
    else:
        assert left == right


def test_save_then_load_latest_reproduces_the_state(tmp_path: Path, recorded: Path) -> None:
    assert sdk.load_latest(tmp_path / "ckpt") is None
    state = _trained_state()
    path = sdk.save(state, 5, directory=tmp_path / "ckpt")
    loaded = sdk.load_latest(tmp_path / "ckpt")
    assert loaded is not None
    _assert_same(state, loaded[0])
    assert loaded[1] == 5
    [record] = _records(recorded, "checkpoint")
    assert record["step"] == 5 and record["path"] == str(path)
    assert record["size_bytes"] == path.stat().st_size and record["blocking_ms"] > 0
    assert record["seq"] == 1 and record["t"] > 0


def test_keeps_the_last_k_and_leaves_no_temporary_files(tmp_path: Path, recorded: Path) -> None:
    directory = tmp_path / "ckpt"
    for step in (10, 20, 30, 40):
        sdk.save({"step": torch.tensor(step)}, step, directory=directory, keep=2)
    assert sorted(p.name for p in directory.iterdir()) == ["step-000000030.pt", "step-000000040.pt"]
    assert sdk.latest_step(directory) == 40


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, recorded: Path) -> None:
    directory = tmp_path / "ckpt"
    sdk.save({"w": torch.ones(3)}, 1, directory=directory)
    (directory / "step-000000002.pt").write_bytes(b"not a checkpoint")
    loaded = sdk.load_latest(directory)
    assert loaded is not None and loaded[1] == 1 and torch.equal(loaded[0]["w"], torch.ones(3))
    [warning] = _records(recorded, "event")
    assert warning["event"] == "checkpoint_unreadable" and warning["data"]["step"] == 2


def test_async_save_snapshots_at_call_time_and_loads_back(tmp_path: Path, recorded: Path) -> None:
    directory = tmp_path / "ckpt"
    model = nn.Linear(64, 64)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    checkpointer = sdk.AsyncCheckpointer(directory, keep=2)
    checkpointer.save({"model": model.state_dict(), "step": 1}, 1)
    with torch.no_grad():
        # Changes after save() returns must not leak into the checkpoint being written.
        model.weight.add_(1.0)
    checkpointer.wait()
    loaded = sdk.load_latest(directory)
    assert loaded is not None and loaded[1] == 1
    _assert_same({"model": expected, "step": 1}, loaded[0])

    # The second save reuses the host buffers, after waiting for the first write.
    checkpointer.save({"model": model.state_dict(), "step": 2}, 2)
    checkpointer.save({"model": model.state_dict(), "step": 3}, 3)
    checkpointer.wait()
    latest = sdk.load_latest(directory)
    assert latest is not None and latest[1] == 3
    _assert_same({"model": model.state_dict(), "step": 3}, latest[0])
    assert sorted(p.name for p in directory.iterdir()) == ["step-000000002.pt", "step-000000003.pt"]
    blocking = [r["blocking_ms"] for r in _records(recorded, "checkpoint")]
    assert len(blocking) == 3 and all(b >= 0 for b in blocking)


DISTRIBUTED_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from workers import sdk

    out, ckpt = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Whole-state checkpoint: rank 0 writes, everyone passes the barrier, everyone can load.
    state = {"w": torch.arange(10.0) * (rank + 1)}
    sdk.save(state, 3, directory=ckpt + "/whole")
    loaded, step = sdk.load_latest(ckpt + "/whole")
    # Rank 1 looks in an empty directory (another host, no shared disk): rank 0's copy is sent.
    mine = ckpt + "/whole" if rank == 0 else ckpt + "/elsewhere"
    assert sdk.load_latest(mine) is None or rank == 0
    shared_state, shared_step = sdk.load_latest(mine, collective=True)
    assert shared_step == 3 and torch.equal(shared_state["w"], torch.arange(10.0))
    # Sharded: a DTensor split across the two ranks; each rank writes and reads back its half.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2,))
    shard = {"param": distribute_tensor(torch.arange(8.0), mesh, [Shard(0)]), "shared": torch.arange(6.0)}
    sdk.save_sharded(shard, 9, directory=ckpt + "/sharded")
    target = {"param": distribute_tensor(torch.zeros(8), mesh, [Shard(0)]), "shared": torch.zeros(6)}
    sharded_step = sdk.load_sharded(target, directory=ckpt + "/sharded")
    local = target["param"].to_local()
    # Stop agreement: only rank 1 is asked to stop, both must see it on the same step.
    if rank == 1:
        sdk.request_stop()
    stopped_at = next(s for s in range(1, 100) if sdk.should_stop(s))
    # Outside the console only rank 0 prints its line (every 10 steps by default).
    sdk.log(10, rank=rank)
    with open(out + f".{rank}", "w") as handle:
        json.dump({
            "step": step, "w": loaded["w"].tolist(), "sharded_step": sharded_step,
            "local": local.tolist(), "shared": target["shared"].tolist(),
            "stopped_at": stopped_at,
        }, handle)
    # Both ranks finish every collective before either tears the group down: a rank that exits
    # while its peer is still inside one was seen to abort in gloo ("terminate called ...").
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_ddp_and_sharded_checkpoints_under_plain_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(DISTRIBUTED_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            # --standalone: torchrun picks a free port itself, with no window for another
            # process to take it (tests of other suites run beside these).
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(tmp_path / "out"),
            str(tmp_path / "ckpt"),
        ],
        cwd=REPO,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("[step")] == ["[step 10] rank 0"]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"out.{rank}").read_text())
        assert seen["step"] == 3 and seen["w"] == [float(i) for i in range(10)]  # rank 0's state
        assert seen["sharded_step"] == 9
        assert seen["local"] == [float(i) for i in range(rank * 4, rank * 4 + 4)]
        assert seen["shared"] == [float(i) for i in range(6)]
        assert seen["stopped_at"] == 10
    assert sorted(p.name for p in (tmp_path / "ckpt/whole").iterdir()) == ["step-000000003.pt"]
    assert sorted(p.name for p in (tmp_path / "ckpt/sharded").iterdir()) == ["step-000000009.dcp"]
