"""An embedding table 4x larger than one PS may hold trains when sharded over 4 PS.

The limit is real memory, not only bookkeeping: each PS caps its data segment (RLIMIT_DATA) at its
size after start-up (torch, grpc and the handler threads loaded) plus ``GROWTH``, and holds at most
``BUDGET_ROWS`` rows (the row budget refuses cleanly before the kernel refuses an allocation).
The table is 4 x BUDGET_ROWS rows of 64 float32: 4x the row budget, 2x the whole growth cap
(the cap also covers the row index, message buffers and allocator slack: a PS holding its 16 MiB
of rows grew its data segment by ~24 MiB here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from tests.support.ps import count_worker_argv
from workers.ps.local import LocalPsJob

DIM = 64
BUDGET_ROWS = 65536  # 16 MiB of rows
GROWTH = 32 << 20  # data-segment growth cap per PS: the rows plus 16 MiB for everything else
ROWS = 4 * BUDGET_ROWS  # 64 MiB of rows
BATCH = 4096


def test_a_table_four_times_one_ps_limit_trains_over_four_ps(
    ps_job: Callable[..., LocalPsJob], tmp_path: Path
) -> None:
    started = time.monotonic()
    argv = count_worker_argv(tmp_path / "w.json", ROWS, BATCH * 4, BATCH, "--dim", str(DIM))
    # glibc keeps freed message buffers in per-thread arenas and raises its mmap threshold as it
    # goes: one arena and a fixed threshold make the data segment follow what the PS holds.
    limits = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    # Given one PS under the memory cap alone (no row budget: the kernel's limit is what stops it)
    alone: LocalPsJob = ps_job(ps_count=1, max_data_bytes=GROWTH, extra_env=limits)
    alone.start_servers()
    worker = alone.start_worker(0, argv, TRAINYARD_PS_RETRY_S="5")
    # when the table is trained on it, then it runs out of memory before holding it
    assert worker.wait(180) != 0
    assert "RESOURCE_EXHAUSTED" in alone.log("worker-0") or alone.processes["ps-0"].poll() is not None, (
        alone.log("worker-0")[-3000:] + alone.log("ps-0")[-3000:]
    )
    alone.stop()

    # Given four PS with the same cap and the row budget
    sharded: LocalPsJob = ps_job(ps_count=4, max_data_bytes=GROWTH, max_rows=BUDGET_ROWS, extra_env=limits)
    sharded.start_servers()
    # when the same table is trained over them
    worker = sharded.start_worker(0, argv)
    assert worker.wait(180) == 0, sharded.log("worker-0")[-3000:]
    # then every row was stored and updated once, a quarter on each PS, within its budget
    client = sharded.client()
    stats = client.stats()
    assert [s["rows"] for s in stats] == [BUDGET_ROWS] * 4
    sample = torch.randint(0, ROWS, (5000,))
    rows, _, _ = client.pull({"examples": sample}, [])
    assert torch.equal(rows["examples"], torch.full((5000, DIM), -1.0 / DIM))
    assert all(s["rss_bytes"] > 0 for s in stats)
    print(
        f"\n{ROWS} x {DIM} float32 rows ({ROWS * DIM * 4 >> 20} MiB) over 4 PS, each capped at +{GROWTH >> 20} MiB "
        f"of data and {BUDGET_ROWS} rows; one PS alone ran out; {time.monotonic() - started:.1f} s"
    )
