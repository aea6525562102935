"""Many hosts for real: three hosts made of network namespaces (each its own address on eth0, the
host name resolving to loopback, no DNS), a console on the bridge with Redis behind a password,
each agent enrolled with a join token exactly as README's "Adding a host" says. A plain
torchrun-style DDP script, uploaded as a bundle with no env of its own, trains across them
through a resize, a rank kill, a cut and restored link and the death of a whole host, and
SUCCEEDS with nothing left running. Skipped where namespaces cannot be made (not root, no `ip`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.agents import AgentProcess
from tests.support.netcluster import NetCluster, net_cluster, wait
from tests.support.netns import netns_hosts

__all__ = ["net_cluster", "netns_hosts"]

PLAIN_DDP = Path(__file__).resolve().parent / "scripts" / "plain_ddp.py"
STEP_TIMEOUT = 150.0


def steps(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_world(
    cluster: NetCluster, job_id: int, log: Path, world: int, after_round: int, count: int = 3
) -> int:
    """Until ``count`` steps were logged at ``world`` in a round after ``after_round``; that round."""

    def seen() -> int | None:
        rounds = [
            r["round"]
            for r in steps(log)
            if "loss" in r and r.get("world") == world and r["round"] > after_round
        ]
        return rounds[-1] if len(rounds) >= count else None

    found: int = wait(
        seen,
        STEP_TIMEOUT,
        f"{count} steps at world {world} after round {after_round}",
        lambda: cluster.diagnose(job_id),
    )
    return found


def first_step_after(log: Path, number: int, since: float) -> float:
    """Seconds from ``since`` (unix time) to round ``number``'s first logged step."""
    return min(r["t"] for r in steps(log) if "loss" in r and r["round"] == number) - since


def rank_pid(cluster: NetCluster, host: str) -> int:
    """The pid of the DDP rank on ``host`` (a descendant of its agent running plain_ddp.py)."""
    for proc in cluster.agents[host].descendants():
        try:
            if any("plain_ddp.py" in part for part in proc.cmdline()):
                return proc.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no rank on {host}\n{cluster.diagnose()}")


@pytest.mark.cluster
@pytest.mark.timeout(900)  # about 3 minutes on a quiet machine; 10 at a load of 20 on 2 cores
def test_a_plain_ddp_script_survives_resize_rank_kill_link_cut_and_host_death_across_hosts(
    net_cluster: NetCluster, tmp_path: Path
) -> None:
    cluster = net_cluster
    hosts = cluster.hosts

    # Given three hosts enrolled with join tokens, each reporting its own address and interface
    for host in hosts.hosts:
        cluster.start_agent(host)
    nodes = cluster.wait_online(*(h.name for h in hosts.hosts))
    for host in hosts.hosts:
        assert (nodes[host.name]["address"], nodes[host.name]["interface"]) == (host.address, "eth0")

    # When a plain DDP script is uploaded as a bundle and submitted on two of them
    log = tmp_path / "steps.jsonl"
    finish = tmp_path / "finish"
    bundle = cluster.upload(PLAIN_DDP)
    job_id = cluster.submit(
        {
            "name": "plain-across-hosts",
            "entrypoint": "plain_ddp.py",
            "bundle": bundle,
            "args": [
                "--steps",
                "100000",
                "--step-sleep",
                "0.05",
                "--checkpoint-every",
                "10",
                "--step-log",
                str(log),
                "--finish-file",
                str(finish),
            ],
            "nnodes": "1:3",
            "nproc_per_node": 1,
            "max_restarts": 3,
            "grace_period": 10,
        }
    )
    cluster.wait_state(job_id, "RUNNING")
    first = wait_world(cluster, job_id, log, 3, after_round=0)

    # Then it trains at world 3, its store on node rank 0's own address, never loopback
    rounds = cluster.job(job_id)["rounds"]
    assert {r["master_addr"] for r in rounds} <= {h.address for h in hosts.hosts}

    # When it is resized to 2, then back to 3
    took: dict[str, float] = {}
    at = time.time()
    resize = cluster.api("POST", f"/api/v1/jobs/{job_id}/resize/", json={"nodes": 2})
    assert resize.status_code in (200, 202), resize.text
    smaller = wait_world(cluster, job_id, log, 2, after_round=first)
    took["scale_down"] = first_step_after(log, smaller, at)
    at = time.time()
    resize = cluster.api("POST", f"/api/v1/jobs/{job_id}/resize/", json={"nodes": 3})
    assert resize.status_code in (200, 202), resize.text
    grown = wait_world(cluster, job_id, log, 3, after_round=smaller)
    took["scale_up"] = first_step_after(log, grown, at)

    # When a rank is SIGKILLed: a new round at world 3
    at = time.time()
    os.kill(rank_pid(cluster, "host-1"), signal.SIGKILL)
    recovered = wait_world(cluster, job_id, log, 3, after_round=grown)
    took["rank_kill"] = first_step_after(log, recovered, at)

    # When host-2's link is cut: the job goes on at world 2 without it
    at = time.time()
    hosts.cut(hosts[2])
    try:
        shrunk = wait_world(cluster, job_id, log, 2, after_round=recovered)
    finally:
        hosts.restore(hosts[2])
        restored = time.time()
    took["link_cut"] = first_step_after(log, shrunk, at)

    # And once the link is back, host-2 registers again and the job grows back to 3
    regrown = wait_world(cluster, job_id, log, 3, after_round=shrunk)
    took["link_restored"] = first_step_after(log, regrown, restored)

    # When host-1 dies whole (its agent and its ranks): world 2 again
    at = time.time()
    killed = hosts.kill_all(hosts[1])
    assert killed
    final = wait_world(cluster, job_id, log, 2, after_round=regrown)
    took["host_death"] = first_step_after(log, final, at)

    # Then the job finishes cleanly, charged only for the rank it lost, with nothing left running
    finish.touch()
    done = cluster.wait_state(job_id, "SUCCEEDED", "FAILED", timeout=STEP_TIMEOUT)
    assert done["state"] == "SUCCEEDED", cluster.diagnose(job_id)
    assert done["restarts"] == 1
    assert final > regrown > shrunk > recovered > grown > smaller > first
    kinds = [e["kind"] for e in cluster.events(job_id)]
    assert "round.launch_failed" not in kinds, cluster.diagnose(job_id)
    for host in (hosts[0], hosts[2]):
        agent = cluster.agents[host.name]

        def none_left(agent: AgentProcess = agent) -> bool:
            return not [p for p in agent.descendants() if "plain_ddp" in " ".join(_cmd(p))]

        assert wait(none_left, 30, f"no rank left on {host.name}", cluster.diagnose)
    print("seconds to the next step:", json.dumps({k: round(v, 2) for k, v in took.items()}))


def _cmd(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []
