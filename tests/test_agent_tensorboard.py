"""The agent's reading of TensorBoard event files (workers/agent/tensorboard.py), in process:
which files are a rank's (its own directory; under runs/ only those named with its pid, written
since it started; never the SDK's own mirror), scalars only, ``add_scalars`` names, a record cut
mid-write read once complete, and sequence numbers that stay the same across readings."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from workers.agent.tensorboard import SDK_SUFFIX, SEQ_BASE, EventFileName, ScalarFiles


def write(directory: Path, suffix: str = "", steps: int = 3) -> Path:
    writer = SummaryWriter(log_dir=str(directory), filename_suffix=suffix)
    for step in range(steps):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.add_text("note", "not a scalar", step)
    writer.add_scalars("lr", {"base": 0.1}, 0)
    writer.close()
    return next(p for p in directory.glob("events.out.tfevents.*") if p.name.endswith(suffix))


def values(records: list[dict[str, object]], name: str) -> list[tuple[object, object]]:
    return [(r["step"], r["values"][name]) for r in records if name in r["values"]]  # type: ignore[index,operator]


def test_own_directory_runs_by_pid_and_never_the_sdk_mirror(tmp_path: Path) -> None:
    own, runs = tmp_path / "own", tmp_path / "work" / "runs"
    write(own / "sub")
    write(own, suffix=SDK_SUFFIX)  # the SDK's mirror: its points came through the telemetry file
    mine = write(runs / "exp1")
    assert EventFileName.parse(mine.name).pid == os.getpid()  # type: ignore[union-attr]
    foreign = runs / "old" / "events.out.tfevents.1700000000.host.999999.0"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(mine.read_bytes())  # another process's (or an earlier run's) file
    stale = runs / "stale" / f"events.out.tfevents.{int(time.time()) - 3600}.host.{os.getpid()}.7"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(mine.read_bytes())  # this pid, but written long before the rank started

    files = ScalarFiles(own, [runs], os.getpid(), time.time() - 5)
    records = files.read(final=True)
    found = sorted(str(Path(p).relative_to(tmp_path).parent) for p in files.paths)
    # add_scalars writes a file of its own per key, in a directory named after it.
    assert found == ["own/sub", "own/sub/lr_base", "work/runs/exp1", "work/runs/exp1/lr_base"]
    assert values(records, "loss") == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))] * 2  # float32
    assert values(records, "lr/base") == [(0, pytest.approx(0.1))] * 2  # add_scalars' own directory names it
    assert all(r["seq"] >= SEQ_BASE for r in records)  # type: ignore[operator]
    assert not any("note" in r["values"] for r in records)  # type: ignore[operator]
    assert files.read() == []  # nothing new

    again = ScalarFiles.of_files(files.paths).read(final=True)
    assert [r["seq"] for r in again] == [r["seq"] for r in records]  # the same keys: ingest drops repeats


def test_a_record_cut_mid_write_is_read_once_complete(tmp_path: Path) -> None:
    whole = write(tmp_path / "w", steps=5)
    data = whole.read_bytes()
    growing = tmp_path / "own" / whole.name
    growing.parent.mkdir()
    growing.write_bytes(data[:-9])
    files = ScalarFiles(growing.parent, [], None, 0.0)
    first = files.read(final=True)
    with growing.open("ab") as fh:
        fh.write(data[-9:])
    rest = files.read(final=True)
    assert [s for s, _ in values(first + rest, "loss")] == [0, 1, 2, 3, 4]
    assert len({r["seq"] for r in first + rest}) == len(first + rest)
