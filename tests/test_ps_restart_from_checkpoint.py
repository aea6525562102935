"""A PS SIGKILLed mid-run restarts from its last checkpoint while the workers wait for it.

Rows the checkpoint holds as updated keep that value to the end (neither lost nor applied twice:
the dedupe keys are checkpointed with them); updates after the checkpoint are lost by design.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tests.support.ps import count_worker_argv, wait_for
from workers.ps import checkpoint
from workers.ps.local import LocalPsJob

EXAMPLES = 2400
SHARD = 80
BATCH = 16


def test_a_killed_ps_resumes_from_its_checkpoint(ps_job: Callable[..., LocalPsJob], tmp_path: Path) -> None:
    started = time.monotonic()
    job: LocalPsJob = ps_job(ps_count=2, lease_s=3.0, checkpoint_every_s=0.5)
    job.start_servers()
    hold = tmp_path / "hold"
    for index in (0, 1):
        argv = count_worker_argv(tmp_path / f"w{index}.json", EXAMPLES, SHARD, BATCH, "--hold", str(hold))
        job.start_worker(index, argv)
    queue = job.coordinator_client()
    # Given training under way and a checkpoint of PS 1 written (the workers paused around it)
    wait_for(lambda: queue.queue()["epochs"] and queue.queue()["done"] >= 4, 120, "4 shards done", job)
    hold.touch()
    time.sleep(0.3)
    path, version = job.client().checkpoint()[1]
    saved = checkpoint.read(checkpoint.Source(2, (Path(path),), reshard=False))
    state = next(saved)
    saved_ids = torch.cat([block["ids"] for block in state["tables"]["examples"]["blocks"]])
    saved_rows = torch.cat([block["parts"][0] for block in state["tables"]["examples"]["blocks"]])
    assert version > 0 and torch.equal(saved_rows, torch.full_like(saved_rows, -1.0))
    # when it is SIGKILLed after more updates and started again at the same address
    hold.unlink()
    wait_for(lambda: queue.queue()["done"] >= 8, 120, "4 more shards", job)
    job.kill("ps-1", signal.SIGKILL)
    time.sleep(0.5)
    job.start_ps(1)
    # then it reports the checkpoint it resumed from, and the workers finish the epoch through it
    for index in (0, 1):
        assert job.processes[f"worker-{index}"].wait(180) == 0, job.log(f"worker-{index}")
    assert "restored version" in job.log("ps-1"), job.log("ps-1")
    client = job.client()
    restarted = client.stats()[1]
    assert (
        restarted["restored_from"].endswith("ps-0001-of-0002.pt")
        and restarted["checkpoint_version"] >= version
    )
    stats = queue.queue()
    assert stats["finished"] and stats["completions"] == {f"0:{s}": 1 for s in range(EXAMPLES // SHARD)}
    rows, _, _ = client.pull({"examples": torch.arange(EXAMPLES)}, [])
    values = rows["examples"][:, 0]
    assert torch.equal(values[saved_ids], torch.full((saved_ids.numel(),), -1.0))
    assert torch.equal(values[0::2], torch.full((EXAMPLES // 2,), -1.0))  # PS 0 kept running
    lost = int((values[1::2] == 0).sum())
    assert set(values[1::2].tolist()) <= {-1.0, 0.0}
    print(
        f"\nPS 1 resumed from version {restarted['checkpoint_version']}; {lost} row updates made after its "
        f"last checkpoint were lost; {time.monotonic() - started:.1f} s in all"
    )
