"""What an agent's heartbeat says of a round's progress (workers/agent/shipper.py): the newest
step its ranks logged, the script's own total (sdk.progress), and, for a round that carries its
ranks over in place, the step they had reached in the round before (not nothing until their
next point). The shipper reads real telemetry files and ships to the real Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from tests.support.agents import redis_url
from workers.agent.shipper import RoundProgress, TelemetryShipper
from workers.protocol import TELEMETRY_STREAM
from workers.signing import report_key


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("a") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")


def metric(seq: int, step: int, at: float, **values: float) -> dict[str, Any]:
    return {"kind": "metric", "seq": seq, "t": at, "step": step, "values": values}


def test_a_rounds_progress_has_its_steps_its_total_and_goes_on_in_place(tmp_path: Path) -> None:
    redis.Redis.from_url(redis_url()).delete(TELEMETRY_STREAM)
    shipper = TelemetryShipper(redis_url(), "host-p", report_key("tyn_progress-test-secret"))
    files = [tmp_path / name for name in ("telemetry.jsonl", "stdout.log", "stderr.log")]
    for path in files:
        path.touch()
    shipper.add(91, 1, 0, *files)

    # Given a script that announces its total (logged at step 0) and then takes 40 steps
    write_lines(files[0], [metric(1, 0, 1000.0, total_steps=300)])
    write_lines(files[0], [metric(1 + s, s, 1000.0 + s, loss=1.0 / s) for s in range(1, 41)])
    shipper.tick()

    # Then the round has step 40 of 300, and its first step is step 1's time, not the total's
    assert shipper.progress(91, 1) == RoundProgress(last_step=40, first_step_at=1001.0, total_steps=300)

    # When its rank is carried over in place into round 2 before logging there
    shipper.carry((91, 1, 0), (91, 2, 0))
    # Then round 2 goes on from step 40 with the same total; its first step is still to come
    assert shipper.progress(91, 2) == RoundProgress(last_step=40, first_step_at=None, total_steps=300)
    write_lines(files[0], [metric(41 + s, 40 + s, 2000.0 + s, loss=0.1) for s in range(1, 6)])
    shipper.tick()
    assert shipper.progress(91, 2) == RoundProgress(last_step=45, first_step_at=2001.0, total_steps=300)

    # And a round the shipper never saw has no progress
    assert shipper.progress(91, 7) == RoundProgress()
