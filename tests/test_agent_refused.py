"""An agent the console refuses (it speaks an older protocol than the console needs) logs the
console's reason and exits with its own exit code, instead of heartbeating on unheard."""

from __future__ import annotations

from tests.support.agents import AgentProcs, ControlQueue, agent_procs, control_queue, start_registered
from workers import protocol
from workers.agent.app import EXIT_REFUSED

__all__ = ["agent_procs", "control_queue"]


def test_a_refused_agent_says_why_and_exits(agent_procs: AgentProcs, control_queue: ControlQueue) -> None:
    agent, register = start_registered(agent_procs, control_queue, "host-old", timeout=120)
    assert register.kwargs["info"]["protocol"] == protocol.PROTOCOL_VERSION

    reason = (
        "agent 0.1.0 on host-old speaks protocol 1; this console needs protocol 2 or newer: upgrade the agent"
    )
    control_queue.send("host-old", protocol.AGENT_REFUSED, reason=reason)

    assert agent.popen.wait(60) == EXIT_REFUSED
    assert f"the console refused this agent: {reason}" in agent.log()
