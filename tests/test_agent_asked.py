"""The controller's requests to an agent that are not about rounds: a heartbeat now (a rank
failure waits for every host's proof of life) and registering again (a heartbeat the console
could not place). A real agent, its Celery queue and the control queue; no controller."""

from __future__ import annotations

from tests.support.agents import AgentProcs, ControlQueue, agent_procs, control_queue, start_registered
from workers import protocol

__all__ = ["agent_procs", "control_queue"]


def test_an_agent_asked_for_a_heartbeat_or_to_register_again_does_so_at_once(
    agent_procs: AgentProcs, control_queue: ControlQueue
) -> None:
    # Given an agent whose next heartbeat is half a minute away
    agent, registered = start_registered(agent_procs, control_queue, "host-asked", heartbeat=30.0)

    # When the controller asks it for a heartbeat now, it comes within seconds, not in 30
    control_queue.send(agent.name, protocol.AGENT_HEARTBEAT_NOW)
    beat = control_queue.wait_for(protocol.CONTROL_HEARTBEAT, timeout=5, node=agent.name)
    assert beat.kwargs["session"] == registered.kwargs["session"] and beat.kwargs["rounds"] == []

    # And when asked to register again, it registers again (same session), saying why in its log
    control_queue.send(agent.name, protocol.AGENT_REGISTER_AGAIN, reason="the console shows this node LOST")
    again = control_queue.wait_for(protocol.CONTROL_REGISTER, timeout=5, node=agent.name)
    assert again.kwargs["session"] == registered.kwargs["session"]
    assert again.kwargs["info"]["hostname"] == registered.kwargs["info"]["hostname"]
    assert "register again: the console shows this node LOST" in agent.log()
