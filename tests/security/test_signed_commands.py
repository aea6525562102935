"""The broker is not root on every host: an agent runs only commands the console sealed
(workers/signing.py), and a report carries a seal, never the node's secret.

Attack: anyone who can write to the broker (any local user of bin/run's Redis, say) queues a
``start_round`` for a node with Celery's own client. Before commands were sealed the agent ran
it; now it refuses it, logs why, and runs only what the console's key sealed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from celery import Celery
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from console.core.transport import Command, command_signer, sealed
from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    one_rank_round,
    start_registered,
    wait_until,
)
from workers import protocol
from workers.signing import SEAL, CommandSigner, CommandVerifier, load_public_key

pytestmark = pytest.mark.cluster
__all__ = ["agent_procs", "control_queue"]

TOUCH = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')\n"


def _marker_script(tmp_path: Path) -> Path:
    script = tmp_path / "touch_marker.py"
    script.write_text(TOUCH)
    return script


def test_a_start_round_written_straight_into_redis_is_refused(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given a running agent, and someone with write access to its broker
    agent, _ = start_registered(agent_procs, control_queue, "host-s")
    script = _marker_script(tmp_path)
    intruder = Celery("intruder", broker=control_queue.url, set_as_current=False)
    intruder.conf.update(task_serializer="json", accept_content=["json"])

    # When they queue a start_round with Celery's own client: unsealed, and sealed with a key
    # of their own
    unsealed_marker, forged_marker = tmp_path / "unsealed", tmp_path / "forged"
    spec = one_rank_round(71, script, [str(unsealed_marker)])
    intruder.send_task(protocol.AGENT_START_ROUND, kwargs={"spec": spec}, queue="node.host-s")
    forged_spec = one_rank_round(72, script, [str(forged_marker)])
    forger = CommandSigner(Ed25519PrivateKey.generate())
    forged = {
        "spec": forged_spec,
        SEAL: forger.seal(protocol.AGENT_START_ROUND, "host-s", {"spec": forged_spec}, 60),
    }
    intruder.send_task(protocol.AGENT_START_ROUND, kwargs=forged, queue="node.host-s")

    # Then the agent refuses both and says why
    assert wait_until(lambda: agent.log().count(f"refused {protocol.AGENT_START_ROUND}") >= 2, 90), (
        agent.log()[-3000:]
    )
    assert "carries no seal" in agent.log() and "does not verify" in agent.log()

    # And a start_round the console sealed does run (so the refusals above were not an idle agent)
    sealed_marker = tmp_path / "sealed"
    control_queue.send(
        "host-s", protocol.AGENT_START_ROUND, spec=one_rank_round(73, script, [str(sealed_marker)])
    )
    assert wait_until(sealed_marker.exists, 120), agent.log()[-3000:]
    assert not unsealed_marker.exists() and not forged_marker.exists()


def _verifier(node: str = "host-v") -> CommandVerifier:
    return CommandVerifier(load_public_key(command_signer().public_key), node)


def _sealed_stop(node: str = "host-v", expires: float = 60.0, **body: object) -> dict[str, object]:
    kwargs = {"job_id": 5, "round": 2, "grace_period": 1.0, **body}
    return sealed(Command(protocol.AGENT_STOP_JOB, protocol.node_queue(node), kwargs, expires))


def test_a_sealed_command_runs_once_for_its_node_until_it_expires() -> None:
    verifier = _verifier()
    good = _sealed_stop()
    assert verifier.refusal(protocol.AGENT_STOP_JOB, good) == ""
    # replayed (the same message again, as MONITOR on Redis would have captured it)
    assert "replay" in verifier.refusal(protocol.AGENT_STOP_JOB, good)
    # for another node
    assert "does not verify" in verifier.refusal(protocol.AGENT_STOP_JOB, _sealed_stop(node="host-w"))
    # altered on the way (another job)
    altered = {**_sealed_stop(), "job_id": 6}
    assert "does not verify" in verifier.refusal(protocol.AGENT_STOP_JOB, altered)
    # another command under the same seal
    assert "does not verify" in verifier.refusal(protocol.AGENT_SYNC, _sealed_stop())
    # expired
    late = _sealed_stop(expires=1.0)
    assert "expired" in verifier.refusal(protocol.AGENT_STOP_JOB, late, now=time.time() + 5)
    # no seal
    assert "no seal" in verifier.refusal(protocol.AGENT_STOP_JOB, {"job_id": 5, "round": 2})


def test_verifying_a_command_costs_well_under_a_millisecond() -> None:
    verifier = _verifier()
    commands = [_sealed_stop() for _ in range(200)]
    started = time.perf_counter()
    for command in commands:
        assert verifier.refusal(protocol.AGENT_STOP_JOB, command) == ""
    per_command = (time.perf_counter() - started) / len(commands)
    print(f"verify: {per_command * 1e6:.0f} us per command ({sys.platform})")
    assert per_command < 0.002
