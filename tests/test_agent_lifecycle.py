"""An agent's life on the wire: stale commands purged at boot, registration, heartbeats with
round status, torchrun's environment contract, log and telemetry shipping, signal exits,
clean shutdown (OFFLINE) and restart (re-registration with a new session)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    pid_alive,
    rank_pids,
    round_spec,
    start_registered,
    wait_until,
)
from workers import protocol

__all__ = ["agent_procs", "control_queue"]

RANK_SCRIPT = """
import json, os, sys, time
json.dump(dict(os.environ), open(os.path.join(os.environ["OUT"], "env-" + os.environ["RANK"] + ".json"), "w"))
with open(os.environ["TRAINYARD_TELEMETRY"], "a") as fh:
    for step in (1, 2, 3):
        fh.write(json.dumps({"kind": "metric", "t": time.time(), "step": step, "values": {"loss": 1 / step}}) + "\\n")
    fh.write(json.dumps({"kind": "event", "event": "note", "severity": "info", "message": "hi", "data": {}}) + "\\n")
print("hello from rank", os.environ["RANK"])
print("a warning line", file=sys.stderr)
"""

SIGTERM_SCRIPT = """
import os, signal, sys, time
out, rank = os.environ["OUT"], os.environ["RANK"]
def on_term(signum, frame):
    open(os.path.join(out, "terminated-" + rank), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "ready-" + rank), "w").close()
time.sleep(300)
"""


def python_round(job_id: int, code: str, out: Path, **overrides: Any) -> protocol.RoundSpec:
    spec = round_spec(
        job_id=job_id,
        round_=1,
        node_rank=1,
        nnodes=2,
        master_port=29_999,
        entrypoint=sys.executable,
        args=["-c", code],
        env={"OUT": str(out), "OMP_NUM_THREADS": "2"},
        restart_count=2,
    )
    spec.update(overrides)  # type: ignore[typeddict-item]
    return spec


def stream_records(control_queue: ControlQueue, job_id: int) -> dict[int, list[dict[str, Any]]]:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    entries: list[tuple[bytes, dict[bytes, bytes]]] = control_queue.redis.xrange(protocol.TELEMETRY_STREAM)  # type: ignore[assignment]
    for _id, fields in entries:
        batch = json.loads(fields[b"batch"])
        if batch["job_id"] == job_id:
            assert batch["node"] == "host-l"
            assert batch["round"] == 1
            by_rank.setdefault(batch["rank"], []).extend(batch["records"])
    return by_rank


def test_agent_lifecycle_on_the_wire(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    control_queue.redis.delete(protocol.TELEMETRY_STREAM, protocol.node_queue("host-l"))
    # Given a command left in the node queue from before the agent started
    control_queue.send("host-l", protocol.AGENT_START_ROUND, spec=python_round(70, "pass", tmp_path))

    # When the agent starts
    agent, register = start_registered(agent_procs, control_queue, "host-l", heartbeat=0.3)

    # Then it registers its inventory with token, name and a session
    info = register.kwargs["info"]
    session = register.kwargs["session"]
    assert "token" not in register.kwargs and str(agent_procs.token) not in str(register.kwargs)
    assert len(session) == 32
    assert info["address"] == "127.0.0.1"
    assert info["cpus"] >= 1 and info["slots"] == info["cpus"]
    assert info["memory_bytes"] > 0
    assert info["gpus"] == []  # no NVIDIA driver on this machine
    assert info["torch_version"].startswith("2.13")
    assert info["agent_version"]
    heartbeat = control_queue.wait_for(protocol.CONTROL_HEARTBEAT, 5, node="host-l", session=session)
    assert 0 <= heartbeat.kwargs["load"]["memory_percent"] <= 100
    assert heartbeat.kwargs["rounds"] == []

    # When a round of a 2-node job runs here as node 1 (ranks 2 and 3)
    control_queue.send("host-l", protocol.AGENT_START_ROUND, spec=python_round(71, RANK_SCRIPT, tmp_path))
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, node="host-l", job_id=71)
    assert ended.kwargs["outcome"] == "succeeded"

    # Then each rank saw exactly torchrun's environment plus TRAINYARD_*
    for local_rank, rank in ((0, 2), (1, 3)):
        env = json.loads((tmp_path / f"env-{rank}.json").read_text())
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK")} == {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "GROUP_RANK": "1",
            "ROLE_RANK": str(rank),
        }
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert env["ROLE_NAME"] == "default"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29999")
        assert env["TORCHELASTIC_RESTART_COUNT"] == "2"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert env["TORCHELASTIC_RUN_ID"] == "job-71"
        assert env["OMP_NUM_THREADS"] == "2"  # the job's env wins over the default of 1
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the store
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"rank-{local_rank}/error.json")
        assert env[protocol.ENV_JOB_ID] == "71"
        assert env[protocol.ENV_ROUND] == "1"
        assert env[protocol.ENV_NODE] == "host-l"
        assert env[protocol.ENV_CHECKPOINT_DIR] == str(
            (agent_procs.root / "checkpoints" / "job-71").resolve()
        )
        assert json.loads(env[protocol.ENV_HYPERPARAMETERS]) == {"lr": 0.01}
        assert (env[protocol.ENV_PRECISION], env[protocol.ENV_STRATEGY]) == ("fp32", "allreduce")
        assert env[protocol.ENV_GRAD_ACCUM] == "1"
        assert env[protocol.ENV_TELEMETRY].endswith(f"rank-{local_rank}/telemetry.jsonl")

    # And its telemetry and log lines reached the Redis stream, batched per rank
    # (shipped within ~100 ms of being written, independently of the control messages)
    assert wait_until(lambda: [len(r) for r in stream_records(control_queue, 71).values()] == [6, 6], 5), (
        stream_records(control_queue, 71)
    )
    records = stream_records(control_queue, 71)
    assert sorted(records) == [2, 3]
    for rank, rank_records in records.items():
        metrics = [r for r in rank_records if r["kind"] == "metric"]
        assert [(m["seq"], m["step"]) for m in metrics] == [(1, 1), (2, 2), (3, 3)]
        assert [r["event"] for r in rank_records if r["kind"] == "event"] == ["note"]
        logs = [(r["stream"], r["seq"], r["text"]) for r in rank_records if r["kind"] == "log"]
        assert ("stdout", 1, f"hello from rank {rank}") in logs
        assert ("stderr", 1, "a warning line") in logs

    # And heartbeats report the ended round with the last step its ranks logged
    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT,
        5,
        node="host-l",
        match=lambda m: [(s["state"], s["last_step"]) for s in m.kwargs["rounds"]] == [("succeeded", 3)],
    )
    (status,) = heartbeat.kwargs["rounds"]
    assert (status["job_id"], status["round"]) == (71, 1)
    assert status["first_step_at"] is not None

    # And the stale command from before the agent started never ran
    assert not (agent.data_dir / "rounds" / "job-70").exists()

    # When a rank is killed by a signal
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    control_queue.send(
        "host-l", protocol.AGENT_START_ROUND, spec=python_round(72, kill_self, tmp_path, nproc_per_node=1)
    )

    # Then its exit names the signal
    exited = control_queue.wait_for(protocol.CONTROL_RANK_EXITED, 30, node="host-l", job_id=72)
    assert exited.kwargs["exit"]["signal"] == "SIGKILL"
    assert exited.kwargs["exit"]["exit_code"] is None
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 10, node="host-l", job_id=72)
    assert ended.kwargs["outcome"] == "failed"

    # When a sync lists a round the agent does not run, it starts it; when a later sync no
    # longer lists it, the agent stops it (SIGTERM) and reports it stopped
    # (one process on node 1: rank 1)
    sync_spec = python_round(74, SIGTERM_SCRIPT, tmp_path, nproc_per_node=1)
    control_queue.send("host-l", protocol.AGENT_SYNC, rounds=[sync_spec])
    assert wait_until(lambda: (tmp_path / "ready-1").exists(), 30)
    control_queue.send("host-l", protocol.AGENT_SYNC, rounds=[])
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, node="host-l", job_id=74)
    assert ended.kwargs["outcome"] == "stopped"
    assert (tmp_path / "terminated-1").exists()
    for marker in ("ready-1", "terminated-1"):
        (tmp_path / marker).unlink()

    # When the agent shuts down cleanly while a round runs
    control_queue.send("host-l", protocol.AGENT_START_ROUND, spec=python_round(73, SIGTERM_SCRIPT, tmp_path))
    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 30, node="host-l", match=lambda m: len(rank_pids(m, 73, 1)) == 2
    )
    pids = rank_pids(heartbeat, 73, 1)
    assert wait_until(lambda: all((tmp_path / f"ready-{rank}").exists() for rank in (2, 3)), 30)
    assert agent.stop() == 0

    # Then its ranks got SIGTERM (and used it), the round ended "stopped", and it said goodbye
    assert sorted(p.name for p in tmp_path.glob("terminated-*")) == ["terminated-2", "terminated-3"]
    assert not any(pid_alive(pid) for pid in pids)
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 5, node="host-l", job_id=73)
    assert ended.kwargs["outcome"] == "stopped"
    offline = control_queue.wait_for(protocol.CONTROL_OFFLINE, 5, node="host-l")
    assert offline.kwargs["session"] == session

    # And when it starts again it re-registers under the same name with a new session and
    # resumes heartbeats
    _, again = start_registered(agent_procs, control_queue, "host-l", heartbeat=0.3)
    assert again.kwargs["session"] != session
    control_queue.wait_for(protocol.CONTROL_HEARTBEAT, 5, node="host-l", session=again.kwargs["session"])
