"""A parameter-server job's PS and coordinator answer only callers with the job's secret
(workers/ps/auth.py), which the console derives per job and sends in the signed round spec.

Attack: anyone who can reach a PS's port (it listens on the node's routable address) pulls the
job's embedding rows, overwrites them with a push of their own, or registers at the coordinator
and takes the job's data shards. Before, both servers listened with an insecure port and answered
every gRPC caller.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import torch
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from console.cluster.models import Node
from console.jobs import failures, reports, scheduler
from console.jobs.models import Job
from console.jobs.spec import ps_secret
from console.telemetry.models import Event
from tests.support.decisions import Decide, failing_exit, make_job, make_node
from tests.support.jobs import submitted_ps_job
from workers import protocol
from workers.ps import contract, ps_pb2, ps_pb2_grpc, tensors
from workers.ps.client import PsClient, PsClientError
from workers.ps.contract import Role
from workers.ps.local import LocalPsJob
from workers.ps.optim import OptimizerConfig
from workers.ps.store import TableConfig

IDS = torch.tensor([0, 1, 2, 3])
DIM = 4


def refused(call: Callable[..., Any], request: Any, secret: str | None) -> grpc.RpcError:
    """Calls a raw stub method as an outsider: with no metadata, or presenting ``secret``."""
    metadata = None if secret is None else (("authorization", f"Bearer {secret}"),)
    with pytest.raises(grpc.RpcError) as raised:
        call(request, metadata=metadata, timeout=10)
    return raised.value


def attacker_push() -> ps_pb2.PushRequest:
    grads = tensors.encode(torch.full((IDS.numel(), DIM), 100.0))
    return ps_pb2.PushRequest(
        worker="attacker",
        examples=1,
        tables=[ps_pb2.TableGrad(table="users", ids=tensors.encode(IDS), grads=grads)],
    )


def test_the_ps_and_the_coordinator_refuse_callers_without_the_jobs_secret(
    ps_job: Callable[..., LocalPsJob],
) -> None:
    # Given a PS job's coordinator and PS, started with its secret, and a table its worker declared
    job: LocalPsJob = ps_job(ps_count=1)
    job.start_servers()
    owner = job.client("owner")
    owner.declare([TableConfig("users", DIM, 0.1, OptimizerConfig("sgd", lr=1.0))])
    before, _, _ = owner.pull({"users": IDS})
    version = owner.stats()[0]["version"]

    # When an outsider calls the PS and the coordinator with no secret, and with a guessed one
    attempts = []
    with grpc.insecure_channel(job.ps_addresses[0]) as ps, grpc.insecure_channel(job.coordinator) as co:
        server, coordinator = ps_pb2_grpc.ParameterServerStub(ps), ps_pb2_grpc.CoordinatorStub(co)
        for secret in (None, "guessed"):
            attempts += [
                refused(server.Push, attacker_push(), secret),
                refused(
                    server.Pull,
                    ps_pb2.PullRequest(tables=[ps_pb2.TableIds(table="users", ids=tensors.encode(IDS))]),
                    secret,
                ),
                refused(server.Declare, ps_pb2.DeclareRequest(), secret),
                refused(coordinator.Register, ps_pb2.RegisterRequest(worker="attacker"), secret),
                refused(coordinator.Acquire, ps_pb2.WorkerRequest(worker="attacker"), secret),
            ]

    # Then every call is refused as unauthenticated, naming the cause, with no row in the answer
    assert {error.code() for error in attempts} == {grpc.StatusCode.UNAUTHENTICATED}  # type: ignore[attr-defined]
    details = [str(error.details()) for error in attempts]  # type: ignore[attr-defined]
    assert all(contract.ENV_SECRET in text for text in details), details
    assert "the call carried no secret" in details[0]
    assert "the call carried a wrong secret" in details[5]
    assert job.secret not in str(details)
    # And nothing changed: the rows, the PS's version, the coordinator's workers
    after, _, _ = owner.pull({"users": IDS})
    assert torch.equal(after["users"], before["users"])
    assert owner.stats()[0]["version"] == version
    watcher = job.coordinator_client("watcher")
    assert watcher.queue()["workers"] == 0

    # When the SDK's client is given a wrong secret
    intruder = PsClient(job.ps_addresses, "intruder", retry_s=30, secret="guessed")
    started = time.monotonic()
    with pytest.raises(PsClientError, match="pull on PS 0: UNAUTHENTICATED: the call carried a wrong secret"):
        intruder.pull({"users": IDS})
    intruder.close()
    # Then it fails at once (no retrying for 30 s as for a restarting PS)
    assert time.monotonic() - started < 10

    # And the job's own clients, with the right secret, push, pull and register as before
    grads = torch.ones(IDS.numel(), DIM)
    assert owner.push(None, {"users": (IDS, grads)}, {}, {}, IDS.numel()).applied == 1
    pushed, _, _ = owner.pull({"users": IDS})
    assert torch.allclose(pushed["users"], before["users"] - 1.0)
    worker = job.coordinator_client("worker-0")
    worker.register()
    assert watcher.queue()["workers"] == 1
    for client in (owner, worker, watcher):
        client.close()


@pytest.mark.parametrize("module", ["workers.ps.server", "workers.ps.coordinator"])
def test_a_server_without_a_secret_refuses_to_start(ps_job: Callable[..., LocalPsJob], module: str) -> None:
    # Given a PS or coordinator environment that lacks the secret
    job: LocalPsJob = ps_job(ps_count=1)
    role = Role.PS if module == "workers.ps.server" else Role.COORDINATOR
    env = job.env(role, 0)
    del env[contract.ENV_SECRET]
    # When it is started
    ended = subprocess.run(
        [sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    # Then it exits naming the variable: a server never runs open
    assert ended.returncode == 2, ended.stderr
    assert "TRAINYARD_PS_SECRET must be set" in ended.stderr


def specs_of(sent: list[tuple[str, str, dict[str, Any]]], job: Job) -> list[dict[str, Any]]:
    """The round specs of the start commands sent for ``job``."""
    starts = [kwargs["spec"] for name, _, kwargs in sent if name == protocol.AGENT_START_ROUND]
    return [spec for spec in starts if spec["job_id"] == job.pk]


def test_the_console_sends_each_ps_job_its_own_secret_the_same_in_every_round(decide: Decide) -> None:
    # Given a PS job placed on two nodes: a has the coordinator and PS 1, b PS 0 and worker 0
    make_node("a", slots=3), make_node("b", slots=3)
    job = submitted_ps_job(workers=1)
    first = specs_of(decide(scheduler.tick).to_agents(), job)
    # Then both hosts get the job's secret in the round's PS layout, not in the job's env
    assert len(first) == 2 and {spec["ps"]["secret"] for spec in first} == {ps_secret(job)}
    assert len(ps_secret(job)) == 64 and not [s for s in first if ps_secret(job) in str(s["env"])]

    # When PS 0 is SIGKILLed and the job restarts in round 2
    lost = {**failing_exit(rank=1, code=None, signal="SIGKILL"), "local_rank": 0, "error": ""}
    decide(reports.rank_exited, "b", job.pk, 1, lost)
    Node.objects.update(last_heartbeat=timezone.now())
    second = specs_of(decide(failures.settle_failed_rounds).to_agents(), job)
    # Then round 2's processes get the same secret: the restarted PS and the workers agree
    assert {(spec["round"], spec["ps"]["secret"]) for spec in second} == {(2, ps_secret(job))}

    # When another PS job and a plain job are placed on two more nodes
    make_node("c", slots=4), make_node("d", slots=4)
    other, plain = submitted_ps_job(workers=1), make_job("plain")
    sent = decide(scheduler.tick).to_agents()
    # Then the other PS job gets a secret of its own and the plain job none
    assert {spec["ps"]["secret"] for spec in specs_of(sent, other)} == {ps_secret(other)} != {ps_secret(job)}
    (plain_spec,) = specs_of(sent, plain)
    assert "ps" not in plain_spec and ps_secret(job) not in str(plain_spec)
    # And no event shows a secret
    assert not [e for e in Event.objects.all() if ps_secret(job) in str(e.__dict__)]


@pytest.mark.parametrize("field", ["env", "secret_env"])
def test_a_job_cannot_set_the_ps_secret_itself(operator: User, field: str) -> None:
    # Given an operator who submits a PS job that sets TRAINYARD_PS_SECRET itself
    client = APIClient()
    client.force_authenticate(operator)
    body = {
        "name": "ps",
        "workload": "recsys-embedding",
        "strategy": "parameter_server",
        "nnodes": "1",
        "roles": {"ps": {"count": 1}, "worker": {"count": 1}},
        field: {contract.ENV_SECRET: "known-to-the-attacker"},
    }
    # When it is submitted
    response = client.post("/api/v1/jobs/", body, format="json")
    # Then it is refused with the variable named: the console's secret cannot be replaced
    assert response.status_code == 400
    assert "TRAINYARD_PS_SECRET is set by the launcher" in str(response.json()["errors"][field])
    assert not Job.objects.exists()


def test_the_secret_is_in_the_environment_not_on_the_command_line(ps_job: Callable[..., LocalPsJob]) -> None:
    # Given a PS started by the local runner with the job's secret
    job: LocalPsJob = ps_job(ps_count=1)
    process = job.start_ps(0)
    # Then `ps` shows its command line without the secret, and the process's environment has it
    with open(f"/proc/{process.pid}/cmdline", "rb") as cmdline:
        assert job.secret.encode() not in cmdline.read()
    with open(f"/proc/{process.pid}/environ", "rb") as environ:
        assert f"{contract.ENV_SECRET}={job.secret}".encode() in environ.read().split(b"\0")
    assert job.secret not in job.log("ps-0") and job.secret not in repr(job)
