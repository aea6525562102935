"""A job sees none of the agent's secrets: a rank's environment is an allow-list
(workers/agent/environment.py) plus the job's own env and torchrun's contract, for cold ranks
and for the warm pool's interpreters alike.

Attack: a job dumps its environment. Before the allow-list, ranks inherited the agent's whole
environment: under bin/run that held DATABASE_URL with the embedded PostgreSQL superuser's
password, REDIS_URL and the shared node token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    control_queue,
    round_spec,
    wait_pool_ready,
    wait_until,
)
from workers import protocol
from workers.agent.environment import inherited
from workers.net import free_port

# alone: the warm pool holds its imports while the cores are busy, by design
pytestmark = [pytest.mark.cluster, pytest.mark.alone]
__all__ = ["control_queue"]

SECRETS = {
    "DATABASE_URL": "postgres://postgres:db-password-7f3a@127.0.0.1:5432/trainyard",
    "REDIS_URL": "redis://:redis-password-9c1e@127.0.0.1:6379/0",
    "SECRET_KEY": "django-secret-4d2b",
    "TRAINYARD_TOKEN": "ty_cli-token-secret-1a2b",  # an operator's CLI token in the shell
    "AWS_SECRET_ACCESS_KEY": "aws-secret-5e6f",
    "GITHUB_TOKEN": "ghp_github-secret-8a9b",
}
DUMP = (
    "import json, os, sys; open(sys.argv[1] % os.environ['RANK'], 'w').write(json.dumps(dict(os.environ)))\n"
)


def test_no_rank_cold_or_warm_sees_the_agents_secrets(control_queue: ControlQueue, tmp_path: Path) -> None:
    # Given an agent whose environment holds secrets (as bin/run's does), with a warm pool of 2
    env = {**os.environ, **SECRETS}
    agents = AgentProcs(tmp_path, control_queue.url, token=None, warm_pool=2, env=env)
    try:
        agent = agents.start("host-env")
        control_queue.wait_for(protocol.CONTROL_REGISTER, 60, node="host-env")
        wait_pool_ready(agent, 2)
        script = tmp_path / "dump_env.py"
        script.write_text(DUMP)
        out = tmp_path / "rank-%s.json"

        # When a 3-rank round (2 warm, 1 cold) of a job with its own env dumps its environment
        spec = round_spec(
            job_id=81,
            round_=1,
            node_rank=0,
            nnodes=1,
            nproc_per_node=3,
            master_port=free_port(),
            entrypoint=str(script),
            args=[str(out)],
            env={"JOB_SETTING": "mine", "HF_TOKEN": "the-jobs-own-token"},
        )
        control_queue.send("host-env", protocol.AGENT_START_ROUND, spec=spec)
        files = [Path(str(out) % rank) for rank in range(3)]
        assert wait_until(lambda: all(f.exists() and f.read_text() for f in files), 90), agent.log()[-3000:]
        seen = [json.loads(f.read_text()) for f in files]
    finally:
        agents.cleanup()

    # Then no rank holds any of the agent's secrets, nor its node token, under any name
    node_token = os.environ["TRAINYARD_NODE_TOKEN"]
    for rank_env in seen:
        leaked = [
            name
            for name, value in rank_env.items()
            if any(s in value for s in [*SECRETS.values(), node_token])
        ]
        assert leaked == [], leaked
        assert "TRAINYARD_NODE_TOKEN" not in rank_env and "DATABASE_URL" not in rank_env
        # And it has what it needs: the job's own env (its secrets are its own), the contract, PATH
        assert rank_env["JOB_SETTING"] == "mine" and rank_env["HF_TOKEN"] == "the-jobs-own-token"
        assert rank_env["WORLD_SIZE"] == "3" and rank_env["PATH"] and rank_env["MASTER_PORT"]
    # And warm and cold ranks saw the same names (apart from per-rank values)
    assert {frozenset(e) for e in seen} == {frozenset(seen[0])}


def test_the_allow_list_keeps_transport_settings_and_drops_credentials() -> None:
    kept = inherited(
        {
            "PATH": "/usr/bin",
            "LC_ALL": "C.UTF-8",
            "NCCL_SOCKET_IFNAME": "eth0",
            "GLOO_SOCKET_IFNAME": "eth0",
            "CUDA_HOME": "/usr/local/cuda",
            "TP_SOCKET_IFNAME": "eth0",
            "OMP_NUM_THREADS": "2",
            "PYTHONHASHSEED": "0",
            "TORCH_NCCL_TOKEN": "x",  # a transport-looking name that carries a credential
            "REDIS_URL": "redis://:p@h/0",
            "TRAINYARD_NODE_TOKEN": "t",
            "TRAINYARD_CONSOLE_URL": "http://c",
            "HOSTNAME_SECRET": "s",
            "CELERY_BROKER_URL": "redis://:p@h/0",
        }
    )
    assert sorted(kept) == [
        "CUDA_HOME",
        "GLOO_SOCKET_IFNAME",
        "LC_ALL",
        "NCCL_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
        "PATH",
        "PYTHONHASHSEED",
        "TP_SOCKET_IFNAME",
    ]
