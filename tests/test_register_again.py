"""A heartbeat the console cannot place makes the agent register again at once: from a node it
does not know, from a session it does not know, or from a node it shows OFFLINE or LOST. The
request is sent at most once per heartbeat interval per node, and a node is never left OFFLINE
while its agent heartbeats."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from console.cluster import registry
from console.cluster.models import Node
from console.core.states import NodeState
from tests.support.decisions import TICK, Decide, make_node
from workers import protocol

LOAD: protocol.NodeLoad = {"cpu_percent": 1.0, "memory_percent": 2.0, "gpus": []}
INFO: protocol.NodeInfo = {
    "hostname": "h",
    "address": "10.0.0.5",
    "cpus": 2,
    "memory_bytes": 1 << 30,
    "slots": 2,
    "gpus": [],
    "torch_version": "2.13.0",
    "agent_version": "0.2.0",
    "protocol": protocol.PROTOCOL_VERSION,
}
NAMES = ("ghost", "a", "off", "gone")


@pytest.fixture(autouse=True)
def fresh_rate_limit() -> Iterator[None]:
    def clear() -> None:
        for name in NAMES:
            registry._register_again_limiter().clear(registry.register_again_window(), "register-again", name)

    clear()
    yield
    clear()


def register_again(node: str, reason: str) -> tuple[str, str, dict[str, str]]:
    return (protocol.AGENT_REGISTER_AGAIN, f"node.{node}", {"reason": reason})


@override_settings(HEARTBEAT_INTERVAL=1.0)
def test_an_unknown_node_is_asked_to_register_once_per_interval(decide: Decide) -> None:
    asked = decide(registry.heartbeat, "ghost", "s1", LOAD, [])
    assert asked.sent() == [register_again("ghost", "the console does not know this node")]
    assert decide(registry.heartbeat, "ghost", "s1", LOAD, []).sent() == []  # within the interval
    time.sleep(1.05)
    assert len(decide(registry.heartbeat, "ghost", "s1", LOAD, []).sent()) == 1
    assert not Node.objects.filter(name="ghost").exists()


def test_an_unknown_session_is_asked_to_register_and_changes_nothing(decide: Decide) -> None:
    node = make_node("a", session="registered", seen_ago=30)
    asked = decide(registry.heartbeat, "a", "another", LOAD, [])
    assert asked.sent() == [register_again("a", "the console does not know this agent session")]
    node.refresh_from_db()
    assert node.cpu_percent == 0.0 and (node.last_heartbeat is not None)
    assert node.last_heartbeat.timestamp() < time.time() - 20  # not taken as proof of life


def test_an_offline_node_that_heartbeats_registers_again_and_is_online(decide: Decide) -> None:
    make_node("off", state=NodeState.OFFLINE, session="s-off")
    asked = decide(registry.heartbeat, "off", "s-off", LOAD, [])
    assert asked.sent() == [register_again("off", "the console shows this node OFFLINE")]

    # The agent answers by registering (same session): the node is ONLINE again
    back = decide(registry.register_node, "off", "s-off", INFO)
    assert back.kinds() == ["node.online"]
    assert back.sent() == [(protocol.AGENT_SYNC, "node.off", {"rounds": []}), TICK]
    assert Node.objects.get(name="off").state == NodeState.ONLINE


def test_a_lost_node_that_heartbeats_is_online_at_once_and_registers_again(decide: Decide) -> None:
    make_node("gone", state=NodeState.LOST, session="s-gone")
    back = decide(registry.heartbeat, "gone", "s-gone", LOAD, [])
    assert back.sent() == [
        register_again("gone", "the console shows this node LOST"),
        (protocol.AGENT_SYNC, "node.gone", {"rounds": []}),
        TICK,
    ]
    assert back.kinds() == ["node.online"]
    assert Node.objects.get(name="gone").state == NodeState.ONLINE


def test_a_known_online_node_is_not_asked(decide: Decide) -> None:
    make_node("a", session="s-a")
    assert decide(registry.heartbeat, "a", "s-a", LOAD, []).sent() == []
