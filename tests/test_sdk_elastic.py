"""In-place rounds at the SDK level: real gloo processes re-form 2 -> 3 -> 2 as control files change."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import procs
from workers.net import free_port
from workers.sdk.elastic import backend_for, device_for
from workers.sdk.elastic_control import Control, ElasticError, read_state, write_control
from workers.sdk.elastic_data import epoch_order, rank_slice

SCRIPT = Path(__file__).parent / "scripts" / "elastic_count.py"
ROOT = Path(__file__).resolve().parent.parent
# Long enough that the epoch outlasts both changes under load (the survivors train on while the
# newcomer starts); the test then lets the rest run without sleeps.
EXAMPLES = 4000


def control(round_no: int, rank: int, world: int, port: int, joiners: int = 0) -> Control:
    return Control("job", round_no, rank, max(rank, 0), world, "127.0.0.1", port, joiners)


def records(paths: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start(tmp: Path, rank_slot: int, **flags: Any) -> tuple[Any, Path, Path]:
    control_path = tmp / f"control-{rank_slot}.json"
    record = tmp / f"record-{rank_slot}.jsonl"
    argv = [sys.executable, str(SCRIPT), "--record", str(record)]
    for key, value in flags.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    env = {"TRAINYARD_CONTROL": str(control_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return procs.spawn(argv, env=env, log=tmp / f"out-{rank_slot}.log", cwd=ROOT), control_path, record


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("remaining", [0, 1, 3, 7, 30])
def test_a_step_splits_its_examples_by_rank_without_gap_or_overlap(world: int, remaining: int) -> None:
    position, batch = 11, 4
    taken = min(remaining, world * batch)
    covered: list[int] = []
    for rank in range(world):
        start, end = rank_slice(position, remaining, world, rank, batch)
        covered += range(start, end)
    assert covered == list(range(position, position + taken))


def test_the_epoch_order_is_the_same_permutation_everywhere() -> None:
    assert torch.equal(epoch_order(50, 3, 1), epoch_order(50, 3, 1))
    assert sorted(epoch_order(50, 3, 1).tolist()) == list(range(50))
    assert not torch.equal(epoch_order(50, 3, 1), epoch_order(50, 3, 2))


def test_a_bad_control_file_is_a_clear_error() -> None:
    with pytest.raises(ElasticError, match="bad field"):
        Control.parse({"round": 1, "rank": 0, "world_size": 2})
    with pytest.raises(ElasticError, match="outside world"):
        Control.parse({"round": 1, "rank": 2, "world_size": 2, "master_addr": "h", "master_port": 1})
    assert Control.parse(
        {"round": 1, "rank": -1, "world_size": 2, "master_addr": "h", "master_port": 1}
    ).leaves


def test_gpu_processes_use_nccl_on_their_local_ranks_gpu_and_cpu_processes_gloo() -> None:
    assert backend_for(torch.device("cuda", 1)) == "nccl"
    assert backend_for(torch.device("cpu")) == "gloo"
    assert device_for(torch.device("cuda"), local_rank=3) == torch.device("cuda", 3)
    assert device_for(torch.device("cuda", 0), local_rank=3) == torch.device("cuda", 0)
    assert device_for(None, local_rank=3) == device_for(torch.device("cpu"), 3) == torch.device("cpu")


def test_ranks_re_form_in_place_2_to_3_to_2(tmp_path: Path) -> None:
    fast = tmp_path / "fast"
    # Given two ranks training in round 1
    port = free_port()
    slots = []
    for rank in range(2):
        write_control(tmp_path / f"control-{rank}.json", control(1, rank, 2, port))
    for rank in range(2):
        slots.append(start(tmp_path, rank, examples=EXAMPLES, step_sleep=0.04, fast_file=fast))
    paths = [record for _, _, record in slots]

    def steps() -> int:
        return max((r.get("step", 0) for r in records(paths)), default=0)

    try:
        wait_for("the first steps", lambda: steps() >= 8)
        # When a newcomer joins in round 2 (world 3) ...
        port = free_port()
        newcomer, newcomer_control, newcomer_record = start(
            tmp_path, 2, examples=EXAMPLES, step_sleep=0.04, fast_file=fast
        )
        # (the survivors train on in round 1 until the newcomer has checked in)
        for rank in range(2):
            write_control(slots[rank][1], control(2, rank, 3, port, joiners=1))
        write_control(newcomer_control, control(2, 2, 3, port, joiners=1))
        wait_for("world 3", lambda: any(r.get("world") == 3 for r in records([newcomer_record])))
        joined = steps()
        wait_for("steps at world 3", lambda: steps() >= joined + 8)
        # ... and its node leaves again in round 3 (world 2): the agent sends it SIGTERM, which
        # alone must not stop the others, and tells the survivors the new round a little later
        newcomer.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        port = free_port()
        for rank in range(2):
            write_control(slots[rank][1], control(3, rank, 2, port))
        wait_for("round 3", lambda: any(r.get("round") == 3 for r in records(paths)))
        fast.touch()  # the rest of the epoch without sleeping
        for process, _, _ in [*slots, (newcomer, None, None)]:
            process.wait(timeout=60)
    finally:
        procs.stop_all()

    # Then the survivors kept their processes through every round and all ended cleanly
    assert [p.returncode for p, _, _ in slots] == [0, 0] and newcomer.returncode == 0
    seen = records([*paths, newcomer_record])
    steps_lines = [r for r in seen if "indices" in r]
    for process, _, record in slots:
        mine = [r for r in records([record]) if "indices" in r]
        assert {r["pid"] for r in mine} == {process.pid}
        assert [r["world"] for r in mine].count(3) >= 8 and {r["round"] for r in mine} == {1, 2, 3}
    ends = {r["pid"]: r for r in seen if r.get("end")}
    assert ends[newcomer.pid]["left"] is True and not ends[slots[0][0].pid]["left"]
    assert (read_state(newcomer_control) or {}).get("state") == "left"
    survivor = read_state(slots[0][1]) or {}
    assert survivor.get("state") == "formed" and survivor.get("round") == 3
    # the newcomer's parameters equal the survivors' from its first step on
    first = min(r["step"] for r in steps_lines if r["pid"] == newcomer.pid)
    at_first = {r["checksum"] for r in steps_lines if r["step"] == first}
    assert len(at_first) == 1 and len([r for r in steps_lines if r["step"] == first]) == 3
    # every step's lines agree on the parameters, and the step counter never went back per process
    for step in {r["step"] for r in steps_lines}:
        assert len({r["checksum"] for r in steps_lines if r["step"] == step}) == 1
    for pid in {r["pid"] for r in steps_lines}:
        own = [r["step"] for r in steps_lines if r["pid"] == pid]
        assert own == sorted(own) and len(own) == len(set(own))
    # and each example of the epoch was seen exactly once
    counted = Counter(i for r in steps_lines for i in r["indices"])
    assert sorted(counted) == list(range(EXAMPLES)) and set(counted.values()) == {1}


def test_a_re_form_that_cannot_complete_reports_failed(tmp_path: Path) -> None:
    # Given two ranks training
    port = free_port()
    slots = []
    for rank in range(2):
        write_control(tmp_path / f"control-{rank}.json", control(1, rank, 2, port))
        slots.append(start(tmp_path, rank, examples=2000, step_sleep=0.02, form_timeout=2))
    try:
        wait_for(
            "a formed group", lambda: all((read_state(c) or {}).get("state") == "formed" for _, c, _ in slots)
        )
        # When round 2 asks for a world of 3 but the third rank never comes
        port = free_port()
        for rank in range(2):
            write_control(slots[rank][1], control(2, rank, 3, port))
        for process, _, _ in slots:
            process.wait(timeout=30)
    finally:
        procs.stop_all()
    # Then both report the failure, with the reason, and exit so the restart path can take over
    for process, control_path, _ in slots:
        state = read_state(control_path)
        assert process.returncode == 3
        assert state is not None and state["state"] == "failed" and state["round"] == 2
        assert "round 2" in state["reason"]


def test_sigterm_to_every_rank_stops_the_group_between_steps(tmp_path: Path) -> None:
    port = free_port()
    slots = []
    for rank in range(2):
        write_control(tmp_path / f"control-{rank}.json", control(1, rank, 2, port))
        slots.append(start(tmp_path, rank, examples=4000, step_sleep=0.02))
    try:
        wait_for(
            "a formed group", lambda: all((read_state(c) or {}).get("state") == "formed" for _, c, _ in slots)
        )
        for process, _, _ in slots:
            process.send_signal(signal.SIGTERM)
        for process, _, _ in slots:
            process.wait(timeout=30)
    finally:
        procs.stop_all()
    ends = [r for r in records([record for _, _, record in slots]) if r.get("end")]
    assert [p.returncode for p, _, _ in slots] == [0, 0]
    assert len(ends) == 2 and all(e["stopped"] and not e["left"] for e in ends)
    assert len({e["step"] for e in ends}) == 1


def test_survivors_of_a_sigkilled_rank_re_form_in_place_and_redo_the_broken_step(tmp_path: Path) -> None:
    # Given three ranks training in round 1
    port = free_port()
    slots = []
    for rank in range(3):
        write_control(tmp_path / f"control-{rank}.json", control(1, rank, 3, port))
    for rank in range(3):
        slots.append(start(tmp_path, rank, examples=600, step_sleep=0.05, collective_timeout=3))
    paths = [record for _, _, record in slots]
    survivors, (dead, _, dead_record) = slots[:2], slots[2]
    try:
        wait_for("the first steps", lambda: max((r.get("step", 0) for r in records(paths)), default=0) >= 6)
        # When rank 2 is SIGKILLed mid-step (the ranks sleep before their all-reduce)
        dead.send_signal(signal.SIGKILL)
        # the survivors notice, wait for a new round, and get one for the two of them
        wait_for(
            "the survivors waiting",
            lambda: all((read_state(c) or {}).get("state") == "waiting" for _, c, _ in survivors),
            timeout=20,
        )
        port = free_port()
        for rank, (_, control_path, _) in enumerate(survivors):
            write_control(control_path, control(2, rank, 2, port))
        for process, _, _ in survivors:
            process.wait(timeout=60)
    finally:
        procs.stop_all()

    # Then the survivors finished the epoch in their own processes
    assert [p.returncode for p, _, _ in survivors] == [0, 0]
    ends = {r["pid"]: r for r in records(paths) if r.get("end")}
    for process, control_path, record in survivors:
        mine = [r for r in records([record]) if "indices" in r]
        assert {r["pid"] for r in mine} == {process.pid}
        assert {r["round"] for r in mine} == {1, 2}
        assert ends[process.pid]["recoveries"] == 1
        assert (read_state(control_path) or {}).get("state") == "formed"
        # the step counter never went back (a redone step repeats its number, once)
        own = [r["step"] for r in mine]
        assert own == sorted(own)
    # Only completed steps count: a survivor's last attempt at each step, and the dead rank's line
    # for a step whose last attempt was still in round 1 (it took part in that step)
    final: dict[tuple[int, int], dict[str, Any]] = {}
    for process, _, record in survivors:
        for r in records([record]):
            if "indices" in r:
                final[(process.pid, r["step"])] = r
    steps_in_round_1 = {step for (_, step), r in final.items() if r["round"] == 1}
    dead_lines = [r for r in records([dead_record]) if "indices" in r and r["step"] in steps_in_round_1]
    redone = {step for (_, step), r in final.items() if r["round"] == 2} & {
        r["step"] for r in records([dead_record]) if "indices" in r
    }
    counted = Counter(i for r in [*final.values(), *dead_lines] for i in r["indices"])
    assert sorted(counted) == list(range(600)) and set(counted.values()) == {1}
    # the parameters agree across the survivors at every step of round 2
    for step in {step for (_, step), r in final.items() if r["round"] == 2}:
        assert len({final[(p.pid, step)]["checksum"] for p, _, _ in survivors}) == 1
    # a step broken by the kill (the usual case: the ranks sleep before their all-reduce) is redone
    # from the parameters it started with: its partial update was undone
    assert len(redone) <= 1
    for step in redone:
        for _, _, record in survivors:
            attempts = [r for r in records([record]) if r.get("step") == step and "indices" in r]
            assert [r["round"] for r in attempts] == [1, 2]
            assert attempts[0]["checksum"] == attempts[1]["checksum"]
